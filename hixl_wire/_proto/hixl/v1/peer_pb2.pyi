from hixl_wire._proto.hixl.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LeaseState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_RENEWED: _ClassVar[LeaseState]
    LEASE_UNKNOWN: _ClassVar[LeaseState]
    LEASE_DROPPED: _ClassVar[LeaseState]
    LEASE_STOPPING: _ClassVar[LeaseState]
LEASE_RENEWED: LeaseState
LEASE_UNKNOWN: LeaseState
LEASE_DROPPED: LeaseState
LEASE_STOPPING: LeaseState

class HelloRequest(_message.Message):
    __slots__ = ("protocol_version", "daemon_id", "version", "src_cluster_id", "dst_cluster_id", "backend", "challenge", "client_nonce", "proof", "peer_calls")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DAEMON_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SRC_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    DST_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NONCE_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    PEER_CALLS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    daemon_id: str
    version: str
    src_cluster_id: int
    dst_cluster_id: int
    backend: str
    challenge: bytes
    client_nonce: bytes
    proof: bytes
    peer_calls: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, protocol_version: _Optional[int] = ..., daemon_id: _Optional[str] = ..., version: _Optional[str] = ..., src_cluster_id: _Optional[int] = ..., dst_cluster_id: _Optional[int] = ..., backend: _Optional[str] = ..., challenge: _Optional[bytes] = ..., client_nonce: _Optional[bytes] = ..., proof: _Optional[bytes] = ..., peer_calls: _Optional[_Iterable[str]] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("protocol_version", "daemon_id", "version", "data_host", "data_port", "link_token", "backend", "lane_port", "link_key", "server_proof", "lease_ms", "peer_calls")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DAEMON_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DATA_HOST_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    LINK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    LANE_PORT_FIELD_NUMBER: _ClassVar[int]
    LINK_KEY_FIELD_NUMBER: _ClassVar[int]
    SERVER_PROOF_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    PEER_CALLS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    daemon_id: str
    version: str
    data_host: str
    data_port: int
    link_token: int
    backend: str
    lane_port: int
    link_key: bytes
    server_proof: bytes
    lease_ms: int
    peer_calls: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, protocol_version: _Optional[int] = ..., daemon_id: _Optional[str] = ..., version: _Optional[str] = ..., data_host: _Optional[str] = ..., data_port: _Optional[int] = ..., link_token: _Optional[int] = ..., backend: _Optional[str] = ..., lane_port: _Optional[int] = ..., link_key: _Optional[bytes] = ..., server_proof: _Optional[bytes] = ..., lease_ms: _Optional[int] = ..., peer_calls: _Optional[_Iterable[str]] = ...) -> None: ...

class ChallengeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ChallengeReply(_message.Message):
    __slots__ = ("nonce",)
    NONCE_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    def __init__(self, nonce: _Optional[bytes] = ...) -> None: ...

class ResolveCacheRequest(_message.Message):
    __slots__ = ("link_token", "ref")
    LINK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    link_token: int
    ref: _common_pb2.CacheRef
    def __init__(self, link_token: _Optional[int] = ..., ref: _Optional[_Union[_common_pb2.CacheRef, _Mapping]] = ...) -> None: ...

class ResolveCacheReply(_message.Message):
    __slots__ = ("cache_id", "region_id", "tensor_offsets", "tensor_size", "stride", "batch_size", "batch_index", "blocks", "writable")
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    TENSOR_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_SIZE_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_FIELD_NUMBER: _ClassVar[int]
    cache_id: int
    region_id: int
    tensor_offsets: _containers.RepeatedScalarFieldContainer[int]
    tensor_size: int
    stride: int
    batch_size: int
    batch_index: int
    blocks: bool
    writable: bool
    def __init__(self, cache_id: _Optional[int] = ..., region_id: _Optional[int] = ..., tensor_offsets: _Optional[_Iterable[int]] = ..., tensor_size: _Optional[int] = ..., stride: _Optional[int] = ..., batch_size: _Optional[int] = ..., batch_index: _Optional[int] = ..., blocks: _Optional[bool] = ..., writable: _Optional[bool] = ...) -> None: ...

class ReleaseKeyRequest(_message.Message):
    __slots__ = ("link_token", "key", "tensor_indices")
    LINK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TENSOR_INDICES_FIELD_NUMBER: _ClassVar[int]
    link_token: int
    key: _common_pb2.CacheKey
    tensor_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, link_token: _Optional[int] = ..., key: _Optional[_Union[_common_pb2.CacheKey, _Mapping]] = ..., tensor_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class ReleaseKeyReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnlinkRequest(_message.Message):
    __slots__ = ("link_token",)
    LINK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    link_token: int
    def __init__(self, link_token: _Optional[int] = ...) -> None: ...

class UnlinkReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResolveAddressesRequest(_message.Message):
    __slots__ = ("link_token", "addresses", "length")
    LINK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    link_token: int
    addresses: _containers.RepeatedScalarFieldContainer[int]
    length: int
    def __init__(self, link_token: _Optional[int] = ..., addresses: _Optional[_Iterable[int]] = ..., length: _Optional[int] = ...) -> None: ...

class ResolveAddressesReply(_message.Message):
    __slots__ = ("region_ids", "offsets", "writable")
    REGION_IDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_FIELD_NUMBER: _ClassVar[int]
    region_ids: _containers.RepeatedScalarFieldContainer[int]
    offsets: _containers.RepeatedScalarFieldContainer[int]
    writable: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, region_ids: _Optional[_Iterable[int]] = ..., offsets: _Optional[_Iterable[int]] = ..., writable: _Optional[_Iterable[bool]] = ...) -> None: ...

class HcclConnectRequest(_message.Message):
    __slots__ = ("link_token", "root_info", "rank_table", "buffer_mb", "comm_name")
    LINK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ROOT_INFO_FIELD_NUMBER: _ClassVar[int]
    RANK_TABLE_FIELD_NUMBER: _ClassVar[int]
    BUFFER_MB_FIELD_NUMBER: _ClassVar[int]
    COMM_NAME_FIELD_NUMBER: _ClassVar[int]
    link_token: int
    root_info: bytes
    rank_table: str
    buffer_mb: int
    comm_name: str
    def __init__(self, link_token: _Optional[int] = ..., root_info: _Optional[bytes] = ..., rank_table: _Optional[str] = ..., buffer_mb: _Optional[int] = ..., comm_name: _Optional[str] = ...) -> None: ...

class HcclConnectReply(_message.Message):
    __slots__ = ("one_sided",)
    ONE_SIDED_FIELD_NUMBER: _ClassVar[int]
    one_sided: bool
    def __init__(self, one_sided: _Optional[bool] = ...) -> None: ...

class HcclPostRequest(_message.Message):
    __slots__ = ("link_token", "send", "region_id", "ranges", "timeout_ms")
    LINK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SEND_FIELD_NUMBER: _ClassVar[int]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    link_token: int
    send: bool
    region_id: int
    ranges: bytes
    timeout_ms: int
    def __init__(self, link_token: _Optional[int] = ..., send: _Optional[bool] = ..., region_id: _Optional[int] = ..., ranges: _Optional[bytes] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class HcclPostReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HcclPrepareRequest(_message.Message):
    __slots__ = ("link_token", "timeout_ms")
    LINK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    link_token: int
    timeout_ms: int
    def __init__(self, link_token: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class HcclPrepareReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HcclRegionRequest(_message.Message):
    __slots__ = ("link_token", "region_id")
    LINK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    link_token: int
    region_id: int
    def __init__(self, link_token: _Optional[int] = ..., region_id: _Optional[int] = ...) -> None: ...

class HcclRegionReply(_message.Message):
    __slots__ = ("address", "size", "writable", "bound")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    address: int
    size: int
    writable: bool
    bound: bool
    def __init__(self, address: _Optional[int] = ..., size: _Optional[int] = ..., writable: _Optional[bool] = ..., bound: _Optional[bool] = ...) -> None: ...

class HcclRankInfoRequest(_message.Message):
    __slots__ = ("link_token",)
    LINK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    link_token: int
    def __init__(self, link_token: _Optional[int] = ...) -> None: ...

class HcclRank(_message.Message):
    __slots__ = ("host_ip", "device_id", "device_ip", "soc_name", "super_pod", "super_device_id", "super_pod_id")
    HOST_IP_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IP_FIELD_NUMBER: _ClassVar[int]
    SOC_NAME_FIELD_NUMBER: _ClassVar[int]
    SUPER_POD_FIELD_NUMBER: _ClassVar[int]
    SUPER_DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    SUPER_POD_ID_FIELD_NUMBER: _ClassVar[int]
    host_ip: str
    device_id: int
    device_ip: str
    soc_name: str
    super_pod: bool
    super_device_id: int
    super_pod_id: int
    def __init__(self, host_ip: _Optional[str] = ..., device_id: _Optional[int] = ..., device_ip: _Optional[str] = ..., soc_name: _Optional[str] = ..., super_pod: _Optional[bool] = ..., super_device_id: _Optional[int] = ..., super_pod_id: _Optional[int] = ...) -> None: ...

class HcclReserveRequest(_message.Message):
    __slots__ = ("link_token", "comm_name", "hold_ms", "tie_break")
    LINK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMM_NAME_FIELD_NUMBER: _ClassVar[int]
    HOLD_MS_FIELD_NUMBER: _ClassVar[int]
    TIE_BREAK_FIELD_NUMBER: _ClassVar[int]
    link_token: int
    comm_name: str
    hold_ms: int
    tie_break: int
    def __init__(self, link_token: _Optional[int] = ..., comm_name: _Optional[str] = ..., hold_ms: _Optional[int] = ..., tie_break: _Optional[int] = ...) -> None: ...

class HcclReserveReply(_message.Message):
    __slots__ = ("granted", "tie_break")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    TIE_BREAK_FIELD_NUMBER: _ClassVar[int]
    granted: bool
    tie_break: int
    def __init__(self, granted: _Optional[bool] = ..., tie_break: _Optional[int] = ...) -> None: ...

class HcclTeardownRequest(_message.Message):
    __slots__ = ("link_token", "comm_name", "step", "wait_ms")
    class Step(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STEP_WATCH: _ClassVar[HcclTeardownRequest.Step]
        STEP_DESTROYED: _ClassVar[HcclTeardownRequest.Step]
    STEP_WATCH: HcclTeardownRequest.Step
    STEP_DESTROYED: HcclTeardownRequest.Step
    LINK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMM_NAME_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    link_token: int
    comm_name: str
    step: HcclTeardownRequest.Step
    wait_ms: int
    def __init__(self, link_token: _Optional[int] = ..., comm_name: _Optional[str] = ..., step: _Optional[_Union[HcclTeardownRequest.Step, str]] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class HcclTeardownReply(_message.Message):
    __slots__ = ("destroy",)
    DESTROY_FIELD_NUMBER: _ClassVar[int]
    destroy: bool
    def __init__(self, destroy: _Optional[bool] = ...) -> None: ...

class HcclDestroyRequest(_message.Message):
    __slots__ = ("link_token", "comm_name")
    LINK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMM_NAME_FIELD_NUMBER: _ClassVar[int]
    link_token: int
    comm_name: str
    def __init__(self, link_token: _Optional[int] = ..., comm_name: _Optional[str] = ...) -> None: ...

class HcclDestroyReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("daemon_id", "link_tokens")
    DAEMON_ID_FIELD_NUMBER: _ClassVar[int]
    LINK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    daemon_id: str
    link_tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, daemon_id: _Optional[str] = ..., link_tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("daemon_id", "states", "lease_ms")
    DAEMON_ID_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    daemon_id: str
    states: _containers.RepeatedScalarFieldContainer[LeaseState]
    lease_ms: int
    def __init__(self, daemon_id: _Optional[str] = ..., states: _Optional[_Iterable[_Union[LeaseState, str]]] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class NotifyRequest(_message.Message):
    __slots__ = ("link_token", "name", "message")
    LINK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    link_token: int
    name: str
    message: bytes
    def __init__(self, link_token: _Optional[int] = ..., name: _Optional[str] = ..., message: _Optional[bytes] = ...) -> None: ...

class NotifyReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
