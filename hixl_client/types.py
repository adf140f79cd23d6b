"""Data types, placements, roles and the cache descriptor.

numpy is optional, so the numpy dtype maps (`dtype_to_np_dtype`,
`valid_np_dtypes`, `np_dtype_to_dtype`) are built on first access through a
module ``__getattr__`` limited to exactly those three names; importing this
module never imports numpy.
"""

from __future__ import annotations

import abc
import enum
import math
from dataclasses import dataclass
from typing import Any

from hixl_client._validation import (
    INT64_MAX,
    check_int32,
    check_int64,
    check_isinstance,
    check_list_int64,
    check_uint32,
)
from hixl_client.status import LLMException, LLMStatusCode, raise_if_false
from hixl_wire.types import DataType, LLMRole, Placement, bytes_per_element

__all__ = [
    "CacheDesc",
    "DataType",
    "LLMRole",
    "LayerSynchronizer",
    "LinkState",
    "LinkStatus",
    "MemInfo",
    "Memtype",
    "Placement",
    "RegisterMemStatus",
    "bytes_per_element",
    "numpy_dtype",
    "role_to_str",
    "validate_cpu_cache_args",
]


_LAZY_NUMPY_NAMES = frozenset({"dtype_to_np_dtype", "valid_np_dtypes", "np_dtype_to_dtype"})


def _build_numpy_maps() -> None:
    import numpy as np

    to_np: dict[DataType, Any] = {
        DataType.DT_FLOAT: np.float32,
        DataType.DT_FLOAT16: np.float16,
        # numpy has no bfloat16; the reference maps it to float16 (same width).
        DataType.DT_BF16: np.float16,
        DataType.DT_INT8: np.int8,
        DataType.DT_INT16: np.int16,
        DataType.DT_UINT16: np.uint16,
        DataType.DT_UINT8: np.uint8,
        DataType.DT_INT32: np.int32,
        DataType.DT_INT64: np.int64,
        DataType.DT_UINT32: np.uint32,
        DataType.DT_UINT64: np.uint64,
        DataType.DT_BOOL: np.bool_,
        DataType.DT_DOUBLE: np.double,
        DataType.DT_STRING: np.bytes_,
    }
    # Keyed by np.dtype so that ``np_dtype_to_dtype[array.dtype]`` works; BF16 is left
    # out because float16 already means DT_FLOAT16.
    from_np = {np.dtype(t): dt for dt, t in to_np.items() if dt is not DataType.DT_BF16}
    globals().update(
        dtype_to_np_dtype=to_np, valid_np_dtypes=list(to_np.values()), np_dtype_to_dtype=from_np
    )


def numpy_dtype(data_type: DataType) -> Any:
    """The numpy dtype a tensor's elements are stored as.

    Unlike the reference's `dtype_to_np_dtype`, kept as LLM-DataDist has it,
    ``DT_BF16`` is bfloat16 (from ml_dtypes), never float16.

    Raises:
        LLMException: ``DT_BF16`` without ml_dtypes installed
            (``LLM_FEATURE_NOT_ENABLED``).
    """
    import numpy as np

    if data_type is DataType.DT_BF16:
        try:
            from ml_dtypes import bfloat16
        except ImportError:
            raise LLMException("DT_BF16 tensors need the ml_dtypes package for a numpy view "
                               "(numpy has no bfloat16): pip install ml_dtypes",
                               status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED) from None
        return np.dtype(bfloat16)
    if "dtype_to_np_dtype" not in globals():
        _build_numpy_maps()
    return np.dtype(globals()["dtype_to_np_dtype"][data_type])


def __getattr__(name: str) -> Any:
    """Build the numpy dtype maps on first access; any other name is an AttributeError."""
    if name not in _LAZY_NUMPY_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _build_numpy_maps()
    return globals()[name]


def role_to_str(role: LLMRole) -> str:
    """Return the option spelling of a role: ``"Prompt"``, ``"Decoder"`` or ``"Mix"``.

    Args:
        role: the role.

    Returns:
        The role's name with only its first letter upper-case.
    """
    return role.name.capitalize()


class RegisterMemStatus(enum.Enum):
    """Progress of memory registration after a two-sided ``link``."""

    OK = 0
    PREPARING = 1
    FAILED = 2


class LinkState(enum.Enum):
    """hixl extension: where a link is in its life (docs/daemon.md, "Link states")."""

    CONNECTING = "connecting"  # handshaking, at first or again after the peer restarted
    UP = "up"
    DEGRADED = "degraded"  # some data streams lost and being reopened, or heartbeats missed
    DOWN = "down"  # the peer unreachable past links.down_after_s, or it dropped the link
    CLOSED = "closed"


@dataclass(frozen=True)
class LinkStatus:
    """hixl extension: one link of this cluster, as ``query_link_states`` reports it.

    Attributes:
        remote_cluster_id: the cluster at the other end.
        direction: ``"outbound"`` (this cluster linked) or ``"inbound"`` (it linked here).
        state: the link's state.
        since: when it entered ``state``, seconds since the epoch.
        last_error: why it last left ``up`` (empty if it never did).
        streams_up: data streams connected now, of ``streams``.
        streams: data streams of the link.
        bytes: payload bytes moved by this cluster's transfers over it (outbound).
        transfers: transfers over it that ended (outbound).
        failed_transfers: of those, the failed ones.
        remote_daemon_id: the daemon holding the other end.
        transport: ``"tcp"``, ``"hccl"`` or ``"local"``.
        lease_left_s: inbound: seconds until the link is dropped unless renewed.
    """

    remote_cluster_id: int
    direction: str
    state: LinkState
    since: float
    last_error: str
    streams_up: int
    streams: int
    bytes: int
    transfers: int
    failed_transfers: int
    remote_daemon_id: str
    transport: str
    lease_left_s: float = 0.0


class Memtype(enum.Enum):
    """Kind of memory named by a `MemInfo`."""

    MEM_TYPE_DEVICE = 0
    MEM_TYPE_HOST = 1


class MemInfo:
    """A memory range, as given to ``remap_registered_memory``.

    Args:
        mem_type: the kind of memory.
        addr: start address.
        size: length in bytes.

    Raises:
        TypeError: an argument has the wrong type (None is tolerated, as in the reference).
    """

    def __init__(self, mem_type: Memtype, addr: int, size: int) -> None:
        check_isinstance("mem_type", mem_type, Memtype)
        check_isinstance("addr", addr, int)
        check_isinstance("size", size, int)
        self._mem_type = mem_type
        self._addr = addr
        self._size = size

    @property
    def mem_type(self) -> Memtype:
        """The kind of memory."""
        return self._mem_type

    @property
    def addr(self) -> int:
        """The start address."""
        return self._addr

    @property
    def size(self) -> int:
        """The length in bytes."""
        return self._size

    def __repr__(self) -> str:
        return f"MemInfo(mem_type={self._mem_type}, addr={self._addr}, size={self._size})"

    __str__ = __repr__


class CacheDesc:
    """Describes a cache: ``num_tensors`` tensors of one shape, type and placement.

    Args:
        num_tensors: number of tensors (uint32; 0 is accepted here).
        shape: the shape of each tensor, a list or tuple of int64 dims.
        data_type: the element type.
        placement: where the memory lives.
        batch_dim_index: the batch dimension, in ``[0, len(shape))``.
        seq_len_dim_index: the sequence-length dimension, or -1.
        kv_tensor_format: an optional format label.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: ``num_tensors``, ``seq_len_dim_index`` or a dim is out of its integer range.
        LLMException: a dimension index is out of range (``LLM_PARAM_INVALID``).
    """

    def __init__(
        self,
        num_tensors: int,
        shape: list[int] | tuple[int, ...],
        data_type: DataType,
        placement: Placement = Placement.DEVICE,
        batch_dim_index: int = 0,
        seq_len_dim_index: int = -1,
        kv_tensor_format: str | None = None,
    ) -> None:
        check_uint32("num_tensors", num_tensors)
        check_isinstance("shape", shape, [tuple, list], int, allow_none=False)
        check_isinstance("data_type", data_type, DataType, allow_none=False)
        check_isinstance("placement", placement, Placement, allow_none=False)
        check_isinstance("batch_dim_index", batch_dim_index, int, allow_none=False)
        check_int32("seq_len_dim_index", seq_len_dim_index)
        check_isinstance("kv_tensor_format", kv_tensor_format, str)
        rank = len(shape)
        raise_if_false(
            0 <= batch_dim_index < rank,
            "batch_dim_index {0} is out of range [0, {1}).",
            batch_dim_index,
            rank,
        )
        raise_if_false(
            seq_len_dim_index == -1 or 0 <= seq_len_dim_index < rank,
            "seq_len_dim_index {0} is invalid, it must be -1 or in [0, {1}).",
            seq_len_dim_index,
            rank,
        )
        check_list_int64("shape", shape)
        # A private copy: later edits go through update_dim, never through the caller's list.
        self._shape: list[int] | tuple[int, ...] = (
            list(shape) if isinstance(shape, list) else tuple(shape)
        )
        self._num_tensors = num_tensors
        self._data_type = data_type
        self._placement = placement
        self._batch_dim = batch_dim_index
        # Fixed here on purpose: update_dim does not change it (reference behaviour).
        self._batch_size = shape[batch_dim_index]
        self._seq_len_dim_index = seq_len_dim_index
        self._kv_tensor_format = kv_tensor_format
        self._size: int | None = None
        # Set by the cache manager for blocks caches; never by the user.
        self._is_blocks = False

    def __repr__(self) -> str:
        # The missing space before kv_tensor_format is LLM-DataDist's; callers compare reprs.
        return (
            f"CacheDesc(num_tensors={self._num_tensors}, shape={self._shape}, "
            f"data_type={self._data_type}, placement={self._placement}, "
            f"batch_dim_index={self._batch_dim}, seq_len_dim_index={self._seq_len_dim_index},"
            f"kv_tensor_format={self._kv_tensor_format})"
        )

    @property
    def num_tensors(self) -> int:
        """The number of tensors."""
        return self._num_tensors

    @property
    def shape(self) -> list[int] | tuple[int, ...]:
        """The shape of each tensor."""
        return self._shape

    @property
    def data_type(self) -> DataType:
        """The element type."""
        return self._data_type

    @property
    def placement(self) -> Placement:
        """Where the memory lives."""
        return self._placement

    @property
    def batch_dim(self) -> int:
        """The batch dimension index."""
        return self._batch_dim

    @property
    def batch_size(self) -> int:
        """``shape[batch_dim]`` as it was at construction."""
        return self._batch_size

    @property
    def seq_len_dim_index(self) -> int:
        """The sequence-length dimension index, or -1."""
        return self._seq_len_dim_index

    @property
    def kv_tensor_format(self) -> str | None:
        """The format label, if any."""
        return self._kv_tensor_format

    @property
    def size(self) -> int:
        """Bytes of ONE tensor: the product of the dims times the element size.

        Raises:
            LLMException: a dim is not positive or the size overflows int64 (its
                status code is left at the default, as in the reference).
        """
        if self._size is None:
            size = math.prod(self._shape) * bytes_per_element(self._data_type)
            if any(dim <= 0 for dim in self._shape) or size > INT64_MAX:
                raise LLMException(
                    f"Failed to calc tensor size, shape = {self._shape}, "
                    f"data_type = {self._data_type}."
                )
            self._size = size
        return self._size

    def update_dim(self, dim_index: int, dim_value: int) -> None:
        """Change one dimension of the shape; the cached `size` is recomputed on next use.

        `batch_size` keeps its construction-time value.

        Args:
            dim_index: the dimension, in ``[0, len(shape))``.
            dim_value: its new int64 value.

        Raises:
            TypeError: an argument is not an int.
            ValueError: ``dim_value`` is outside int64.
            LLMException: ``dim_index`` is out of range (``LLM_PARAM_INVALID``).
        """
        check_isinstance("dim_index", dim_index, int, allow_none=False)
        check_int64("dim_value", dim_value)
        rank = len(self._shape)
        raise_if_false(
            0 <= dim_index < rank, "dim_index {0} is out of range [0, {1}).", dim_index, rank
        )
        if isinstance(self._shape, list):
            self._shape[dim_index] = dim_value
        else:
            self._shape = (*self._shape[:dim_index], dim_value, *self._shape[dim_index + 1 :])
        self._size = None


def validate_cpu_cache_args(cache_desc: CacheDesc, addrs: list[int]) -> None:
    """Check the arguments of ``Cache.create_cpu_cache``.

    Args:
        cache_desc: the descriptor; it must describe HOST memory.
        addrs: one address per tensor.

    Raises:
        TypeError: ``cache_desc`` is not a `CacheDesc`, or ``addrs`` is not a list of int.
        AttributeError: ``cache_desc`` is None (the reference lets None through its type
            check and fails on the first attribute access).
        LLMException: placement is not HOST, or ``len(addrs) != num_tensors``
            (``LLM_PARAM_INVALID``).
    """
    check_isinstance("cache_desc", cache_desc, CacheDesc)
    check_isinstance("addrs", addrs, list, int, allow_none=False)
    raise_if_false(cache_desc.placement == Placement.HOST, "cache_desc placement must be HOST.")
    raise_if_false(
        cache_desc.num_tensors == len(addrs),
        "cache_desc num_tensors {0} is not equal to the number of addrs {1}.",
        cache_desc.num_tensors,
        len(addrs),
    )


class LayerSynchronizer(abc.ABC):
    """Tells a layer-wise transfer when a layer's KV is ready to send.

    Subclass it and pass an instance to ``transfer_cache_async``.
    """

    @abc.abstractmethod
    def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
        """Block until the model has finished computing ``layer_index``.

        Called from the transfer worker, once per needed source layer, in increasing
        layer order.

        Args:
            layer_index: the layer to wait for.
            timeout_in_millis: currently always None (timeouts are not supported).

        Returns:
            True to transfer the layer; False aborts the whole task.
        """
