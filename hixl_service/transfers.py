"""Pulls and pushes: find both ends, plan byte ranges, move them, settle keys.

One deadline per call (the cluster's ``sync_kv_timeout``) covers finding
the far cache and moving its bytes; the link's transport receives what is
left of it, so every transfer ends by then whatever the peer does. A pull by
key then tells the owner, within ``RELEASE_SLACK_S`` past that deadline.

A pull_cache or push_cache by cache id can be repeated by handle: its
Outcome carries the plan and the far end it used, from which ``prepared``
makes the transfer that repeats start again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.status import param_invalid as _invalid

from .cluster import Cluster
from .links import FarCache, OutboundLink
from .native_errors import RegionRefused
from .peer_api import CacheRefSpec, KeyRef
from .planning import (
    Blocks,
    Ranges,
    plan_blocks,
    plan_cache_pull,
    plan_slot_to_blocks,
    tensor_pairs,
    total_bytes,
)
from .registry import CacheEntry

logger = logging.getLogger(__name__)

# Above this many blocks a request's ranges are planned off the event loop.
PLAN_OFF_LOOP_BLOCKS = 4096
# How long past sync_kv_timeout a pull by key may wait for the owner to take
# its release. Less than the half second past its timeout at which the
# client's deadline ends the call (docs/client.md, "Bounded calls"): the pull answers
# success (a release not confirmed is logged) before that cuts it off.
RELEASE_SLACK_S = 0.25



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
    checksum: bool = False  # a CRC-32C over the wire (TCP links), resolved per call


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
    checksum: bool = False


@dataclass(slots=True)
class Outcome:
    """What a transfer moved, over which transport, and how long moving took."""

    bytes: int = 0
    transport: str = ""
    data_s: float = 0.0
    # The plan and the far end it moved against, for a repeat of its shape.
    ranges: Ranges | None = None
    far: FarCache | None = None


def _timeout(cluster: Cluster) -> LLMException:
    return LLMException(f"the transfer did not finish within sync_kv_timeout "
                        f"({cluster.settings.sync_timeout_ms} ms)",
                        status_code=LLMStatusCode.LLM_TIMEOUT)


async def find_target(cluster: Cluster, link: OutboundLink, ref: CacheRefSpec,
                      deadline: float, fresh: bool = False) -> FarCache:
    """Locate the far end of a transfer; ``fresh`` skips the link's remembered answers."""
    remaining = deadline - asyncio.get_running_loop().time()
    try:
        return await link.far.find(ref, remaining, cluster.settings.sync_timeout_s, fresh)
    except asyncio.TimeoutError:
        raise _timeout(cluster) from None


async def _plan(plan: Callable[[FarCache], Ranges], target: FarCache,
                blocks: int) -> Ranges:
    # Planning is pure array work, but per block: long block lists are
    # planned in a worker thread so that the event loop keeps serving.
    if blocks > PLAN_OFF_LOOP_BLOCKS:
        return await asyncio.to_thread(plan, target)
    return plan(target)


async def _retrying_stale(cluster: Cluster, link: OutboundLink, ref: CacheRefSpec,
                          deadline: float, plan: Callable[[FarCache], Ranges],
                          move: Callable[[FarCache, Ranges], Awaitable[None]],
                          outcome: Outcome, local: CacheEntry, blocks: int = 0) -> None:
    """Plan and move against the far end; if a remembered far end turns out stale
    (the plan does not fit it, or its data server refuses the region), find it
    afresh and try once more. Nothing has moved when either happens. The plan
    and the far end that moved go into ``outcome``."""
    target = await find_target(cluster, link, ref, deadline)
    try:
        ranges = plan(target) if blocks <= PLAN_OFF_LOOP_BLOCKS else \
            await _plan(plan, target, blocks)
        await _timed(move, target, ranges, outcome, local)
    except LLMException as exc:
        planning = exc.status_code == LLMStatusCode.LLM_PARAM_INVALID
        # A refused region is found afresh even when this call just resolved it:
        # the far cache was freed in between (the resolve then says so) or moved.
        if not (isinstance(exc, RegionRefused) or (target.cached and planning)):
            raise
        link.far.forget(ref)
        target = await find_target(cluster, link, ref, deadline, fresh=True)
        ranges = await _plan(plan, target, blocks)
        await _timed(move, target, ranges, outcome, local)
    outcome.ranges, outcome.far = ranges, target
    outcome.bytes = total_bytes(ranges)


async def _timed(move: Callable[[FarCache, Ranges], Awaitable[None]], target: FarCache,
                 ranges: Ranges, outcome: Outcome, local: CacheEntry) -> None:
    # perf_counter, not loop.time(): uvloop's clock is cached per iteration
    # in whole milliseconds.
    started = time.perf_counter()
    try:
        with fenced(local, target):
            await move(target, ranges)
    finally:
        outcome.data_s += time.perf_counter() - started


@contextlib.contextmanager
def fenced(local: CacheEntry, far: FarCache, check: bool = True) -> Iterator[None]:
    """Around a move: nothing starts in a cache freed since it was found (both
    ends of a local link; ``check`` False for a move already started), and each
    end's extent stays out of its pool until the move has ended (``Caches.fence``)."""
    far_entry = far.origin if isinstance(far.origin, CacheEntry) else None
    with contextlib.ExitStack() as using:
        for entry in (local, far_entry):
            if entry is not None:
                if check:
                    entry.check_present()
                using.enter_context(entry.in_use())
        yield


def _remaining_ms(cluster: Cluster, deadline: float) -> int:
    remaining = int((deadline - asyncio.get_running_loop().time()) * 1000)
    if remaining <= 0:
        raise _timeout(cluster)
    return remaining


def plan_pull(source: FarCache, dst: CacheEntry, spec: PullSpec) -> Ranges:
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


def move(cluster: Cluster, link: OutboundLink, local: CacheEntry, far: FarCache,
         ranges: Ranges, deadline: float, push: bool, checksum: bool = False) -> Awaitable[None]:
    """Move planned ranges between a local cache and the far end over the link's
    transport: into ``local`` for a pull, out of it for a push. The transport's
    own awaitable, not one wrapping it: a coroutine less on every request."""
    transfer = link.transport.write if push else link.transport.read
    return transfer(local.memory, far.place, ranges, _remaining_ms(cluster, deadline),
                    checksum)


async def pull(cluster: Cluster, spec: PullSpec) -> Outcome:
    """Run one pull."""
    dst = cluster.registry.get(spec.dst_cache_id)
    if spec.src.cluster_id == cluster.cluster_id:
        raise _invalid("cannot pull from the cluster's own id")
    link = cluster.link_to(spec.src.cluster_id)
    deadline = asyncio.get_running_loop().time() + cluster.settings.sync_timeout_s

    def into_dst(source: FarCache, ranges: Ranges) -> Awaitable[None]:
        return move(cluster, link, dst, source, ranges, deadline, push=False,
                    checksum=spec.checksum)

    outcome = Outcome(transport=link.transport.name)
    await _retrying_stale(cluster, link, spec.src, deadline,
                          lambda source: plan_pull(source, dst, spec), into_dst, outcome,
                          dst, len(spec.dst_blocks))
    dst.check_present()  # freed while its bytes arrived: they went nowhere
    if isinstance(spec.src, KeyRef):
        await _release_key(link, spec.src, spec.src_tensor_indices, deadline)
    return outcome


async def _release_key(link: OutboundLink, ref: KeyRef, tensor_indices: list[int],
                       deadline: float) -> None:
    """Tell the owner that a pull by key moved its tensors, by the deadline plus
    RELEASE_SLACK_S; the bytes have arrived, so a late owner is logged, not failed."""
    left_s = deadline + RELEASE_SLACK_S - asyncio.get_running_loop().time()
    try:
        # wait_for, not asyncio.timeout: a lane call may get here in its eager first step
        await asyncio.wait_for(link.far.release_key(ref, tensor_indices), max(left_s, 0.01))
    except asyncio.TimeoutError:
        logger.warning("pulled %s but cluster %d did not take its release in time",
                       ref.key, ref.cluster_id)


def plan_push(src: CacheEntry, target: FarCache, spec: PushSpec) -> Ranges:
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


async def push(cluster: Cluster, spec: PushSpec) -> Outcome:
    """Run one push into a remote-accessible cache."""
    src = cluster.registry.get(spec.src_cache_id)
    if spec.dst.cluster_id == cluster.cluster_id:
        raise _invalid("cannot push to the cluster's own id")
    link = cluster.link_to(spec.dst.cluster_id)
    deadline = asyncio.get_running_loop().time() + cluster.settings.sync_timeout_s

    def out_of_src(target: FarCache, ranges: Ranges) -> Awaitable[None]:
        return move(cluster, link, src, target, ranges, deadline, push=True,
                    checksum=spec.checksum)

    outcome = Outcome(transport=link.transport.name)
    await _retrying_stale(cluster, link, spec.dst, deadline,
                          lambda target: plan_push(src, target, spec), out_of_src, outcome,
                          src, len(spec.dst_blocks))
    return outcome
