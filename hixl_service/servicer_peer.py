"""The Peer service: what other daemons call on this one.

Challenge and Hello are gRPC only (never on the peer lane): they need the
call's credentials, which say who links (``trust.Trust.identity_of``), and
both count against the Hello rate before anything else is looked at.

A servicer bound to a cluster serves that cluster's own listener (its
listen_ip_info, ``cluster_listeners``): a Hello there must name the cluster,
and a call naming a link by token is served only for links to it (another
link's token is answered as an unknown one).

The calls a link's transport makes (HCCL's) are the transport's own: the
factory registers their handlers (``transports.factory.PEER_HANDLERS``) and
this servicer serves each by name, through ``InboundLinks.transport_call``.
"""

from __future__ import annotations

from typing import Any

from hixl_wire._proto.hixl.v1 import peer_pb2, peer_pb2_grpc
from hixl_wire.status import LLMException, LLMStatusCode

from .calls import CallInfo, GrpcContext, Unary, unary
from .drain import Drain, refuses_while_draining
from .engine import Engine
from .peer_api import PeerHello
from .peer_client import PEER_CALLS, key_from_proto, ref_from_proto
from .rpc_errors import CallRefused, abort_with, handler_error
from .transports.factory import PEER_HANDLERS
from .trust import HelloFacts


class PeerServicer(peer_pb2_grpc.PeerServicer):
    """Handlers of the Peer service."""

    def __init__(self, engine: Engine, cluster_id: int | None = None) -> None:
        self._engine = engine
        self._cluster_id = cluster_id  # None: the daemon's peer port, every cluster
        self.drain: Drain = engine.drain  # read by refuses_while_draining

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
        try:
            return await self._challenge(request, context)
        except Exception as exc:
            error = handler_error("Challenge", exc)
            self.call_failed("Challenge", error)
            await abort_with(context, error)

    # Challenge and Hello take the call's credentials, so they are not @unary;
    # their steps are, for the drain refusal, inside their handlers' error
    # translation.
    @refuses_while_draining("links")
    async def _challenge(self, request: peer_pb2.ChallengeRequest,
                         context: GrpcContext) -> peer_pb2.ChallengeReply:
        trust = self._engine.deps.trust
        trust.hello_gate.admit()
        if trust.mode != "token":
            raise LLMException(f"this daemon does not use token authentication "
                               f"(security.mode = {trust.mode!r})",
                               status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
        return peer_pb2.ChallengeReply(nonce=trust.challenges.issue())

    @refuses_while_draining("links")
    async def _accept(self, request: peer_pb2.HelloRequest, context: GrpcContext) -> PeerHello:
        trust = self._engine.deps.trust
        trust.hello_gate.admit()
        identity = trust.identity_of(context)
        facts = (HelloFacts(request.challenge, request.client_nonce, request.daemon_id,
                            request.src_cluster_id, request.dst_cluster_id)
                 if request.challenge else None)
        return self._engine.inbound.accept_link(
            request.protocol_version, request.daemon_id, request.src_cluster_id,
            request.dst_cluster_id, request.backend or "host", identity, facts,
            request.proof, listener_of=self._cluster_id,
            peer_calls=tuple(request.peer_calls))

    async def Hello(self, request: peer_pb2.HelloRequest,
                    context: GrpcContext) -> peer_pb2.HelloReply:
        try:
            hello = await self._accept(request, context)
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

    async def transport_call(self, method: str, request: Any) -> Any:
        """A Peer call of a link's transport (``transports.factory.PEER_HANDLERS``),
        answered by the link's inbound side."""
        token = self._token(request.link_token)
        return await self._engine.inbound.transport_call(method, token, request)


def _transport_method(method: str) -> Unary[PeerServicer, Any, Any]:
    async def handler(servicer: PeerServicer, request: Any, context: CallInfo) -> Any:
        return await servicer.transport_call(method, request)

    handler.__name__ = handler.__qualname__ = method
    return unary(handler)


# The Peer methods the transports answer, each served over gRPC and the peer
# lane like the handlers above; which transport, and what they do, is theirs.
for _method in PEER_HANDLERS:
    setattr(PeerServicer, _method, _transport_method(_method))
