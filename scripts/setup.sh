#!/usr/bin/env bash
# Create .venv (if needed) and install hixl with its test extras, building the
# native extension. Safe to run again: it only reinstalls hixl itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
