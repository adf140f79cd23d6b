"""Pulls and pushes: find both ends, plan byte ranges, move them, settle keys.

One deadline per call (the cluster's ``sync_kv_timeout``) covers resolving
the remote cache and moving its bytes; the native transport receives what is
left of it, so every transfer ends by then whatever the peer does.

A pull_cache or push_cache by cache id can be repeated by handle
(``repeats``): ``again`` reuses what the last transfer of the same shape
found, once it has checked that each part is still the one in use, and
otherwise runs the full ``pull`` or ``push``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import hixl_native
import numpy as np

from hixl_client.status import LLMException, LLMStatusCode

from .cluster import Cluster
from .copier import triples_of
from .engine import Engine
from .links import SLICE_RANGES, OutboundLink, RegionRefused, landed, native_status_error
from .peer_api import BlocksRef, CacheRefSpec, IdRef, KeyRef, ResolvedCache
from .planning import (
    Blocks,
    Layout,
    Ranges,
    plan_blocks,
    plan_cache_pull,
    plan_slot_to_blocks,
    tensor_pairs,
    total_bytes,
)
from .pools import Memory
from .registry import CacheEntry
from .repeats import Repeat, TransferShape

logger = logging.getLogger(__name__)

# Telling the owner that a keyed slot was pulled is bounded on its own: the
# data already arrived, so a slow owner must not turn success into failure.
RELEASE_TIMEOUT_S = 2.0
# Above this many blocks a request's ranges are planned off the event loop.
PLAN_OFF_LOOP_BLOCKS = 4096


def _invalid(message: str) -> LLMException:
    return LLMException(message, status_code=LLMStatusCode.LLM_PARAM_INVALID)


@dataclass(slots=True)
class PullSpec:
    """A pull_cache or pull_blocks request after client-side validation."""

    src: CacheRefSpec
    dst_cache_id: int
    batch_index: int
    size: int
    src_tensor_indices: list[int]
    dst_tensor_indices: list[int]
    tensor_num_per_layer: int
    blocks: bool = False  # pull_blocks: the destination is a blocks cache
    src_blocks: Blocks = ()
    dst_blocks: Blocks = ()


@dataclass(slots=True)
class PushSpec:
    """A push_cache or push_blocks request after client-side validation."""

    dst: CacheRefSpec
    src_cache_id: int
    src_batch_index: int
    src_tensor_indices: list[int]
    dst_tensor_indices: list[int]
    tensor_num_per_layer: int
    blocks: bool = False
    src_blocks: Blocks = ()
    dst_blocks: Blocks = ()


@dataclass(slots=True)
class Outcome:
    """What a transfer moved, over which transport, and how long moving took."""

    bytes: int = 0
    transport: str = ""
    data_s: float = 0.0


@dataclass(slots=True)
class Peer:
    """The far end of a transfer, wherever it lives."""

    layout: Layout
    batch_index: int
    blocks: bool
    writable: bool
    region_id: int = 0  # remote ends only
    memory: Memory | None = None  # local ends only
    cached: bool = False  # from the link's resolve cache (may be stale)


def _timeout(cluster: Cluster) -> LLMException:
    return LLMException(f"the transfer did not finish within sync_kv_timeout "
                        f"({cluster.settings.sync_timeout_ms} ms)",
                        status_code=LLMStatusCode.LLM_TIMEOUT)


def _cache_key(ref: CacheRefSpec) -> tuple[str, int] | None:
    """Refs whose resolution may be reused: by cache id and by blocks key, not by key."""
    if isinstance(ref, IdRef):
        return ("id", ref.cache_id)
    if isinstance(ref, BlocksRef):
        return ("blocks", ref.model_id)
    return None


async def find_target(engine: Engine, cluster: Cluster, link: OutboundLink, ref: CacheRefSpec,
                      deadline: float, fresh: bool = False) -> Peer:
    """Locate the far end of a transfer; ``fresh`` skips the link's resolve cache."""
    if link.transport == "local":
        _, entry, batch_index = engine.lookup_local(link, ref)
        return Peer(entry.layout, batch_index, entry.blocks, entry.writable,
                    memory=entry.memory)
    assert link.peer is not None
    key = _cache_key(ref)
    found = link.resolved.get(key) if key is not None and not fresh else None
    cached = found is not None
    if found is None:
        # wait_for, not asyncio.timeout: a lane call may get here in its eager
        # first step, before it has a task (eager.py).
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            found = await asyncio.wait_for(
                link.peer.resolve(link.token, ref, cluster.settings.sync_timeout_s), remaining)
        except asyncio.TimeoutError:
            raise _timeout(cluster) from None
        if key is not None:
            link.resolved[key] = found
    batch_index = ref.batch_index if isinstance(ref, IdRef) else found.batch_index
    return Peer(found.layout, batch_index, found.blocks, found.writable,
                region_id=found.region_id, cached=cached)


async def _plan(plan: Callable[[Peer], Ranges], target: Peer, blocks: int) -> Ranges:
    # Planning is pure array work, about 0.3 us per block: long block lists are
    # planned in a worker thread so that the event loop keeps serving.
    if blocks > PLAN_OFF_LOOP_BLOCKS:
        return await asyncio.to_thread(plan, target)
    return plan(target)


async def _retrying_stale(engine: Engine, cluster: Cluster, link: OutboundLink,
                          ref: CacheRefSpec, deadline: float, plan: Callable[[Peer], Ranges],
                          move: Callable[[Peer, Ranges], Awaitable[None]],
                          outcome: Outcome, blocks: int = 0) -> Ranges:
    """Plan and move against the far end; if a remembered far end turns out stale
    (the plan does not fit it, or its data server refuses the region), resolve it
    afresh and try once more. Nothing has moved when either happens."""
    target = await find_target(engine, cluster, link, ref, deadline)
    try:
        ranges = plan(target) if blocks <= PLAN_OFF_LOOP_BLOCKS else \
            await _plan(plan, target, blocks)
        await _timed(move, target, ranges, outcome)
        return ranges
    except LLMException as exc:
        planning = exc.status_code == LLMStatusCode.LLM_PARAM_INVALID
        if not target.cached or not (planning or isinstance(exc, RegionRefused)):
            raise
        key = _cache_key(ref)
        if key is not None:
            link.resolved.pop(key, None)
    target = await find_target(engine, cluster, link, ref, deadline, fresh=True)
    ranges = await _plan(plan, target, blocks)
    await _timed(move, target, ranges, outcome)
    return ranges


async def _timed(move: Callable[[Peer, Ranges], Awaitable[None]], target: Peer,
                 ranges: Ranges, outcome: Outcome) -> None:
    # perf_counter, not loop.time(): uvloop's clock is cached per iteration
    # in whole milliseconds.
    started = time.perf_counter()
    try:
        await move(target, ranges)
    finally:
        outcome.data_s += time.perf_counter() - started


def _remaining_ms(cluster: Cluster, deadline: float) -> int:
    remaining = int((deadline - asyncio.get_running_loop().time()) * 1000)
    if remaining <= 0:
        raise _timeout(cluster)
    return remaining


def plan_pull(source: Peer, dst: CacheEntry, spec: PullSpec) -> Ranges:
    """Ranges (source offset, destination pool offset, length)."""
    if dst.blocks != spec.blocks:
        raise _invalid("pull_blocks needs a blocks destination cache" if spec.blocks
                       else "pull_cache needs a non-blocks destination cache")
    dst_layout = dst.layout
    pairs = tensor_pairs(source.layout, dst_layout, spec.src_tensor_indices,
                         spec.dst_tensor_indices, spec.tensor_num_per_layer)
    if not spec.blocks:
        if source.blocks:
            raise _invalid("pull_cache cannot read a blocks cache; use pull_blocks")
        ranges, _ = plan_cache_pull(source.layout, source.batch_index, dst_layout,
                                    spec.batch_index, spec.size, pairs)
        return ranges
    if len(spec.src_blocks):
        if not source.blocks:
            raise _invalid("src_blocks name blocks, but the source is not a blocks cache")
        ranges = plan_blocks(source.layout, dst_layout, pairs, spec.src_blocks,
                             spec.dst_blocks)
    else:
        if source.blocks:
            raise _invalid("a blocks source needs src_blocks")
        ranges = plan_slot_to_blocks(source.layout, source.batch_index, dst_layout, pairs,
                                     spec.dst_blocks)
    return ranges


async def _move(engine: Engine, cluster: Cluster, link: OutboundLink, local: CacheEntry,
                far: Peer, ranges: Ranges, deadline: float, push: bool) -> None:
    """Move planned ranges between a local cache and the far end: into ``local``
    for a pull, out of it for a push; a memcpy when the far end is in this daemon."""
    if far.memory is not None:
        dst, src = (far.memory, local.memory) if push else (local.memory, far.memory)
        await engine.deps.copier.copy(dst, src, ranges)
    else:
        transfer = link.write if push else link.read
        await transfer(engine.deps.dispatcher, local.memory, far.region_id, ranges,
                       _remaining_ms(cluster, deadline))


async def pull(engine: Engine, cluster: Cluster, spec: PullSpec) -> Outcome:
    """Run one pull."""
    dst = cluster.registry.get(spec.dst_cache_id)
    if spec.src.cluster_id == cluster.cluster_id:
        raise _invalid("cannot pull from the cluster's own id")
    link = cluster.link_to(spec.src.cluster_id)
    deadline = asyncio.get_running_loop().time() + cluster.settings.sync_timeout_s

    async def move(source: Peer, ranges: Ranges) -> None:
        await _move(engine, cluster, link, dst, source, ranges, deadline, push=False)

    outcome = Outcome(transport=link.transport)
    ranges = await _retrying_stale(engine, cluster, link, spec.src, deadline,
                                   lambda source: plan_pull(source, dst, spec), move, outcome,
                                   len(spec.dst_blocks))
    if isinstance(spec.src, KeyRef):
        await _release_key(engine, link, spec.src, spec.src_tensor_indices)
    outcome.bytes = total_bytes(ranges)
    return outcome


def repeat_handle(engine: Engine, cluster: Cluster, spec: PullSpec | PushSpec) -> int:
    """After a transfer succeeded: the handle its shape may be repeated by (0: none).

    Only pull_cache and push_cache by cache id repeat: a key names a
    different slot each time, and blocks requests carry their block lists.
    """
    ref = spec.src if isinstance(spec, PullSpec) else spec.dst
    if spec.blocks or not isinstance(ref, IdRef):
        return 0
    if isinstance(spec, PullSpec):
        shape = TransferShape(False, ref.cluster_id, ref.cache_id, spec.dst_cache_id, spec.size,
                              tuple(spec.src_tensor_indices), tuple(spec.dst_tensor_indices),
                              spec.tensor_num_per_layer)
    else:
        shape = TransferShape(True, ref.cluster_id, ref.cache_id, spec.src_cache_id, -1,
                              tuple(spec.src_tensor_indices), tuple(spec.dst_tensor_indices),
                              spec.tensor_num_per_layer)
    handle = cluster.repeats.offer(shape)
    if handle:
        repeat = cluster.repeats.get(handle, shape.push)
        if repeat.found is None:
            repeat.found = _find(engine, cluster, shape)
    return handle


def _spec_of(shape: TransferShape, src_batch: int, dst_batch: int) -> PullSpec | PushSpec:
    """The full request of ``shape`` between two slots."""
    if shape.push:
        return PushSpec(dst=IdRef(shape.remote_cluster_id, shape.remote_cache_id, dst_batch),
                        src_cache_id=shape.local_cache_id, src_batch_index=src_batch,
                        src_tensor_indices=list(shape.src_tensor_indices),
                        dst_tensor_indices=list(shape.dst_tensor_indices),
                        tensor_num_per_layer=shape.tensor_num_per_layer)
    return PullSpec(src=IdRef(shape.remote_cluster_id, shape.remote_cache_id, src_batch),
                    dst_cache_id=shape.local_cache_id, batch_index=dst_batch, size=shape.size,
                    src_tensor_indices=list(shape.src_tensor_indices),
                    dst_tensor_indices=list(shape.dst_tensor_indices),
                    tensor_num_per_layer=shape.tensor_num_per_layer)


@dataclass(slots=True)
class Found:
    """What a transfer of a shape used, for repeats of it: each part is checked to
    be the one still in use (``current``) before a repeat relies on it.

    ``ranges`` are the shape's plan between slots 0 and 0. A plan between other
    slots adds the two slots' offsets to every source and every destination
    offset, which keeps contiguous ranges contiguous: the same merged ranges
    ``plan_cache_pull`` gives, without planning again. A copy inside the
    daemon, or a TCP request of one region, does not even build that plan: the
    native copy or data link adds the offsets as it checks the ranges.
    """

    local: CacheEntry  # the pull's destination, the push's source
    link: OutboundLink
    remote: Peer  # the pull's source, the push's destination
    ranges: Ranges
    remote_cluster: Cluster | None = None  # local links: the far cluster and cache
    remote_entry: CacheEntry | None = None
    resolved: ResolvedCache | None = None  # remote links: the link's remembered resolve
    bytes: int = 0
    source: Layout | None = None  # the layouts of the ranges' two columns
    destination: Layout | None = None
    triples: np.ndarray | None = None  # local links: the ranges as native copies take them

    def current(self, engine: Engine, cluster: Cluster, shape: TransferShape) -> bool:
        link = self.link
        if cluster.registry.live(shape.local_cache_id) is not self.local \
                or cluster.links.get(shape.remote_cluster_id) is not link or not link.alive:
            return False
        remote_cluster = self.remote_cluster
        if remote_cluster is None:
            return link.resolved.get(("id", shape.remote_cache_id)) is self.resolved
        return (engine.clusters.get(link.remote_cluster_id) is remote_cluster
                and not remote_cluster.closed and link.token in engine.inbound
                and remote_cluster.registry.live(shape.remote_cache_id) is self.remote_entry)

    def shifts(self, src_batch: int, dst_batch: int) -> tuple[int, int] | None:
        """What a plan between two slots adds to every source and every destination
        offset, or None for a slot out of range."""
        source, destination = self.source, self.destination
        assert source is not None and destination is not None
        if not (0 <= src_batch < source.batch_size and 0 <= dst_batch < destination.batch_size):
            return None
        return src_batch * source.stride, dst_batch * destination.stride

    def shifted(self, shifts: tuple[int, int]) -> Ranges:
        """The ranges between the two slots ``shifts`` (of :meth:`shifts`) stand for."""
        return self.ranges + np.array((*shifts, 0), dtype=np.uint64)


def _find(engine: Engine, cluster: Cluster, shape: TransferShape) -> Found | None:
    """What a transfer of ``shape`` that just succeeded used; None where it cannot
    be reused."""
    local = cluster.registry.live(shape.local_cache_id)
    link = cluster.links.get(shape.remote_cluster_id)
    if local is None or link is None:
        return None
    if link.transport == "local":
        try:
            remote_cluster, entry, _ = engine.lookup_local(
                link, IdRef(shape.remote_cluster_id, shape.remote_cache_id, 0))
        except LLMException:
            return None
        remote = Peer(entry.layout, 0, entry.blocks, entry.writable, memory=entry.memory)
        found = Found(local, link, remote, None, remote_cluster=remote_cluster,
                      remote_entry=entry)
    else:
        resolved = link.resolved.get(("id", shape.remote_cache_id))
        if resolved is None:
            return None
        remote = Peer(resolved.layout, 0, resolved.blocks, resolved.writable,
                      region_id=resolved.region_id, cached=True)
        found = Found(local, link, remote, None, resolved=resolved)
    spec = _spec_of(shape, 0, 0)
    try:  # the full transfer's own planning, checks included, between slots 0 and 0
        if isinstance(spec, PushSpec):
            found.ranges = plan_push(local, remote, spec)
            found.source, found.destination = local.layout, remote.layout
        else:
            if remote.blocks:
                return None
            found.ranges = plan_pull(remote, local, spec)
            found.source, found.destination = remote.layout, local.layout
    except LLMException:
        return None
    found.bytes = total_bytes(found.ranges)
    if remote.memory is not None:
        found.triples = triples_of(found.ranges)
    return found


async def again(engine: Engine, cluster: Cluster, repeat: Repeat, src_batch: int,
                dst_batch: int) -> Outcome:
    """Run a transfer of a known shape: the same result and errors as ``pull`` or
    ``push`` of the full request, which runs whenever what was found before no
    longer holds."""
    started = again_at_once(engine, cluster, repeat, src_batch, dst_batch)
    if isinstance(started, Outcome):
        return started
    if started is not None:
        return await started
    return await _full(engine, cluster, repeat, src_batch, dst_batch)


def again_at_once(engine: Engine, cluster: Cluster, repeat: Repeat, src_batch: int,
                  dst_batch: int) -> Outcome | Awaitable[Outcome] | None:
    """Start ``again`` without waiting, from what the last transfer found.

    Returns the Outcome when the transfer ended right here (a small copy, or a
    small TCP request, alone in the daemon), an awaitable of it while bytes
    move, or None when what was found no longer holds: then nothing has moved,
    and the full call must run (``again`` runs it). Raises only before
    anything moved, with the full call's errors (a link gone down, the daemon
    stopping).
    """
    shape, found = repeat.shape, repeat.found
    if found is None or not found.current(engine, cluster, shape):
        return None
    shifts = found.shifts(src_batch, dst_batch)
    if shifts is None:  # a slot out of range: the full call words the error
        return None
    started = time.perf_counter()
    link, far, local = found.link, found.remote, found.local
    moving: Awaitable[None]
    if far.memory is not None:
        dst, src = (far.memory, local.memory) if shape.push else (local.memory, far.memory)
        assert found.triples is not None
        src_shift, dst_shift = shifts
        if engine.deps.copier.copy_now(dst, src, found.triples, found.bytes, dst_shift,
                                       src_shift):
            return _repeated(cluster, found, started)
        moving = engine.deps.copier.copy(dst, src, found.shifted(shifts))
    elif link.hccl is None and len(found.ranges) <= SLICE_RANGES:
        src_shift, dst_shift = shifts
        remote_shift, local_shift = (dst_shift, src_shift) if shape.push else shifts
        posted = link.start(engine.deps.dispatcher, shape.push, local.memory, far.region_id,
                            found.ranges, cluster.settings.sync_timeout_ms, remote_shift,
                            local_shift)
        if not isinstance(posted, int):
            moving = landed(posted)
        elif posted == hixl_native.OK:
            return _repeated(cluster, found, started)
        elif posted == hixl_native.E_REFUSED:  # the remote cache is gone or moved
            link.resolved.pop(("id", shape.remote_cache_id), None)
            return None
        else:
            raise native_status_error(posted)
    else:
        deadline = asyncio.get_running_loop().time() + cluster.settings.sync_timeout_s
        moving = _move(engine, cluster, link, local, far, found.shifted(shifts), deadline,
                       shape.push)
    return _finish(engine, cluster, repeat, src_batch, dst_batch, found, moving, started)


async def _finish(engine: Engine, cluster: Cluster, repeat: Repeat, src_batch: int,
                  dst_batch: int, found: Found, moving: Awaitable[None],
                  started: float) -> Outcome:
    """The rest of a transfer ``again_at_once`` started: its Outcome once the bytes
    landed; the full call's if the peer refused the remembered region."""
    try:
        await moving
    except RegionRefused:  # the remote cache is gone or moved; nothing has moved
        found.link.resolved.pop(("id", repeat.shape.remote_cache_id), None)
        return await _full(engine, cluster, repeat, src_batch, dst_batch)
    return _repeated(cluster, found, started)


def _repeated(cluster: Cluster, found: Found, started: float) -> Outcome:
    cluster.repeats.repeated += 1
    return Outcome(found.bytes, found.link.transport, time.perf_counter() - started)


async def _full(engine: Engine, cluster: Cluster, repeat: Repeat, src_batch: int,
                dst_batch: int) -> Outcome:
    """The full pull or push of a repeat's shape, which finds what the next
    repeats reuse."""
    shape = repeat.shape
    repeat.found = None
    spec = _spec_of(shape, src_batch, dst_batch)
    outcome = await (push(engine, cluster, spec) if isinstance(spec, PushSpec)
                     else pull(engine, cluster, spec))
    repeat.found = _find(engine, cluster, shape)
    return outcome


async def _release_key(engine: Engine, link: OutboundLink, ref: KeyRef,
                       tensor_indices: list[int]) -> None:
    if link.transport == "local":
        source, _, _ = engine.lookup_local(link, ref)
        await engine.record_local_pull(source, ref.key, tensor_indices)
        return
    assert link.peer is not None
    try:
        await link.peer.release_key(link.token, ref.key, tensor_indices, RELEASE_TIMEOUT_S)
    except LLMException as exc:
        logger.warning("pulled %s but could not release it on cluster %d: %s",
                       ref.key, ref.cluster_id, exc)


def plan_push(src: CacheEntry, target: Peer, spec: PushSpec) -> Ranges:
    """Ranges (local source offset, target offset, length)."""
    if not target.writable:
        raise _invalid("the destination cache is not remote-accessible; its cluster must "
                       "enable_remote_cache_accessible")
    if src.blocks != spec.blocks or target.blocks != spec.blocks:
        kind = "blocks" if spec.blocks else "non-blocks"
        raise _invalid(f"{'push_blocks' if spec.blocks else 'push_cache'} needs {kind} "
                       f"caches at both ends")
    src_layout = src.layout
    pairs = tensor_pairs(src_layout, target.layout, spec.src_tensor_indices,
                         spec.dst_tensor_indices, spec.tensor_num_per_layer)
    if spec.blocks:
        return plan_blocks(src_layout, target.layout, pairs, spec.src_blocks, spec.dst_blocks)
    ranges, _ = plan_cache_pull(src_layout, spec.src_batch_index, target.layout,
                                target.batch_index, src_layout.stride, pairs)
    return ranges


async def push(engine: Engine, cluster: Cluster, spec: PushSpec) -> Outcome:
    """Run one push into a remote-accessible cache."""
    src = cluster.registry.get(spec.src_cache_id)
    if spec.dst.cluster_id == cluster.cluster_id:
        raise _invalid("cannot push to the cluster's own id")
    link = cluster.link_to(spec.dst.cluster_id)
    deadline = asyncio.get_running_loop().time() + cluster.settings.sync_timeout_s

    async def move(target: Peer, ranges: Ranges) -> None:
        await _move(engine, cluster, link, src, target, ranges, deadline, push=True)

    outcome = Outcome(transport=link.transport)
    ranges = await _retrying_stale(engine, cluster, link, spec.dst, deadline,
                                   lambda target: plan_push(src, target, spec), move, outcome,
                                   len(spec.dst_blocks))
    outcome.bytes = total_bytes(ranges)
    return outcome
