#!/usr/bin/env bash
# The main job on a fresh machine: install, then run a prefill-to-decode
# transfer between two daemons with the embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/prefill_decode.py "$@"
