#!/usr/bin/env bash
# Create .venv (if needed) and install hixl with its test extras, building the
# native extension, then hixl-bench (bench/, its own distribution, with its
# native ceilings). Safe to run again: it only reinstalls hixl and hixl-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# The native data plane links OpenSSL's libcrypto (HMAC of its connection
# proofs); its headers come with libssl-dev.
if [ ! -e /usr/include/openssl/hmac.h ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get install -y -q libssl-dev >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q libssl-dev >/dev/null; }
fi
# The partition tests cut links between network namespaces with nftables
# drops (the kernel has no netem); without nft (or root) they skip.
if ! command -v nft >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get install -y -q nftables iproute2 >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q nftables iproute2 >/dev/null; } || echo "setup.sh: nftables not installed: the partition tests will skip" >&2
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
# after hixl, so that its dependency on hixl is this checkout, not an index
.venv/bin/python -m pip install --quiet -e ./bench
