from hixl_wire._proto.hixl.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SelfTestRequest(_message.Message):
    __slots__ = ("bytes",)
    BYTES_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    def __init__(self, bytes: _Optional[int] = ...) -> None: ...

class LinkSelfTest(_message.Message):
    __slots__ = ("local_cluster_id", "remote_cluster_id", "transport", "bytes", "seconds", "skipped", "error")
    LOCAL_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    local_cluster_id: int
    remote_cluster_id: int
    transport: str
    bytes: int
    seconds: float
    skipped: str
    error: str
    def __init__(self, local_cluster_id: _Optional[int] = ..., remote_cluster_id: _Optional[int] = ..., transport: _Optional[str] = ..., bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., skipped: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class SelfTestReply(_message.Message):
    __slots__ = ("links",)
    LINKS_FIELD_NUMBER: _ClassVar[int]
    links: _containers.RepeatedCompositeFieldContainer[LinkSelfTest]
    def __init__(self, links: _Optional[_Iterable[_Union[LinkSelfTest, _Mapping]]] = ...) -> None: ...

class TransferCount(_message.Message):
    __slots__ = ("op", "transport", "status", "calls", "bytes")
    OP_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    op: str
    transport: str
    status: str
    calls: int
    bytes: int
    def __init__(self, op: _Optional[str] = ..., transport: _Optional[str] = ..., status: _Optional[str] = ..., calls: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SessionStatus(_message.Message):
    __slots__ = ("session_id", "client_pid", "client_name", "has_cluster", "cluster_id", "lane_connections", "lane_calls")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_PID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    HAS_CLUSTER_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    LANE_CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    LANE_CALLS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    client_pid: int
    client_name: str
    has_cluster: bool
    cluster_id: int
    lane_connections: int
    lane_calls: int
    def __init__(self, session_id: _Optional[str] = ..., client_pid: _Optional[int] = ..., client_name: _Optional[str] = ..., has_cluster: _Optional[bool] = ..., cluster_id: _Optional[int] = ..., lane_connections: _Optional[int] = ..., lane_calls: _Optional[int] = ...) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("cluster_id", "role", "session_id", "caches", "keys", "options", "repeat_shapes", "repeated_transfers", "repeats_answered_at_once", "listen_address", "listen_shared", "repeats_native")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CACHES_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REPEAT_SHAPES_FIELD_NUMBER: _ClassVar[int]
    REPEATED_TRANSFERS_FIELD_NUMBER: _ClassVar[int]
    REPEATS_ANSWERED_AT_ONCE_FIELD_NUMBER: _ClassVar[int]
    LISTEN_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LISTEN_SHARED_FIELD_NUMBER: _ClassVar[int]
    REPEATS_NATIVE_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    role: str
    session_id: str
    caches: int
    keys: int
    options: _containers.ScalarMap[str, str]
    repeat_shapes: int
    repeated_transfers: int
    repeats_answered_at_once: int
    listen_address: str
    listen_shared: bool
    repeats_native: int
    def __init__(self, cluster_id: _Optional[int] = ..., role: _Optional[str] = ..., session_id: _Optional[str] = ..., caches: _Optional[int] = ..., keys: _Optional[int] = ..., options: _Optional[_Mapping[str, str]] = ..., repeat_shapes: _Optional[int] = ..., repeated_transfers: _Optional[int] = ..., repeats_answered_at_once: _Optional[int] = ..., listen_address: _Optional[str] = ..., listen_shared: _Optional[bool] = ..., repeats_native: _Optional[int] = ...) -> None: ...

class LinkStatus(_message.Message):
    __slots__ = ("local_cluster_id", "remote_cluster_id", "remote_daemon_id", "remote_peer_address", "transport", "streams", "alive", "direction", "data_path", "health")
    LOCAL_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_DAEMON_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    DATA_PATH_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    local_cluster_id: int
    remote_cluster_id: int
    remote_daemon_id: str
    remote_peer_address: str
    transport: str
    streams: int
    alive: bool
    direction: str
    data_path: str
    health: _common_pb2.LinkHealth
    def __init__(self, local_cluster_id: _Optional[int] = ..., remote_cluster_id: _Optional[int] = ..., remote_daemon_id: _Optional[str] = ..., remote_peer_address: _Optional[str] = ..., transport: _Optional[str] = ..., streams: _Optional[int] = ..., alive: _Optional[bool] = ..., direction: _Optional[str] = ..., data_path: _Optional[str] = ..., health: _Optional[_Union[_common_pb2.LinkHealth, _Mapping]] = ...) -> None: ...

class PoolStatus(_message.Message):
    __slots__ = ("pool_id", "cluster_id", "placement", "size", "used", "free", "page_size")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    pool_id: int
    cluster_id: int
    placement: str
    size: int
    used: int
    free: int
    page_size: int
    def __init__(self, pool_id: _Optional[int] = ..., cluster_id: _Optional[int] = ..., placement: _Optional[str] = ..., size: _Optional[int] = ..., used: _Optional[int] = ..., free: _Optional[int] = ..., page_size: _Optional[int] = ...) -> None: ...

class CacheStatus(_message.Message):
    __slots__ = ("cluster_id", "cache_id", "kind", "bytes", "keys", "released")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    cache_id: int
    kind: str
    bytes: int
    keys: int
    released: bool
    def __init__(self, cluster_id: _Optional[int] = ..., cache_id: _Optional[int] = ..., kind: _Optional[str] = ..., bytes: _Optional[int] = ..., keys: _Optional[int] = ..., released: _Optional[bool] = ...) -> None: ...

class DaemonStatus(_message.Message):
    __slots__ = ("daemon_id", "version", "backend", "uptime_s", "peer_address", "data_address", "pool_budget_bytes", "pool_reserved_bytes", "sessions", "clusters", "links", "pools", "caches", "peer_lane_address", "peer_lane_calls", "transfers_under_way", "devices", "transfers", "pid", "metrics_address", "refusals", "transfer_lane", "engine_memory")
    class RefusalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    DAEMON_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    POOL_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    POOL_RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    CACHES_FIELD_NUMBER: _ClassVar[int]
    PEER_LANE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PEER_LANE_CALLS_FIELD_NUMBER: _ClassVar[int]
    TRANSFERS_UNDER_WAY_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    TRANSFERS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REFUSALS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_LANE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_MEMORY_FIELD_NUMBER: _ClassVar[int]
    daemon_id: str
    version: str
    backend: str
    uptime_s: float
    peer_address: str
    data_address: str
    pool_budget_bytes: int
    pool_reserved_bytes: int
    sessions: _containers.RepeatedCompositeFieldContainer[SessionStatus]
    clusters: _containers.RepeatedCompositeFieldContainer[ClusterStatus]
    links: _containers.RepeatedCompositeFieldContainer[LinkStatus]
    pools: _containers.RepeatedCompositeFieldContainer[PoolStatus]
    caches: _containers.RepeatedCompositeFieldContainer[CacheStatus]
    peer_lane_address: str
    peer_lane_calls: int
    transfers_under_way: int
    devices: _containers.RepeatedCompositeFieldContainer[DeviceStatus]
    transfers: _containers.RepeatedCompositeFieldContainer[TransferCount]
    pid: int
    metrics_address: str
    refusals: _containers.ScalarMap[str, int]
    transfer_lane: str
    engine_memory: str
    def __init__(self, daemon_id: _Optional[str] = ..., version: _Optional[str] = ..., backend: _Optional[str] = ..., uptime_s: _Optional[float] = ..., peer_address: _Optional[str] = ..., data_address: _Optional[str] = ..., pool_budget_bytes: _Optional[int] = ..., pool_reserved_bytes: _Optional[int] = ..., sessions: _Optional[_Iterable[_Union[SessionStatus, _Mapping]]] = ..., clusters: _Optional[_Iterable[_Union[ClusterStatus, _Mapping]]] = ..., links: _Optional[_Iterable[_Union[LinkStatus, _Mapping]]] = ..., pools: _Optional[_Iterable[_Union[PoolStatus, _Mapping]]] = ..., caches: _Optional[_Iterable[_Union[CacheStatus, _Mapping]]] = ..., peer_lane_address: _Optional[str] = ..., peer_lane_calls: _Optional[int] = ..., transfers_under_way: _Optional[int] = ..., devices: _Optional[_Iterable[_Union[DeviceStatus, _Mapping]]] = ..., transfers: _Optional[_Iterable[_Union[TransferCount, _Mapping]]] = ..., pid: _Optional[int] = ..., metrics_address: _Optional[str] = ..., refusals: _Optional[_Mapping[str, int]] = ..., transfer_lane: _Optional[str] = ..., engine_memory: _Optional[str] = ...) -> None: ...

class DeviceStatus(_message.Message):
    __slots__ = ("device_id", "budget_bytes", "reserved_bytes", "hccl_buffer_bytes", "communicators")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    HCCL_BUFFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMMUNICATORS_FIELD_NUMBER: _ClassVar[int]
    device_id: int
    budget_bytes: int
    reserved_bytes: int
    hccl_buffer_bytes: int
    communicators: int
    def __init__(self, device_id: _Optional[int] = ..., budget_bytes: _Optional[int] = ..., reserved_bytes: _Optional[int] = ..., hccl_buffer_bytes: _Optional[int] = ..., communicators: _Optional[int] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DrainReply(_message.Message):
    __slots__ = ("already_draining", "grace_period_s")
    ALREADY_DRAINING_FIELD_NUMBER: _ClassVar[int]
    GRACE_PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    already_draining: bool
    grace_period_s: float
    def __init__(self, already_draining: _Optional[bool] = ..., grace_period_s: _Optional[float] = ...) -> None: ...
