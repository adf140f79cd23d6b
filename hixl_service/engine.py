"""The daemon's state and rules: sessions, clusters, caches, links, pulls.

Plain asyncio, no gRPC: the servicers translate messages into these calls and
``peer_client`` implements the calls this engine makes on other daemons.
State changes happen in synchronous steps; slow work (native copies, socket
setup, unregistering regions) happens afterwards, off the event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import hixl_native

from hixl_client.status import LLMException, LLMStatusCode
from hixl_client.types import LLMRole, Placement
from hixl_wire.compat import timeout

from .ascend.hccl_link import HcclInbound, HcclLink, region_pairs
from .cluster import Cluster, ClusterSettings
from .copier import Copier
from .links import (
    TRANSPORT_HCCL,
    TRANSPORT_LOCAL,
    TRANSPORT_TCP,
    CompletionDispatcher,
    InboundLink,
    OutboundLink,
)
from .load import TransferLoad
from .peer_api import (
    PROTOCOL_VERSION,
    CacheRefSpec,
    IdRef,
    KeyRef,
    PeerApi,
    PeerHello,
    ResolvedCache,
)
from .pools import Memory, Pool, PoolManager, UserBuffer
from .registry import CacheEntry, KeySpec

if TYPE_CHECKING:
    from .ascend.backend import AscendBackend

logger = logging.getLogger(__name__)


@dataclass
class Session:
    """One attached client connection; owns at most one cluster."""

    session_id: str
    client_pid: int
    client_name: str
    cluster: Cluster | None = None
    # The transfer lane's use, for the admin status.
    lane_connections: int = 0
    lane_calls: int = 0


@dataclass(frozen=True)
class NewCache:
    """The layout of a cache to allocate, checked by the servicer."""

    num_tensors: int
    tensor_size: int
    batch_size: int
    placement: Placement
    blocks: bool = False
    blocks_model_id: int | None = None


@dataclass
class PeerLaneInfo:
    """The peer lane as the admin status shows it."""

    port: int = 0  # set once it listens; 0: no peer lane
    calls: int = 0  # calls it accepted


@dataclass
class EngineDeps:
    """What the engine is built from (the server wires the real ones)."""

    daemon_id: str
    version: str
    pools: PoolManager
    data_server: hixl_native.DataServer
    data_host: str
    peer_factory: Callable[[str], PeerApi]
    copier: Copier
    dispatcher: CompletionDispatcher
    streams_per_link: int = 4
    connect_timeout_s: float = 3.0
    started: float = field(default_factory=time.monotonic)
    backend: str = "host"  # pool.backend: "host" or "hccl"
    ascend: AscendBackend | None = None  # set with the hccl backend
    peer_lane: PeerLaneInfo = field(default_factory=PeerLaneInfo)
    # The dispatcher's too: it decides inline waits and copies by it (see load.py).
    load: TransferLoad = field(default_factory=TransferLoad)


@dataclass(frozen=True)
class DeviceRegion:
    """Device memory linked peers may reach over HCCL (the TCP data server's
    region table, for memory it cannot see)."""

    memory: Memory
    offset: int
    size: int
    cluster_id: int
    writable: bool


class Engine:
    """Owns every session, cluster, cache and link of the daemon."""

    def __init__(self, deps: EngineDeps) -> None:
        self.deps = deps
        self.daemon_id = deps.daemon_id
        self.pools = deps.pools
        self.sessions: dict[str, Session] = {}
        self.clusters: dict[int, Cluster] = {}
        self.inbound: dict[int, InboundLink] = {}
        self._region_ids = itertools.count(1)
        self._buffer_ids = itertools.count(1)
        self._initializing: set[int] = set()
        self._closing = False
        self.device_regions: dict[int, DeviceRegion] = {}
        self._background: set[asyncio.Task[None]] = set()

    # -- sessions and clusters --------------------------------------------

    def attach(self, client_pid: int, client_name: str) -> Session:
        if self._closing:
            raise LLMException("the daemon is shutting down",
                               status_code=LLMStatusCode.LLM_FAILED)
        session = Session(secrets.token_hex(16), client_pid, client_name)
        self.sessions[session.session_id] = session
        logger.info("session %s attached (pid %d, %s)", session.session_id, client_pid,
                    client_name or "unnamed")
        return session

    def session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise LLMException("unknown or expired session; attach again",
                               status_code=LLMStatusCode.LLM_FAILED)
        return session

    async def detach(self, session: Session) -> None:
        """End a session (client gone): free everything it owned."""
        if self.sessions.pop(session.session_id, None) is None:
            return
        if session.cluster is not None:
            await self.finalize(session)
        logger.info("session %s detached", session.session_id)

    async def init_cluster(self, session: Session, cluster_id: int, role: LLMRole,
                           options: dict[str, str]) -> Cluster:
        if session.cluster is not None:
            raise LLMException(f"this session already initialized cluster "
                               f"{session.cluster.cluster_id}",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        if cluster_id in self.clusters or cluster_id in self._initializing:
            raise LLMException(f"cluster_id {cluster_id} is already in use on this daemon",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        settings = ClusterSettings.from_options(options)
        if self.deps.ascend is not None:
            self.deps.ascend.device(settings.device_id)  # refuses a device not served here
        cluster = Cluster(cluster_id, role, session.session_id, dict(options), settings)
        # Creating pools awaits: hold the id meanwhile, so that it cannot be taken twice.
        self._initializing.add(cluster_id)
        try:
            for placement, spec in ((Placement.DEVICE, settings.device_pool),
                                    (Placement.HOST, settings.host_pool)):
                if spec is not None:
                    cluster.pools[placement] = await self.pools.create(
                        cluster_id, placement, spec, settings.device_id)
        except BaseException:
            for pool in cluster.pools.values():
                await self.pools.destroy(pool)
            raise
        finally:
            self._initializing.discard(cluster_id)
        if session.session_id not in self.sessions:  # the client left while we waited
            for pool in cluster.pools.values():
                await self.pools.destroy(pool)
            raise LLMException("the session ended during init",
                               status_code=LLMStatusCode.LLM_FAILED)
        self.clusters[cluster_id] = cluster
        session.cluster = cluster
        logger.info("cluster %d initialized (%s)", cluster_id, role.name)
        return cluster

    def cluster_of(self, session: Session) -> Cluster:
        if session.cluster is None or session.cluster.closed:
            raise LLMException("the session has no initialized cluster; call init first",
                               status_code=LLMStatusCode.LLM_FAILED)
        return session.cluster

    async def finalize(self, session: Session) -> None:
        """Tear down the session's cluster: links, caches, pools."""
        cluster, session.cluster = session.cluster, None
        if cluster is None or cluster.closed:
            return
        cluster.closed = True
        self.clusters.pop(cluster.cluster_id, None)
        links = list(cluster.links.values())
        cluster.links.clear()
        await asyncio.gather(*(self._close_link(link, notify=True) for link in links))
        for token in [t for t, i in self.inbound.items() if i.dst_cluster_id == cluster.cluster_id]:
            self._drop_inbound(token)
        for entry in cluster.registry.drain():
            await self._unregister_region(entry.region_id)
        for pool in cluster.pools.values():
            await self.pools.destroy(pool)
        for buffer in cluster.buffers.values():  # unmapped here, never freed: the user's
            buffer.closed = True
            await buffer.wait_unpinned()
            await asyncio.to_thread(buffer.release)
        logger.info("cluster %d finalized", cluster.cluster_id)

    async def close(self) -> None:
        """Drain: end every session, then release native resources."""
        self._closing = True
        for session in list(self.sessions.values()):
            await self.detach(session)
        for token in list(self.inbound):
            self._drop_inbound(token)
        await asyncio.gather(*self._background, return_exceptions=True)
        self.deps.copier.close()  # its threads post to the dispatcher's queue: first
        self.deps.dispatcher.close()

    # -- caches ---------------------------------------------------------------

    def allocate(self, cluster: Cluster, spec: NewCache, keys: list[KeySpec]) -> CacheEntry:
        pool = cluster.pool_for(spec.placement)
        registry = cluster.registry
        if spec.blocks_model_id is not None:
            registry.check_blocks_key(spec.blocks_model_id)
        if not spec.blocks:
            registry.check_keys(keys, spec.batch_size)
        cache_id = registry.reserve_id()
        offset, size, tensor_offsets = pool.alloc_cache(spec.num_tensors, spec.tensor_size)
        region_id = next(self._region_ids)
        writable = cluster.settings.remote_cache_accessible
        try:
            self._register_region(region_id, pool, offset, size, cluster,
                                  self._peer_writable(cluster, writable))
        except BaseException:
            pool.allocator.free(offset)
            raise
        entry = CacheEntry(cache_id=cache_id, blocks=spec.blocks, num_tensors=spec.num_tensors,
                           tensor_size=spec.tensor_size, batch_size=spec.batch_size,
                           memory=pool, extent_offset=offset, extent_size=size,
                           tensor_offsets=tensor_offsets, region_id=region_id,
                           blocks_model_id=spec.blocks_model_id, writable=writable)
        registry.add(entry, keys)
        return entry

    async def deallocate(self, cluster: Cluster, cache_id: int, blocks: bool) -> None:
        await self._free(cluster.registry.release(cache_id, blocks))

    async def remove_key(self, cluster: Cluster, key: KeySpec) -> None:
        await self._free(cluster.registry.remove_key(key))

    async def _free(self, entry: CacheEntry | None) -> None:
        if entry is None:
            return
        await self._unregister_region(entry.region_id)
        if entry.registered or entry.memory.closed:
            return  # the user's memory, or the whole pool went away with its cluster
        assert isinstance(entry.memory, Pool)
        entry.memory.allocator.free(entry.extent_offset)

    def _register_region(self, region_id: int, memory: Memory, offset: int, size: int,
                         cluster: Cluster, writable: bool) -> None:
        """Make [offset, offset + size) of ``memory`` reachable by linked peers."""
        if memory.on_device:
            self.device_regions[region_id] = DeviceRegion(memory, offset, size,
                                                          cluster.cluster_id, writable)
        else:
            self.deps.data_server.register_region(region_id, memory.native, offset, size,
                                                  cluster.cluster_id, writable)

    async def _unregister_region(self, region_id: int) -> None:
        if self.device_regions.pop(region_id, None) is not None:
            return  # HCCL batches in flight pin the memory itself
        # Waits for data-plane reads of the region that already started.
        await asyncio.to_thread(self.deps.data_server.unregister_region, region_id)

    # -- registered memory ------------------------------------------------------

    def add_user_buffer(self, upload_token: bytes, fd: int) -> int:
        """Map a client's shareable buffer (fd from the fd socket); return its id."""
        cluster = next((c for c in self.clusters.values()
                        if secrets.compare_digest(c.upload_token, upload_token)), None)
        if cluster is None:
            raise LLMException("unknown upload token", status_code=LLMStatusCode.LLM_FAILED)
        size = os.fstat(fd).st_size
        if size <= 0:
            raise LLMException("the uploaded buffer is empty",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        buffer_id = next(self._buffer_ids)
        cluster.buffers[buffer_id] = UserBuffer(buffer_id, cluster.cluster_id,
                                                hixl_native.Mapping(fd, size))
        return buffer_id

    async def import_device_buffer(self, cluster: Cluster, key: str, size: int,
                                   device_id: int) -> int:
        """Import a client's exported device memory (hccl backend); return its buffer id."""
        if self.deps.ascend is None:
            raise LLMException("device buffers need the daemon's hccl backend",
                               status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
        if device_id != cluster.settings.device_id:
            raise LLMException(f"the buffer is on device {device_id}, the cluster on "
                               f"{cluster.settings.device_id}",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        imported = await self.deps.ascend.import_buffer(device_id, key, size)
        buffer_id = next(self._buffer_ids)
        cluster.buffers[buffer_id] = UserBuffer(buffer_id, cluster.cluster_id, device=imported)
        return buffer_id

    def register(self, cluster: Cluster, spec: NewCache, buffer_id: int,
                 tensor_offsets: list[int], keys: list[KeySpec], remote_accessible: bool,
                 buffer_address: int = 0) -> tuple[CacheEntry, list[CacheEntry]]:
        """Describe user memory as a cache; return it and caches its keys orphaned."""
        buffer = cluster.buffers.get(buffer_id)
        if buffer is None:
            raise LLMException(f"buffer {buffer_id} was not uploaded by this cluster",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        if len(tensor_offsets) != spec.num_tensors:
            raise LLMException(f"{len(tensor_offsets)} addresses for {spec.num_tensors} tensors",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        if buffer_address:
            buffer.client_base = buffer_address
        if any(o + spec.tensor_size > buffer.size for o in tensor_offsets):
            raise LLMException("a tensor runs past the end of its shareable buffer",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        if spec.blocks_model_id is not None:
            cluster.registry.check_blocks_key(spec.blocks_model_id)
        start = min(tensor_offsets)
        span = max(tensor_offsets) + spec.tensor_size - start
        region_id = next(self._region_ids)
        self._register_region(region_id, buffer, start, span, cluster,
                              self._peer_writable(cluster, remote_accessible))
        entry = CacheEntry(cache_id=cluster.registry.reserve_id(), blocks=spec.blocks,
                           num_tensors=spec.num_tensors, tensor_size=spec.tensor_size,
                           batch_size=spec.batch_size, memory=buffer, extent_offset=start,
                           extent_size=span, tensor_offsets=list(tensor_offsets),
                           region_id=region_id, blocks_model_id=spec.blocks_model_id,
                           writable=remote_accessible, registered=True)
        return entry, cluster.registry.add_registered(entry, keys)

    async def unregister(self, cluster: Cluster, cache_id: int) -> None:
        entry = cluster.registry.unregister(cache_id)
        if entry is not None:
            await self._unregister_region(entry.region_id)

    async def free_all(self, entries: list[CacheEntry]) -> None:
        for entry in entries:
            await self._free(entry)

    def switch_role(self, cluster: Cluster, role: LLMRole) -> None:
        """Relabel a cluster; refused while links exist, as LLM-DataDist does."""
        inbound = any(i.dst_cluster_id == cluster.cluster_id for i in self.inbound.values())
        if cluster.links or inbound:
            raise LLMException("unlink every cluster before switching roles",
                               status_code=LLMStatusCode.LLM_EXIST_LINK)
        cluster.role = role

    # -- links ------------------------------------------------------------------

    def accept_link(self, protocol_version: int, src_daemon_id: str, src_cluster_id: int,
                    dst_cluster_id: int, backend: str = "host") -> PeerHello:
        """Peer side of a link: authorize a token for one of our clusters."""
        if protocol_version != PROTOCOL_VERSION:
            raise LLMException(f"peer protocol {protocol_version} is not {PROTOCOL_VERSION}",
                               status_code=LLMStatusCode.LLM_LINK_FAILED)
        if backend != self.deps.backend:
            raise LLMException(f"daemon {src_daemon_id} runs the {backend!r} backend and daemon "
                               f"{self.daemon_id} the {self.deps.backend!r} one; link daemons "
                               f"of one backend", status_code=LLMStatusCode.LLM_LINK_FAILED)
        cluster = self.clusters.get(dst_cluster_id)
        if cluster is None:
            raise LLMException(f"cluster {dst_cluster_id} is not initialized on daemon "
                               f"{self.daemon_id}", status_code=LLMStatusCode.LLM_LINK_FAILED)
        token = secrets.randbits(64) or 1
        inbound = InboundLink(token, src_daemon_id, src_cluster_id, dst_cluster_id)
        if self.deps.ascend is not None and src_daemon_id != self.daemon_id:
            inbound.hccl = HcclInbound(self.deps.ascend.device(cluster.settings.device_id))
        self.inbound[token] = inbound
        self.deps.data_server.authorize(token, dst_cluster_id)
        logger.info("cluster %d of daemon %s linked to cluster %d", src_cluster_id,
                    src_daemon_id, dst_cluster_id)
        return PeerHello(self.daemon_id, self.deps.version, self.deps.data_host,
                         self.deps.data_server.port, token, self.deps.backend,
                         self.deps.peer_lane.port)

    def drop_inbound_link(self, token: int) -> None:
        if token not in self.inbound:
            raise LLMException("unknown link", status_code=LLMStatusCode.LLM_NOT_YET_LINK)
        self._drop_inbound(token)

    def _drop_inbound(self, token: int) -> None:
        inbound = self.inbound.pop(token, None)
        self.deps.data_server.revoke(token)
        if inbound is not None and inbound.hccl is not None:
            # Waits for a running batch (bounded by its deadline): in the background.
            self._in_background(inbound.hccl.close())

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def link(self, cluster: Cluster, remote_cluster_id: int, address: str,
                   timeout_s: float) -> OutboundLink:
        """Open a link from ``cluster`` to a cluster of the daemon at ``address``."""
        if remote_cluster_id == cluster.cluster_id:
            raise LLMException("a cluster cannot link to itself",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        if remote_cluster_id in cluster.links:
            raise LLMException(f"already linked to cluster {remote_cluster_id}",
                               status_code=LLMStatusCode.LLM_ALREADY_LINK)
        peer = self.deps.peer_factory(address)
        try:
            async with timeout(timeout_s):
                link = await self._open_link(cluster, remote_cluster_id, peer, timeout_s)
        except asyncio.TimeoutError:
            raise LLMException(f"linking to {address} timed out after {timeout_s:.3f} s",
                               status_code=LLMStatusCode.LLM_LINK_FAILED) from None
        if cluster.closed or remote_cluster_id in cluster.links:
            await self._close_link(link, notify=True)
            raise LLMException(f"already linked to cluster {remote_cluster_id}",
                               status_code=LLMStatusCode.LLM_ALREADY_LINK)
        cluster.links[remote_cluster_id] = link
        logger.info("cluster %d linked to cluster %d at %s over %s", cluster.cluster_id,
                    remote_cluster_id, address, link.transport)
        return link

    async def _open_link(self, cluster: Cluster, remote_cluster_id: int, peer: PeerApi,
                         timeout_s: float) -> OutboundLink:
        hello = await peer.hello(self.daemon_id, cluster.cluster_id, remote_cluster_id,
                                 self.deps.connect_timeout_s, self.deps.backend)
        link = OutboundLink(cluster.cluster_id, remote_cluster_id, peer.address,
                            hello.daemon_id, hello.token, TRANSPORT_LOCAL, peer)
        if hello.daemon_id == self.daemon_id:  # the address is ours: copy pool to pool
            try:
                self._check_local_devices(cluster, remote_cluster_id)
            except LLMException:
                await self._notify_unlink(link)
                raise
            return link
        if self.deps.ascend is not None:
            return await self._open_hccl_link(cluster, link, peer, timeout_s)
        link.transport = TRANSPORT_TCP
        try:
            link.data = await asyncio.to_thread(
                hixl_native.DataLink, hello.data_host, hello.data_port, hello.token,
                self.deps.streams_per_link, self.deps.dispatcher.queue,
                int(self.deps.connect_timeout_s * 1000))
        except hixl_native.NativeError as exc:
            await self._notify_unlink(link)
            raise LLMException(f"cannot open the data plane to {hello.data_host}:"
                               f"{hello.data_port}: {exc}",
                               status_code=LLMStatusCode.LLM_LINK_FAILED) from exc
        except BaseException:
            await self._notify_unlink(link)
            raise
        return link

    def _check_local_devices(self, cluster: Cluster, remote_cluster_id: int) -> None:
        """Device memory is copied with ACL inside one daemon, which stays on one device."""
        remote = self.clusters.get(remote_cluster_id)
        if self.deps.ascend is None or remote is None:
            return
        mine, theirs = cluster.settings.device_id, remote.settings.device_id
        if mine != theirs:
            raise LLMException(f"clusters {cluster.cluster_id} (device {mine}) and "
                               f"{remote_cluster_id} (device {theirs}) share a daemon but not a "
                               f"device; ACL copies inside a daemon stay on one device",
                               status_code=LLMStatusCode.LLM_LINK_FAILED)

    async def _open_hccl_link(self, cluster: Cluster, link: OutboundLink, peer: PeerApi,
                              timeout_s: float) -> OutboundLink:
        assert self.deps.ascend is not None
        link.transport = TRANSPORT_HCCL
        link.hccl = HcclLink(self.deps.ascend.device(cluster.settings.device_id), peer,
                             link.token)
        try:
            await link.hccl.connect(timeout_s)
        except BaseException:
            await link.hccl.close()
            await self._notify_unlink(link)
            raise
        return link

    async def unlink(self, cluster: Cluster, remote_cluster_id: int, force: bool) -> None:
        link = cluster.links.pop(remote_cluster_id, None)
        if link is None:
            raise LLMException(f"not linked to cluster {remote_cluster_id}",
                               status_code=LLMStatusCode.LLM_UNLINK_FAILED)
        if not await self._close_link(link, notify=not force):
            raise LLMException(f"cluster {remote_cluster_id} could not be told of the unlink; "
                               f"unlink on its side too",
                               status_code=LLMStatusCode.LLM_NOTIFY_PROMPT_UNLINK_FAILED)

    async def _close_link(self, link: OutboundLink, notify: bool) -> bool:
        if link.data is not None:
            await asyncio.to_thread(link.close)
        if link.hccl is not None:
            await link.hccl.close()
        return await self._notify_unlink(link) if notify else True

    async def _notify_unlink(self, link: OutboundLink) -> bool:
        if link.remote_daemon_id == self.daemon_id:
            self._drop_inbound(link.token)
            return True
        if link.peer is None:
            return True
        try:
            await link.peer.unlink(link.token, self.deps.connect_timeout_s)
            return True
        except LLMException as exc:
            logger.warning("could not tell %s about an unlink: %s", link.remote_peer_address, exc)
            return False

    # -- resolving caches for pulls ----------------------------------------------

    @staticmethod
    def _lookup(cluster: Cluster, ref: CacheRefSpec) -> tuple[CacheEntry, int]:
        if isinstance(ref, KeyRef):
            binding = cluster.registry.lookup_key(ref.key)
            return binding.cache, binding.batch_index
        if isinstance(ref, IdRef):
            entry = cluster.registry.get(ref.cache_id)
            return entry, ref.batch_index
        return cluster.registry.lookup_blocks(ref.model_id), 0

    def _inbound_cluster(self, token: int) -> Cluster:
        inbound = self.inbound.get(token)
        cluster = self.clusters.get(inbound.dst_cluster_id) if inbound is not None else None
        if cluster is None:
            raise LLMException("the link is gone; link again",
                               status_code=LLMStatusCode.LLM_NOT_YET_LINK)
        return cluster

    def resolve_for_peer(self, token: int, ref: CacheRefSpec) -> ResolvedCache:
        """Peer side of a pull: describe the cache a linked cluster asks for."""
        cluster = self._inbound_cluster(token)
        if ref.cluster_id != cluster.cluster_id:
            raise LLMException(f"the link reaches cluster {cluster.cluster_id}, "
                               f"not {ref.cluster_id}",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        entry, batch_index = self._lookup(cluster, ref)
        return ResolvedCache(entry.cache_id, entry.region_id,
                             tuple(o - entry.extent_offset for o in entry.tensor_offsets),
                             entry.tensor_size, entry.batch_size, batch_index, entry.blocks,
                             entry.writable)

    async def release_for_peer(self, token: int, key: KeySpec,
                               tensor_indices: list[int]) -> None:
        """Peer side of a completed pull by key: account it, maybe free the cache."""
        cluster = self._inbound_cluster(token)
        await self._free(cluster.registry.record_pull(key, tensor_indices))

    @staticmethod
    def translate(cluster: Cluster, address: int, length: int) -> tuple[CacheEntry, int]:
        """Find the cache whose memory holds [address, address + length) in the client's
        address space; return it and the offset inside its region."""
        for entry in cluster.registry.caches():
            base = entry.memory.client_base
            if base is None:
                continue
            start = base + entry.extent_offset
            if start <= address and address + length <= start + entry.extent_size:
                return entry, address - start
        raise LLMException(f"[{address:#x}, +{length}) is not inside a cache of cluster "
                           f"{cluster.cluster_id}", status_code=LLMStatusCode.LLM_PARAM_INVALID)

    def resolve_addresses_for_peer(self, token: int, addresses: list[int],
                                   length: int) -> list[tuple[int, int, bool]]:
        """Peer side of a TransferConfig: (region, offset, writable) per address."""
        cluster = self._inbound_cluster(token)
        found = [self.translate(cluster, a, length) for a in addresses]
        return [(entry.region_id, offset, self._peer_writable(cluster, entry.writable))
                for entry, offset in found]

    async def hccl_connect_for_peer(self, token: int, root_info: bytes) -> None:
        """Peer side of an HCCL link: join the communicator the linking daemon created."""
        inbound = self.inbound.get(token)
        if inbound is None or inbound.hccl is None:
            raise LLMException("the link is gone or not an HCCL link; link again",
                               status_code=LLMStatusCode.LLM_NOT_YET_LINK)
        await inbound.hccl.connect(root_info)

    async def hccl_post_for_peer(self, token: int, send: bool, region_id: int, ranges: bytes,
                                 timeout_ms: int) -> None:
        """Peer side of an HCCL transfer: check the ranges, queue our half of the batch."""
        inbound = self.inbound.get(token)
        if inbound is None or inbound.hccl is None:
            raise LLMException("the link is gone or not an HCCL link; link again",
                               status_code=LLMStatusCode.LLM_NOT_YET_LINK)
        region = self.device_regions.get(region_id)
        if region is None or region.cluster_id != inbound.dst_cluster_id:
            raise LLMException(f"region {region_id} is not a device cache of cluster "
                               f"{inbound.dst_cluster_id} (freed, or never there)",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        if not send and not region.writable:
            raise LLMException(f"region {region_id} of cluster {inbound.dst_cluster_id} is not "
                               f"writable by linked peers",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        pairs = region_pairs(ranges, region_id, region.offset, region.size)
        await inbound.hccl.post(send, region.memory, pairs, timeout_ms)

    async def share_device_pools(self, cluster: Cluster, tgid: int) -> list[tuple[int, str]]:
        """Let a client process import the cluster's device pools; (pool id, key) each."""
        ascend = self.deps.ascend
        if ascend is None:
            return []
        return [(pool.pool_id, await asyncio.to_thread(ascend.share, pool, tgid))
                for pool in cluster.pools.values() if pool.on_device]

    @staticmethod
    def _peer_writable(cluster: Cluster, remote_accessible: bool) -> bool:
        """May linked peers write into a cache? (its region's data-plane permission)

        In remote-cache-accessible mode, only caches marked remote-accessible.
        Otherwise LLM-DataDist's contract is TransferConfig: a linked peer writes
        to the addresses its user names, so every cache of the cluster is open
        to it; a push by key or id still needs a remote-accessible cache.
        """
        return remote_accessible or not cluster.settings.remote_cache_accessible

    def lookup_local(self, link: OutboundLink,
                     ref: CacheRefSpec) -> tuple[Cluster, CacheEntry, int]:
        """Find the source of a pull over a local link."""
        source = self.clusters.get(link.remote_cluster_id)
        if source is None or link.token not in self.inbound:
            raise LLMException(f"cluster {link.remote_cluster_id} is gone; link again",
                               status_code=LLMStatusCode.LLM_NOT_YET_LINK)
        entry, batch_index = self._lookup(source, ref)
        return source, entry, batch_index

    async def record_local_pull(self, source: Cluster, key: KeySpec,
                                tensor_indices: list[int]) -> None:
        await self._free(source.registry.record_pull(key, tensor_indices))


__all__ = ["Engine", "EngineDeps", "NewCache", "Session"]
