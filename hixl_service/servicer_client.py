"""The Client service: translate messages, call the engine, build replies."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from hixl_wire._proto.hixl.v1 import client_pb2, client_pb2_grpc, common_pb2
from hixl_wire.lane import RepeatFrame
from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.status import param_invalid as _invalid
from hixl_wire.types import DataType, LLMRole, Placement, bytes_per_element

from . import copies, tracing
from .calls import CallInfo, GrpcContext, call_info_of, unary
from .cluster import Cluster
from .drain import Drain, refuses_while_draining
from .engine import Engine, NewCache, Session
from .layerwise import LayerwiseTask
from .link_views import inbound_health, outbound_health
from .log_keys import keys
from .memory.base import Pool
from .native_errors import ChecksumMismatch
from .peer_api import KeyRef
from .peer_client import key_from_proto, ref_from_proto
from .planning import block_list
from .prepared import again, repeat_at_once, repeat_handle
from .repeats import Repeat
from .rpc_errors import CallRefused, abort_with
from .sessions import no_session
from .stats import COPY_TRANSPORT, DaemonStats
from .transfer_log import settled, succeeded
from .transfers import Outcome, PullSpec, PushSpec, pull, push

logger = logging.getLogger(__name__)

MAX_SHAPE_RANK = 32
# LLM-DataDist links up to 16 clusters of one call in parallel.
MAX_PARALLEL_LINKS = 16



def new_cache_from_proto(desc: common_pb2.CacheDescriptor, blocks: bool,
                         blocks_model_id: int | None) -> NewCache:
    """Check a descriptor as LLM-DataDist's native allocate does and size it ourselves."""
    shape = list(desc.shape)
    if not 1 <= len(shape) <= MAX_SHAPE_RANK:
        raise _invalid(f"shape rank {len(shape)} is not in [1, {MAX_SHAPE_RANK}]")
    if desc.num_tensors <= 0:
        raise _invalid("num_tensors must be > 0")
    if any(dim <= 0 for dim in shape):
        raise _invalid(f"every dim of shape {shape} must be > 0")
    batch_dim = 0 if blocks else desc.batch_dim_index
    if not 0 <= batch_dim < len(shape):
        raise _invalid(f"batch_dim_index {batch_dim} is out of range for shape {shape}")
    tensor_size = math.prod(shape) * bytes_per_element(DataType(desc.data_type))
    if tensor_size >= 2**63:
        raise _invalid(f"tensor size of shape {shape} overflows int64")
    return NewCache(num_tensors=desc.num_tensors, tensor_size=tensor_size,
                    batch_size=shape[batch_dim], placement=Placement(desc.placement),
                    blocks=blocks, blocks_model_id=blocks_model_id)


class LaneTasks:
    """Layer-wise tasks that take LayerReady calls, by (session id, task id).

    A LayerReady call may arrive before its task's stream was read (the lane
    is the faster path), so a lookup waits for the task to be posted.
    """

    def __init__(self) -> None:
        self._slots: dict[tuple[str, str], asyncio.Future[LayerwiseTask | None]] = {}

    def _slot(self, key: tuple[str, str]) -> asyncio.Future[LayerwiseTask | None]:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = asyncio.get_running_loop().create_future()
        return slot

    def post(self, key: tuple[str, str], task: LayerwiseTask) -> None:
        slot = self._slot(key)
        if not slot.done():
            slot.set_result(task)

    def end(self, key: tuple[str, str]) -> None:
        slot = self._slots.pop(key, None)
        if slot is not None and not slot.done():
            slot.set_result(None)

    async def find(self, key: tuple[str, str], timeout_s: float) -> LayerwiseTask | None:
        """The task, waiting up to ``timeout_s`` for it to be posted; None: no such task."""
        slot = self._slot(key)
        if slot.done():  # the usual case: no timer, no extra turn of the loop
            return slot.result()
        try:
            return await asyncio.wait_for(asyncio.shield(slot), timeout_s)
        except asyncio.TimeoutError:
            if not slot.done():
                self._slots.pop(key, None)
            return None


class ClientServicer(client_pb2_grpc.ClientServicer):
    """Handlers of the Client service; sessions are named by call metadata."""

    def __init__(self, engine: Engine, version: str, fd_socket: str,
                 lane_socket: str = "", peer_address: str = "") -> None:
        self._engine = engine
        self.drain: Drain = engine.drain  # read by refuses_while_draining
        self._peer_address = peer_address
        self._stats = engine.deps.stats
        self._version = version
        self._fd_socket = fd_socket
        self._lane_socket = lane_socket
        self._stopping = asyncio.Event()
        self._cleanups: set[asyncio.Task[None]] = set()
        self._lane_tasks = LaneTasks()
        # Transfer lane calls answered in the frame's callback when they can be
        # (lane_server.AtOnce): a repeat that ends there needs no coroutine.
        self.at_once: dict[str, Callable[[Any, CallInfo], Any]] = {
            "RepeatPull": functools.partial(self._repeat_at_once, push=False),
            "RepeatPush": functools.partial(self._repeat_at_once, push=True),
        }

    def call_failed(self, method: str, error: LLMException) -> None:
        """A handler of ``method`` failed with ``error`` (``calls.FailureHook``): counted."""
        if isinstance(error, CallRefused):
            self._stats.call_refused(error.reason)
        elif isinstance(error, ChecksumMismatch):
            self._stats.checksum_mismatches += 1
        self._stats.call_failed(method, error.status_code)

    def stop_sessions(self) -> None:
        """Make every Attach stream end (graceful daemon stop)."""
        self._stopping.set()
        for session in self._engine.sessions.values():
            session.inbox.close()

    async def wait_cleanups(self) -> None:
        await asyncio.gather(*self._cleanups, return_exceptions=True)

    def _session(self, context: CallInfo) -> Session:
        if context.session_id is None:
            raise no_session("the call carries no session; attach first")
        return self._engine.sessions.get(context.session_id)

    async def Attach(self, request: client_pb2.AttachRequest, context: GrpcContext) -> None:
        try:
            session = self._engine.sessions.attach(request.client_pid, request.client_name)
        except LLMException as exc:  # the daemon is draining (UNAVAILABLE)
            await abort_with(context, exc)
        try:
            await context.write(client_pb2.SessionEvent(attached=client_pb2.Attached(
                session_id=session.session_id, daemon_id=self._engine.daemon_id,
                version=self._version, fd_socket=self._fd_socket,
                lane_socket=self._lane_socket, peer_address=self._peer_address)))
            # The stream carries the session's notifications until it ends.
            while not self._stopping.is_set():
                taken = await session.inbox.take()
                if not taken:
                    break  # closed: the session or the daemon ends
                for one in taken:
                    await context.write(client_pb2.SessionEvent(notify=client_pb2.Notify(
                        src_cluster_id=one.src_cluster_id, name=one.name,
                        message=one.message)))
        finally:
            # The stream ends when the client leaves, even by SIGKILL: free its
            # memory. Shielded, and kept referenced, so a second cancellation
            # cannot cut the cleanup short.
            cleanup = asyncio.get_running_loop().create_task(self._engine.detach(session))
            self._cleanups.add(cleanup)
            cleanup.add_done_callback(self._cleanups.discard)
            await asyncio.shield(cleanup)

    @unary
    @refuses_while_draining("clusters")
    async def Init(self, request: client_pb2.InitRequest,
                   context: CallInfo) -> client_pb2.InitReply:
        session = self._session(context)
        cluster = await self._engine.init_cluster(session, request.cluster_id,
                                                  LLMRole(request.role), dict(request.options))
        pools = [client_pb2.PoolInfo(pool_id=p.pool_id, placement=int(p.placement), size=p.size,
                                     page_shift=p.allocator.page_shift, fd_token=p.fd_token,
                                     on_device=p.on_device,
                                     device_id=cluster.settings.device_id)
                 for p in cluster.pools.values()]
        ascend = self._engine.deps.ascend
        return client_pb2.InitReply(pools=pools, fd_socket=self._fd_socket,
                                    upload_token=cluster.upload_token,
                                    backend=self._engine.deps.backend,
                                    cann_path=ascend.cann_dir if ascend is not None else "",
                                    daemon_tgid=ascend.tgid if ascend is not None else 0)

    @unary
    async def ImportDeviceBuffer(self, request: client_pb2.ImportDeviceBufferRequest,
                                 context: CallInfo) -> client_pb2.ImportDeviceBufferReply:
        cluster = self._engine.cluster_of(self._session(context))
        buffer_id = await self._engine.caches.import_device_buffer(cluster, request.ipc_key,
                                                            request.size, request.device_id)
        return client_pb2.ImportDeviceBufferReply(buffer_id=buffer_id)

    @unary
    async def ShareDevicePools(self, request: client_pb2.ShareDevicePoolsRequest,
                               context: CallInfo) -> client_pb2.ShareDevicePoolsReply:
        cluster = self._engine.cluster_of(self._session(context))
        if request.tgid <= 0:
            raise LLMException(f"tgid must be a process id, got {request.tgid}",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        shared = await self._engine.caches.share_device_pools(cluster, request.tgid)
        return client_pb2.ShareDevicePoolsReply(
            pools=[client_pb2.DevicePoolKey(pool_id=pool_id, ipc_key=key)
                   for pool_id, key in shared])

    @unary
    async def ReportMappings(self, request: client_pb2.ReportMappingsRequest,
                             context: CallInfo) -> client_pb2.ReportMappingsReply:
        cluster = self._engine.cluster_of(self._session(context))
        pools = {p.pool_id: p for p in cluster.pools.values()}
        for mapped in request.pools:
            if mapped.pool_id in pools:
                pools[mapped.pool_id].client_base = mapped.address
        return client_pb2.ReportMappingsReply()

    @unary
    async def Finalize(self, request: client_pb2.FinalizeRequest,
                       context: CallInfo) -> client_pb2.FinalizeReply:
        await self._engine.finalize(self._session(context))
        return client_pb2.FinalizeReply()

    async def _link_all(
            self, request: client_pb2.LinkClustersRequest | client_pb2.UnlinkClustersRequest,
            context: CallInfo, unlink: bool) -> client_pb2.LinkClustersReply:
        cluster = self._engine.cluster_of(self._session(context))
        if not request.clusters:
            return client_pb2.LinkClustersReply(status=LLMStatusCode.LLM_PARAM_INVALID)
        # One deadline for the whole call: links queued behind the first
        # MAX_PARALLEL_LINKS get what is left of the timeout, not a fresh one,
        # so the call answers within its timeout (docs/client.md, "Bounded calls").
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(request.timeout_ms, 1) / 1000.0
        gate = asyncio.Semaphore(MAX_PARALLEL_LINKS)

        async def one(target: client_pb2.ClusterLink) -> client_pb2.LinkResult:
            async with gate:
                try:
                    left_s = deadline - loop.time()
                    if unlink:
                        await _unlink_within(self._engine, cluster, target.remote_cluster_id,
                                             request.force, left_s)
                        return client_pb2.LinkResult(status=LLMStatusCode.LLM_SUCCESS)
                    if left_s <= 0:
                        # as a link that timed out answers (outbound)
                        raise LLMException("link_clusters' timeout passed before this link "
                                           "could start",
                                           status_code=LLMStatusCode.LLM_LINK_FAILED)
                    link = await self._engine.outbound.link(
                        cluster, target.remote_cluster_id,
                        f"{target.remote_host}:{target.remote_port}", left_s)
                    return client_pb2.LinkResult(status=LLMStatusCode.LLM_SUCCESS,
                                                 transport=link.transport.name)
                except LLMException as exc:
                    logger.warning("%s cluster %d %s cluster %d: %s",
                                   "unlinking" if unlink else "linking", cluster.cluster_id,
                                   "from" if unlink else "to", target.remote_cluster_id, exc,
                                   extra=keys(session=cluster.session_id,
                                              cluster=cluster.cluster_id,
                                              link=(cluster.cluster_id,
                                                    target.remote_cluster_id),
                                              status=exc.status_code.name))
                    return client_pb2.LinkResult(status=exc.status_code, message=str(exc))

        results = await asyncio.gather(*(one(t) for t in request.clusters))
        failed = [r.status for r in results if r.status != LLMStatusCode.LLM_SUCCESS]
        overall = failed[-1] if failed else LLMStatusCode.LLM_SUCCESS
        return client_pb2.LinkClustersReply(status=overall, results=results)

    @unary
    @refuses_while_draining("links")
    async def LinkClusters(self, request: client_pb2.LinkClustersRequest,
                           context: CallInfo) -> client_pb2.LinkClustersReply:
        return await self._link_all(request, context, unlink=False)

    @unary
    async def UnlinkClusters(self, request: client_pb2.UnlinkClustersRequest,
                             context: CallInfo) -> client_pb2.LinkClustersReply:
        return await self._link_all(request, context, unlink=True)

    @unary
    async def QueryLinkStates(self, request: client_pb2.QueryLinkStatesRequest,
                              context: CallInfo) -> client_pb2.QueryLinkStatesReply:
        cluster = self._engine.cluster_of(self._session(context))
        reply = client_pb2.QueryLinkStatesReply()
        for link in cluster.links.values():
            reply.links.add(remote_cluster_id=link.remote_cluster_id, direction="outbound",
                            remote_daemon_id=link.remote_daemon_id,
                            transport=link.transport.name, health=outbound_health(link))
        inbound = self._engine.inbound
        for peer in inbound.to_cluster(cluster.cluster_id):
            reply.links.add(remote_cluster_id=peer.src_cluster_id, direction="inbound",
                            remote_daemon_id=peer.src_daemon_id, transport=peer.side.name,
                            health=inbound_health(peer, inbound))
        return reply

    @unary
    async def SendNotify(self, request: client_pb2.SendNotifyRequest,
                         context: CallInfo) -> client_pb2.SendNotifyReply:
        cluster = self._engine.cluster_of(self._session(context))
        await self._engine.send_notify(cluster, request.remote_cluster_id, request.name,
                                       request.message, (request.timeout_ms or 1000) / 1000.0)
        return client_pb2.SendNotifyReply()

    @unary
    async def SwitchRole(self, request: client_pb2.SwitchRoleRequest,
                         context: CallInfo) -> client_pb2.SwitchRoleReply:
        cluster = self._engine.cluster_of(self._session(context))
        self._engine.switch_role(cluster, LLMRole(request.role))
        return client_pb2.SwitchRoleReply()

    @unary
    async def AllocateCache(self, request: client_pb2.AllocateCacheRequest,
                            context: CallInfo) -> client_pb2.AllocateCacheReply:
        cluster = self._engine.cluster_of(self._session(context))
        model_id = request.blocks_key.model_id if request.has_blocks_key else None
        spec = new_cache_from_proto(request.desc, request.blocks, model_id)
        keys = [key_from_proto(k) for k in request.keys]
        entry = self._engine.caches.allocate(cluster, spec, keys)
        assert isinstance(entry.memory, Pool)
        return client_pb2.AllocateCacheReply(cache_id=entry.cache_id,
                                             pool_id=entry.memory.pool_id,
                                             tensor_offsets=entry.tensor_offsets)

    @unary
    async def RegisterCache(self, request: client_pb2.RegisterCacheRequest,
                            context: CallInfo) -> client_pb2.AllocateCacheReply:
        cluster = self._engine.cluster_of(self._session(context))
        model_id = request.blocks_key.model_id if request.has_blocks_key else None
        spec = new_cache_from_proto(request.desc, request.blocks, model_id)
        entry, orphans = await self._engine.caches.register(
            cluster, spec, request.buffer_id, list(request.tensor_offsets),
            [key_from_proto(k) for k in request.keys], request.remote_accessible,
            request.buffer_address, list(request.client_addrs),
            request.pool_id if request.in_pool else None)
        await self._engine.caches.free_all(orphans)
        return client_pb2.AllocateCacheReply(cache_id=entry.cache_id,
                                             tensor_offsets=entry.tensor_offsets)

    @unary
    async def UnregisterCache(self, request: client_pb2.UnregisterCacheRequest,
                              context: CallInfo) -> client_pb2.UnregisterCacheReply:
        cluster = self._engine.cluster_of(self._session(context))
        await self._engine.caches.unregister(cluster, request.cache_id)
        return client_pb2.UnregisterCacheReply()

    @unary
    async def DeallocateCache(self, request: client_pb2.DeallocateCacheRequest,
                              context: CallInfo) -> client_pb2.DeallocateCacheReply:
        cluster = self._engine.cluster_of(self._session(context))
        await self._engine.caches.deallocate(cluster, request.cache_id, request.blocks)
        return client_pb2.DeallocateCacheReply()

    @unary
    async def RemoveCacheKey(self, request: client_pb2.RemoveCacheKeyRequest,
                             context: CallInfo) -> client_pb2.RemoveCacheKeyReply:
        cluster = self._engine.cluster_of(self._session(context))
        await self._engine.caches.remove_key(cluster, key_from_proto(request.key))
        return client_pb2.RemoveCacheKeyReply()

    def _pull_spec(self, request: client_pb2.PullCacheRequest, blocks: bool) -> PullSpec:
        src = ref_from_proto(request.src)
        if src is None:
            raise _invalid("the pull names no source cache")
        if request.size < -1 or request.size == 0:
            raise _invalid(f"size must be -1 or > 0, got {request.size}")
        return PullSpec(src=src, dst_cache_id=request.dst_cache_id,
                        batch_index=request.batch_index, size=request.size,
                        src_tensor_indices=list(request.src_tensor_indices),
                        dst_tensor_indices=list(request.dst_tensor_indices),
                        tensor_num_per_layer=request.tensor_num_per_layer or 2, blocks=blocks,
                        src_blocks=block_list(request.src_blocks),
                        dst_blocks=block_list(request.dst_blocks),
                        checksum=self._checksum(request.checksum))

    def _checksum(self, asked: int) -> bool:
        """A transfer's CRC-32C: as the call asks, else the daemon's ``[transfer] checksum``."""
        if asked == client_pb2.CHECKSUM_DEFAULT:
            return self._engine.deps.checksum
        return bool(asked == client_pb2.CHECKSUM_ON)

    @unary
    @refuses_while_draining("transfers")
    async def PullCache(self, request: client_pb2.PullCacheRequest,
                        context: CallInfo) -> client_pb2.PullCacheReply:
        started = time.perf_counter()
        cluster = self._engine.cluster_of(self._session(context))
        spec = self._pull_spec(request, False)
        outcome = await settled(cluster, spec.src.cluster_id, "PullCache", pull(cluster, spec))
        handle = self._handle_of(cluster, spec, outcome, request.checksum)
        return client_pb2.PullCacheReply(bytes=outcome.bytes, transport=outcome.transport,
                                         repeat_handle=handle,
                                         repeat_native=self._engine.native.runs(handle),
                                         **_timing(self._stats, "pull_cache", started, outcome))

    def _handle_of(self, cluster: Cluster, spec: PullSpec | PushSpec, outcome: Outcome,
                   asked_checksum: int) -> int:
        """The repeat handle of a transfer that succeeded (0: none), its shape
        offered to the native lanes."""
        handle = repeat_handle(cluster, spec, outcome, asked_checksum)
        if handle:
            self._offer_native(cluster, cluster.repeats.get(handle, isinstance(spec, PushSpec)))
        return handle

    def _offer_native(self, cluster: Cluster, repeat: Repeat) -> bool:
        """Let the native lanes run the next repeats of a shape that just moved
        (native_lanes.py); whether they do."""
        return self._engine.native.offer(cluster, repeat, self._checksum)

    @unary
    @refuses_while_draining("transfers")
    async def RepeatPull(self, request: RepeatFrame,
                         context: CallInfo) -> client_pb2.PullCacheReply:
        """A PullCache of a shape pulled before, by handle (transfer lane only)."""
        reply: client_pb2.PullCacheReply = await self._again(request, context, push=False)
        return reply

    async def _again(self, request: RepeatFrame, context: CallInfo, push: bool) -> Any:
        """RepeatPull and RepeatPush: the reply of the PullCache or PushCache they repeat."""
        started = time.perf_counter()
        cluster = self._engine.cluster_of(self._session(context))
        repeat = cluster.repeats.get(request.handle, push=push)
        outcome = await settled(cluster, repeat.shape.remote_cluster_id, _repeat_call(push),
                                again(cluster, repeat, request.src_batch_index,
                                      request.dst_batch_index,
                                      self._checksum(repeat.shape.checksum)))
        return _repeat_reply(self._stats, repeat, started, outcome,
                             self._offer_native(cluster, repeat))

    def _repeat_at_once(self, request: RepeatFrame, context: CallInfo, push: bool) -> Any:
        """RepeatPull or RepeatPush answered in the transfer lane's frame callback
        (``lane_server.AtOnce``): the reply when the transfer ended there, an
        awaitable of it while bytes move, or None: the call runs as usual."""
        if self.drain.draining:
            return None  # the call itself answers with the refusal
        started = time.perf_counter()
        try:
            cluster = self._engine.cluster_of(self._session(context))
        except LLMException:
            return None  # the call itself answers with the error
        begun = repeat_at_once(cluster, request.handle, push, request.src_batch_index,
                               request.dst_batch_index, self._checksum)
        if begun is None:
            return None
        repeat, outcome = begun
        remote_cluster_id = repeat.shape.remote_cluster_id
        if isinstance(outcome, Outcome):
            succeeded(cluster, remote_cluster_id, outcome)
            return _repeat_reply(self._stats, repeat, started, outcome,
                                 self._offer_native(cluster, repeat))
        return self._reply_when_landed(cluster, repeat, started, settled(
            cluster, remote_cluster_id, _repeat_call(push), outcome))

    async def _reply_when_landed(self, cluster: Cluster, repeat: Repeat, started: float,
                                 outcome: Awaitable[Outcome]) -> Any:
        landed = await outcome
        return _repeat_reply(self._stats, repeat, started, landed,
                             self._offer_native(cluster, repeat))

    @unary
    @refuses_while_draining("transfers")
    async def PullBlocks(self, request: client_pb2.PullCacheRequest,
                         context: CallInfo) -> client_pb2.PullCacheReply:
        started = time.perf_counter()
        cluster = self._engine.cluster_of(self._session(context))
        spec = self._pull_spec(request, True)
        outcome = await settled(cluster, spec.src.cluster_id, "PullBlocks", pull(cluster, spec))
        return client_pb2.PullCacheReply(bytes=outcome.bytes, transport=outcome.transport,
                                         **_timing(self._stats, "pull_blocks", started,
                                                   outcome))

    async def _push(self, request: client_pb2.PushRequest, context: CallInfo,
                    blocks: bool) -> client_pb2.PushReply:
        started = time.perf_counter()
        cluster = self._engine.cluster_of(self._session(context))
        dst = ref_from_proto(request.dst)
        if dst is None or isinstance(dst, KeyRef):
            raise _invalid("a push names its destination by cache id and index, "
                           "or by blocks key")
        spec = PushSpec(dst=dst, src_cache_id=request.src_cache_id,
                        src_batch_index=request.src_batch_index,
                        src_tensor_indices=list(request.src_tensor_indices),
                        dst_tensor_indices=list(request.dst_tensor_indices),
                        tensor_num_per_layer=request.tensor_num_per_layer or 2, blocks=blocks,
                        src_blocks=block_list(request.src_blocks),
                        dst_blocks=block_list(request.dst_blocks),
                        checksum=self._checksum(request.checksum))
        outcome = await settled(cluster, dst.cluster_id, "PushBlocks" if blocks else "PushCache",
                                push(cluster, spec))
        handle = self._handle_of(cluster, spec, outcome, request.checksum)
        return client_pb2.PushReply(bytes=outcome.bytes, transport=outcome.transport,
                                    repeat_handle=handle,
                                    repeat_native=self._engine.native.runs(handle),
                                    **_timing(self._stats,
                                              "push_blocks" if blocks else "push_cache",
                                              started, outcome))

    @unary
    @refuses_while_draining("transfers")
    async def PushCache(self, request: client_pb2.PushRequest,
                        context: CallInfo) -> client_pb2.PushReply:
        return await self._push(request, context, blocks=False)

    @unary
    @refuses_while_draining("transfers")
    async def RepeatPush(self, request: RepeatFrame,
                         context: CallInfo) -> client_pb2.PushReply:
        """A PushCache of a shape pushed before, by handle (transfer lane only)."""
        reply: client_pb2.PushReply = await self._again(request, context, push=True)
        return reply

    @unary
    @refuses_while_draining("transfers")
    async def PushBlocks(self, request: client_pb2.PushRequest,
                         context: CallInfo) -> client_pb2.PushReply:
        return await self._push(request, context, blocks=True)

    @unary
    @refuses_while_draining("transfers")
    async def CopyCache(self, request: client_pb2.CopyCacheRequest,
                        context: CallInfo) -> client_pb2.CopyReply:
        cluster = self._engine.cluster_of(self._session(context))
        if request.size < -1 or request.size == 0:
            raise _invalid(f"size must be -1 or > 0, got {request.size}")
        moved = await copies.copy_cache(self._engine, cluster, request.dst_cache_id,
                                        request.src_cache_id, request.dst_batch_index,
                                        request.src_batch_index, request.offset, request.size)
        self._stats.copied("copy_cache", COPY_TRANSPORT, moved)
        return client_pb2.CopyReply(bytes=moved)

    @unary
    @refuses_while_draining("transfers")
    async def CopyBlocks(self, request: client_pb2.CopyBlocksRequest,
                         context: CallInfo) -> client_pb2.CopyReply:
        cluster = self._engine.cluster_of(self._session(context))
        moved = await copies.copy_blocks(self._engine, cluster, request.cache_id,
                                         block_list(request.src_blocks),
                                         block_list(request.dst_blocks))
        self._stats.copied("copy_blocks", COPY_TRANSPORT, moved)
        return client_pb2.CopyReply(bytes=moved)

    @unary
    @refuses_while_draining("transfers")
    async def SwapBlocks(self, request: client_pb2.SwapBlocksRequest,
                         context: CallInfo) -> client_pb2.CopyReply:
        cluster = self._engine.cluster_of(self._session(context))
        moved = await copies.swap_blocks(self._engine, cluster, _operand(request.src),
                                         _operand(request.dst), block_list(request.src_blocks),
                                         block_list(request.dst_blocks))
        self._stats.copied("swap_blocks", COPY_TRANSPORT, moved)
        return client_pb2.CopyReply(bytes=moved)

    async def TransferCache(self, request_iterator: AsyncIterator[client_pb2.TransferMessage],
                            context: GrpcContext) -> None:
        if not tracing.ENABLED:
            await self._transfer_cache(request_iterator, context)
            return
        with tracing.server_span("hixl.daemon.TransferCache",
                                 tracing.traceparent_of(context.invocation_metadata())):
            await self._transfer_cache(request_iterator, context)

    async def _transfer_cache(self,
                              request_iterator: AsyncIterator[client_pb2.TransferMessage],
                              context: GrpcContext) -> None:
        lane_key: tuple[str, str] | None = None
        task: LayerwiseTask | None = None
        drain = self.drain
        try:
            session = self._session(call_info_of(context))
            cluster = self._engine.cluster_of(session)
            first = await anext(aiter(request_iterator), None)
            if first is None or not first.HasField("start"):
                raise _invalid("a transfer stream starts with its task")
            drain.refuse_new("transfers")
            if first.start.lane_task_id:
                lane_key = (session.session_id, first.start.lane_task_id)
            task = LayerwiseTask(cluster, first.start, self._stats)
            drain.layerwise_tasks += 1  # a drain lets it end (drain.py)
            for report in await task.prepare():
                await context.write(report)
            if lane_key is not None:
                self._lane_tasks.post(lane_key, task)
            # After a failure keep reading until the client half-closes, so
            # that the stream never ends under a write of the client's.
            async for message in request_iterator:
                if not task.failed and message.HasField("layer_ready"):
                    for report in await task.send_layer(message.layer_ready):
                        await context.write(report)
        except LLMException as exc:
            self.call_failed("TransferCache", exc)
            await abort_with(context, exc)
        finally:
            if task is not None:
                task.ended = True
                drain.layerwise_tasks -= 1
            if lane_key is not None:
                self._lane_tasks.end(lane_key)

    @unary
    async def LayerReady(self, request: client_pb2.LayerReadyRequest,
                         context: CallInfo) -> client_pb2.LayerReadyReply:
        session = self._session(context)
        cluster = self._engine.cluster_of(session)
        task = await self._lane_tasks.find((session.session_id, request.task_id),
                                           cluster.settings.sync_timeout_s)
        if task is None:
            raise _invalid(f"no layer-wise task {request.task_id!r} is running")
        async with task.layers_in_order:
            if task.failed or task.ended:  # the stream reported why, or was cancelled
                return client_pb2.LayerReadyReply()
            return client_pb2.LayerReadyReply(reports=await task.send_layer(request.layer))


async def _unlink_within(engine: Engine, cluster: Cluster, remote_cluster_id: int,
                         force: bool, left_s: float) -> None:
    """Unlink, answering within ``left_s``: the unlink itself (closing the link,
    telling the far daemon) goes on in the background if it takes longer, and
    is never cut off half way."""
    unlinking = asyncio.ensure_future(engine.unlink(cluster, remote_cluster_id, force))
    try:
        await asyncio.wait_for(asyncio.shield(unlinking), max(left_s, 0.0))
    except asyncio.TimeoutError:
        unlinking.add_done_callback(_log_late_unlink)
        raise LLMException(f"unlinking from cluster {remote_cluster_id} did not end within "
                           f"unlink_clusters' timeout; the link is closed, telling cluster "
                           f"{remote_cluster_id} goes on in the background",
                           status_code=LLMStatusCode.LLM_NOTIFY_PROMPT_UNLINK_FAILED) from None


def _log_late_unlink(unlinking: asyncio.Future[None]) -> None:
    if not unlinking.cancelled() and unlinking.exception() is not None:
        logger.warning("an unlink that outlived its call failed: %s", unlinking.exception())


def _repeat_call(push: bool) -> str:
    return "RepeatPush" if push else "RepeatPull"


def _repeat_reply(stats: DaemonStats, repeat: Repeat, started: float, outcome: Outcome,
                  native: bool) -> Any:
    push = repeat.shape.push
    reply_type = client_pb2.PushReply if push else client_pb2.PullCacheReply
    return reply_type(bytes=outcome.bytes, transport=outcome.transport,
                      repeat_handle=repeat.handle, repeat_native=native,
                      **_timing(stats, "push_cache" if push else "pull_cache", started, outcome))


def _timing(stats: DaemonStats, op: str, started: float, outcome: Outcome) -> dict[str, Any]:
    """The daemon's split of a transfer: control work and data movement, in us;
    counted in ``stats`` on the way (the one place a successful pull or push ends)."""
    control_s = max(0.0, time.perf_counter() - started - outcome.data_s)
    stats.transferred(op, outcome.transport, outcome.bytes, control_s, outcome.data_s)
    return {"control_us": int(control_s * 1e6), "data_us": int(outcome.data_s * 1e6)}


def _operand(message: client_pb2.CacheOperand) -> copies.Operand:
    return copies.Operand(message.cache_id, message.pool_id, tuple(message.tensor_offsets),
                          message.tensor_size, message.batch_size, message.buffer_id)
