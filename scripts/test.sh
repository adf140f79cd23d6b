#!/usr/bin/env bash
# The test command: install, then run every test (unit, native, integration).
#
# The async tests run on the event loop that HIXL_TEST_LOOP selects (uvloop,
# the daemon's default, unless it is set; see tests/conftest.py). grpc.aio
# binds to one loop per process, so the other kind needs a second pytest
# process: after the whole suite passes on uvloop, the async tests of the
# client-side packages and the in-process engines (tests/integration,
# tests/wire, tests/client, tests/service, the in-process daemons of
# tests/integration/engine among them) run
# again on asyncio's default loop, but those marked one_loop (link health
# and scale, partitions: their subject is the daemons, whose loop is
# uvloop either way).
#
# That second run happens only for the full run (no arguments, HIXL_TEST_LOOP
# unset): arguments select a subset or change pytest's behaviour, and repeating
# a fixed set of tests after them would be surprising, so with arguments only
# the first run happens (a note says so). To run a subset on asyncio's loop:
#   HIXL_TEST_LOOP=asyncio bash scripts/test.sh -k pull
# A failure in either run makes the script exit non-zero, and pytest's summary
# is always the last output.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PYTEST=(.venv/bin/python -m pytest -q)
if [ "$#" -gt 0 ] || [ -n "${HIXL_TEST_LOOP:-}" ]; then
  echo "scripts/test.sh: one run, on ${HIXL_TEST_LOOP:-uvloop}" \
       "(arguments or HIXL_TEST_LOOP given; the full run also repeats the async tests on asyncio)"
  exec "${PYTEST[@]}" "$@"
fi
echo "scripts/test.sh: run 1 of 2: the whole suite on uvloop"
HIXL_TEST_LOOP=uvloop "${PYTEST[@]}"
echo "scripts/test.sh: run 2 of 2: the async client-side tests on asyncio's default loop"
HIXL_TEST_LOOP=asyncio exec "${PYTEST[@]}" -m "asyncio and not one_loop" \
  tests/integration tests/wire tests/client tests/service tests/test_loop_kind.py
