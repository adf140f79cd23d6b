"""Peers measured in the same run: Mooncake Transfer Engine (TCP) and NIXL (UCX over TCP).

Each peer runs as two processes of ``peer_worker.py`` (a target that
registers its memory and an initiator that moves the bytes), on the same
block sizes and batch shapes as hixl's rows, one request in flight. A peer
that is not installed (its package does not import in the chosen
interpreter) is reported as skipped, never faked.
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


def _failed(peer: Peer, case: Case, status: str) -> Row:
    return Row(PEER, peer.name, case.suite, case.op, case.path, case.block, case.nblocks,
               status=status)


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


async def _spawn(python: str, peer: Peer, role: str, cold: int) -> spawn.Child:
    return await spawn.start([python, "-u", _WORKER, role, peer.engine, str(cold)],
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


async def _measure(python: str, peer: Peer, cases: list[Case], cold: int, budget: Budget,
                   progress: Callable[[Row], None]) -> list[Row]:
    rows: list[Row] = []
    per_case = 3 * budget.seconds + 20
    target = await _spawn(python, peer, "target", cold)
    initiator: spawn.Child | None = None
    try:
        ready = await _read_json(target, 120)
        if "info" not in ready:
            raise RuntimeError(ready.get("error", f"unexpected {ready}"))
        initiator = await _spawn(python, peer, "initiator", cold)
        spec = {"info": ready["info"], "cases": [[c.op, c.block, c.nblocks] for c in cases],
                "budget": {"seconds": budget.seconds, "min_requests": budget.min_requests,
                           "max_requests": budget.max_requests, "warmup": budget.warmup}}
        await initiator.write_and_close_stdin(json.dumps(spec).encode())
        for case in cases:
            record = await _read_json(initiator, per_case + 120)
            row = Row(PEER, peer.name, case.suite, case.op, case.path, case.block, case.nblocks)
            if "latencies" in record:
                row.fill(Timing(record["latencies"], record["wall_s"]), case.request_bytes)
            else:
                row.status = f"error: {record.get('error', record)}"
            progress(row)
            rows.append(row)
            if "case" not in record:  # the worker failed as a whole
                break
    finally:
        if initiator is not None:
            await _stop(initiator)
        await _stop(target)
    return rows


async def missing(names: list[str], pythons: dict[str, str]) -> dict[str, str]:
    """Why each peer of ``names`` that does not import cannot run; installed ones are absent.

    Checked before the run, so that its row count (one skipped row for a
    missing peer, one per case for an installed one) is known up front.
    """
    reasons = {}
    for name in names:
        reason = await _check_import(pythons.get(name, sys.executable), PEERS[name].module)
        if reason is not None:
            reasons[name] = reason
    return reasons


async def peer_rows(names: list[str], cases: list[Case], cold: int, budget: Budget,
                    pythons: dict[str, str], progress: Callable[[Row], None],
                    absent: dict[str, str]) -> list[Row]:
    """Rows of every peer in ``names`` for ``cases``; one skipped row for a peer not installed.

    Args:
        names: keys of :data:`PEERS` to try.
        cases: the shapes and operations to run (path ``tcp``, one in flight).
        cold: bytes of registered memory on each side, rotated through.
        budget: per case.
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
        try:
            rows += await _measure(python, peer, cases, cold, budget, progress)
        except Exception as exc:  # a broken peer must not lose the run's other rows
            # The cases it did not reach are errors: the peer is installed but broke.
            done = {(r.name, r.op, r.block, r.nblocks) for r in rows}
            for case in cases:
                if (peer.name, case.op, case.block, case.nblocks) not in done:
                    rows.append(_failed(peer, case, f"error: {type(exc).__name__}: {exc}"))
                    progress(rows[-1])
    return rows
