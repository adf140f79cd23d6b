"""The hixl side of a run: two real daemons and the clusters linked between them.

* daemon A (the initiator's host) runs the initiator cluster and, for the
  ``local`` path, a second target cluster; the link between those two is
  ``local`` (a native memcpy inside the daemon);
* daemon B runs the ``tcp`` target cluster; the initiator's link to it moves
  bytes over the native multi-stream TCP data plane.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from hixl_bench.model import MIB
from hixl_client import (
    CacheDesc,
    CacheManager,
    DataType,
    LLMClusterInfo,
    LLMConfig,
    LLMDataDist,
    LLMRole,
    LLMStatusCode,
)
from hixl_service.testing import DaemonProcess, start_daemon

INITIATOR, TCP_TARGET, LOCAL_TARGET = 2, 1, 3
_SYNC_KV_TIMEOUT_MS = 60000
_PAGE_SHIFT = 16


@dataclass
class Clusters:
    """The initiator and one target cluster per path, all initialised and linked."""

    initiator: LLMDataDist
    targets: dict[str, LLMDataDist]

    @property
    def cm(self) -> CacheManager:
        return self.initiator.cache_manager

    def target_cm(self, path: str) -> CacheManager:
        return self.targets[path].cache_manager

    def target_id(self, path: str) -> int:
        return self.targets[path].cluster_id


@dataclass
class Daemons:
    """Daemon A (initiator and local target) and daemon B (TCP target)."""

    a: DaemonProcess
    b: DaemonProcess


def supports(cm: object, method: str) -> bool:
    """Whether this build's CacheManager offers ``method`` (push, blocks, layer-wise)."""
    return callable(getattr(cm, method, None))


def remote_accessible() -> bool:
    """Push needs LLM-DataDist's remote-accessible mode; turn it on when push exists."""
    return supports(CacheManager, "push_cache")


def options(pool_bytes: int, remote_access: bool | None = None) -> dict[str, str]:
    """A cluster's options; ``remote_access`` None: on whenever push exists."""
    config = LLMConfig()
    config.device_id = 0
    config.enable_cache_manager = True
    config.mem_pool_cfg = json.dumps({"memory_size": pool_bytes, "page_shift": _PAGE_SHIFT})
    config.sync_kv_timeout = _SYNC_KV_TIMEOUT_MS
    if remote_accessible() if remote_access is None else remote_access:
        config.enable_remote_cache_accessible = True
    return dict(config.generate_options())


@contextlib.asynccontextmanager
async def daemons(budget_a: int, budget_b: int, streams: int) -> AsyncIterator[Daemons]:
    """Start the two daemons with pre-faulted pools and ``streams`` TCP streams per link."""
    settings: dict[str, Any] = {"pool__populate": True, "transfer__streams_per_link": streams,
                                "logging__level": "WARNING"}
    async with start_daemon(pool__max_bytes=budget_a, **settings) as a, \
            start_daemon(pool__max_bytes=budget_b, **settings) as b:
        yield Daemons(a, b)


@contextlib.asynccontextmanager
async def clusters(pair: Daemons, pool_bytes: int, paths: tuple[str, ...],
                   id_base: int = 0, remote_access: bool | None = None) -> AsyncIterator[Clusters]:
    """Initialise the initiator and the targets of ``paths`` and link them; finalize on exit.

    ``remote_access``: LLM-DataDist's remote-cache-accessible mode (see :func:`options`).
    """
    initiator = LLMDataDist(LLMRole.DECODER, id_base + INITIATOR, daemon=pair.a.client_target)
    targets: dict[str, LLMDataDist] = {}
    where = {"tcp": (id_base + TCP_TARGET, pair.b), "local": (id_base + LOCAL_TARGET, pair.a)}
    try:
        await initiator.init(options(pool_bytes, remote_access))
        for path in paths:
            cluster_id, daemon = where[path]
            targets[path] = LLMDataDist(LLMRole.PROMPT, cluster_id, daemon=daemon.client_target)
            await targets[path].init(options(pool_bytes, remote_access))
        infos = [LLMClusterInfo.for_peer(where[p][0], where[p][1].peer_address) for p in paths]
        status, per_cluster = await initiator.link_clusters(infos, timeout=10000)
        if status != LLMStatusCode.LLM_SUCCESS:
            raise RuntimeError(f"link_clusters failed: {status} {per_cluster}")
        yield Clusters(initiator, targets)
    finally:
        for dd in (initiator, *targets.values()):
            if dd.is_initialized:
                await dd.finalize()


def slot_desc(block: int, nblocks: int, slots: int) -> CacheDesc:
    """``nblocks`` tensors of ``[slots, block]`` bytes: one slot of every tensor is a request.

    Tensors are ``slots * block`` apart, so with two or more slots the blocks
    of one request are separate ranges the daemon cannot merge.
    """
    return CacheDesc(nblocks, [slots, block], DataType.DT_UINT8)


def slots_for(block: int, nblocks: int, cold_bytes: int) -> int:
    """Slots so a cache spans about ``cold_bytes`` (at least two: see :func:`slot_desc`)."""
    return max(2, cold_bytes // (block * nblocks))


def pool_bytes_for(cold_bytes: int) -> int:
    """A cluster's pool: one cold cache plus room for the small probe caches."""
    return cold_bytes + 64 * MIB
