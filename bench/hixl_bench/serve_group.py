"""The serving suite's cases measured side by side: rows that are compared
with each other run in alternating slices.

The targets of the suite compare rows with each other: the blocking facade
with the async client, engine-allocated memory with shareable memory, each
with the raw TCP ceiling of its shape, and the small request with a
repeated 4 KiB pull. Run one after the other, two such rows see different
minutes of a shared host, whose load moves their ratio by more than the
10% a target allows. So the cases of one shape and concurrency (a *group*:
the same prompt, every memory and client measured) and the ceilings of that
shape are all opened first, then timed in ``ROUNDS`` rounds, each member
taking a slice of its budget per round, in an order that reverses every
round, a compared row timing at least ``PAIRED_MIN_REQUESTS`` requests
in all; a member's row pools its slices. The small async rows also
interleave the 4 KiB reference pull with their own requests
(``ref_4k_p50_us``).

A member that cannot open (memory its host refuses) or fails is reported in
its row's status; the others go on.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from dataclasses import asdict
from typing import Any, Protocol

from hixl_bench import spawn
from hixl_bench.ceilings import NativeCeilings
from hixl_bench.env import Clusters, Daemons, options
from hixl_bench.model import MIB, Budget, Row, Timing, drive, percentile
from hixl_bench.plan import ServeCase
from hixl_bench.runner import Pull
from hixl_bench.serve import (
    AFTER,
    BEFORE,
    ROTATIONS,
    Prefill,
    Reference,
    Side,
    Unsupported,
    case_spec,
    open_side,
    row_of,
    side_tables,
    verify,
    verify_pairs,
    worker_pool,
)

ROUNDS = 4
# Rows a target compares time at least this many requests each: a p50 of
# fewer moves by more than the 10% a target allows on this host.
PAIRED_MIN_REQUESTS = 48
# Async rows of one request in flight up to this size interleave the 4 KiB
# reference pull (drive's slices of 64 requests stay short).
REF_BESIDE_MAX_BYTES = 2 * MIB
# The facade's process: start-up (imports, init, link) and its fills take a
# while beside the row's own time.
WORKER_START_S = 120
WORKER_CLOSE_S = 60
# The last lines of the worker's stderr (its traceback) that a failed row shows.
WORKER_ERROR_LINES = 12


def group_key(case: ServeCase) -> tuple[Any, ...]:
    """Cases that are compared with each other: one prompt shape, one concurrency."""
    return (case.model.name, case.dtype, case.tokens, case.block_tokens, case.conc)


def groups(cases: tuple[ServeCase, ...]) -> list[list[tuple[int, ServeCase]]]:
    """The plan's cases (with their plan index) by ``group_key``, in plan order."""
    found: dict[tuple[Any, ...], list[tuple[int, ServeCase]]] = {}
    for index, case in enumerate(cases):
        found.setdefault(group_key(case), []).append((index, case))
    return list(found.values())


def facade_pools(group: list[ServeCase]) -> int:
    """The facade clusters' pools a group holds at once on the decode daemon."""
    return sum(worker_pool(c) for c in group if c.client == "sync")


class Member(Protocol):
    """One row of a group, timed a slice at a time (its row filled by the group)."""

    row: Row
    request_bytes: int

    async def slice(self, budget: Budget) -> Timing: ...


def merge(timings: list[Timing]) -> Timing:
    return Timing([t for timing in timings for t in timing.latencies],
                  sum(t.wall_s for t in timings),
                  [t for timing in timings for t in timing.paced])


def sliced(budget: Budget, rounds: int, at_least: int = 0) -> Budget:
    """One round's part of a row's budget, enough for ``at_least`` requests over
    the rounds."""
    return Budget(budget.seconds / rounds,
                  -(-max(budget.min_requests, at_least) // rounds),
                  -(-max(budget.max_requests, at_least) // rounds), budget.warmup)


async def take_turns(members: list[Member], budget: Budget, rounds: int = ROUNDS,
                     at_least: int = 0) -> dict[int, Timing]:
    """Time every member in ``rounds`` rounds of slices, the order reversing each
    round, each member timing ``at_least`` requests or more in all. A member
    whose slice fails gets the error in its row's status and leaves the
    rotation. Returns each timed member's pooled timing, by its position in
    ``members``."""
    part = sliced(budget, rounds, at_least)
    timings: dict[int, list[Timing]] = {i: [] for i in range(len(members))}
    for turn in range(rounds):
        order = list(timings) if turn % 2 == 0 else list(reversed(timings))
        for i in order:
            if i not in timings:
                continue
            try:
                timings[i].append(await members[i].slice(part))
            except Exception as exc:  # reported in the row; the group goes on
                members[i].row.status = f"error: {type(exc).__name__}: {exc}"
                del timings[i]
    return {i: merge(parts) for i, parts in timings.items()}


class AsyncDecode:
    """The decode side on the async client, in this process."""

    def __init__(self, env: Clusters, case: ServeCase, index: int, prefill: Prefill,
                 row: Row, reference: Pull | None) -> None:
        self.env, self.case, self.prefill, self.row = env, case, prefill, row
        self.request_bytes = case.request_bytes
        self.src, self.dst = side_tables(case, index)
        self.reference = reference
        self.side: Side | None = None
        self.free_slots = list(range(case.conc))
        self.verified = 0

    async def open(self) -> None:
        self.side = await open_side(self.env.cm, self.case, None)
        self.verified += await verify(self.env.cm, self.case, self.prefill.key, self.side,
                                      verify_pairs(self.src, self.dst, BEFORE))

    async def request(self, i: int) -> None:
        assert self.side is not None
        slot = self.free_slots.pop()
        layers = range(self.case.model.layers)
        try:
            rotation = i % ROTATIONS
            await self.env.cm.pull_blocks(self.prefill.key, self.side.cache,
                                          self.src[slot][rotation], self.dst[slot][rotation],
                                          src_layer_range=layers, dst_layer_range=layers)
        finally:
            self.free_slots.append(slot)

    async def slice(self, budget: Budget) -> Timing:
        beside = self.reference.request if self.reference is not None else None
        return await drive(self.request, self.case.conc, budget, beside)

    async def close(self) -> None:
        if self.side is None:
            return
        try:
            if self.row.ok:
                self.verified += await verify(self.env.cm, self.case, self.prefill.key,
                                              self.side, verify_pairs(self.src, self.dst, AFTER))
                self.row.extra["verified_pulls"] = self.verified
        finally:
            await self.side.release()


class FacadeDecode:
    """The decode side on the blocking facade: ``serve_worker`` in a process of
    its own (grpc.aio serves one event loop per process), driven a slice at a
    time over its stdin and stdout (one JSON line each way)."""

    def __init__(self, spec: dict[str, Any], row: Row, request_bytes: int) -> None:
        self.spec, self.row, self.request_bytes = spec, row, request_bytes
        self.child: spawn.Child | None = None
        self.stderr = tempfile.TemporaryFile()

    async def open(self) -> None:
        """Start the worker; it registers, links and checks its first pulls.
        Raises Unsupported when its memory is refused there."""
        command = [sys.executable, "-X", "faulthandler", "-m", "hixl_bench.serve_worker",
                   json.dumps(self.spec)]
        self.child = await spawn.start(command, stdin=spawn.PIPE, stdout=spawn.PIPE,
                                       stderr=self.stderr.fileno())
        record = await self._answer(WORKER_START_S)
        if "skipped" in record:
            raise Unsupported(record["skipped"])
        if not record.get("ready"):
            raise RuntimeError(self._error(record))

    async def slice(self, budget: Budget) -> Timing:
        record = await self._ask({"slice": asdict(budget)}, 3 * budget.seconds + 30)
        if "latencies" not in record:
            raise RuntimeError(self._error(record))
        return Timing(record["latencies"], record["wall_s"])

    async def close(self) -> None:
        try:
            if self.child is not None and self.child.returncode is None:
                record = await self._ask({"close": True}, WORKER_CLOSE_S)
                if "verified_pulls" in record:
                    self.row.extra["verified_pulls"] = record["verified_pulls"]
                elif self.row.ok:
                    self.row.status = f"error: {self._error(record)}"
        finally:
            if self.child is not None:
                await self.child.terminate()
                for pipe in (self.child.popen.stdin, self.child.popen.stdout):
                    if pipe is not None:
                        pipe.close()
            self.stderr.close()

    async def _ask(self, command: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.child is not None and self.child.popen.stdin is not None
        stdin = self.child.popen.stdin

        def write() -> None:
            stdin.write(json.dumps(command).encode() + b"\n")
            stdin.flush()

        await asyncio.to_thread(write)
        return await self._answer(timeout)

    async def _answer(self, timeout: float) -> dict[str, Any]:
        assert self.child is not None
        try:
            line = await self.child.readline(timeout)
        except TimeoutError:
            await self.child.kill()
            return {"error": f"the facade's worker did not answer within {timeout:.0f} s"}
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            code = await self.child.wait(10)
            return {"error": f"the facade's worker exited ({code})"}
        return record

    def _error(self, record: dict[str, Any]) -> str:
        self.stderr.seek(0)
        tail = " | ".join(self.stderr.read().decode(errors="replace").strip()
                          .splitlines()[-WORKER_ERROR_LINES:])
        error = str(record.get("error", record))
        return f"{error} ({tail})" if tail else error


def facade_spec(pair: Daemons, env: Clusters, case: ServeCase, index: int, prefill: Prefill,
                cluster_id: int) -> dict[str, Any]:
    return {"daemon": pair.a.client_target, "cluster_id": cluster_id,
            "options": options(worker_pool(case)),
            "prefill": {"cluster_id": env.target_id("tcp"), "peer": pair.b.peer_address,
                        "model_id": prefill.model_id},
            "case": case_spec(case), "index": index}


def _wants_reference(case: ServeCase) -> bool:
    return case.client == "async" and case.conc == 1 and \
        case.request_bytes <= REF_BESIDE_MAX_BYTES


async def serve_group(pair: Daemons, env: Clusters, native: NativeCeilings,
                      group: list[tuple[int, ServeCase]], cold_bytes: int, budget: Budget,
                      facade_id: int) -> list[Row]:
    """Measure one group (see the module docstring): its ceilings' rows, then
    its cases' rows in plan order. Facade clusters take ids from ``facade_id``."""
    rows = [row_of(case, index, cold_bytes) for index, case in group]
    ceilings = native.pending(group[0][1].ceiling_shape(cold_bytes), {"tcp"})
    members: list[Member] = list(ceilings)
    prefills: dict[str, Prefill | Exception] = {}
    opened: list[AsyncDecode | FacadeDecode] = []
    reference = Reference(env)
    try:
        for (index, case), row in zip(group, rows, strict=True):
            decode = await _open_member(pair, env, case, index, row, prefills, reference,
                                        facade_id + len(opened))
            if decode is not None:
                opened.append(decode)
                members.append(decode)
        paired = len(opened) > 1
        timed_parts = await take_turns(members, budget,
                                       at_least=PAIRED_MIN_REQUESTS if paired else 0)
        for i, timing in timed_parts.items():
            timed = members[i]
            timed.row.fill(timing, timed.request_bytes)
            if timing.paced:
                timed.row.extra["ref_4k_p50_us"] = percentile(timing.paced, 50) * 1e6
    finally:
        for decode in opened:
            try:
                await decode.close()
            except Exception as exc:
                decode.row.status = f"error: {type(exc).__name__}: {exc}"
        await reference.close()
        for prefill in prefills.values():
            if isinstance(prefill, Prefill):
                await prefill.close()
    return [c.row for c in ceilings] + rows


async def _open_member(pair: Daemons, env: Clusters, case: ServeCase, index: int, row: Row,
                       prefills: dict[str, Prefill | Exception], reference: Reference,
                       facade_id: int) -> AsyncDecode | FacadeDecode | None:
    """Open one case's decode side (and its memory's prefill side, once per
    group); None with the row's status set when it cannot run."""
    try:
        prefill = prefills.get(case.memory)
        if prefill is None:
            prefill = Prefill(env, case, model_id=index + 1)
            prefills[case.memory] = prefill
            try:
                await prefill.open()
            except Exception as exc:
                prefills[case.memory] = exc
                raise
        elif isinstance(prefill, Exception):
            raise prefill
        member: AsyncDecode | FacadeDecode
        if case.client == "async":
            beside = await reference.pull() if _wants_reference(case) else None
            member = AsyncDecode(env, case, index, prefill, row, beside)
        else:
            member = FacadeDecode(facade_spec(pair, env, case, index, prefill, facade_id), row,
                                  case.request_bytes)
        try:
            await member.open()
        except BaseException:
            await member.close()
            raise
        return member
    except Unsupported as exc:
        row.status = f"skipped: {exc}"
    except Exception as exc:  # reported in the row; the group goes on
        row.status = f"error: {type(exc).__name__}: {exc}"
    return None
