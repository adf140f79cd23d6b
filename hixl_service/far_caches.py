"""Where a link finds the caches of the cluster it reaches (``links.FarCaches``).

A link's far cluster lives in another daemon (``PeerCaches``: asked over
the Peer API, its answers remembered) or in this one (``DaemonCaches``:
read from this daemon's own registry). The link factory picks one with the
link's transport; transfers ask the link's ``FarCaches`` and never which
kind it holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from hixl_wire.status import LLMException, LLMStatusCode

from .links import FarCache
from .notifies import Notification
from .peer_api import BlocksRef, CacheRefSpec, IdRef, KeyRef, ResolvedCache
from .transports.base import Place

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .cluster import Cluster
    from .peer_api import PeerApi
    from .registry import KeySpec

logger = logging.getLogger(__name__)

# Telling the owner that a keyed slot was pulled is bounded on its own: the
# data already arrived, so a slow owner must not turn success into failure.
RELEASE_TIMEOUT_S = 2.0


def _remembered_as(ref: CacheRefSpec) -> tuple[str, int] | None:
    """Refs whose resolution may be reused: by cache id and by blocks key, not by key."""
    if isinstance(ref, IdRef):
        return ("id", ref.cache_id)
    if isinstance(ref, BlocksRef):
        return ("blocks", ref.model_id)
    return None


class PeerCaches:
    """Caches of a cluster in another daemon, asked for over the Peer API.

    Like LLM-DataDist's copy of the peer's cache index, answers for caches
    named by id or blocks key are remembered, which saves the peer call on
    later transfers; region ids are never reused, so a stale answer can only
    be refused by the far data server, never misdirect bytes.
    """

    def __init__(self, peer: PeerApi, token: int) -> None:
        self._peer = peer
        self._token = token
        self._resolved: dict[tuple[str, int], ResolvedCache] = {}

    async def find(self, ref: CacheRefSpec, wait_s: float, call_timeout_s: float,
                   fresh: bool = False) -> FarCache:
        key = _remembered_as(ref)
        found = self._resolved.get(key) if key is not None and not fresh else None
        cached = found is not None
        if found is None:
            # wait_for, not asyncio.timeout: a lane call may get here in its eager
            # first step, before it has a task (eager.py).
            found = await asyncio.wait_for(
                self._peer.resolve(self._token, ref, call_timeout_s), wait_s)
            if key is not None:
                self._resolved[key] = found
        batch_index = ref.batch_index if isinstance(ref, IdRef) else found.batch_index
        return FarCache(found.layout, batch_index, found.blocks, found.writable,
                        Place(region_id=found.region_id), cached, found)

    def known(self) -> FarCache | None:
        for found in self._resolved.values():
            return FarCache(found.layout, 0, found.blocks, found.writable,
                            Place(region_id=found.region_id), True, found)
        return None

    def forget(self, ref: CacheRefSpec) -> None:
        key = _remembered_as(ref)
        if key is not None:
            self._resolved.pop(key, None)

    def still_current(self, cache_id: int, found: FarCache) -> bool:
        return self._resolved.get(("id", cache_id)) is found.origin

    async def find_addresses(self, addresses: Sequence[int], span: int,
                             wait_s: float) -> list[tuple[Place, int, bool]]:
        resolved = await self._peer.resolve_addresses(self._token, addresses, span,
                                                     max(wait_s, 0.001))
        return [(Place(region_id=region), offset, writable)
                for region, offset, writable in resolved]

    async def release_key(self, ref: KeyRef, tensor_indices: list[int]) -> None:
        try:
            await self._peer.release_key(self._token, ref.key, tensor_indices, RELEASE_TIMEOUT_S)
        except LLMException as exc:
            logger.warning("pulled %s but could not release it on cluster %d: %s",
                           ref.key, ref.cluster_id, exc)

    async def notify(self, src_cluster_id: int, name: str, message: bytes,
                     timeout_s: float) -> None:
        # The far daemon names the sender by the link, not by what we say.
        await self._peer.notify(self._token, name, message, timeout_s)

    async def tell_unlinked(self, timeout_s: float) -> bool:
        try:
            await self._peer.unlink(self._token, timeout_s)
            return True
        except LLMException as exc:
            logger.warning("could not tell %s about an unlink: %s", self._peer.address, exc)
            return False

    @property
    def peer(self) -> PeerApi:
        return self._peer

    def reachable(self) -> bool:
        return True  # the link monitor's heartbeats ask the far daemon


class Daemon(Protocol):
    """What ``DaemonCaches`` reads of this daemon (the engine provides it)."""

    @property
    def clusters(self) -> Mapping[int, Cluster]: ...

    def has_inbound(self, token: int) -> bool: ...

    def drop_inbound(self, token: int) -> None: ...

    async def record_pull(self, source: Cluster, key: KeySpec,
                          tensor_indices: list[int]) -> None: ...


class DaemonCaches:
    """Caches of another cluster of this daemon, read from its registry."""

    def __init__(self, daemon: Daemon, remote_cluster_id: int, token: int) -> None:
        self._daemon = daemon
        self._remote_cluster_id = remote_cluster_id
        self._token = token

    def _owner(self) -> Cluster:
        owner = self._daemon.clusters.get(self._remote_cluster_id)
        if owner is None or not self._daemon.has_inbound(self._token):
            raise LLMException(f"cluster {self._remote_cluster_id} is gone; link again",
                               status_code=LLMStatusCode.LLM_NOT_YET_LINK)
        return owner

    async def find(self, ref: CacheRefSpec, wait_s: float, call_timeout_s: float,
                   fresh: bool = False) -> FarCache:
        entry, batch_index = self._owner().lookup(ref)
        return FarCache(entry.layout, batch_index, entry.blocks, entry.writable,
                        Place(memory=entry.memory), origin=entry)

    def forget(self, ref: CacheRefSpec) -> None:
        return None

    def still_current(self, cache_id: int, found: FarCache) -> bool:
        owner = self._daemon.clusters.get(self._remote_cluster_id)
        return (owner is not None and not owner.closed and self._daemon.has_inbound(self._token)
                and owner.registry.live(cache_id) is found.origin)

    async def find_addresses(self, addresses: Sequence[int], span: int,
                             wait_s: float) -> list[tuple[Place, int, bool]]:
        owner = self._owner()
        found = [owner.find_address(a, span) for a in addresses]
        return [(Place(memory=entry.memory), entry.extent_offset + offset, True)
                for entry, offset in found]

    async def release_key(self, ref: KeyRef, tensor_indices: list[int]) -> None:
        await self._daemon.record_pull(self._owner(), ref.key, tensor_indices)

    async def notify(self, src_cluster_id: int, name: str, message: bytes,
                     timeout_s: float) -> None:
        self._owner().inbox.put(Notification(src_cluster_id, name, message))

    async def tell_unlinked(self, timeout_s: float) -> bool:
        self._daemon.drop_inbound(self._token)
        return True

    def known(self) -> FarCache | None:
        owner = self._daemon.clusters.get(self._remote_cluster_id)
        entries = owner.registry.caches() if owner is not None else []
        for entry in entries:
            if entry.memory.host_copies:  # the self-test reads it into host memory
                return FarCache(entry.layout, 0, entry.blocks, entry.writable,
                                Place(memory=entry.memory), origin=entry)
        return None

    @property
    def peer(self) -> None:
        return None

    def reachable(self) -> bool:
        owner = self._daemon.clusters.get(self._remote_cluster_id)
        return owner is not None and not owner.closed and self._daemon.has_inbound(self._token)
