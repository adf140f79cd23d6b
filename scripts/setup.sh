#!/usr/bin/env bash
# Create .venv (if needed) and install hixl with its test, docs and release extras,
# building the native extension, then hixl-bench (bench/, its own
# distribution, with its native ceilings). Safe to run again: it only
# reinstalls hixl and hixl-bench. One line per step on stdout; pip's own
# output only when something goes wrong.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
step() { echo "scripts/setup.sh: $*"; }
# The native data plane links OpenSSL's libcrypto (HMAC of its connection
# proofs); its headers come with libssl-dev.
if [ ! -e /usr/include/openssl/hmac.h ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  step "installing libssl-dev (OpenSSL's headers, for the native extension)"
  apt-get install -y -q libssl-dev >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q libssl-dev >/dev/null; }
fi
# The partition tests cut links between network namespaces with nftables
# drops (the kernel has no netem); without nft (or root) they skip.
if ! command -v nft >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  step "installing nftables and iproute2 (for the partition tests)"
  apt-get install -y -q nftables iproute2 >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q nftables iproute2 >/dev/null; } || echo "setup.sh: nftables not installed: the partition tests will skip" >&2
fi
if [ ! -x .venv/bin/python ]; then
  step "creating .venv with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv .venv
fi
# setuptools emits "Editable installation." (a warning of its InformationOnly
# class) for every editable install that maps a package from a directory of
# its own, as hixl does with native/hixl_native, and pip shows it as a
# warning. It only tells that directories named like the packages take
# precedence, which in a checkout is the point. That one notice is filtered
# (by its literal start), so any other warning of the build still shows.
pip_install() {
  PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install --quiet "$@"
}
step "upgrading pip"
pip_install --upgrade pip
step "installing hixl with the test, docs and release extras (builds the native extension; about a minute)"
pip_install -e '.[test,docs,release]'
# after hixl, so that its dependency on hixl is this checkout, not an index
step "installing hixl-bench (builds its native ceilings)"
pip_install -e ./bench
step "done: .venv has hixl $(.venv/bin/python -c 'import hixl_client; print(hixl_client.__version__)') and hixl-bench"
