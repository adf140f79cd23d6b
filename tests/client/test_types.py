"""DataType and its lazy numpy maps, small enums, MemInfo, CacheDesc and the cpu-cache checks."""

from __future__ import annotations

import subprocess
import sys
from typing import Any
from unittest import mock

import pytest

from hixl_client import types as hixl_types
from hixl_client.status import LLMException, LLMStatusCode
from hixl_client.types import (
    CacheDesc,
    DataType,
    LayerSynchronizer,
    LLMRole,
    MemInfo,
    Memtype,
    Placement,
    RegisterMemStatus,
    bytes_per_element,
    role_to_str,
    validate_cpu_cache_args,
)

DT = DataType

DATA_TYPES = [
    ("DT_FLOAT", 0, 4),
    ("DT_FLOAT16", 1, 2),
    ("DT_BF16", 27, 2),
    ("DT_INT8", 2, 1),
    ("DT_INT16", 6, 2),
    ("DT_UINT16", 7, 2),
    ("DT_UINT8", 4, 1),
    ("DT_INT32", 3, 4),
    ("DT_INT64", 9, 8),
    ("DT_UINT32", 8, 4),
    ("DT_UINT64", 10, 8),
    ("DT_BOOL", 12, 1),
    ("DT_DOUBLE", 11, 8),
    ("DT_STRING", 13, 16),
]


def test_data_type_declaration_order() -> None:
    assert [m.name for m in DT] == [name for name, _, _ in DATA_TYPES]


@pytest.mark.parametrize(("name", "value", "width"), DATA_TYPES)
def test_data_type_values(name: str, value: int, width: int) -> None:
    member = DataType[name]
    assert member.value == value
    assert not isinstance(member, int)
    assert str(member) == f"DataType.{name}"
    assert bytes_per_element(member) == width


def test_import_does_not_load_numpy() -> None:
    code = "import sys, hixl_client.types as t; assert 'numpy' not in sys.modules; t.valid_np_dtypes; assert 'numpy' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env=_child_env())


def _child_env() -> dict[str, str]:
    import os

    # The parent's import path, plus the directory holding hixl_client in case the
    # parent found it through an empty ('' = cwd) entry.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(hixl_types.__file__)))
    paths = [p for p in sys.path if p] + [package_root]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def test_numpy_maps() -> None:
    np = pytest.importorskip("numpy")
    to_np = hixl_types.dtype_to_np_dtype
    assert len(to_np) == 14
    assert to_np[DT.DT_BF16] is np.float16
    assert to_np[DT.DT_STRING] is np.bytes_
    assert to_np[DT.DT_FLOAT] is np.float32
    assert hixl_types.valid_np_dtypes == list(to_np.values())
    from_np = hixl_types.np_dtype_to_dtype
    assert len(from_np) == 13
    assert DT.DT_BF16 not in from_np.values()
    assert from_np[np.zeros(1, np.float16).dtype] is DT.DT_FLOAT16
    assert from_np[np.zeros(1, np.float32).dtype] is DT.DT_FLOAT
    assert from_np[np.dtype(np.bool_)] is DT.DT_BOOL
    # Cached: the second access is the same object.
    assert hixl_types.dtype_to_np_dtype is to_np


@pytest.mark.parametrize("name", ["np", "numpy", "dtype_map", "__missing__"])
def test_unknown_module_attribute(name: str) -> None:
    with pytest.raises(AttributeError):
        getattr(hixl_types, name)


@pytest.mark.parametrize(
    ("member", "value", "text"),
    [
        (Placement.HOST, 0, "Placement.HOST"),
        (Placement.DEVICE, 1, "Placement.DEVICE"),
        (LLMRole.PROMPT, 1, "LLMRole.PROMPT"),
        (LLMRole.DECODER, 2, "LLMRole.DECODER"),
        (LLMRole.MIX, 3, "LLMRole.MIX"),
    ],
)
def test_int_enums(member: Any, value: int, text: str) -> None:
    assert member == value
    assert str(member) == text
    assert f"{member}" == text


@pytest.mark.parametrize(
    ("role", "text"),
    [(LLMRole.PROMPT, "Prompt"), (LLMRole.DECODER, "Decoder"), (LLMRole.MIX, "Mix")],
)
def test_role_to_str(role: LLMRole, text: str) -> None:
    assert role_to_str(role) == text


@pytest.mark.parametrize(
    ("member", "value"),
    [
        (RegisterMemStatus.OK, 0),
        (RegisterMemStatus.PREPARING, 1),
        (RegisterMemStatus.FAILED, 2),
        (Memtype.MEM_TYPE_DEVICE, 0),
        (Memtype.MEM_TYPE_HOST, 1),
    ],
)
def test_plain_enums(member: Any, value: int) -> None:
    assert member.value == value
    assert member != value


def test_mem_info() -> None:
    info = MemInfo(Memtype.MEM_TYPE_DEVICE, 1234, 1)
    assert (info.mem_type, info.addr, info.size) == (Memtype.MEM_TYPE_DEVICE, 1234, 1)
    assert str(info) == "MemInfo(mem_type=Memtype.MEM_TYPE_DEVICE, addr=1234, size=1)"
    assert repr(info) == str(info)
    MemInfo(None, None, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        ((0, 1, 1), r"^mem_type only support \['Memtype'\]"),
        ((Memtype.MEM_TYPE_HOST, "1", 1), r"^addr only support \['int'\]"),
        ((Memtype.MEM_TYPE_HOST, 1, 1.0), r"^size only support \['int'\]"),
        ((Memtype.MEM_TYPE_HOST, True, 1), r"^addr only support"),
    ],
)
def test_mem_info_types(args: tuple[Any, ...], pattern: str) -> None:
    with pytest.raises(TypeError, match=pattern):
        MemInfo(*args)


# ---- CacheDesc ----------------------------------------------------------------------------------


def test_cache_desc_defaults_and_properties() -> None:
    desc = CacheDesc(4, [2, 8, 16], DT.DT_FLOAT16)
    assert desc.num_tensors == 4
    assert desc.shape == [2, 8, 16]
    assert desc.data_type is DT.DT_FLOAT16
    assert desc.placement is Placement.DEVICE
    assert desc.batch_dim == 0
    assert desc.batch_size == 2
    assert desc.seq_len_dim_index == -1
    assert desc.kv_tensor_format is None
    assert desc._is_blocks is False
    assert desc.size == 2 * 8 * 16 * 2


def test_cache_desc_repr() -> None:
    desc = CacheDesc(80, [4, 256], DT.DT_FLOAT16, Placement.HOST, 1, 0, "ND")
    assert repr(desc) == (
        "CacheDesc(num_tensors=80, shape=[4, 256], data_type=DataType.DT_FLOAT16, "
        "placement=Placement.HOST, batch_dim_index=1, seq_len_dim_index=0,kv_tensor_format=ND)"
    )
    assert repr(CacheDesc(1, (3,), DT.DT_INT8)) == (
        "CacheDesc(num_tensors=1, shape=(3,), data_type=DataType.DT_INT8, "
        "placement=Placement.DEVICE, batch_dim_index=0, seq_len_dim_index=-1,kv_tensor_format=None)"
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_tensors": 0, "shape": [1]},
        {"num_tensors": 2**32 - 1, "shape": [1]},
        {"shape": (2, 3), "batch_dim_index": 1, "seq_len_dim_index": 0},
        {"shape": [2, 3], "seq_len_dim_index": 1},
        {"shape": [0, -3]},  # dims are not checked for positivity here
        {"shape": [2**63 - 1, -(2**63)]},
        {"shape": [1], "kv_tensor_format": "NZ"},
    ],
)
def test_cache_desc_accepts(kwargs: dict[str, Any]) -> None:
    args = {"num_tensors": 1, "data_type": DT.DT_FLOAT, **kwargs}
    CacheDesc(**args)


# (kwargs over a valid base, exception, message regex). Rows that break two rules pin the order.
CACHE_DESC_BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"num_tensors": -1}, ValueError, r"^num_tensors's value is out of range"),
    ({"num_tensors": 2**32}, ValueError, r"^num_tensors's value is out of range"),
    ({"num_tensors": True}, TypeError, r"^num_tensors only support"),
    ({"num_tensors": "1"}, TypeError, r"^num_tensors only support"),
    ({"num_tensors": -1, "shape": "x"}, ValueError, r"^num_tensors"),
    ({"shape": None}, TypeError, r"^shape only support \['tuple', 'list'\]"),
    ({"shape": 4}, TypeError, r"^shape only support"),
    ({"shape": [1, "2"]}, TypeError, r"^shape inner type only support"),
    ({"shape": [1, True]}, TypeError, r"^shape inner type only support"),
    ({"shape": [1, 2.0], "data_type": 1}, TypeError, r"^shape inner"),
    ({"data_type": 0}, TypeError, r"^data_type only support \['DataType'\]"),
    ({"data_type": None}, TypeError, r"^data_type only support"),
    ({"placement": 1}, TypeError, r"^placement only support \['Placement'\]"),
    ({"batch_dim_index": "0"}, TypeError, r"^batch_dim_index only support \['int'\]"),
    ({"batch_dim_index": False}, TypeError, r"^batch_dim_index only support"),
    ({"seq_len_dim_index": 2**31}, ValueError, r"^seq_len_dim_index's value is out of range"),
    ({"seq_len_dim_index": None}, TypeError, r"^seq_len_dim_index only support"),
    ({"kv_tensor_format": 1}, TypeError, r"^kv_tensor_format only support \['str'\]"),
    ({"kv_tensor_format": 1, "batch_dim_index": 9}, TypeError, r"^kv_tensor_format"),
    ({"batch_dim_index": 2}, LLMException, r"batch_dim_index 2 is out of range"),
    ({"batch_dim_index": -1}, LLMException, r"batch_dim_index -1 is out of range"),
    ({"shape": []}, LLMException, r"batch_dim_index 0 is out of range"),
    ({"seq_len_dim_index": 2}, LLMException, r"seq_len_dim_index 2 is invalid"),
    ({"seq_len_dim_index": -2}, LLMException, r"seq_len_dim_index -2 is invalid"),
    ({"seq_len_dim_index": 5, "shape": [2**63, 1]}, LLMException, r"seq_len_dim_index"),
    (
        {"shape": [2**63, 1]},
        ValueError,
        r"^shape's value is out of range,9223372036854775808 is not a int64",
    ),
    ({"shape": [1, -(2**63) - 1]}, ValueError, r"^shape's value is out of range"),
]


@pytest.mark.parametrize(("kwargs", "exc", "pattern"), CACHE_DESC_BAD)
def test_cache_desc_rejects(kwargs: dict[str, Any], exc: type[Exception], pattern: str) -> None:
    args = {"num_tensors": 1, "shape": [2, 3], "data_type": DT.DT_FLOAT, **kwargs}
    with pytest.raises(exc, match=pattern) as info:
        CacheDesc(**args)
    if isinstance(info.value, LLMException):
        assert info.value.status_code is LLMStatusCode.LLM_PARAM_INVALID


@pytest.mark.parametrize(("name", "value", "width"), DATA_TYPES)
def test_cache_desc_size_per_type(name: str, value: int, width: int) -> None:
    assert CacheDesc(3, [2, 5], DataType[name]).size == 10 * width


@pytest.mark.parametrize(
    "shape",
    [[0, 4], [2, -1], [2**62, 2], [2**31, 2**31, 2]],
    ids=["zero", "negative", "overflow", "overflow-3d"],
)
def test_cache_desc_size_failure(shape: list[int]) -> None:
    desc = CacheDesc(1, shape, DT.DT_FLOAT16)
    with pytest.raises(LLMException, match=r"^Failed to calc tensor size") as info:
        _ = desc.size
    assert info.value.status_code is LLMStatusCode.LLM_SUCCESS


def test_cache_desc_size_at_int64_limit() -> None:
    assert CacheDesc(1, [2**62 - 1, 2], DT.DT_INT8).size == 2**63 - 2


def test_cache_desc_update_dim() -> None:
    shape = [4, 16]
    desc = CacheDesc(2, shape, DT.DT_FLOAT)
    assert desc.size == 4 * 16 * 4
    desc.update_dim(1, 32)
    assert desc.shape == [4, 32]
    assert desc.size == 4 * 32 * 4
    desc.update_dim(0, 8)
    assert desc.batch_size == 4  # fixed at construction
    assert desc.size == 8 * 32 * 4
    assert shape == [4, 16]  # the caller's list is not aliased
    desc.update_dim(1, 0)
    with pytest.raises(LLMException, match="Failed to calc tensor size"):
        _ = desc.size


def test_cache_desc_update_dim_tuple_shape() -> None:
    desc = CacheDesc(1, (2, 3), DT.DT_INT8)
    desc.update_dim(1, 7)
    assert desc.shape == (2, 7)
    assert desc.size == 14


@pytest.mark.parametrize(
    ("index", "value", "exc"),
    [
        (2, 1, LLMException),
        (-1, 1, LLMException),
        ("0", 1, TypeError),
        (0, "1", TypeError),
        (0, 2**63, ValueError),
    ],
)
def test_cache_desc_update_dim_bad(index: Any, value: Any, exc: type[Exception]) -> None:
    desc = CacheDesc(1, [2, 3], DT.DT_INT8)
    with pytest.raises(exc):
        desc.update_dim(index, value)
    assert desc.shape == [2, 3]


# ---- Cache.create_cpu_cache arguments -----------------------------------------------------------

HOST_DESC = CacheDesc(2, [4, 8], DT.DT_FLOAT16, Placement.HOST)
DEVICE_DESC = CacheDesc(2, [4, 8], DT.DT_FLOAT16)


def test_cpu_cache_args_ok() -> None:
    validate_cpu_cache_args(HOST_DESC, [1, 2])


@pytest.mark.parametrize(
    ("desc", "addrs", "exc", "pattern"),
    [
        ("desc", [1, 2], TypeError, r"^cache_desc only support \['CacheDesc'\]"),
        (None, [1, 2], AttributeError, r"placement"),
        (HOST_DESC, (1, 2), TypeError, r"^addrs only support \['list'\]"),
        (HOST_DESC, None, TypeError, r"^addrs only support"),
        (HOST_DESC, [1, "2"], TypeError, r"^addrs inner type only support"),
        (HOST_DESC, [1, True], TypeError, r"^addrs inner type only support"),
        (None, (1,), TypeError, r"^addrs"),
        (DEVICE_DESC, [1, 2], LLMException, r"placement must be HOST"),
        (DEVICE_DESC, [1], LLMException, r"placement must be HOST"),
        (HOST_DESC, [1], LLMException, r"num_tensors 2 is not equal to the number of addrs 1"),
        (HOST_DESC, [], LLMException, r"num_tensors 2"),
    ],
)
def test_cpu_cache_args_bad(desc: Any, addrs: Any, exc: type[Exception], pattern: str) -> None:
    with pytest.raises(exc, match=pattern) as info:
        validate_cpu_cache_args(desc, addrs)
    if isinstance(info.value, LLMException):
        assert info.value.status_code is LLMStatusCode.LLM_PARAM_INVALID


# ---- LayerSynchronizer --------------------------------------------------------------------------


def test_layer_synchronizer_is_abstract() -> None:
    with pytest.raises(TypeError):
        LayerSynchronizer()  # type: ignore[abstract]

    class Ready(LayerSynchronizer):
        def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
            return layer_index < 2

    sync = Ready()
    assert sync.synchronize_layer(1, None) is True
    assert sync.synchronize_layer(2, None) is False


def test_layer_synchronizer_mock_passes_isinstance() -> None:
    assert isinstance(mock.Mock(spec=LayerSynchronizer), LayerSynchronizer)
    assert isinstance(mock.MagicMock(spec=LayerSynchronizer), LayerSynchronizer)
