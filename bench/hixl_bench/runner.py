"""hixl rows of the block, batch and concurrency sweeps: one small adapter per operation.

A request of ``nblocks`` blocks of ``block`` bytes is one call moving one batch
slot of a continuous cache of ``nblocks`` tensors shaped ``[slots, block]``
(uint8) between the initiator and a target cluster: the blocks of one request
are ``slots * block`` bytes apart in both caches, so the daemon moves
``nblocks`` separate ranges. Successive requests take successive slots, so
source and destination rotate through about ``cold_bytes`` each, as the
ceilings do.

* ``pull``: ``pull_cache(CacheKeyByIdAndIndex(target, src, slot), dst,
  batch_index=slot)`` (by id, which never drops the source);
* ``push``: ``push_cache(CacheKeyByIdAndIndex(target, dst, slot), src,
  src_batch_index=slot, tensor_num_per_layer=1)``, reported as skipped when
  this build's CacheManager has no ``push_cache``.
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from hixl_bench.env import Clusters, Daemons, clusters, slot_desc, slots_for, supports
from hixl_bench.model import HIXL, MIB, PROBE, Budget, Case, Row, Timing, drive
from hixl_client import (
    Cache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    DataType,
    TransferTiming,
    capture_timings,
)

NOOP, TINY, KEYED = "hixl-noop", "hixl-tiny", "hixl-keyed"
# Keyed caches bound ahead of the keyed probe's pulls, per refill, in pools
# of their own clusters (ids offset from the sweep's).
KEYED_BATCH = 256
KEYED_POOL_BYTES = 48 * MIB
KEYED_ID_BASE = 100
# Rows up to this many bytes per request, one in flight, interleave the bare
# gRPC call with their requests: their p50/rtt compares latencies under one load.
RTT_BESIDE_BYTES = MIB
Ping = Callable[[int], Awaitable[None]]


@dataclass
class Caches:
    """The initiator's cache and the target's cache of one case."""

    local: Cache
    remote: Cache
    slots: int


class Operation:
    """How one request of a case is issued; subclasses are the operations."""

    name = ""
    method = ""

    def __init__(self, env: Clusters, path: str, caches: Caches) -> None:
        self.env, self.path, self.caches = env, path, caches
        self.target = env.target_id(path)

    async def request(self, index: int) -> None:
        raise NotImplementedError


class Pull(Operation):
    name, method = "pull", "pull_cache"

    async def request(self, index: int) -> None:
        slot = index % self.caches.slots
        key = CacheKeyByIdAndIndex(self.target, self.caches.remote.cache_id, slot)
        await self.env.cm.pull_cache(key, self.caches.local, batch_index=slot)


class Push(Operation):
    name, method = "push", "push_cache"

    async def request(self, index: int) -> None:
        slot = index % self.caches.slots
        key = CacheKeyByIdAndIndex(self.target, self.caches.remote.cache_id, slot)
        push = getattr(self.env.cm, self.method)
        await push(key, self.caches.local, src_batch_index=slot, tensor_num_per_layer=1)


OPERATIONS: dict[str, type[Operation]] = {"pull": Pull, "push": Push}


def unavailable(env: Clusters, op: str) -> str | None:
    """Why ``op`` cannot run in this build, or None."""
    method = OPERATIONS[op].method
    if not supports(env.cm, method):
        return f"skipped: {method} not available in this build"
    return None


async def _allocate(env: Clusters, path: str, desc: CacheDesc) -> Caches:
    local = await env.cm.allocate_cache(desc)
    try:
        remote = await env.target_cm(path).allocate_cache(desc)
    except BaseException:
        await env.cm.deallocate_cache(local)
        raise
    return Caches(local, remote, desc.shape[0])


async def _free(env: Clusters, path: str, caches: Caches) -> None:
    await env.cm.deallocate_cache(caches.local)
    await env.target_cm(path).deallocate_cache(caches.remote)


def beside_rtt(row: Row, timing: Timing) -> None:
    """Keep the p50 of the gRPC calls interleaved with the row's requests."""
    if timing.paced:
        row.extra["rtt_us"] = statistics.median(timing.paced) * 1e6


async def run_case(env: Clusters, case: Case, cold_bytes: int, budget: Budget,
                   ping: Ping | None = None) -> Row:
    """Measure one case; a missing operation or a failure becomes the row's status.

    ``ping`` (the bare gRPC call) is interleaved with small one-in-flight rows."""
    row = Row(HIXL, "hixl", case.suite, case.op, case.path, case.block, case.nblocks, case.conc)
    reason = unavailable(env, case.op)
    if reason:
        row.status = reason
        return row
    slots = slots_for(case.block, case.nblocks, cold_bytes)
    try:
        caches = await _allocate(env, case.path, slot_desc(case.block, case.nblocks, slots))
    except Exception as exc:  # reported, not raised: one failed shape must not end the run
        row.status = f"error: allocate: {exc}"
        return row
    try:
        operation = OPERATIONS[case.op](env, case.path, caches)
        beside = ping if case.conc == 1 and case.request_bytes <= RTT_BESIDE_BYTES else None
        with capture_timings() as measured:
            timing = await drive(operation.request, case.conc, budget, beside)
        row.fill(timing, case.request_bytes)
        beside_rtt(row, timing)
        measured_split(row, measured)
    except Exception as exc:
        row.status = f"error: {type(exc).__name__}: {exc}"
    finally:
        await _free(env, case.path, caches)
    return row


async def probe_rows(env: Clusters, paths: tuple[str, ...], budget: Budget,
                     progress: Callable[[Row], None], ping: Ping | None = None) -> list[Row]:
    """The zero-byte-ish requests behind each row's time split.

    * ``hixl-noop``: ``remove_cache_key`` of an unbound key, a client-to-daemon
      round trip through hixl's client and servicer that does no work;
    * ``hixl-tiny`` per path: a pull of one 64-byte block, i.e. the fixed cost
      of a pull (client call, daemon control work, one data-plane round trip).

    ``hixl-keyed`` rows come from :func:`keyed_rows`.
    """
    rows = []
    unbound = CacheKey(env.initiator.cluster_id, req_id=0x7FFF_FFFF)

    async def noop(_index: int) -> None:
        await env.cm.remove_cache_key(unbound)

    timing = await drive(noop, 1, budget, ping)
    rows.append(Row(PROBE, NOOP, "probe", "rpc", "unix").fill(timing, 0))
    beside_rtt(rows[-1], timing)
    progress(rows[-1])
    desc = CacheDesc(1, [2, 64], DataType.DT_UINT8)
    for path in paths:
        caches = await _allocate(env, path, desc)
        try:
            timing = await drive(Pull(env, path, caches).request, 1, budget, ping)
        finally:
            await _free(env, path, caches)
        rows.append(Row(PROBE, TINY, "probe", "pull", path, 64, 1).fill(timing, 64))
        beside_rtt(rows[-1], timing)
        progress(rows[-1])
    return rows


async def keyed_rows(pair: Daemons, paths: tuple[str, ...], budget: Budget,
                     progress: Callable[[Row], None], ping: Ping | None = None) -> list[Row]:
    """``hixl-keyed`` per path, on clusters of their own: LLM-DataDist refuses pulls
    by CacheKey in the remote-cache-accessible mode the sweep's clusters use."""
    rows = []
    async with clusters(pair, KEYED_POOL_BYTES, paths, id_base=KEYED_ID_BASE,
                        remote_access=False) as keyed:
        for path in paths:
            rows.append(await _keyed_probe(keyed, path, budget, ping))
            progress(rows[-1])
    return rows


async def _keyed_probe(env: Clusters, path: str, budget: Budget, ping: Ping | None) -> Row:
    """``hixl-keyed``: the tiny pull by ``CacheKey``, which the owner resolves and
    then releases (LLM-DataDist's usual decode pull) instead of by id.

    Each pull needs a freshly bound key: the target binds them KEYED_BATCH at a
    time, inside the request that runs out (one request in KEYED_BATCH, so the
    p50 is the pull's), and frees the pulled caches then.
    """
    desc = CacheDesc(1, [1, 64], DataType.DT_UINT8)
    target_cm = env.target_cm(path)
    target = env.target_id(path)
    dst = await env.cm.allocate_cache(desc)
    bound: list[Cache] = []
    first_req_id = 1 << 40

    async def refill(index: int) -> None:
        for cache in bound:
            await target_cm.deallocate_cache(cache)
        bound.clear()
        for req_id in range(first_req_id + index, first_req_id + index + KEYED_BATCH):
            bound.append(await target_cm.allocate_cache(desc, [CacheKey(target, req_id=req_id)]))

    async def pull(index: int) -> None:
        if index % KEYED_BATCH == 0:
            await refill(index)
        await env.cm.pull_cache(CacheKey(target, req_id=first_req_id + index), dst)

    try:
        timing = await drive(pull, 1, budget, ping)
    finally:
        for cache in bound:
            await target_cm.deallocate_cache(cache)
        await env.cm.deallocate_cache(dst)
    row = Row(PROBE, KEYED, "probe", "pull", path, 64, 1).fill(timing, 64)
    beside_rtt(row, timing)
    return row


def measured_split(row: Row, measured: list[TransferTiming]) -> None:
    """The split the daemon reported (medians over the row's requests), when it did."""
    if not measured:
        return
    row.client_us = statistics.median(t.client_us for t in measured)
    row.control_us = statistics.median(t.control_us for t in measured)
    row.data_us = statistics.median(t.data_us for t in measured)


def split(row: Row, noop_p50_us: float | None, tiny_p50_us: float | None) -> None:
    """Estimate a row's split into client-to-daemon, daemon control and data movement.

    Only for rows the daemon did not report (layer-wise tasks): client = the
    no-op round trip; control = the tiny pull less the no-op (it includes the
    data plane's fixed per-request round trip); data = the rest.
    """
    if row.control_us is not None:
        return  # measured by the daemon
    if row.p50_us is None or noop_p50_us is None or tiny_p50_us is None:
        return
    row.client_us = noop_p50_us
    row.control_us = max(0.0, tiny_p50_us - noop_p50_us)
    row.data_us = max(0.0, row.p50_us - tiny_p50_us)

