"""hixl_bench.calls: Python calls per request, counted in the client and both daemons."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


def _calls(output: str, process: str) -> float:
    found = re.search(rf"^{re.escape(process)}: ([0-9.]+) Python calls per request$", output,
                      re.MULTILINE)
    assert found, output
    return float(found.group(1))


def _switches(output: str, process: str) -> tuple[float, float, float]:
    found = re.search(rf"^{re.escape(process)}: ([0-9.]+) context switches per request "
                      r"\(([0-9.]+) voluntary\), ([0-9.]+) us of CPU$", output, re.MULTILINE)
    assert found, output
    return float(found.group(1)), float(found.group(2)), float(found.group(3))


@pytest.mark.parametrize(("op", "path"), [("pull", "tcp"), ("blocks", "local")])
def test_every_process_reports_its_calls_per_request(op: str, path: str) -> None:
    done = subprocess.run([sys.executable, "-m", "hixl_bench.calls", "--op", op, "--path", path,
                           "--requests", "400", "--top", "3"],
                          capture_output=True, text=True, timeout=120, check=True)
    out = done.stdout
    # every request costs the client Python work, and the counts are per
    # request: far fewer than the requests made
    assert 10 < _calls(out, "client") < 1000
    if op == "pull" and path == "tcp":
        # Repeats over TCP run on daemon A's native lane: its Python only
        # counts them afterwards, in batches.
        assert _calls(out, "daemon A (initiator)") < 20
    else:
        assert 10 < _calls(out, "daemon A (initiator)") < 1000
    if path == "tcp":
        # The target's data server is native: repeats cost it no Python. What it
        # shows is its timers' work in the window (lease checks, the status
        # line), spread over the requests: well under one call each.
        assert _calls(out, "daemon B (target)") < 1
    else:
        assert "daemon B" not in out
    # Each process spends some CPU on every request. (Waiting threads spin and
    # yield before they sleep, so how often each sleeps depends on the host.)
    processes = ["client", "daemon A (initiator)"] + (["daemon B (target)"] if path == "tcp" else [])
    for process in processes:
        switches, voluntary, cpu_us = _switches(out, process)
        assert 0 <= voluntary <= switches < 100, out
        assert 0 < cpu_us < 100_000, out
