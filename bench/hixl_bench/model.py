"""What a benchmark run is made of: cases, result rows, statistics and the timing loops."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30

# Result kinds, in the order the table shows them.
CEILING, HIXL, PEER, PROBE = "ceiling", "hixl", "peer", "probe"
OK = "ok"

# A row with several requests in flight compares with a ceiling moving all of
# their bytes at once (one request of that many blocks), up to this size:
# larger requests add nothing to the ceiling's GB/s here.
CONC_CEILING_MAX_BYTES = 64 * MIB


def ceiling_shape(block: int, nblocks: int, conc: int = 1) -> tuple[int, int]:
    """The (block, nblocks) of the ceiling that matches ``conc`` requests of
    ``nblocks`` blocks of ``block`` bytes in flight: the same bytes, at once."""
    if conc <= 1:
        return (block, nblocks)
    cap = max(nblocks, CONC_CEILING_MAX_BYTES // block)
    return (block, min(nblocks * conc, cap))


@dataclass(frozen=True)
class Case:
    """One point of a sweep: ``nblocks`` blocks of ``block`` bytes per request.

    Attributes:
        suite: which sweep it belongs to (``block``, ``batch``, ``conc``).
        op: ``pull`` (read from the target) or ``push`` (write to it).
        path: ``local`` (two clusters in one daemon) or ``tcp`` (two daemons).
        block: bytes per block.
        nblocks: blocks per request.
        conc: requests in flight at once.
    """

    suite: str
    op: str
    path: str
    block: int
    nblocks: int
    conc: int = 1

    @property
    def request_bytes(self) -> int:
        return self.block * self.nblocks

    @property
    def shape_key(self) -> tuple[int, int]:
        return (self.block, self.nblocks)

    @property
    def ceiling_key(self) -> tuple[int, int]:
        """The ceilings' shape for this case (see :func:`ceiling_shape`)."""
        return ceiling_shape(self.block, self.nblocks, self.conc)


@dataclass
class Timing:
    """Latencies of the measured requests and the wall time they took together.

    ``paced`` holds the latencies of requests interleaved with them (see
    :func:`drive`), whose time is not in ``wall_s``.
    """

    latencies: list[float]
    wall_s: float
    paced: list[float] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.latencies)


@dataclass
class Row:
    """One line of the table and of the JSON output."""

    kind: str
    name: str
    suite: str
    op: str
    path: str
    block: int = 0
    nblocks: int = 0
    conc: int = 1
    status: str = OK
    requests: int = 0
    gbps: float | None = None
    rps: float | None = None
    p50_us: float | None = None
    p99_us: float | None = None
    client_us: float | None = None
    control_us: float | None = None
    data_us: float | None = None
    ratio: float | None = None
    ratio_to: str | None = None
    rtt_ratio: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == OK

    def fill(self, timing: Timing, request_bytes: int) -> Row:
        """Set the throughput and latency columns from ``timing``."""
        self.requests = timing.count
        if timing.count and timing.wall_s > 0:
            if request_bytes:
                self.gbps = request_bytes * timing.count / timing.wall_s / 1e9
            self.rps = timing.count / timing.wall_s
            self.p50_us = percentile(timing.latencies, 50) * 1e6
            self.p99_us = percentile(timing.latencies, 99) * 1e6
        return self

    def to_json(self) -> dict[str, Any]:
        record = {name: getattr(self, name) for name in JSON_KEYS}
        record.update(self.extra)
        return record


JSON_KEYS = ("kind", "name", "suite", "op", "path", "block", "nblocks", "conc", "status",
             "requests", "gbps", "rps", "p50_us", "p99_us", "client_us", "control_us",
             "data_us", "ratio", "ratio_to", "rtt_ratio")


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (p50 is the median's lower neighbour on even counts)."""
    if not values:
        return math.nan
    if pct == 50:
        return statistics.median(values)
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Budget:
    """How long each row runs: a time budget bounded by request counts."""

    seconds: float
    min_requests: int
    max_requests: int
    warmup: int

    def scaled(self, factor: float) -> Budget:
        return Budget(self.seconds * factor, self.min_requests, self.max_requests, self.warmup)


# When a row interleaves a reference request (drive's `beside`): the row's
# requests per slice, and the reference calls between two slices. Slices are
# long so that few of the row's requests follow right after gRPC calls, whose
# threads may still be busy. (Slices of 8 requests were used up to run 8 of
# bench/RESULTS.md; paired runs of both at run 9's commit differed by no more
# than the noise.)
INTERLEAVE_SLICE = 64
BESIDE_PER_SLICE = 8


async def drive(request: Callable[[int], Awaitable[None]], conc: int, budget: Budget,
                beside: Callable[[int], Awaitable[None]] | None = None) -> Timing:
    """Run ``request(i)`` with ``conc`` in flight until the budget is spent.

    Every request gets a distinct index (callers rotate buffers with it). The
    warm-up requests run first, ``conc`` at a time, and are not timed.

    With ``beside`` (one in flight only), slices of ``INTERLEAVE_SLICE``
    requests alternate with ``BESIDE_PER_SLICE`` ``beside`` calls, timed into
    ``Timing.paced``: a reference measured under the same load as the row,
    on a host whose load drifts within seconds. Their time is left out of
    ``wall_s``, and they do not count against the budget's request bounds.
    """
    if beside is not None and conc == 1:
        return await _drive_beside(request, beside, budget)
    counter = 0

    def next_index() -> int:
        nonlocal counter
        counter += 1
        return counter - 1

    for _ in range(max(1, budget.warmup // conc)):
        await asyncio.gather(*(request(next_index()) for _ in range(conc)))
    latencies: list[float] = []
    started = time.perf_counter()
    deadline = started + budget.seconds

    async def worker() -> None:
        while len(latencies) < budget.max_requests and (
                time.perf_counter() < deadline or len(latencies) < budget.min_requests):
            index = next_index()
            t0 = time.perf_counter()
            await request(index)
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker() for _ in range(conc)))
    return Timing(latencies, time.perf_counter() - started)


def drive_sync(run: Callable[[int], list[float]], budget: Budget) -> Timing:
    """Time a native ceiling: ``run(n)`` performs n requests and returns their durations.

    One warm-up call sizes the measured batch to fill the time budget.
    """
    warm = run(max(1, budget.warmup))
    estimate = max(statistics.median(warm), 1e-7)
    wanted = int(budget.seconds / estimate)
    iters = min(budget.max_requests, max(budget.min_requests, wanted))
    latencies: list[float] = []
    started = time.perf_counter()
    while len(latencies) < iters:
        # Batches keep a slow first guess from overrunning the budget much.
        latencies += run(min(iters - len(latencies), max(1, iters // 4)))
        if time.perf_counter() - started > 2 * budget.seconds + 0.5:
            break
    return Timing(latencies, sum(latencies))


async def _drive_beside(request: Callable[[int], Awaitable[None]],
                        beside: Callable[[int], Awaitable[None]], budget: Budget) -> Timing:
    for index in range(max(1, budget.warmup)):
        await request(index)
        await beside(index)
    latencies: list[float] = []
    paced: list[float] = []
    index, wall = budget.warmup, 0.0
    deadline = time.perf_counter() + budget.seconds
    while len(latencies) < budget.max_requests and (
            time.perf_counter() < deadline or len(latencies) < budget.min_requests):
        started = time.perf_counter()
        for _ in range(INTERLEAVE_SLICE):
            t0 = time.perf_counter()
            await request(index)
            latencies.append(time.perf_counter() - t0)
            index += 1
        wall += time.perf_counter() - started
        for _ in range(BESIDE_PER_SLICE):
            t0 = time.perf_counter()
            await beside(index)
            paced.append(time.perf_counter() - t0)
    return Timing(latencies, wall, paced)
