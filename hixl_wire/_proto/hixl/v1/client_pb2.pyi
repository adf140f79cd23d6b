from hixl_wire._proto.hixl.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Checksum(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKSUM_DEFAULT: _ClassVar[Checksum]
    CHECKSUM_ON: _ClassVar[Checksum]
    CHECKSUM_OFF: _ClassVar[Checksum]
CHECKSUM_DEFAULT: Checksum
CHECKSUM_ON: Checksum
CHECKSUM_OFF: Checksum

class AttachRequest(_message.Message):
    __slots__ = ("client_pid", "client_name")
    CLIENT_PID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    client_pid: int
    client_name: str
    def __init__(self, client_pid: _Optional[int] = ..., client_name: _Optional[str] = ...) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("attached", "notify")
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_FIELD_NUMBER: _ClassVar[int]
    attached: Attached
    notify: Notify
    def __init__(self, attached: _Optional[_Union[Attached, _Mapping]] = ..., notify: _Optional[_Union[Notify, _Mapping]] = ...) -> None: ...

class Attached(_message.Message):
    __slots__ = ("session_id", "daemon_id", "version", "fd_socket", "lane_socket", "peer_address")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DAEMON_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FD_SOCKET_FIELD_NUMBER: _ClassVar[int]
    LANE_SOCKET_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    daemon_id: str
    version: str
    fd_socket: str
    lane_socket: str
    peer_address: str
    def __init__(self, session_id: _Optional[str] = ..., daemon_id: _Optional[str] = ..., version: _Optional[str] = ..., fd_socket: _Optional[str] = ..., lane_socket: _Optional[str] = ..., peer_address: _Optional[str] = ...) -> None: ...

class InitRequest(_message.Message):
    __slots__ = ("cluster_id", "role", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    role: int
    options: _containers.ScalarMap[str, str]
    def __init__(self, cluster_id: _Optional[int] = ..., role: _Optional[int] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PoolInfo(_message.Message):
    __slots__ = ("pool_id", "placement", "size", "page_shift", "fd_token", "on_device", "device_id")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SHIFT_FIELD_NUMBER: _ClassVar[int]
    FD_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ON_DEVICE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    pool_id: int
    placement: int
    size: int
    page_shift: int
    fd_token: bytes
    on_device: bool
    device_id: int
    def __init__(self, pool_id: _Optional[int] = ..., placement: _Optional[int] = ..., size: _Optional[int] = ..., page_shift: _Optional[int] = ..., fd_token: _Optional[bytes] = ..., on_device: _Optional[bool] = ..., device_id: _Optional[int] = ...) -> None: ...

class InitReply(_message.Message):
    __slots__ = ("pools", "fd_socket", "upload_token", "backend", "cann_path", "daemon_tgid")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    FD_SOCKET_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    CANN_PATH_FIELD_NUMBER: _ClassVar[int]
    DAEMON_TGID_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolInfo]
    fd_socket: str
    upload_token: bytes
    backend: str
    cann_path: str
    daemon_tgid: int
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolInfo, _Mapping]]] = ..., fd_socket: _Optional[str] = ..., upload_token: _Optional[bytes] = ..., backend: _Optional[str] = ..., cann_path: _Optional[str] = ..., daemon_tgid: _Optional[int] = ...) -> None: ...

class ImportDeviceBufferRequest(_message.Message):
    __slots__ = ("ipc_key", "size", "device_id")
    IPC_KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    ipc_key: str
    size: int
    device_id: int
    def __init__(self, ipc_key: _Optional[str] = ..., size: _Optional[int] = ..., device_id: _Optional[int] = ...) -> None: ...

class ImportDeviceBufferReply(_message.Message):
    __slots__ = ("buffer_id",)
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    buffer_id: int
    def __init__(self, buffer_id: _Optional[int] = ...) -> None: ...

class ShareDevicePoolsRequest(_message.Message):
    __slots__ = ("tgid",)
    TGID_FIELD_NUMBER: _ClassVar[int]
    tgid: int
    def __init__(self, tgid: _Optional[int] = ...) -> None: ...

class DevicePoolKey(_message.Message):
    __slots__ = ("pool_id", "ipc_key")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    IPC_KEY_FIELD_NUMBER: _ClassVar[int]
    pool_id: int
    ipc_key: str
    def __init__(self, pool_id: _Optional[int] = ..., ipc_key: _Optional[str] = ...) -> None: ...

class ShareDevicePoolsReply(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[DevicePoolKey]
    def __init__(self, pools: _Optional[_Iterable[_Union[DevicePoolKey, _Mapping]]] = ...) -> None: ...

class FinalizeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FinalizeReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterLink(_message.Message):
    __slots__ = ("remote_cluster_id", "remote_host", "remote_port")
    REMOTE_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_HOST_FIELD_NUMBER: _ClassVar[int]
    REMOTE_PORT_FIELD_NUMBER: _ClassVar[int]
    remote_cluster_id: int
    remote_host: str
    remote_port: int
    def __init__(self, remote_cluster_id: _Optional[int] = ..., remote_host: _Optional[str] = ..., remote_port: _Optional[int] = ...) -> None: ...

class LinkClustersRequest(_message.Message):
    __slots__ = ("clusters", "timeout_ms", "force")
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedCompositeFieldContainer[ClusterLink]
    timeout_ms: int
    force: bool
    def __init__(self, clusters: _Optional[_Iterable[_Union[ClusterLink, _Mapping]]] = ..., timeout_ms: _Optional[int] = ..., force: _Optional[bool] = ...) -> None: ...

class UnlinkClustersRequest(_message.Message):
    __slots__ = ("clusters", "timeout_ms", "force")
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedCompositeFieldContainer[ClusterLink]
    timeout_ms: int
    force: bool
    def __init__(self, clusters: _Optional[_Iterable[_Union[ClusterLink, _Mapping]]] = ..., timeout_ms: _Optional[int] = ..., force: _Optional[bool] = ...) -> None: ...

class LinkResult(_message.Message):
    __slots__ = ("status", "transport", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: int
    transport: str
    message: str
    def __init__(self, status: _Optional[int] = ..., transport: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class LinkClustersReply(_message.Message):
    __slots__ = ("status", "results")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    status: int
    results: _containers.RepeatedCompositeFieldContainer[LinkResult]
    def __init__(self, status: _Optional[int] = ..., results: _Optional[_Iterable[_Union[LinkResult, _Mapping]]] = ...) -> None: ...

class AllocateCacheRequest(_message.Message):
    __slots__ = ("desc", "keys", "blocks", "blocks_key", "has_blocks_key")
    DESC_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_KEY_FIELD_NUMBER: _ClassVar[int]
    HAS_BLOCKS_KEY_FIELD_NUMBER: _ClassVar[int]
    desc: _common_pb2.CacheDescriptor
    keys: _containers.RepeatedCompositeFieldContainer[_common_pb2.CacheKey]
    blocks: bool
    blocks_key: _common_pb2.BlocksKey
    has_blocks_key: bool
    def __init__(self, desc: _Optional[_Union[_common_pb2.CacheDescriptor, _Mapping]] = ..., keys: _Optional[_Iterable[_Union[_common_pb2.CacheKey, _Mapping]]] = ..., blocks: _Optional[bool] = ..., blocks_key: _Optional[_Union[_common_pb2.BlocksKey, _Mapping]] = ..., has_blocks_key: _Optional[bool] = ...) -> None: ...

class AllocateCacheReply(_message.Message):
    __slots__ = ("cache_id", "pool_id", "tensor_offsets")
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    TENSOR_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    cache_id: int
    pool_id: int
    tensor_offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, cache_id: _Optional[int] = ..., pool_id: _Optional[int] = ..., tensor_offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class DeallocateCacheRequest(_message.Message):
    __slots__ = ("cache_id", "blocks")
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    cache_id: int
    blocks: bool
    def __init__(self, cache_id: _Optional[int] = ..., blocks: _Optional[bool] = ...) -> None: ...

class DeallocateCacheReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RemoveCacheKeyRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: _common_pb2.CacheKey
    def __init__(self, key: _Optional[_Union[_common_pb2.CacheKey, _Mapping]] = ...) -> None: ...

class RemoveCacheKeyReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PullCacheRequest(_message.Message):
    __slots__ = ("src", "dst_cache_id", "batch_index", "size", "src_tensor_indices", "dst_tensor_indices", "tensor_num_per_layer", "src_blocks", "dst_blocks", "checksum")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SRC_TENSOR_INDICES_FIELD_NUMBER: _ClassVar[int]
    DST_TENSOR_INDICES_FIELD_NUMBER: _ClassVar[int]
    TENSOR_NUM_PER_LAYER_FIELD_NUMBER: _ClassVar[int]
    SRC_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    src: _common_pb2.CacheRef
    dst_cache_id: int
    batch_index: int
    size: int
    src_tensor_indices: _containers.RepeatedScalarFieldContainer[int]
    dst_tensor_indices: _containers.RepeatedScalarFieldContainer[int]
    tensor_num_per_layer: int
    src_blocks: _containers.RepeatedScalarFieldContainer[int]
    dst_blocks: _containers.RepeatedScalarFieldContainer[int]
    checksum: Checksum
    def __init__(self, src: _Optional[_Union[_common_pb2.CacheRef, _Mapping]] = ..., dst_cache_id: _Optional[int] = ..., batch_index: _Optional[int] = ..., size: _Optional[int] = ..., src_tensor_indices: _Optional[_Iterable[int]] = ..., dst_tensor_indices: _Optional[_Iterable[int]] = ..., tensor_num_per_layer: _Optional[int] = ..., src_blocks: _Optional[_Iterable[int]] = ..., dst_blocks: _Optional[_Iterable[int]] = ..., checksum: _Optional[_Union[Checksum, str]] = ...) -> None: ...

class PullCacheReply(_message.Message):
    __slots__ = ("bytes", "transport", "control_us", "data_us", "repeat_handle", "repeat_native")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    CONTROL_US_FIELD_NUMBER: _ClassVar[int]
    DATA_US_FIELD_NUMBER: _ClassVar[int]
    REPEAT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    REPEAT_NATIVE_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    transport: str
    control_us: int
    data_us: int
    repeat_handle: int
    repeat_native: bool
    def __init__(self, bytes: _Optional[int] = ..., transport: _Optional[str] = ..., control_us: _Optional[int] = ..., data_us: _Optional[int] = ..., repeat_handle: _Optional[int] = ..., repeat_native: _Optional[bool] = ...) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("dst", "src_cache_id", "src_batch_index", "src_tensor_indices", "dst_tensor_indices", "tensor_num_per_layer", "src_blocks", "dst_blocks", "checksum")
    DST_FIELD_NUMBER: _ClassVar[int]
    SRC_CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    SRC_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    SRC_TENSOR_INDICES_FIELD_NUMBER: _ClassVar[int]
    DST_TENSOR_INDICES_FIELD_NUMBER: _ClassVar[int]
    TENSOR_NUM_PER_LAYER_FIELD_NUMBER: _ClassVar[int]
    SRC_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    dst: _common_pb2.CacheRef
    src_cache_id: int
    src_batch_index: int
    src_tensor_indices: _containers.RepeatedScalarFieldContainer[int]
    dst_tensor_indices: _containers.RepeatedScalarFieldContainer[int]
    tensor_num_per_layer: int
    src_blocks: _containers.RepeatedScalarFieldContainer[int]
    dst_blocks: _containers.RepeatedScalarFieldContainer[int]
    checksum: Checksum
    def __init__(self, dst: _Optional[_Union[_common_pb2.CacheRef, _Mapping]] = ..., src_cache_id: _Optional[int] = ..., src_batch_index: _Optional[int] = ..., src_tensor_indices: _Optional[_Iterable[int]] = ..., dst_tensor_indices: _Optional[_Iterable[int]] = ..., tensor_num_per_layer: _Optional[int] = ..., src_blocks: _Optional[_Iterable[int]] = ..., dst_blocks: _Optional[_Iterable[int]] = ..., checksum: _Optional[_Union[Checksum, str]] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("bytes", "transport", "control_us", "data_us", "repeat_handle", "repeat_native")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    CONTROL_US_FIELD_NUMBER: _ClassVar[int]
    DATA_US_FIELD_NUMBER: _ClassVar[int]
    REPEAT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    REPEAT_NATIVE_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    transport: str
    control_us: int
    data_us: int
    repeat_handle: int
    repeat_native: bool
    def __init__(self, bytes: _Optional[int] = ..., transport: _Optional[str] = ..., control_us: _Optional[int] = ..., data_us: _Optional[int] = ..., repeat_handle: _Optional[int] = ..., repeat_native: _Optional[bool] = ...) -> None: ...

class CacheOperand(_message.Message):
    __slots__ = ("cache_id", "pool_id", "tensor_offsets", "tensor_size", "batch_size", "buffer_id")
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    TENSOR_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    cache_id: int
    pool_id: int
    tensor_offsets: _containers.RepeatedScalarFieldContainer[int]
    tensor_size: int
    batch_size: int
    buffer_id: int
    def __init__(self, cache_id: _Optional[int] = ..., pool_id: _Optional[int] = ..., tensor_offsets: _Optional[_Iterable[int]] = ..., tensor_size: _Optional[int] = ..., batch_size: _Optional[int] = ..., buffer_id: _Optional[int] = ...) -> None: ...

class CopyCacheRequest(_message.Message):
    __slots__ = ("dst_cache_id", "src_cache_id", "dst_batch_index", "src_batch_index", "offset", "size")
    DST_CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    SRC_CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    DST_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    SRC_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    dst_cache_id: int
    src_cache_id: int
    dst_batch_index: int
    src_batch_index: int
    offset: int
    size: int
    def __init__(self, dst_cache_id: _Optional[int] = ..., src_cache_id: _Optional[int] = ..., dst_batch_index: _Optional[int] = ..., src_batch_index: _Optional[int] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class CopyBlocksRequest(_message.Message):
    __slots__ = ("cache_id", "src_blocks", "dst_blocks")
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    SRC_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    cache_id: int
    src_blocks: _containers.RepeatedScalarFieldContainer[int]
    dst_blocks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, cache_id: _Optional[int] = ..., src_blocks: _Optional[_Iterable[int]] = ..., dst_blocks: _Optional[_Iterable[int]] = ...) -> None: ...

class SwapBlocksRequest(_message.Message):
    __slots__ = ("src", "dst", "src_blocks", "dst_blocks")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    SRC_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    src: CacheOperand
    dst: CacheOperand
    src_blocks: _containers.RepeatedScalarFieldContainer[int]
    dst_blocks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, src: _Optional[_Union[CacheOperand, _Mapping]] = ..., dst: _Optional[_Union[CacheOperand, _Mapping]] = ..., src_blocks: _Optional[_Iterable[int]] = ..., dst_blocks: _Optional[_Iterable[int]] = ...) -> None: ...

class CopyReply(_message.Message):
    __slots__ = ("bytes",)
    BYTES_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    def __init__(self, bytes: _Optional[int] = ...) -> None: ...

class TransferTarget(_message.Message):
    __slots__ = ("dst_cluster_id", "dst", "dst_addrs", "src_layer_start", "src_layer_stop", "dst_layer_start", "src_batch_index")
    DST_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    DST_ADDRS_FIELD_NUMBER: _ClassVar[int]
    SRC_LAYER_START_FIELD_NUMBER: _ClassVar[int]
    SRC_LAYER_STOP_FIELD_NUMBER: _ClassVar[int]
    DST_LAYER_START_FIELD_NUMBER: _ClassVar[int]
    SRC_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    dst_cluster_id: int
    dst: _common_pb2.CacheRef
    dst_addrs: _containers.RepeatedScalarFieldContainer[int]
    src_layer_start: int
    src_layer_stop: int
    dst_layer_start: int
    src_batch_index: int
    def __init__(self, dst_cluster_id: _Optional[int] = ..., dst: _Optional[_Union[_common_pb2.CacheRef, _Mapping]] = ..., dst_addrs: _Optional[_Iterable[int]] = ..., src_layer_start: _Optional[int] = ..., src_layer_stop: _Optional[int] = ..., dst_layer_start: _Optional[int] = ..., src_batch_index: _Optional[int] = ...) -> None: ...

class TransferStart(_message.Message):
    __slots__ = ("src_cache_id", "targets", "src_blocks", "dst_blocks", "dst_block_memory_size", "lane_task_id")
    SRC_CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    SRC_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCK_MEMORY_SIZE_FIELD_NUMBER: _ClassVar[int]
    LANE_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    src_cache_id: int
    targets: _containers.RepeatedCompositeFieldContainer[TransferTarget]
    src_blocks: _containers.RepeatedScalarFieldContainer[int]
    dst_blocks: _containers.RepeatedScalarFieldContainer[int]
    dst_block_memory_size: int
    lane_task_id: str
    def __init__(self, src_cache_id: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[TransferTarget, _Mapping]]] = ..., src_blocks: _Optional[_Iterable[int]] = ..., dst_blocks: _Optional[_Iterable[int]] = ..., dst_block_memory_size: _Optional[int] = ..., lane_task_id: _Optional[str] = ...) -> None: ...

class LayerReadyRequest(_message.Message):
    __slots__ = ("task_id", "layer")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    layer: int
    def __init__(self, task_id: _Optional[str] = ..., layer: _Optional[int] = ...) -> None: ...

class LayerReadyReply(_message.Message):
    __slots__ = ("reports",)
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[TransferProgress]
    def __init__(self, reports: _Optional[_Iterable[_Union[TransferProgress, _Mapping]]] = ...) -> None: ...

class TransferMessage(_message.Message):
    __slots__ = ("start", "layer_ready")
    START_FIELD_NUMBER: _ClassVar[int]
    LAYER_READY_FIELD_NUMBER: _ClassVar[int]
    start: TransferStart
    layer_ready: int
    def __init__(self, start: _Optional[_Union[TransferStart, _Mapping]] = ..., layer_ready: _Optional[int] = ...) -> None: ...

class TransferProgress(_message.Message):
    __slots__ = ("target", "layer", "status", "message", "target_done")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TARGET_DONE_FIELD_NUMBER: _ClassVar[int]
    target: int
    layer: int
    status: int
    message: str
    target_done: bool
    def __init__(self, target: _Optional[int] = ..., layer: _Optional[int] = ..., status: _Optional[int] = ..., message: _Optional[str] = ..., target_done: _Optional[bool] = ...) -> None: ...

class RegisterCacheRequest(_message.Message):
    __slots__ = ("desc", "buffer_id", "tensor_offsets", "keys", "blocks", "blocks_key", "has_blocks_key", "remote_accessible", "buffer_address", "client_addrs", "in_pool", "pool_id")
    DESC_FIELD_NUMBER: _ClassVar[int]
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    TENSOR_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_KEY_FIELD_NUMBER: _ClassVar[int]
    HAS_BLOCKS_KEY_FIELD_NUMBER: _ClassVar[int]
    REMOTE_ACCESSIBLE_FIELD_NUMBER: _ClassVar[int]
    BUFFER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDRS_FIELD_NUMBER: _ClassVar[int]
    IN_POOL_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    desc: _common_pb2.CacheDescriptor
    buffer_id: int
    tensor_offsets: _containers.RepeatedScalarFieldContainer[int]
    keys: _containers.RepeatedCompositeFieldContainer[_common_pb2.CacheKey]
    blocks: bool
    blocks_key: _common_pb2.BlocksKey
    has_blocks_key: bool
    remote_accessible: bool
    buffer_address: int
    client_addrs: _containers.RepeatedScalarFieldContainer[int]
    in_pool: bool
    pool_id: int
    def __init__(self, desc: _Optional[_Union[_common_pb2.CacheDescriptor, _Mapping]] = ..., buffer_id: _Optional[int] = ..., tensor_offsets: _Optional[_Iterable[int]] = ..., keys: _Optional[_Iterable[_Union[_common_pb2.CacheKey, _Mapping]]] = ..., blocks: _Optional[bool] = ..., blocks_key: _Optional[_Union[_common_pb2.BlocksKey, _Mapping]] = ..., has_blocks_key: _Optional[bool] = ..., remote_accessible: _Optional[bool] = ..., buffer_address: _Optional[int] = ..., client_addrs: _Optional[_Iterable[int]] = ..., in_pool: _Optional[bool] = ..., pool_id: _Optional[int] = ...) -> None: ...

class UnregisterCacheRequest(_message.Message):
    __slots__ = ("cache_id",)
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    cache_id: int
    def __init__(self, cache_id: _Optional[int] = ...) -> None: ...

class UnregisterCacheReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SwitchRoleRequest(_message.Message):
    __slots__ = ("role",)
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: int
    def __init__(self, role: _Optional[int] = ...) -> None: ...

class SwitchRoleReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolAddress(_message.Message):
    __slots__ = ("pool_id", "address")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    pool_id: int
    address: int
    def __init__(self, pool_id: _Optional[int] = ..., address: _Optional[int] = ...) -> None: ...

class ReportMappingsRequest(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolAddress]
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolAddress, _Mapping]]] = ...) -> None: ...

class ReportMappingsReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueryLinkStatesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterLinkState(_message.Message):
    __slots__ = ("remote_cluster_id", "direction", "remote_daemon_id", "transport", "health")
    REMOTE_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    REMOTE_DAEMON_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    remote_cluster_id: int
    direction: str
    remote_daemon_id: str
    transport: str
    health: _common_pb2.LinkHealth
    def __init__(self, remote_cluster_id: _Optional[int] = ..., direction: _Optional[str] = ..., remote_daemon_id: _Optional[str] = ..., transport: _Optional[str] = ..., health: _Optional[_Union[_common_pb2.LinkHealth, _Mapping]] = ...) -> None: ...

class QueryLinkStatesReply(_message.Message):
    __slots__ = ("links",)
    LINKS_FIELD_NUMBER: _ClassVar[int]
    links: _containers.RepeatedCompositeFieldContainer[ClusterLinkState]
    def __init__(self, links: _Optional[_Iterable[_Union[ClusterLinkState, _Mapping]]] = ...) -> None: ...

class Notify(_message.Message):
    __slots__ = ("src_cluster_id", "name", "message")
    SRC_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    src_cluster_id: int
    name: str
    message: bytes
    def __init__(self, src_cluster_id: _Optional[int] = ..., name: _Optional[str] = ..., message: _Optional[bytes] = ...) -> None: ...

class SendNotifyRequest(_message.Message):
    __slots__ = ("remote_cluster_id", "name", "message", "timeout_ms")
    REMOTE_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    remote_cluster_id: int
    name: str
    message: bytes
    timeout_ms: int
    def __init__(self, remote_cluster_id: _Optional[int] = ..., name: _Optional[str] = ..., message: _Optional[bytes] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class SendNotifyReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
