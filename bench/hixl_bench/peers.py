"""Peers measured in the same run: Mooncake Transfer Engine (TCP) and NIXL (UCX over TCP).

Each peer runs as two processes of ``peer_worker.py`` (a target that
registers its memory and an initiator that moves the bytes), on the same
block sizes and batch shapes as hixl's rows, and on the serving pattern
(``serve_peers``: the same KV layouts and block tables as hixl's serving
rows), one request in flight. A peer that is not installed (its package
does not import in the chosen interpreter) is reported as skipped, never
faked.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hixl_bench import spawn
from hixl_bench.model import PEER, Budget, Case, Row, Timing
from hixl_bench.serve_peers import CHECKED_PULLS, ServeJob, fill_serve_row, region_bytes

_WORKER = str(Path(__file__).with_name("peer_worker.py"))


@dataclass(frozen=True)
class Peer:
    """A peer engine: its row name, the module that must import, its environment."""

    name: str
    engine: str
    module: str
    env: dict[str, str] = field(default_factory=dict)


PEERS = {
    "mooncake": Peer("mooncake-tcp", "mooncake", "mooncake.engine"),
    # UCX's default on one host is shared memory (CMA); TCP is the like-for-like path.
    "nixl": Peer("nixl-ucx-tcp", "nixl", "nixl._api", {"UCX_TLS": "tcp"}),
}


@dataclass(frozen=True)
class Work:
    """What one peer run measures: sweep cases, then serving jobs."""

    cases: list[Case]
    serve_jobs: list[ServeJob]
    cold: int
    budget: Budget
    serve_budget: Budget

    def __len__(self) -> int:
        return len(self.cases) + len(self.serve_jobs)

    def empty_rows(self, peer: Peer) -> list[Row]:
        """A row per item, in the order the worker reports them."""
        return [Row(PEER, peer.name, c.suite, c.op, c.path, c.block, c.nblocks)
                for c in self.cases] + [job.row(peer.name, self.cold)
                                        for job in self.serve_jobs]

    def region(self) -> int:
        """The memory each side registers: the cases' rotation and every job's cache."""
        return max(self.cold, region_bytes(self.serve_jobs))


def _budget(budget: Budget) -> dict[str, Any]:
    return {"seconds": budget.seconds, "min_requests": budget.min_requests,
            "max_requests": budget.max_requests, "warmup": budget.warmup}


async def _check_import(python: str, module: str) -> str | None:
    """None if ``module`` imports under ``python``, else the reason it does not."""
    try:
        proc = await spawn.start([python, "-c", f"import {module}"], stderr=spawn.PIPE)
    except OSError as exc:
        return f"cannot run {python}: {exc}"
    _, err = await proc.communicate(120)
    if proc.returncode == 0:
        return None
    lines = err.decode(errors="replace").strip().splitlines()
    return f"not installed ({lines[-1] if lines else 'import failed'})"


async def _spawn(python: str, peer: Peer, role: str, region: int,
                 *more: str) -> spawn.Child:
    return await spawn.start([python, "-u", _WORKER, role, peer.engine, str(region), *more],
                             stdin=spawn.PIPE, stdout=spawn.PIPE,
                             env={**os.environ, **peer.env})


async def _read_json(proc: spawn.Child, timeout: float) -> dict[str, Any]:
    while True:
        line = await proc.readline(timeout)
        if not line:
            raise RuntimeError(f"the worker exited (code {await proc.wait(10)})")
        with contextlib.suppress(json.JSONDecodeError):
            record = json.loads(line)
            if isinstance(record, dict):
                return record


async def _stop(proc: spawn.Child) -> None:
    stdin = proc.popen.stdin
    if stdin is not None and not stdin.closed:
        stdin.close()
    await proc.wait(10)  # killed if it does not end by then
    if proc.popen.stdout is not None:
        proc.popen.stdout.close()


# Start-up of the target: its interpreter, the engine, registration and the
# fill of its region (the pattern is written at this rate or faster).
_START_S = 120
_FILL_BYTES_PER_S = 50e6
# Beside its time budget, an item may take this long per byte of each
# untimed or minimum request (serving jobs check pulls byte-exact too):
# their largest requests move gigabytes.
_SLOWEST_BYTES_PER_S = 100e6


def _item_timeout(budget: Budget, request_bytes: int) -> float:
    pulls = CHECKED_PULLS + max(1, budget.warmup) + budget.min_requests
    return 3 * budget.seconds + 20 + _START_S + pulls * request_bytes / _SLOWEST_BYTES_PER_S


async def _measure(python: str, peer: Peer, work: Work, rows: list[Row],
                   progress: Callable[[Row], None]) -> None:
    """Append the peer's rows of ``work`` to ``rows``; raises if the peer breaks first."""
    region = work.region()
    target = await _spawn(python, peer, "target", region,
                          "pattern" if work.serve_jobs else "flat")
    initiator: spawn.Child | None = None
    try:
        ready = await _read_json(target, _START_S + region / _FILL_BYTES_PER_S)
        if "info" not in ready:
            raise RuntimeError(ready.get("error", f"unexpected {ready}"))
        initiator = await _spawn(python, peer, "initiator", region)
        spec = {"info": ready["info"], "cold": work.cold,
                "cases": [[c.op, c.block, c.nblocks] for c in work.cases],
                "budget": _budget(work.budget),
                "serve": [job.spec() for job in work.serve_jobs],
                "serve_budget": _budget(work.serve_budget)}
        await initiator.write_and_close_stdin(json.dumps(spec).encode())
        sizes = [c.request_bytes for c in work.cases] + \
            [job.case.request_bytes for job in work.serve_jobs]
        budgets = [work.budget] * len(work.cases) + [work.serve_budget] * len(work.serve_jobs)
        for row, request_bytes, budget in zip(work.empty_rows(peer), sizes, budgets,
                                              strict=True):
            record = await _read_json(initiator, _item_timeout(budget, request_bytes))
            if "case" not in record and "serve" not in record:  # the worker failed as a whole
                raise RuntimeError(record.get("error", f"unexpected {record}"))
            if "latencies" in record:
                row.fill(Timing(record["latencies"], record["wall_s"]), request_bytes)
                if "serve" in record:
                    fill_serve_row(row, record)
            else:
                row.status = f"error: {record.get('error', record)}"
            progress(row)
            rows.append(row)
    finally:
        if initiator is not None:
            await _stop(initiator)
        await _stop(target)


async def missing(names: list[str], pythons: dict[str, str],
                  serving: bool = False) -> dict[str, str]:
    """Why each peer of ``names`` that does not import cannot run; installed ones are absent.

    Checked before the run, so that its row count (one skipped row for a
    missing peer, one per case for an installed one) is known up front.
    ``serving``: the run has serving jobs, whose worker needs numpy too.
    """
    reasons = {}
    for name in names:
        modules = PEERS[name].module + (", numpy" if serving else "")
        reason = await _check_import(pythons.get(name, sys.executable), modules)
        if reason is not None:
            reasons[name] = reason
    return reasons


async def peer_rows(names: list[str], work: Work, pythons: dict[str, str],
                    progress: Callable[[Row], None], absent: dict[str, str]) -> list[Row]:
    """Rows of every peer in ``names`` for ``work``; one skipped row for a peer not installed.

    Args:
        names: keys of :data:`PEERS` to try.
        work: the cases (path ``tcp``) and serving jobs, one request in flight.
        pythons: an interpreter per peer name (default: this one).
        progress: called with each row as it completes.
        absent: :func:`missing`'s answer for ``names``.
    """
    rows: list[Row] = []
    for name in names:
        peer = PEERS[name]
        python = pythons.get(name, sys.executable)
        reason = absent.get(name)
        if reason is not None:  # one row says so; no per-case rows are invented
            rows.append(Row(PEER, peer.name, "peer", "-", "tcp", status=f"skipped: {reason}"))
            progress(rows[-1])
            continue
        measured: list[Row] = []
        try:
            await _measure(python, peer, work, measured, progress)
        except Exception as exc:  # a broken peer must not lose the run's other rows
            # The items it did not reach are errors: the peer is installed but broke.
            for row in work.empty_rows(peer)[len(measured):]:
                row.status = f"error: {type(exc).__name__}: {exc}"
                measured.append(row)
                progress(row)
        rows += measured
    return rows
