from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CacheDescriptor(_message.Message):
    __slots__ = ("num_tensors", "shape", "data_type", "placement", "batch_dim_index", "seq_len_dim_index", "tensor_size")
    NUM_TENSORS_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    BATCH_DIM_INDEX_FIELD_NUMBER: _ClassVar[int]
    SEQ_LEN_DIM_INDEX_FIELD_NUMBER: _ClassVar[int]
    TENSOR_SIZE_FIELD_NUMBER: _ClassVar[int]
    num_tensors: int
    shape: _containers.RepeatedScalarFieldContainer[int]
    data_type: int
    placement: int
    batch_dim_index: int
    seq_len_dim_index: int
    tensor_size: int
    def __init__(self, num_tensors: _Optional[int] = ..., shape: _Optional[_Iterable[int]] = ..., data_type: _Optional[int] = ..., placement: _Optional[int] = ..., batch_dim_index: _Optional[int] = ..., seq_len_dim_index: _Optional[int] = ..., tensor_size: _Optional[int] = ...) -> None: ...

class CacheKey(_message.Message):
    __slots__ = ("cluster_id", "req_id", "model_id", "prefix_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    req_id: int
    model_id: int
    prefix_id: int
    def __init__(self, cluster_id: _Optional[int] = ..., req_id: _Optional[int] = ..., model_id: _Optional[int] = ..., prefix_id: _Optional[int] = ...) -> None: ...

class CacheIdAndIndex(_message.Message):
    __slots__ = ("cluster_id", "cache_id", "batch_index")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    cache_id: int
    batch_index: int
    def __init__(self, cluster_id: _Optional[int] = ..., cache_id: _Optional[int] = ..., batch_index: _Optional[int] = ...) -> None: ...

class BlocksKey(_message.Message):
    __slots__ = ("cluster_id", "model_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    model_id: int
    def __init__(self, cluster_id: _Optional[int] = ..., model_id: _Optional[int] = ...) -> None: ...

class CacheRef(_message.Message):
    __slots__ = ("key", "id_and_index", "blocks_key")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ID_AND_INDEX_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_KEY_FIELD_NUMBER: _ClassVar[int]
    key: CacheKey
    id_and_index: CacheIdAndIndex
    blocks_key: BlocksKey
    def __init__(self, key: _Optional[_Union[CacheKey, _Mapping]] = ..., id_and_index: _Optional[_Union[CacheIdAndIndex, _Mapping]] = ..., blocks_key: _Optional[_Union[BlocksKey, _Mapping]] = ...) -> None: ...

class CallError(_message.Message):
    __slots__ = ("grpc_code", "llm_status", "message")
    GRPC_CODE_FIELD_NUMBER: _ClassVar[int]
    LLM_STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    grpc_code: int
    llm_status: int
    message: str
    def __init__(self, grpc_code: _Optional[int] = ..., llm_status: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class LinkHealth(_message.Message):
    __slots__ = ("link_id", "state", "since_unix_s", "last_error", "streams_up", "streams", "bytes", "transfers", "failed_transfers", "lease_left_s")
    LINK_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    STREAMS_UP_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TRANSFERS_FIELD_NUMBER: _ClassVar[int]
    FAILED_TRANSFERS_FIELD_NUMBER: _ClassVar[int]
    LEASE_LEFT_S_FIELD_NUMBER: _ClassVar[int]
    link_id: str
    state: str
    since_unix_s: float
    last_error: str
    streams_up: int
    streams: int
    bytes: int
    transfers: int
    failed_transfers: int
    lease_left_s: float
    def __init__(self, link_id: _Optional[str] = ..., state: _Optional[str] = ..., since_unix_s: _Optional[float] = ..., last_error: _Optional[str] = ..., streams_up: _Optional[int] = ..., streams: _Optional[int] = ..., bytes: _Optional[int] = ..., transfers: _Optional[int] = ..., failed_transfers: _Optional[int] = ..., lease_left_s: _Optional[float] = ...) -> None: ...
