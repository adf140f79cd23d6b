"""The Peer service: what other daemons call on this one.

Challenge and Hello are gRPC only (never on the peer lane): they need the
call's credentials, which say who links (``trust.Trust.identity_of``), and
both count against the Hello rate before anything else is looked at.

A servicer bound to a cluster serves that cluster's own listener (its
listen_ip_info, ``cluster_listeners``): a Hello there must name the cluster,
and a call naming a link by token is served only for links to it (another
link's token is answered as an unknown one).
"""

from __future__ import annotations

from hixl_wire._proto.hixl.v1 import peer_pb2, peer_pb2_grpc
from hixl_wire.status import LLMException, LLMStatusCode

from .ascend.comms import CommSpec
from .calls import CallInfo, GrpcContext, unary
from .engine import Engine
from .peer_client import PEER_CALLS, key_from_proto, ref_from_proto
from .rpc_errors import CallRefused, abort_with, handler_error
from .trust import HelloFacts

# A linking daemon's watch on an HCCL communicator (HcclTeardown) waits at most this.
MAX_TEARDOWN_WAIT_MS = 10_000


def _comm_name(name: str) -> str:
    """An HCCL communicator name a peer may send (HCCL's limit: 128 bytes)."""
    if not name or len(name) >= 128 or not name.isascii():
        raise LLMException(f"not a communicator name: {name[:140]!r}",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID)
    return name


class PeerServicer(peer_pb2_grpc.PeerServicer):
    """Handlers of the Peer service."""

    def __init__(self, engine: Engine, cluster_id: int | None = None) -> None:
        self._engine = engine
        self._cluster_id = cluster_id  # None: the daemon's peer port, every cluster

    def _token(self, token: int) -> int:
        """``token``, if a call naming it may be served here."""
        if self._cluster_id is not None:
            found = self._engine.inbound.dst_cluster_of(token)
            if found is not None and found != self._cluster_id:
                raise LLMException("unknown link", status_code=LLMStatusCode.LLM_NOT_YET_LINK)
        return token

    def call_failed(self, method: str, error: LLMException) -> None:
        """Refusals of peers are counted by reason (``rpc_errors.FailureHook``)."""
        if isinstance(error, CallRefused):
            self._engine.deps.stats.call_refused(error.reason)

    async def Challenge(self, request: peer_pb2.ChallengeRequest,
                        context: GrpcContext) -> peer_pb2.ChallengeReply:
        trust = self._engine.deps.trust
        try:
            self._engine.drain.refuse_new("links")
            trust.hello_gate.admit()
            if trust.mode != "token":
                raise LLMException(f"this daemon does not use token authentication "
                                   f"(security.mode = {trust.mode!r})",
                                   status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
            return peer_pb2.ChallengeReply(nonce=trust.challenges.issue())
        except Exception as exc:
            error = handler_error("Challenge", exc)
            self.call_failed("Challenge", error)
            await abort_with(context, error)

    async def Hello(self, request: peer_pb2.HelloRequest,
                    context: GrpcContext) -> peer_pb2.HelloReply:
        trust = self._engine.deps.trust
        try:
            self._engine.drain.refuse_new("links")
            trust.hello_gate.admit()
            identity = trust.identity_of(context)
            facts = (HelloFacts(request.challenge, request.client_nonce, request.daemon_id,
                                request.src_cluster_id, request.dst_cluster_id)
                     if request.challenge else None)
            hello = self._engine.inbound.accept_link(
                request.protocol_version, request.daemon_id, request.src_cluster_id,
                request.dst_cluster_id, request.backend or "host", identity, facts,
                request.proof, listener_of=self._cluster_id,
                peer_calls=tuple(request.peer_calls))
        except Exception as exc:
            error = handler_error("Hello", exc)
            self.call_failed("Hello", error)
            await abort_with(context, error)
        return peer_pb2.HelloReply(protocol_version=request.protocol_version,
                                   daemon_id=hello.daemon_id, version=hello.version,
                                   data_host=hello.data_host, data_port=hello.data_port,
                                   link_token=hello.token, backend=hello.backend,
                                   lane_port=hello.lane_port, link_key=hello.link_key,
                                   server_proof=hello.server_proof, lease_ms=hello.lease_ms,
                                   peer_calls=PEER_CALLS)

    @unary
    async def ResolveCache(self, request: peer_pb2.ResolveCacheRequest,
                           context: CallInfo) -> peer_pb2.ResolveCacheReply:
        ref = ref_from_proto(request.ref)
        if ref is None:
            raise LLMException("the request names no cache",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        token = self._token(request.link_token)
        found = self._engine.inbound.resolve_for_peer(token, ref)
        return peer_pb2.ResolveCacheReply(
            cache_id=found.cache_id, region_id=found.region_id,
            tensor_offsets=found.tensor_offsets, tensor_size=found.tensor_size,
            stride=found.tensor_size // found.batch_size, batch_size=found.batch_size,
            batch_index=found.batch_index, blocks=found.blocks, writable=found.writable)

    @unary
    async def ReleaseKey(self, request: peer_pb2.ReleaseKeyRequest,
                         context: CallInfo) -> peer_pb2.ReleaseKeyReply:
        token = self._token(request.link_token)
        await self._engine.inbound.release_for_peer(token, key_from_proto(request.key),
                                            list(request.tensor_indices))
        return peer_pb2.ReleaseKeyReply()

    @unary
    async def ResolveAddresses(self, request: peer_pb2.ResolveAddressesRequest,
                               context: CallInfo) -> peer_pb2.ResolveAddressesReply:
        token = self._token(request.link_token)
        found = self._engine.inbound.resolve_addresses_for_peer(
            token, list(request.addresses), request.length)
        return peer_pb2.ResolveAddressesReply(region_ids=[r for r, _, _ in found],
                                              offsets=[o for _, o, _ in found],
                                              writable=[w for _, _, w in found])

    @unary
    async def Notify(self, request: peer_pb2.NotifyRequest,
                     context: CallInfo) -> peer_pb2.NotifyReply:
        self._engine.inbound.notify_for_peer(self._token(request.link_token), request.name,
                                             request.message)
        return peer_pb2.NotifyReply()

    @unary
    async def Unlink(self, request: peer_pb2.UnlinkRequest,
                     context: CallInfo) -> peer_pb2.UnlinkReply:
        token = self._token(request.link_token)
        self._engine.inbound.drop_inbound_link(token)
        return peer_pb2.UnlinkReply()

    @unary
    async def Heartbeat(self, request: peer_pb2.HeartbeatRequest,
                        context: CallInfo) -> peer_pb2.HeartbeatReply:
        inbound = self._engine.inbound
        leases = inbound.renew(request.daemon_id, list(request.link_tokens))
        states = [peer_pb2.LeaseState.Name(lease.value) for lease in leases]
        return peer_pb2.HeartbeatReply(daemon_id=self._engine.daemon_id, states=states,
                                       lease_ms=int(inbound.leases.lease_s * 1000))

    @unary
    async def HcclConnect(self, request: peer_pb2.HcclConnectRequest,
                          context: CallInfo) -> peer_pb2.HcclConnectReply:
        spec = CommSpec(root_info=request.root_info, rank_table=request.rank_table,
                        buffer_mb=request.buffer_mb, name=request.comm_name)
        token = self._token(request.link_token)
        one_sided = await self._engine.inbound.hccl_connect_for_peer(token, spec)
        return peer_pb2.HcclConnectReply(one_sided=one_sided)

    @unary
    async def HcclRankInfo(self, request: peer_pb2.HcclRankInfoRequest,
                           context: CallInfo) -> peer_pb2.HcclRank:
        token = self._token(request.link_token)
        info = await self._engine.inbound.hccl_rank_info_for_peer(token)
        super_pod = info.super_device_id is not None and info.super_pod_id is not None
        return peer_pb2.HcclRank(host_ip=info.host_ip, device_id=info.device_id,
                                 device_ip=info.device_ip, soc_name=info.soc,
                                 super_pod=super_pod, super_device_id=info.super_device_id or 0,
                                 super_pod_id=info.super_pod_id or 0)

    @unary
    async def HcclPost(self, request: peer_pb2.HcclPostRequest,
                       context: CallInfo) -> peer_pb2.HcclPostReply:
        token = self._token(request.link_token)
        await self._engine.inbound.hccl_post_for_peer(token, request.send,
                                              request.region_id, request.ranges,
                                              max(1, request.timeout_ms))
        return peer_pb2.HcclPostReply()

    @unary
    async def HcclPrepare(self, request: peer_pb2.HcclPrepareRequest,
                          context: CallInfo) -> peer_pb2.HcclPrepareReply:
        token = self._token(request.link_token)
        await self._engine.inbound.hccl_prepare_for_peer(token,
                                                         max(1, request.timeout_ms))
        return peer_pb2.HcclPrepareReply()

    @unary
    async def HcclReserve(self, request: peer_pb2.HcclReserveRequest,
                          context: CallInfo) -> peer_pb2.HcclReserveReply:
        token = self._token(request.link_token)
        granted, tie_break = self._engine.inbound.hccl_reserve_for_peer(
            token, _comm_name(request.comm_name), request.hold_ms)
        return peer_pb2.HcclReserveReply(granted=granted, tie_break=tie_break)

    @unary
    async def HcclTeardown(self, request: peer_pb2.HcclTeardownRequest,
                           context: CallInfo) -> peer_pb2.HcclTeardownReply:
        token = self._token(request.link_token)
        destroyed = request.step == peer_pb2.HcclTeardownRequest.STEP_DESTROYED
        wait_ms = min(request.wait_ms, MAX_TEARDOWN_WAIT_MS)
        destroy = await self._engine.inbound.hccl_teardown_for_peer(
            token, _comm_name(request.comm_name), destroyed, wait_ms)
        return peer_pb2.HcclTeardownReply(destroy=destroy)

    @unary
    async def HcclDestroy(self, request: peer_pb2.HcclDestroyRequest,
                          context: CallInfo) -> peer_pb2.HcclDestroyReply:
        token = self._token(request.link_token)
        await self._engine.inbound.hccl_destroy_for_peer(token, _comm_name(request.comm_name))
        return peer_pb2.HcclDestroyReply()

    @unary
    async def HcclRegion(self, request: peer_pb2.HcclRegionRequest,
                         context: CallInfo) -> peer_pb2.HcclRegionReply:
        token = self._token(request.link_token)
        found = self._engine.inbound.hccl_region_for_peer(token, request.region_id)
        return peer_pb2.HcclRegionReply(address=found.address, size=found.size,
                                        writable=found.writable, bound=found.bound)
