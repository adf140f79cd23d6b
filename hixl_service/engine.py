"""The daemon's state, composed: sessions, clusters, caches, links, regions.

Plain asyncio, no gRPC: the servicers translate messages into calls on the
parts below, and ``peer_client`` implements the calls the daemon makes on
other daemons. Each part owns one concern:

* ``sessions.Sessions``: attached clients;
* ``caches.Caches``: caches and registered memory of every cluster;
* ``regions.Regions``: what linked peers may reach;
* ``outbound.OutboundLinks`` / ``inbound.InboundLinks``: the two sides of links;
* ``cluster_listeners``: a cluster's own peer listener at its listen_ip_info.

``Engine`` itself owns the cluster table and a cluster's life (init,
finalize) and the daemon's stop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import hixl_native

from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.types import LLMRole, Placement

from .caches import Caches, NewCache
from .cluster import Cluster, ClusterSettings
from .cluster_listeners import ListenerFactory, NoListeners
from .drain import Drain
from .inbound import DaemonFacts, InboundLinks, LeaseSettings, PeerLaneInfo
from .link_monitor import LinkMonitor
from .load import TransferLoad
from .log_keys import keys
from .memory.process import ProcessBackend
from .native_lanes import NativeLanes
from .notifies import check_notification
from .outbound import LinkerSettings, OutboundLinks
from .peer_api import PeerApi
from .pools import PoolManager
from .regions import Regions
from .registry import KeySpec
from .sessions import Session, Sessions
from .stats import DaemonStats
from .transports.factory import TransportKit
from .trust import Trust, insecure_trust

if TYPE_CHECKING:
    from .ascend.backend import AscendBackend

logger = logging.getLogger(__name__)


@dataclass
class EngineDeps:
    """What the engine is built from (the server wires the real ones)."""

    daemon_id: str
    version: str
    pools: PoolManager
    data_server: hixl_native.DataServer
    data_host: str
    peer_factory: Callable[[str], PeerApi]
    # The backend's copier and the completions' dispatcher, and what links are
    # built from (``backends.open_backend``).
    kit: TransportKit
    connect_timeout_s: float = 3.0
    started: float = field(default_factory=time.monotonic)
    backend: str = "host"  # pool.backend: "host" or "hccl"
    ascend: AscendBackend | None = None  # set with the hccl backend
    peer_lane: PeerLaneInfo = field(default_factory=PeerLaneInfo)
    # The dispatcher's too: it decides inline waits and copies by it (see load.py).
    load: TransferLoad = field(default_factory=TransferLoad)
    # [security] and [limits]: who may link, and the links' keys.
    trust: Trust = field(default_factory=insecure_trust)
    # What the daemon counts of its work, for /metrics and the Admin status.
    stats: DaemonStats = field(default_factory=DaemonStats)
    # Engine-allocated client memory: what the kernel allows, and the bounce
    # buffers (each way) that stage it on the data plane (``backends.open_backend``).
    process: ProcessBackend = field(default_factory=ProcessBackend)
    # [transfer] checksum: TCP transfers carry a CRC-32C unless the call says otherwise.
    checksum: bool = False
    # [links]: heartbeats of our links, leases of the links to us.
    linker: LinkerSettings = field(default_factory=LinkerSettings)
    leases: LeaseSettings = field(default_factory=LeaseSettings)


class Engine:
    """Composes the daemon's parts; owns the cluster table."""

    def __init__(self, deps: EngineDeps) -> None:
        self.deps = deps
        self.daemon_id = deps.daemon_id
        self.pools = deps.pools
        self.clusters: dict[int, Cluster] = {}
        self._initializing: set[int] = set()
        self.sessions = Sessions()
        self.drain = Drain(deps.load, lambda: self.native.under_way)
        self.kit = deps.kit
        # Repeats run by native threads, from rings the clients write (native_lanes.py).
        self.native = NativeLanes(deps.stats)
        self.regions = Regions(deps.data_server)
        self.caches = Caches(self.clusters, self.regions, deps.pools, deps.process)
        facts = DaemonFacts(deps.daemon_id, deps.version, deps.data_host, deps.backend,
                            deps.peer_lane)
        self.inbound = InboundLinks(facts, self.clusters, deps.data_server, self.regions,
                                    self.caches, self.kit, deps.trust, deps.stats, deps.leases)
        self.outbound = OutboundLinks(deps.daemon_id, deps.backend, self, self.kit,
                                      deps.peer_factory, deps.connect_timeout_s, deps.stats,
                                      deps.linker)
        # Opens the listener of a cluster with listen_ip_info; the server sets the
        # real one (cluster_listeners.PeerListeners) once its peer port is bound.
        self.listeners: ListenerFactory = NoListeners()
        # Started by the server once the daemon serves.
        self.monitor = LinkMonitor(deps.daemon_id, self.clusters, self.outbound, self.inbound)

    # -- what far_caches.DaemonCaches reads of this daemon ------------------------

    def has_inbound(self, token: int) -> bool:
        return self.inbound.has_inbound(token)

    def drop_inbound(self, token: int) -> None:
        self.inbound.drop_inbound(token)

    async def record_pull(self, source: Cluster, key: KeySpec,
                          tensor_indices: list[int]) -> None:
        await self.caches.record_pull(source, key, tensor_indices)

    # -- sessions and clusters --------------------------------------------

    async def detach(self, session: Session) -> None:
        """End a session (client gone): free everything it owned."""
        if not self.sessions.pop(session):
            return
        if session.cluster is not None:
            await self.finalize(session)
        logger.info("session %s detached", session.session_id,
                    extra=keys(session=session.session_id))

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
        cluster = Cluster(cluster_id, role, session.session_id, dict(options), settings,
                          inbox=session.inbox)
        # Creating pools awaits: hold the id meanwhile, so that it cannot be taken twice.
        self._initializing.add(cluster_id)
        try:
            # The listener first: a taken port fails init before pools are made.
            if settings.listen is not None:
                cluster.listener = await self.listeners.open(cluster_id, settings.listen)
            for placement, spec in ((Placement.DEVICE, settings.device_pool),
                                    (Placement.HOST, settings.host_pool)):
                if spec is not None:
                    cluster.pools[placement] = await self.pools.create(
                        cluster_id, placement, spec, settings.device_id)
        except BaseException:
            await self._undo_init(cluster)
            raise
        finally:
            self._initializing.discard(cluster_id)
        if session.session_id not in self.sessions:  # the client left while we waited
            await self._undo_init(cluster)
            raise LLMException("the session ended during init",
                               status_code=LLMStatusCode.LLM_FAILED)
        self.clusters[cluster_id] = cluster
        session.cluster = cluster
        logger.info("cluster %d initialized (%s)", cluster_id, role.name,
                    extra=keys(session=session.session_id, cluster=cluster_id))
        return cluster

    async def _undo_init(self, cluster: Cluster) -> None:
        """Release what a failed init had made: nothing of it stays behind."""
        if cluster.listener is not None:
            await cluster.listener.close()
        for pool in cluster.pools.values():
            await self.pools.destroy(pool)

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
        if cluster.listener is not None:  # no new link reaches the cluster there
            await cluster.listener.close()
        links = list(cluster.links.values())
        cluster.links.clear()
        await asyncio.gather(*(self.outbound.close(link, notify=True) for link in links))
        for inbound in self.inbound.to_cluster(cluster.cluster_id):
            self.inbound.drop_inbound(inbound.token, f"cluster {cluster.cluster_id} finalized")
        for entry in cluster.registry.drain():
            await self.caches.drop(entry)
        for pool in cluster.pools.values():
            await self.pools.destroy(pool)
        for buffer in list(cluster.buffers.values()):  # unmapped here, never freed: the user's
            buffer.closed = True
            await buffer.wait_unpinned()
            await asyncio.to_thread(buffer.release)
        if cluster.process is not None:
            cluster.process.close()
        logger.info("cluster %d finalized", cluster.cluster_id,
                    extra=keys(session=cluster.session_id, cluster=cluster.cluster_id))

    async def unlink(self, cluster: Cluster, remote_cluster_id: int, force: bool) -> None:
        """unlink_clusters: the link this cluster made to ``remote_cluster_id`` or, when
        it made none, the links that cluster made to this one (the owner drops
        them itself)."""
        if (remote_cluster_id not in cluster.links
                and self.inbound.drop_from(cluster.cluster_id, remote_cluster_id)):
            return
        await self.outbound.unlink(cluster, remote_cluster_id, force)

    async def send_notify(self, cluster: Cluster, remote_cluster_id: int, name: str,
                          message: bytes, timeout_s: float) -> None:
        """Queue a notification for the client of a cluster ``cluster`` linked to
        (``notifies``), within ``timeout_s``.

        Raises:
            LLMException: not linked, the far cluster gone or its inbox full,
                a bound broken (LLM_PARAM_INVALID), or no answer in time (LLM_TIMEOUT).
        """
        check_notification(name, message)
        link = cluster.link_to(remote_cluster_id)
        try:
            # wait_for, not asyncio.timeout: a lane call may get here in its eager first step
            await asyncio.wait_for(
                link.far.notify(cluster.cluster_id, name, message, timeout_s), timeout_s)
        except asyncio.TimeoutError:
            raise LLMException(f"cluster {remote_cluster_id}'s daemon did not take the "
                               f"notification within {timeout_s:g} s",
                               status_code=LLMStatusCode.LLM_TIMEOUT) from None

    def switch_role(self, cluster: Cluster, role: LLMRole) -> None:
        """Relabel a cluster; refused while links exist, as LLM-DataDist does."""
        if cluster.links or self.inbound.to_cluster(cluster.cluster_id):
            raise LLMException("unlink every cluster before switching roles",
                               status_code=LLMStatusCode.LLM_EXIST_LINK)
        cluster.role = role

    def begin_drain(self) -> bool:
        """Refuse new sessions, links and transfers from now on (``drain``); False if
        the drain had begun already."""
        self.sessions.closing = True
        self.inbound.stopping = True  # linkers hear it at their next heartbeat
        self.native.refuse()
        return self.drain.begin()

    async def close(self) -> None:
        """Drain: end every session, then release native resources."""
        self.sessions.closing = True
        await self.monitor.stop()
        await self.native.close_all()
        for session in self.sessions.values():
            await self.detach(session)
        await self.outbound.close_all()
        await self.inbound.close()
        self.kit.copier.close()  # its threads post to the dispatcher's queue: first
        self.kit.dispatcher.close()


__all__ = ["Engine", "EngineDeps", "NewCache", "Session"]
