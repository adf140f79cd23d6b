"""The Admin service: a snapshot of the daemon for operators, and its drain."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from hixl_wire._proto.hixl.v1 import admin_pb2, admin_pb2_grpc
from hixl_wire.status import LLMException, LLMStatusCode

from .calls import CallInfo, unary
from .engine import Engine
from .link_health import LinkState
from .link_views import inbound_health, outbound_health
from .selftest import self_test

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdminFacts:
    """What the Admin service reports of the process around the engine."""

    backend: str
    peer_address: str
    metrics_address: str = ""
    transfer_lane: str = ""


def snapshot(engine: Engine, backend: str, peer_address: str,
             facts: AdminFacts | None = None) -> admin_pb2.DaemonStatus:
    """Build the status message from the engine's current state."""
    engine.native.catch_up()  # the native lanes' transfers logged since the last look
    deps = engine.deps
    status = admin_pb2.DaemonStatus(
        daemon_id=engine.daemon_id, version=deps.version, backend=backend,
        uptime_s=time.monotonic() - deps.started, peer_address=peer_address,
        data_address=f"{deps.data_host}:{deps.data_server.port}",
        peer_lane_address=(f"{deps.data_host}:{deps.peer_lane.port}"
                           if deps.peer_lane.port else ""),
        peer_lane_calls=deps.peer_lane.calls,
        transfers_under_way=deps.load.running + engine.native.under_way,
        pool_budget_bytes=engine.pools.budget_bytes,
        pool_reserved_bytes=engine.pools.reserved_bytes, pid=os.getpid(),
        metrics_address=facts.metrics_address if facts else "",
        transfer_lane=facts.transfer_lane if facts else "",
        refusals=deps.stats.refused,
        engine_memory=deps.process.summary())
    for op, transport, llm_status, calls, nbytes in deps.stats.transfer_counts():
        status.transfers.add(op=op, transport=transport, status=llm_status, calls=calls,
                             bytes=nbytes)
    for session in engine.sessions.values():
        status.sessions.add(session_id=session.session_id, client_pid=session.client_pid,
                            client_name=session.client_name,
                            has_cluster=session.cluster is not None,
                            cluster_id=session.cluster.cluster_id if session.cluster else 0,
                            lane_connections=session.lane_connections,
                            lane_calls=session.lane_calls)
    for cluster in engine.clusters.values():
        status.clusters.add(cluster_id=cluster.cluster_id, role=cluster.role.name,
                            session_id=cluster.session_id, caches=len(cluster.registry),
                            keys=cluster.registry.key_count, options=cluster.options,
                            repeat_shapes=len(cluster.repeats),
                            repeated_transfers=cluster.repeats.repeated,
                            repeats_answered_at_once=cluster.repeats.answered_at_once,
                            repeats_native=cluster.repeats.native,
                            listen_address=cluster.listener.address if cluster.listener else "",
                            listen_shared=bool(cluster.listener and cluster.listener.shared))
        for link in cluster.links.values():
            info = link.info()
            status.links.add(local_cluster_id=link.local_cluster_id,
                             remote_cluster_id=link.remote_cluster_id,
                             remote_daemon_id=link.remote_daemon_id,
                             remote_peer_address=link.remote_peer_address,
                             transport=info.name, streams=info.streams,
                             alive=info.alive, direction="outbound",
                             data_path=info.data_path, health=outbound_health(link))
        for entry in cluster.registry.caches():
            status.caches.add(cluster_id=cluster.cluster_id, cache_id=entry.cache_id,
                              kind="blocks" if entry.blocks else "cache",
                              bytes=entry.extent_size,
                              keys=len(entry.keys) + len(entry.prefix_keys),
                              released=entry.released)
    for inbound in engine.inbound.all():
        status.links.add(local_cluster_id=inbound.dst_cluster_id,
                         remote_cluster_id=inbound.src_cluster_id,
                         remote_daemon_id=inbound.src_daemon_id, direction="inbound",
                         transport=inbound.side.name,
                         alive=inbound.side.alive and inbound.health.state is LinkState.UP,
                         data_path=inbound.side.data_path,
                         health=inbound_health(inbound, engine.inbound))
    if deps.ascend is not None:
        for use in deps.ascend.device_use():
            status.devices.add(device_id=use.device_id, budget_bytes=use.budget_bytes,
                               reserved_bytes=use.reserved_bytes,
                               hccl_buffer_bytes=use.hccl_buffer_bytes,
                               communicators=use.communicators)
    for pool in engine.pools.pools():
        status.pools.add(pool_id=pool.pool_id, cluster_id=pool.cluster_id,
                         placement=pool.placement.name, size=pool.size,
                         used=pool.allocator.used_bytes, free=pool.allocator.free_bytes,
                         page_size=pool.allocator.page_size)
    return status


def summary(engine: Engine) -> str:
    """One line for ``STATUS=`` (what ``systemctl status`` shows): counts, not lists."""
    clusters = engine.clusters.values()
    outbound = sum(len(cluster.links) for cluster in clusters)
    inbound = sum(1 for _ in engine.inbound.all())
    pools = engine.pools
    return (f"serving: {len(engine.sessions.values())} sessions, {len(clusters)} clusters, "
            f"{outbound} links out, {inbound} in, {engine.deps.load.running} transfers under "
            f"way; pools {pools.reserved_bytes >> 20} of {pools.budget_bytes >> 20} MiB")


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """Handlers of the Admin service."""

    def __init__(self, engine: Engine, backend: str, peer_address: str,
                 facts: AdminFacts | None = None,
                 on_drain: Callable[[], None] | None = None, grace_period_s: float = 0.0
                 ) -> None:
        self._engine = engine
        self._backend = backend
        self._peer_address = peer_address
        self._facts = facts or AdminFacts(backend, peer_address)
        self._on_drain = on_drain  # begins the daemon's graceful stop (server.Daemon.stop)
        self._grace_period_s = grace_period_s

    @unary
    async def GetStatus(self, request: admin_pb2.GetStatusRequest,
                        context: CallInfo) -> admin_pb2.DaemonStatus:
        return snapshot(self._engine, self._backend, self._peer_address, self._facts)

    # branch lifecycle: Admin/Drain, the graceful stop of SIGTERM (drain.py).
    @unary
    async def Drain(self, request: admin_pb2.DrainRequest,
                    context: CallInfo) -> admin_pb2.DrainReply:
        if self._on_drain is None:
            raise LLMException("this daemon cannot be drained over Admin",
                               status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
        already = self._engine.drain.draining
        logger.info("Admin/Drain: %s", "the drain has begun already" if already
                    else "beginning the graceful stop")
        self._on_drain()
        return admin_pb2.DrainReply(already_draining=already,
                                    grace_period_s=self._grace_period_s)

    @unary
    async def SelfTest(self, request: admin_pb2.SelfTestRequest,
                       context: CallInfo) -> admin_pb2.SelfTestReply:
        """A short timed read over each outbound link (``selftest``)."""
        reply = admin_pb2.SelfTestReply()
        for result in await self_test(self._engine, request.bytes):
            reply.links.add(local_cluster_id=result.local_cluster_id,
                            remote_cluster_id=result.remote_cluster_id,
                            transport=result.transport, bytes=result.bytes,
                            seconds=result.seconds, skipped=result.skipped, error=result.error)
        return reply
