"""PeerApi over the Peer gRPC service: how this daemon calls another one.

The calls made for each transfer (resolve a cache, release a pulled key,
post an HCCL batch) go over the peer's lane when its Hello announced one (a
framed TCP connection, ``hixl_wire.lane``, a fraction of a unary gRPC
call's round trip); the rest, and every call to a daemon without a lane,
are unary gRPC calls. A transport's own calls (HCCL's) come as messages it
built (``transport_call``): this client only carries them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from hixl_wire._proto.hixl.v1 import common_pb2, peer_pb2, peer_pb2_grpc
from hixl_wire.lane import Lane
from hixl_wire.status import LLMStatusCode, error_from_rpc

from . import tracing
from .interceptors import REQUEST_ID_METADATA_KEY, request_id
from .peer_api import (
    PROTOCOL_VERSION,
    BlocksRef,
    CacheRefSpec,
    HeartbeatAnswer,
    IdRef,
    KeyRef,
    Lease,
    PeerHello,
    ResolvedCache,
)
from .registry import KeySpec
from .transports.factory import PEER_LANE_METHODS
from .trust import HelloFacts, Trust, insecure_trust, new_client_nonce

logger = logging.getLogger(__name__)

# Opening the peer lane is bounded on its own: failing it only means gRPC.
LANE_CONNECT_TIMEOUT_S = 3.0
# gRPC waits up to 120 s between reconnection attempts by default: after a
# partition heals, heartbeats (and so the link's state) would lag that long.
CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 200),
                   ("grpc.max_reconnect_backoff_ms", 1000))
# The Peer calls this daemon serves, named in Hello (transports.factory.check_peer_calls):
# every method of the service, which PeerServicer implements.
PEER_CALLS: tuple[str, ...] = tuple(
    peer_pb2.DESCRIPTOR.services_by_name["Peer"].methods_by_name)


def key_to_proto(cluster_id: int, key: KeySpec) -> common_pb2.CacheKey:
    return common_pb2.CacheKey(cluster_id=cluster_id, req_id=key.req_id,
                               model_id=key.model_id, prefix_id=key.prefix_id)


def key_from_proto(key: common_pb2.CacheKey) -> KeySpec:
    return KeySpec(key.req_id, key.model_id, key.prefix_id)


def ref_to_proto(ref: CacheRefSpec) -> common_pb2.CacheRef:
    if isinstance(ref, KeyRef):
        return common_pb2.CacheRef(key=key_to_proto(ref.cluster_id, ref.key))
    if isinstance(ref, IdRef):
        return common_pb2.CacheRef(id_and_index=common_pb2.CacheIdAndIndex(
            cluster_id=ref.cluster_id, cache_id=ref.cache_id, batch_index=ref.batch_index))
    return common_pb2.CacheRef(blocks_key=common_pb2.BlocksKey(
        cluster_id=ref.cluster_id, model_id=ref.model_id))


def ref_from_proto(ref: common_pb2.CacheRef) -> CacheRefSpec | None:
    """Decode a CacheRef; None when no variant is set."""
    kind = ref.WhichOneof("ref")
    if kind == "key":
        return KeyRef(ref.key.cluster_id,
                      key_from_proto(ref.key))
    if kind == "id_and_index":
        item = ref.id_and_index
        return IdRef(item.cluster_id, item.cache_id, item.batch_index)
    if kind == "blocks_key":
        return BlocksRef(ref.blocks_key.cluster_id, ref.blocks_key.model_id)
    return None


def _request_tag() -> int:
    """This request's id as a lane tag (ids are 8 hex digits; others go untagged)."""
    current = request_id.get()
    try:
        return int(current, 16) if len(current) == 8 else 0
    except ValueError:
        return 0


# A state this daemon does not know (a newer far daemon) counts as unknown.
_LEASES = frozenset(lease.value for lease in Lease)


class PeerClient:
    """Calls the Peer service of one remote daemon over a cached channel."""

    def __init__(self, address: str, version: str, trust: Trust | None = None) -> None:
        self.address = address
        self._version = version
        self._trust = trust = trust if trust is not None else insecure_trust()
        credentials = trust.channel_credentials()
        self._channel = (
            grpc.aio.secure_channel(address, credentials, options=CHANNEL_OPTIONS)
            if credentials is not None
            else grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS))
        self._stub = peer_pb2_grpc.PeerStub(self._channel)
        self._lane_address: tuple[str, int] | None = None  # from the peer's Hello
        self._lane: Lane | None = None
        self._lane_opening = asyncio.Lock()

    async def _laned(self, method: str, request: Any, timeout_s: float) -> Any:
        """Call ``method`` on the peer lane when there is one, else over gRPC."""
        lane = await self._open_lane()
        if lane is None:
            return await self._call(getattr(self._stub, method), request, timeout_s)
        if tracing.ENABLED:
            return await lane.call(method, request, timeout_s, _request_tag(),
                                   tracing.current_traceparent().encode())
        return await lane.call(method, request, timeout_s, _request_tag())

    async def _open_lane(self) -> Lane | None:
        """The open lane, connecting (again) when needed; None: use gRPC."""
        if self._lane is not None and self._lane.is_open:
            return self._lane
        if self._lane_address is None:
            return None
        async with self._lane_opening:
            if self._lane is not None and self._lane.is_open:
                return self._lane
            host, port = self._lane_address
            try:
                self._lane = await Lane.connect_tcp(
                    host, port, PEER_LANE_METHODS, f"peer daemon at {self.address}",
                    LANE_CONNECT_TIMEOUT_S, lost_status=LLMStatusCode.LLM_LINK_FAILED)
            except (OSError, asyncio.TimeoutError) as exc:
                logger.warning("peer lane %s:%d of %s unavailable, using gRPC: %s", host, port,
                               self.address, exc or type(exc).__name__)
                return None
            return self._lane

    async def _call(self, method: Any, request: Any, timeout_s: float) -> Any:
        """One call to the peer, carrying this request's id so both daemons log it."""
        current = request_id.get()
        metadata: tuple[tuple[str, str], ...] = (
            () if current == "-" else ((REQUEST_ID_METADATA_KEY, current),))
        if tracing.ENABLED:
            traceparent = tracing.current_traceparent()
            if traceparent:
                metadata += ((tracing.TRACEPARENT, traceparent),)
        try:
            return await method(request, timeout=timeout_s, metadata=metadata)
        except grpc.aio.AioRpcError as err:
            raise error_from_rpc(err, f"peer daemon at {self.address}",
                                 unavailable=LLMStatusCode.LLM_LINK_FAILED) from None

    async def hello(self, daemon_id: str, src_cluster_id: int, dst_cluster_id: int,
                    timeout_s: float, backend: str = "host") -> PeerHello:
        request = peer_pb2.HelloRequest(protocol_version=PROTOCOL_VERSION, daemon_id=daemon_id,
                                        version=self._version, src_cluster_id=src_cluster_id,
                                        dst_cluster_id=dst_cluster_id, backend=backend,
                                        peer_calls=PEER_CALLS)
        facts: HelloFacts | None = None
        if self._trust.mode == "token":
            challenge = await self._call(self._stub.Challenge, peer_pb2.ChallengeRequest(),
                                         timeout_s)
            facts = HelloFacts(challenge.nonce, new_client_nonce(), daemon_id, src_cluster_id,
                               dst_cluster_id)
            request.challenge, request.client_nonce = facts.challenge, facts.client_nonce
            request.proof = self._trust.hello_proof(facts)
        reply = await self._call(self._stub.Hello, request, timeout_s)
        key = (reply.link_key if facts is None
               else self._trust.accept_welcome(facts, reply.link_token, reply.server_proof))
        if reply.lane_port:
            self._lane_address = (reply.data_host, reply.lane_port)
        return PeerHello(reply.daemon_id, reply.version, reply.data_host, reply.data_port,
                         reply.link_token, reply.backend or "host", reply.lane_port,
                         link_key=key, lease_ms=reply.lease_ms,
                         peer_calls=tuple(reply.peer_calls))

    async def resolve(self, token: int, ref: CacheRefSpec, timeout_s: float) -> ResolvedCache:
        request = peer_pb2.ResolveCacheRequest(link_token=token, ref=ref_to_proto(ref))
        reply = await self._laned("ResolveCache", request, timeout_s)
        return ResolvedCache(reply.cache_id, reply.region_id, tuple(reply.tensor_offsets),
                             reply.tensor_size, reply.batch_size, reply.batch_index, reply.blocks,
                             reply.writable)

    async def release_key(self, token: int, key: KeySpec, tensor_indices: Sequence[int],
                          timeout_s: float) -> None:
        # The owner ignores the key's cluster id; it is the linked cluster anyway.
        request = peer_pb2.ReleaseKeyRequest(link_token=token, key=key_to_proto(0, key),
                                             tensor_indices=list(tensor_indices))
        await self._laned("ReleaseKey", request, timeout_s)

    async def notify(self, token: int, name: str, message: bytes, timeout_s: float) -> None:
        request = peer_pb2.NotifyRequest(link_token=token, name=name, message=message)
        await self._laned("Notify", request, timeout_s)

    async def unlink(self, token: int, timeout_s: float) -> None:
        await self._call(self._stub.Unlink, peer_pb2.UnlinkRequest(link_token=token), timeout_s)

    async def heartbeat(self, daemon_id: str, tokens: Sequence[int],
                        timeout_s: float) -> HeartbeatAnswer:
        # Over gRPC, not the peer lane: once a second at most, and the lane
        # exists only in mode "none".
        request = peer_pb2.HeartbeatRequest(daemon_id=daemon_id, link_tokens=list(tokens))
        reply = await self._call(self._stub.Heartbeat, request, timeout_s)
        leases = tuple(Lease(state) if state in _LEASES else Lease.UNKNOWN
                       for state in reply.states)
        if len(leases) != len(tokens):
            leases = (Lease.UNKNOWN,) * len(tokens)
        return HeartbeatAnswer(reply.daemon_id, leases, reply.lease_ms)

    async def resolve_addresses(self, token: int, addresses: Sequence[int], length: int,
                                timeout_s: float) -> list[tuple[int, int, bool]]:
        request = peer_pb2.ResolveAddressesRequest(link_token=token, addresses=list(addresses),
                                                   length=length)
        reply = await self._call(self._stub.ResolveAddresses, request, timeout_s)
        return list(zip(reply.region_ids, reply.offsets, reply.writable, strict=True))

    async def transport_call(self, method: str, request: Any, timeout_s: float) -> Any:
        # On the peer lane when the lane carries the method (a call of each transfer).
        if method in PEER_LANE_METHODS:
            return await self._laned(method, request, timeout_s)
        return await self._call(getattr(self._stub, method), request, timeout_s)

    async def close(self) -> None:
        if self._lane is not None:
            self._lane.close()
            self._lane = None
        await self._channel.close()
