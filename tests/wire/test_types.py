"""hixl_wire.types: the vocabulary both sides key and size things by. The
client's validation around it (CacheDesc, MemInfo...) is tests/client/test_types.py."""

from __future__ import annotations

import pytest

import hixl_client.keys
import hixl_client.types
from hixl_wire._proto.hixl.v1 import common_pb2
from hixl_wire.status import QualifiedIntEnum
from hixl_wire.types import (
    PLACEHOLDER_ID,
    DataType,
    LLMRole,
    Placement,
    TransferShape,
    bytes_per_element,
)


def _shape(**changes: object) -> TransferShape:
    fields: dict[str, object] = {
        "push": False, "remote_cluster_id": 7, "remote_cache_id": 3, "local_cache_id": 4,
        "size": -1, "tensor_num_per_layer": 2, "src_tensor_indices": (0, 1),
        "dst_tensor_indices": (1, 0), "checksum": 0}
    fields.update(changes)
    return TransferShape(**fields)  # type: ignore[arg-type]


def test_every_data_type_has_a_width() -> None:
    widths = {data_type: bytes_per_element(data_type) for data_type in DataType}
    assert set(widths.values()) == {1, 2, 4, 8, 16}
    assert widths[DataType.DT_STRING] == 16  # GE's (pointer, length) pair


def test_data_type_values_are_unique_ge_ids() -> None:
    values = [member.value for member in DataType]
    assert len(set(values)) == len(values)


def test_the_placeholder_is_the_largest_uint64_a_key_carries() -> None:
    assert PLACEHOLDER_ID == 2**64 - 1
    key = common_pb2.CacheKey(req_id=PLACEHOLDER_ID)
    assert common_pb2.CacheKey.FromString(key.SerializeToString()).req_id == PLACEHOLDER_ID


def test_a_transfer_shape_keys_by_value() -> None:
    table = {_shape(): "handle"}
    assert table[_shape()] == "handle"
    for change in ({"push": True}, {"remote_cluster_id": 8}, {"size": 64},
                   {"src_tensor_indices": (1, 0)}, {"checksum": 1}):
        assert _shape(**change) not in table


@pytest.mark.parametrize("enum", [Placement, LLMRole])
def test_placements_and_roles_print_qualified(enum: type[QualifiedIntEnum]) -> None:
    for member in enum:
        assert str(member) == f"{enum.__name__}.{member.name}" == f"{member}"
        assert int(member) == member.value


def test_the_clients_public_names_are_the_wires_own_objects() -> None:
    assert hixl_client.types.DataType is DataType
    assert hixl_client.types.Placement is Placement
    assert hixl_client.types.LLMRole is LLMRole
    assert hixl_client.types.bytes_per_element is bytes_per_element
    assert hixl_client.keys.PLACEHOLDER_ID == PLACEHOLDER_ID
