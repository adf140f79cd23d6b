#!/usr/bin/env bash
# The test command: install, then run every test (unit, native, integration).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
