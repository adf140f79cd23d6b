"""PeerApi over the Peer gRPC service: how this daemon calls another one.

The calls made for each transfer (resolve a cache, release a pulled key,
post an HCCL batch) travel on one long-lived ``Peer.Calls`` stream per peer
daemon, where a message costs a fraction of a unary call (about 0.1 ms
against 0.45-0.65 ms here); the rest are unary calls.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from hixl_client._lane import error_from_call
from hixl_client._proto.hixl.v1 import common_pb2, peer_pb2, peer_pb2_grpc
from hixl_client._transport import error_from_rpc
from hixl_client.status import LLMException, LLMStatusCode

from .interceptors import REQUEST_ID_METADATA_KEY, request_id
from .peer_api import (
    PROTOCOL_VERSION,
    BlocksRef,
    CacheRefSpec,
    IdRef,
    KeyRef,
    PeerHello,
    ResolvedCache,
)
from .registry import KeySpec


def key_to_proto(cluster_id: int, key: KeySpec) -> common_pb2.CacheKey:
    return common_pb2.CacheKey(cluster_id=cluster_id, req_id=key.req_id,
                               model_id=key.model_id, prefix_id=key.prefix_id)


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
                      KeySpec(ref.key.req_id, ref.key.model_id, ref.key.prefix_id))
    if kind == "id_and_index":
        item = ref.id_and_index
        return IdRef(item.cluster_id, item.cache_id, item.batch_index)
    if kind == "blocks_key":
        return BlocksRef(ref.blocks_key.cluster_id, ref.blocks_key.model_id)
    return None


class _CallStream:
    """One open Peer.Calls stream: calls out, results matched back by call id."""

    def __init__(self, stub: peer_pb2_grpc.PeerStub, what: str) -> None:
        self._what = what
        self._call = stub.Calls()
        self._pending: dict[int, asyncio.Future[peer_pb2.PeerCallResult]] = {}
        self._ids = itertools.count(1)
        self._written = asyncio.Lock()  # grpc.aio allows one write at a time
        self.broken = False
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def call(self, kind: str, request: Any, timeout_s: float) -> Any:
        call_id = next(self._ids)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[peer_pb2.PeerCallResult] = loop.create_future()
        self._pending[call_id] = future
        current = request_id.get()
        message = peer_pb2.PeerCall(call_id=call_id, timeout_ms=max(1, int(timeout_s * 1000)),
                                    request_id="" if current == "-" else current,
                                    **{kind: request})
        guard = loop.call_later(timeout_s, _expire, future, self._what)
        try:
            async with self._written:
                await self._call.write(message)
            result = await future
        except grpc.aio.AioRpcError as err:  # the write failed: the stream is gone
            self.broken = True
            raise error_from_rpc(err, self._what,
                                 unavailable=LLMStatusCode.LLM_LINK_FAILED) from None
        finally:
            guard.cancel()
            self._pending.pop(call_id, None)
        if result.WhichOneof("result") == "error":
            raise error_from_call(result.error, self._what)
        return getattr(result, kind)

    async def _read(self) -> None:
        failure = LLMException(f"{self._what}: the call stream ended",
                               status_code=LLMStatusCode.LLM_LINK_FAILED)
        try:
            async for result in self._call:
                future = self._pending.pop(result.call_id, None)
                if future is not None and not future.done():
                    future.set_result(result)
        except grpc.aio.AioRpcError as err:
            failure = error_from_rpc(err, self._what, unavailable=LLMStatusCode.LLM_LINK_FAILED)
        finally:
            self.broken = True
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(failure)
            self._pending.clear()

    async def close(self) -> None:
        self.broken = True
        self._call.cancel()
        self._reader.cancel()
        try:
            await self._reader
        except asyncio.CancelledError:
            pass


def _expire(future: asyncio.Future[Any], what: str) -> None:
    if not future.done():
        future.set_exception(LLMException(f"{what}: DEADLINE_EXCEEDED: no answer in time",
                                          status_code=LLMStatusCode.LLM_TIMEOUT))


class PeerClient:
    """Calls the Peer service of one remote daemon over a cached channel."""

    def __init__(self, address: str, version: str) -> None:
        self.address = address
        self._version = version
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = peer_pb2_grpc.PeerStub(self._channel)
        self._stream: _CallStream | None = None

    async def _streamed(self, kind: str, request: Any, timeout_s: float) -> Any:
        """One call on the Calls stream, opened again after it broke."""
        if self._stream is None or self._stream.broken:
            if self._stream is not None:
                await self._stream.close()
            self._stream = _CallStream(self._stub, f"peer daemon at {self.address}")
        return await self._stream.call(kind, request, timeout_s)

    async def _call(self, method: Any, request: Any, timeout_s: float) -> Any:
        """One call to the peer, carrying this request's id so both daemons log it."""
        current = request_id.get()
        metadata = () if current == "-" else ((REQUEST_ID_METADATA_KEY, current),)
        try:
            return await method(request, timeout=timeout_s, metadata=metadata)
        except grpc.aio.AioRpcError as err:
            raise error_from_rpc(err, f"peer daemon at {self.address}",
                                 unavailable=LLMStatusCode.LLM_LINK_FAILED) from None

    async def hello(self, daemon_id: str, src_cluster_id: int, dst_cluster_id: int,
                    timeout_s: float, backend: str = "host") -> PeerHello:
        request = peer_pb2.HelloRequest(protocol_version=PROTOCOL_VERSION, daemon_id=daemon_id,
                                        version=self._version, src_cluster_id=src_cluster_id,
                                        dst_cluster_id=dst_cluster_id, backend=backend)
        reply = await self._call(self._stub.Hello, request, timeout_s)
        return PeerHello(reply.daemon_id, reply.version, reply.data_host, reply.data_port,
                         reply.link_token, reply.backend or "host")

    async def resolve(self, token: int, ref: CacheRefSpec, timeout_s: float) -> ResolvedCache:
        request = peer_pb2.ResolveCacheRequest(link_token=token, ref=ref_to_proto(ref))
        reply = await self._streamed("resolve_cache", request, timeout_s)
        return ResolvedCache(reply.cache_id, reply.region_id, tuple(reply.tensor_offsets),
                             reply.tensor_size, reply.batch_size, reply.batch_index, reply.blocks,
                             reply.writable)

    async def release_key(self, token: int, key: KeySpec, tensor_indices: Sequence[int],
                          timeout_s: float) -> None:
        # The owner ignores the key's cluster id; it is the linked cluster anyway.
        request = peer_pb2.ReleaseKeyRequest(link_token=token, key=key_to_proto(0, key),
                                             tensor_indices=list(tensor_indices))
        await self._streamed("release_key", request, timeout_s)

    async def unlink(self, token: int, timeout_s: float) -> None:
        await self._call(self._stub.Unlink, peer_pb2.UnlinkRequest(link_token=token), timeout_s)

    async def resolve_addresses(self, token: int, addresses: Sequence[int], length: int,
                                timeout_s: float) -> list[tuple[int, int, bool]]:
        request = peer_pb2.ResolveAddressesRequest(link_token=token, addresses=list(addresses),
                                                   length=length)
        reply = await self._call(self._stub.ResolveAddresses, request, timeout_s)
        return list(zip(reply.region_ids, reply.offsets, reply.writable, strict=True))

    async def hccl_connect(self, token: int, root_info: bytes, timeout_s: float) -> None:
        request = peer_pb2.HcclConnectRequest(link_token=token, root_info=root_info)
        await self._call(self._stub.HcclConnect, request, timeout_s)

    async def hccl_post(self, token: int, send: bool, region_id: int, ranges: bytes,
                        timeout_ms: int, timeout_s: float) -> None:
        request = peer_pb2.HcclPostRequest(link_token=token, send=send, region_id=region_id,
                                           ranges=ranges, timeout_ms=timeout_ms)
        await self._streamed("hccl_post", request, timeout_s)

    async def close(self) -> None:
        if self._stream is not None:
            await self._stream.close()
            self._stream = None
        await self._channel.close()
