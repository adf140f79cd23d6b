"""State and helpers shared by the CacheManager's operation groups."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from hixl_wire._proto.hixl.v1 import client_pb2, common_pb2
from hixl_wire.types import TransferShape

from ._memory import upload_buffer
from .keys import BlocksCacheKey, CacheKey, CacheKeyByIdAndIndex
from .status import LLMException, LLMStatusCode
from .types import CacheDesc

if TYPE_CHECKING:
    from ._memory import PoolMapping
    from ._transport import DaemonConnection
    from .device_buffer import DeviceShareableBuffer
    from .shareable import ShareableBuffer

PULL_KWARGS = ("src_layer_range", "dst_layer_range", "tensor_num_per_layer")


def desc_to_proto(desc: CacheDesc) -> common_pb2.CacheDescriptor:
    return common_pb2.CacheDescriptor(
        num_tensors=desc.num_tensors, shape=list(desc.shape), data_type=desc.data_type.value,
        placement=int(desc.placement), batch_dim_index=desc.batch_dim,
        seq_len_dim_index=desc.seq_len_dim_index, tensor_size=desc.size)


def key_to_proto(key: CacheKey) -> common_pb2.CacheKey:
    return common_pb2.CacheKey(cluster_id=key.cluster_id, req_id=key.req_id,
                               model_id=key.model_id, prefix_id=key.prefix_id)


def ref_to_proto(key: CacheKey | CacheKeyByIdAndIndex | BlocksCacheKey) -> common_pb2.CacheRef:
    if type(key) is BlocksCacheKey:  # pull_blocks' usual key; a dict builds the field fastest
        return common_pb2.CacheRef(blocks_key={"cluster_id": key.cluster_id,
                                               "model_id": key.model_id})
    if isinstance(key, CacheKey):
        return common_pb2.CacheRef(key=key_to_proto(key))
    if isinstance(key, CacheKeyByIdAndIndex):
        return common_pb2.CacheRef(id_and_index=common_pb2.CacheIdAndIndex(
            cluster_id=key.cluster_id, cache_id=key.cache_id, batch_index=key.batch_index))
    return common_pb2.CacheRef(blocks_key=common_pb2.BlocksKey(
        cluster_id=key.cluster_id, model_id=key.model_id))


class ManagerBase:
    """The session, pools and options every cache operation needs."""

    def __init__(self, connection: DaemonConnection, options: dict[str, str],
                 pools: dict[int, PoolMapping], fd_socket: str = "",
                 upload_token: bytes = b"", daemon_tgid: int = 0) -> None:
        self._connection = connection
        self._pools = pools
        self._fd_socket = fd_socket
        self._upload_token = upload_token
        self._daemon_tgid = daemon_tgid  # hccl backend: for exporting device buffers to it
        self._initialized = True
        self._is_call_linked = False
        # Whether this process was bound to the cluster for engine-allocated memory.
        self._process_bound = False
        # pull_cache / push_cache shapes -> the daemon's handle for repeating them
        # (RepeatPull / RepeatPush): at most as many as the daemon hands out for
        # one cluster.
        self._repeat_handles: dict[TransferShape, int] = {}
        # Handles whose repeats the daemon's native lane runs (repeat_native of
        # the last reply for them): these go through the session's rings.
        self._native_handles: set[int] = set()
        self._enabled_mem_pool = bool(options.get("llm.MemPoolConfig"))
        self._enable_host_mem_pool = bool(options.get("llm.HostMemPoolConfig"))
        self._enable_remote_cache_accessible = (
            options.get("llm.EnableRemoteCacheAccessible") == "1")
        self._sync_timeout_s = int(options.get("llm.SyncKvCacheWaitTime", "1000")) / 1000.0

    def _check_is_inited(self) -> None:
        if not self._initialized:
            raise LLMException("the LLMDataDist that created this cache manager was finalized",
                               status_code=LLMStatusCode.LLM_ENGINE_FINALIZED)

    def _expire(self) -> None:
        self._initialized = False

    async def _buffer_id(self, buffer: ShareableBuffer) -> int:
        """The daemon's id of a shareable buffer, handing it over on first use."""
        known = buffer._uploaded.get(self._upload_token)
        if known is None:
            buffer_id = await upload_buffer(self._fd_socket, self._upload_token, buffer.fd)
            known = buffer._uploaded[self._upload_token] = (self._fd_socket, buffer_id)
        return known[1]

    async def _device_buffer_id(self, buffer: DeviceShareableBuffer) -> int:
        """The daemon's id of a device buffer, exporting it to the daemon on first use."""
        known = buffer._imported.get(self._upload_token)
        if known is None:
            if not self._daemon_tgid:
                raise LLMException("device buffers need the daemon's hccl backend",
                                   status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
            key = await asyncio.to_thread(buffer.export_for, self._daemon_tgid)
            reply = await self._connection.call(
                "ImportDeviceBuffer",
                client_pb2.ImportDeviceBufferRequest(ipc_key=key, size=buffer.size,
                                                     device_id=buffer.device_id))
            known = buffer._imported[self._upload_token] = (self._fd_socket, reply.buffer_id)
        return known[1]

