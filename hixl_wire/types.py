"""The data vocabulary a client and a daemon share: element types and their
sizes, placements, roles and the placeholder id.

The values are LLM-DataDist's (GE data-type ids, its enum integers), because
they travel in protobuf messages as plain integers; their public home stays
``hixl_client.types`` (and ``hixl_client.keys`` for the placeholder id).
"""

from __future__ import annotations

import enum
import types
from collections.abc import Mapping
from typing import NamedTuple

from hixl_wire.status import QualifiedIntEnum

__all__ = ["PLACEHOLDER_ID", "DataType", "LLMRole", "Placement", "TransferShape",
           "bytes_per_element"]

PLACEHOLDER_ID = 2**64 - 1
"""An id meaning "none": the default ``prefix_id``; as ``req_id``, a key that only holds a slot."""


class DataType(enum.Enum):
    """Element types; the values are GE data-type ids."""

    DT_FLOAT = 0
    DT_FLOAT16 = 1
    DT_BF16 = 27
    DT_INT8 = 2
    DT_INT16 = 6
    DT_UINT16 = 7
    DT_UINT8 = 4
    DT_INT32 = 3
    DT_INT64 = 9
    DT_UINT32 = 8
    DT_UINT64 = 10
    DT_BOOL = 12
    DT_DOUBLE = 11
    DT_STRING = 13


_BYTES_PER_ELEMENT: Mapping[DataType, int] = types.MappingProxyType(
    {
        DataType.DT_FLOAT: 4,
        DataType.DT_FLOAT16: 2,
        DataType.DT_BF16: 2,
        DataType.DT_INT8: 1,
        DataType.DT_INT16: 2,
        DataType.DT_UINT16: 2,
        DataType.DT_UINT8: 1,
        DataType.DT_INT32: 4,
        DataType.DT_INT64: 8,
        DataType.DT_UINT32: 4,
        DataType.DT_UINT64: 8,
        DataType.DT_BOOL: 1,
        DataType.DT_DOUBLE: 8,
        # GE stores a string element as two uint64 words (pointer and length).
        DataType.DT_STRING: 16,
    }
)


def bytes_per_element(data_type: DataType) -> int:
    """Return the size in bytes of one element of ``data_type``.

    Args:
        data_type: the element type.

    Returns:
        The element size (16 for ``DT_STRING``).
    """
    return _BYTES_PER_ELEMENT[data_type]


class Placement(QualifiedIntEnum):
    """Where a cache's memory lives."""

    HOST = 0
    DEVICE = 1


class LLMRole(QualifiedIntEnum):
    """The role label of an LLMDataDist instance (only a label in cache-manager mode)."""

    PROMPT = 1
    DECODER = 2
    MIX = 3


class TransferShape(NamedTuple):
    """A pull_cache or push_cache by cache id less its two batch indices: what a
    repeat handle stands for. The client keys the handles the daemon gave it
    by it, the daemon its repeat table (a tuple: built without a call of its
    own on the client's per-request path)."""

    push: bool
    remote_cluster_id: int
    remote_cache_id: int  # the pull's source, the push's destination
    local_cache_id: int  # the pull's destination, the push's source
    size: int  # -1 for every push
    tensor_num_per_layer: int
    src_tensor_indices: tuple[int, ...]
    dst_tensor_indices: tuple[int, ...]
    # The Checksum the call asked for (a client.proto value); the daemon
    # resolves it against its [transfer] checksum at each transfer.
    checksum: int
