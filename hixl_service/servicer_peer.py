"""The Peer service: what other daemons call on this one."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from hixl_client._proto.hixl.v1 import peer_pb2, peer_pb2_grpc
from hixl_client.status import LLMException, LLMStatusCode

from .call_context import CallAborted, CallContext, Context, deadline_error
from .engine import Engine
from .interceptors import new_request_id, request_id
from .peer_client import ref_from_proto
from .rpc_errors import handles_errors
from .servicer_client import key_from_proto

logger = logging.getLogger(__name__)

# PeerCall's oneof field -> the unary handler that answers it.
STREAMED_CALLS = {"resolve_cache": "ResolveCache", "release_key": "ReleaseKey",
                  "hccl_post": "HcclPost"}


class PeerServicer(peer_pb2_grpc.PeerServicer):
    """Handlers of the Peer service."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._stopping = asyncio.Event()

    def stop_streams(self) -> None:
        """Make every Calls stream end once its calls in flight are answered
        (graceful daemon stop: the streams would otherwise hold it for the grace period)."""
        self._stopping.set()

    @handles_errors
    async def Hello(self, request: peer_pb2.HelloRequest, context: Context) -> peer_pb2.HelloReply:
        hello = self._engine.accept_link(request.protocol_version, request.daemon_id,
                                         request.src_cluster_id, request.dst_cluster_id,
                                         request.backend or "host")
        return peer_pb2.HelloReply(protocol_version=request.protocol_version,
                                   daemon_id=hello.daemon_id, version=hello.version,
                                   data_host=hello.data_host, data_port=hello.data_port,
                                   link_token=hello.token, backend=hello.backend)

    async def Calls(self, request_iterator: AsyncIterator[peer_pb2.PeerCall],
                    context: Context) -> None:
        """Answer each call of the stream in its own task, in completion order."""
        written = asyncio.Lock()  # grpc.aio allows one write at a time
        calls: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()

        async def answer(result: peer_pb2.PeerCallResult) -> None:
            async with written:
                await context.write(result)

        async def run(call: peer_pb2.PeerCall, kind: str) -> None:
            request_id.set(call.request_id or new_request_id())
            task = asyncio.current_task()
            expired = False

            def expire() -> None:
                nonlocal expired
                expired = True
                if task is not None:
                    task.cancel()

            deadline = loop.call_later(call.timeout_ms / 1000.0, expire) \
                if call.timeout_ms else None
            handler = getattr(self, STREAMED_CALLS[kind])
            try:
                reply = await handler(getattr(call, kind), CallContext().as_context())
                result = peer_pb2.PeerCallResult(call_id=call.call_id, **{kind: reply})
            except CallAborted as exc:
                result = peer_pb2.PeerCallResult(call_id=call.call_id, error=exc.error)
            except asyncio.CancelledError:
                if not expired:
                    raise  # the stream ended, not the call's deadline
                result = peer_pb2.PeerCallResult(call_id=call.call_id, error=deadline_error())
            finally:
                if deadline is not None:
                    deadline.cancel()
            await answer(result)

        async def receive() -> None:
            async for call in request_iterator:
                kind = call.WhichOneof("call")
                if kind is None:
                    await answer(peer_pb2.PeerCallResult(call_id=call.call_id, error=(
                        CallAborted.invalid("the call names no method").error)))
                    continue
                task = loop.create_task(run(call, kind))
                calls.add(task)
                task.add_done_callback(calls.discard)

        receiving = loop.create_task(receive())
        stopping = loop.create_task(self._stopping.wait())
        try:
            await asyncio.wait((receiving, stopping), return_when=asyncio.FIRST_COMPLETED)
            receiving.cancel()  # stopping: take no more calls
            await asyncio.gather(receiving, return_exceptions=True)
            await asyncio.gather(*calls, return_exceptions=True)  # finish what was sent
        finally:
            receiving.cancel()
            stopping.cancel()
            for task in calls:
                task.cancel()

    @handles_errors
    async def ResolveCache(self, request: peer_pb2.ResolveCacheRequest,
                           context: Context) -> peer_pb2.ResolveCacheReply:
        ref = ref_from_proto(request.ref)
        if ref is None:
            raise LLMException("the request names no cache",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        found = self._engine.resolve_for_peer(request.link_token, ref)
        return peer_pb2.ResolveCacheReply(
            cache_id=found.cache_id, region_id=found.region_id,
            tensor_offsets=found.tensor_offsets, tensor_size=found.tensor_size,
            stride=found.tensor_size // found.batch_size, batch_size=found.batch_size,
            batch_index=found.batch_index, blocks=found.blocks, writable=found.writable)

    @handles_errors
    async def ReleaseKey(self, request: peer_pb2.ReleaseKeyRequest,
                         context: Context) -> peer_pb2.ReleaseKeyReply:
        await self._engine.release_for_peer(request.link_token, key_from_proto(request.key),
                                            list(request.tensor_indices))
        return peer_pb2.ReleaseKeyReply()

    @handles_errors
    async def ResolveAddresses(self, request: peer_pb2.ResolveAddressesRequest,
                               context: Context) -> peer_pb2.ResolveAddressesReply:
        found = self._engine.resolve_addresses_for_peer(
            request.link_token, list(request.addresses), request.length)
        return peer_pb2.ResolveAddressesReply(region_ids=[r for r, _, _ in found],
                                              offsets=[o for _, o, _ in found],
                                              writable=[w for _, _, w in found])

    @handles_errors
    async def Unlink(self, request: peer_pb2.UnlinkRequest,
                     context: Context) -> peer_pb2.UnlinkReply:
        self._engine.drop_inbound_link(request.link_token)
        return peer_pb2.UnlinkReply()

    @handles_errors
    async def HcclConnect(self, request: peer_pb2.HcclConnectRequest,
                          context: Context) -> peer_pb2.HcclConnectReply:
        await self._engine.hccl_connect_for_peer(request.link_token, request.root_info)
        return peer_pb2.HcclConnectReply()

    @handles_errors
    async def HcclPost(self, request: peer_pb2.HcclPostRequest,
                       context: Context) -> peer_pb2.HcclPostReply:
        await self._engine.hccl_post_for_peer(request.link_token, request.send,
                                              request.region_id, request.ranges,
                                              max(1, request.timeout_ms))
        return peer_pb2.HcclPostReply()
