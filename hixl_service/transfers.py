"""Pulls: resolve the source, plan byte ranges, move them, settle references.

One deadline per pull (the cluster's ``sync_kv_timeout``) covers resolving
the remote cache and moving its bytes; the native transport receives what is
left of it, so every pull ends by then whatever the peer does.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from hixl_client._compat import timeout_at
from hixl_client.status import LLMException, LLMStatusCode

from .cluster import Cluster
from .engine import Engine
from .links import OutboundLink
from .peer_api import CacheRefSpec, KeyRef
from .planning import Layout, plan_cache_pull, tensor_pairs
from .registry import CacheEntry

logger = logging.getLogger(__name__)

# Telling the owner that a keyed slot was pulled is bounded on its own: the
# data already arrived, so a slow owner must not turn success into failure.
RELEASE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class PullSpec:
    """A pull_cache request after client-side validation."""

    src: CacheRefSpec
    dst_cache_id: int
    batch_index: int
    size: int
    src_tensor_indices: list[int]
    dst_tensor_indices: list[int]
    tensor_num_per_layer: int


def _entry_layout(entry: CacheEntry) -> Layout:
    return Layout(entry.tensor_offsets, entry.tensor_size, entry.batch_size)


def _timeout(cluster: Cluster) -> LLMException:
    return LLMException(f"pull did not finish within sync_kv_timeout "
                        f"({cluster.settings.sync_timeout_ms} ms)",
                        status_code=LLMStatusCode.LLM_TIMEOUT)


async def pull_cache(engine: Engine, cluster: Cluster, spec: PullSpec) -> tuple[int, str]:
    """Run one pull into a continuous cache; return (bytes moved, transport)."""
    dst = cluster.registry.get(spec.dst_cache_id)
    if dst.blocks:
        raise LLMException("pull_cache needs a non-blocks destination cache",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID)
    if spec.src.cluster_id == cluster.cluster_id:
        raise LLMException("cannot pull from the cluster's own id",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID)
    link = cluster.link_to(spec.src.cluster_id)
    if link.transport == "local":
        moved = await _pull_local(engine, link, dst, spec)
    else:
        moved = await _pull_remote(engine, cluster, link, dst, spec)
    return moved, link.transport


async def _pull_local(engine: Engine, link: OutboundLink, dst: CacheEntry,
                      spec: PullSpec) -> int:
    source, entry, src_batch = engine.lookup_local(link, spec.src)
    pairs = tensor_pairs(_entry_layout(entry), _entry_layout(dst), spec.src_tensor_indices,
                         spec.dst_tensor_indices, spec.tensor_num_per_layer)
    ranges, length = plan_cache_pull(_entry_layout(entry), src_batch, _entry_layout(dst),
                                     spec.batch_index, spec.size, pairs)
    await engine.deps.copier.copy(engine.pools.get(dst.pool_id),
                                  engine.pools.get(entry.pool_id), ranges)
    if isinstance(spec.src, KeyRef):
        await engine.record_local_pull(source, spec.src.key, spec.src_tensor_indices)
    return length * len(pairs)


async def _pull_remote(engine: Engine, cluster: Cluster, link: OutboundLink, dst: CacheEntry,
                       spec: PullSpec) -> int:
    assert link.peer is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + cluster.settings.sync_timeout_s
    try:
        async with timeout_at(deadline):
            source = await link.peer.resolve(link.token, spec.src,
                                             cluster.settings.sync_timeout_s)
    except asyncio.TimeoutError:
        raise _timeout(cluster) from None
    pairs = tensor_pairs(source.layout, _entry_layout(dst), spec.src_tensor_indices,
                         spec.dst_tensor_indices, spec.tensor_num_per_layer)
    ranges, length = plan_cache_pull(source.layout, source.batch_index, _entry_layout(dst),
                                     spec.batch_index, spec.size, pairs)
    remaining_ms = int((deadline - loop.time()) * 1000)
    if remaining_ms <= 0:
        raise _timeout(cluster)
    await link.read(engine.deps.dispatcher, engine.pools.get(dst.pool_id), source.region_id,
                    ranges, remaining_ms)
    if isinstance(spec.src, KeyRef):
        try:
            await link.peer.release_key(link.token, spec.src.key, spec.src_tensor_indices,
                                        RELEASE_TIMEOUT_S)
        except LLMException as exc:
            logger.warning("pulled %s but could not release it on cluster %d: %s",
                           spec.src.key, spec.src.cluster_id, exc)
    return length * len(pairs)
