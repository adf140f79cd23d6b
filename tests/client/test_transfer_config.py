"""TransferConfig and TransferWithCacheKeyConfig: constructor and setter rules, reprs."""

from __future__ import annotations

from typing import Any

import pytest

from hixl_client.keys import BlocksCacheKey, CacheKey, CacheKeyByIdAndIndex
from hixl_client.status import LLMException, LLMStatusCode
from hixl_client.transfer_config import TransferConfig, TransferWithCacheKeyConfig


def _assert_param_invalid(exc: BaseException) -> None:
    if isinstance(exc, LLMException):
        assert exc.status_code is LLMStatusCode.LLM_PARAM_INVALID


# ---- TransferConfig -------------------------------------------------------------------------------


def test_transfer_config_defaults() -> None:
    cfg = TransferConfig(1, [10, 11])
    assert cfg.dst_cluster_id == 1
    assert cfg.dst_addrs == [10, 11]
    assert cfg.src_layer_range is None
    assert cfg.src_batch_index == 0
    assert cfg.dst_layer_range is None


def test_transfer_config_repr() -> None:
    cfg = TransferConfig(2, (1, 2, 3, 4), range(2), 1)
    text = "TransferConfig(dst_cluster_id=2, dst_addrs=[1, 2, 3, 4], src_layer_range=range(0, 2), src_batch_index=1)"
    assert repr(cfg) == text
    assert str(cfg) == text
    assert repr(TransferConfig(0, [])) == (
        "TransferConfig(dst_cluster_id=0, dst_addrs=[], src_layer_range=None, src_batch_index=0)"
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"dst_cluster_id": 2**64 - 1},
        {"dst_addrs": ()},
        {"dst_addrs": [0, 2**64 - 1]},
        {"src_layer_range": range(3, 4)},
        {"src_batch_index": 2**32 - 1},
    ],
)
def test_transfer_config_accepts(kwargs: dict[str, Any]) -> None:
    TransferConfig(**{"dst_cluster_id": 1, "dst_addrs": [1, 2], **kwargs})


# (field, bad value, exception, message regex): used for the constructor and the setters alike.
TRANSFER_BAD: list[tuple[str, Any, type[Exception], str]] = [
    ("dst_cluster_id", None, TypeError, r"^dst_cluster_id only support \['int'\]"),
    ("dst_cluster_id", "1", TypeError, r"^dst_cluster_id only support"),
    ("dst_cluster_id", True, TypeError, r"^dst_cluster_id only support"),
    ("dst_cluster_id", -1, ValueError, r"^dst_cluster_id's value is out of range"),
    ("dst_cluster_id", 2**64, ValueError, r"^dst_cluster_id's value is out of range"),
    ("dst_addrs", None, TypeError, r"^dst_addrs only support \['list', 'tuple'\]"),
    ("dst_addrs", "123", TypeError, r"^dst_addrs only support"),
    ("dst_addrs", ["123"], TypeError, r"^dst_addrs inner type only support"),
    ("dst_addrs", [1, False], TypeError, r"^dst_addrs inner type only support"),
    ("dst_addrs", [1, -1], ValueError, r"^dst_addrs's value is out of range,-1 is not a uint64"),
    ("src_layer_range", [0, 1], TypeError, r"^src_layer_range only support \['range'\]"),
    ("src_layer_range", range(0, 5, 2), LLMException, r"step"),
    ("src_layer_range", range(0, 1, -1), LLMException, r"step"),
    ("src_layer_range", range(4, 1), LLMException, r"0 <= start < stop"),
    ("src_layer_range", range(0), LLMException, r"0 <= start < stop"),
    ("src_batch_index", None, TypeError, r"^src_batch_index only support"),
    ("src_batch_index", "1", TypeError, r"^src_batch_index only support"),
    ("src_batch_index", -1, ValueError, r"^src_batch_index's value is out of range"),
    ("src_batch_index", 2**32, ValueError, r"^src_batch_index's value is out of range"),
]


@pytest.mark.parametrize(("field", "value", "exc", "pattern"), TRANSFER_BAD)
def test_transfer_config_constructor_rejects(
    field: str, value: Any, exc: type[Exception], pattern: str
) -> None:
    kwargs = {"dst_cluster_id": 1, "dst_addrs": [1, 2], field: value}
    with pytest.raises(exc, match=pattern) as info:
        TransferConfig(**kwargs)
    _assert_param_invalid(info.value)


@pytest.mark.parametrize(("field", "value", "exc", "pattern"), TRANSFER_BAD)
def test_transfer_config_setter_rejects(
    field: str, value: Any, exc: type[Exception], pattern: str
) -> None:
    cfg = TransferConfig(1, [1, 2], range(1), 0)
    before = getattr(cfg, field)
    with pytest.raises(exc, match=pattern) as info:
        setattr(cfg, field, value)
    _assert_param_invalid(info.value)
    assert getattr(cfg, field) == before


def test_transfer_config_validation_order() -> None:
    with pytest.raises(TypeError, match="^dst_cluster_id"):
        TransferConfig("1", None, [0], -1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^dst_addrs"):
        TransferConfig(1, None, [0], -1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^src_layer_range"):
        TransferConfig(1, [], [0], -1)  # type: ignore[arg-type]


def test_transfer_config_setters() -> None:
    cfg = TransferConfig(1, [1, 2])
    cfg.dst_cluster_id = 5
    cfg.dst_addrs = (7, 8, 9, 10)
    cfg.src_layer_range = range(1, 3)
    cfg.src_batch_index = 3
    assert (cfg.dst_cluster_id, cfg.dst_addrs, cfg.src_layer_range, cfg.src_batch_index) == (
        5,
        [7, 8, 9, 10],
        range(1, 3),
        3,
    )
    cfg.src_layer_range = None
    assert cfg.src_layer_range is None


# ---- TransferWithCacheKeyConfig -------------------------------------------------------------------

BY_ID = CacheKeyByIdAndIndex(2, 7, 1)
BLOCKS = BlocksCacheKey(3, 0)


def test_with_key_config() -> None:
    cfg = TransferWithCacheKeyConfig(BY_ID, range(1, 2), range(1), 4)
    assert cfg.cache_key is BY_ID
    assert (cfg.src_layer_range, cfg.dst_layer_range, cfg.src_batch_index) == (
        range(1, 2),
        range(1),
        4,
    )
    assert cfg.dst_cluster_id == 2
    assert repr(cfg) == (
        "TransferWithCacheKeyConfig(cache_key=CacheKeyByIdAndIndex(cluster_id=2, cache_id=7, batch_index=1), "
        "src_layer_range=range(1, 2), dst_layer_range=range(0, 1), src_batch_index=4)"
    )
    assert str(cfg) == repr(cfg)
    blocks = TransferWithCacheKeyConfig(BLOCKS, range(1), range(1))
    assert blocks.dst_cluster_id == 3
    assert repr(blocks) == (
        "TransferWithCacheKeyConfig(cache_key=BlocksCacheKey(cluster_id=3, model_id=0), "
        "src_layer_range=range(0, 1), dst_layer_range=range(0, 1), src_batch_index=0)"
    )


# (args, exception, message regex); rows breaking two rules pin the order.
WITH_KEY_BAD: list[tuple[tuple[Any, ...], type[Exception], str]] = [
    (
        (None, range(1), range(1)),
        TypeError,
        r"^cache_key only support \['BlocksCacheKey', 'CacheKeyByIdAndIndex'\]",
    ),
    ((CacheKey(1, 1), range(1), range(1)), TypeError, r"^cache_key only support"),
    ((BY_ID,), TypeError, r"^src_layer_range only support \['range'\], but got <class 'NoneType'>"),
    ((BY_ID, range(1)), TypeError, r"^dst_layer_range only support"),
    ((BY_ID, None, range(1)), TypeError, r"^src_layer_range only support"),
    ((BY_ID, [0], range(1)), TypeError, r"^src_layer_range only support"),
    ((BY_ID, range(0, 4, 2), range(1)), LLMException, r"src_layer_range\.step"),
    ((BY_ID, range(1), range(2, 1)), LLMException, r"dst_layer_range must satisfy"),
    ((BY_ID, range(0), range(0)), LLMException, r"src_layer_range must satisfy"),
    ((BY_ID, range(2), range(1)), LLMException, r"must have the same length"),
    ((BY_ID, range(1, 3), range(1)), LLMException, r"must have the same length"),
    ((BY_ID, range(1), range(1), -1), ValueError, r"^src_batch_index's value is out of range"),
    ((BY_ID, range(1), range(1), "0"), TypeError, r"^src_batch_index only support"),
    (
        (BLOCKS, range(1), range(1), 1),
        LLMException,
        r"src_batch_index must be 0 when cache_key is a BlocksCacheKey",
    ),
    # constructor: the uint32 check runs before the BlocksCacheKey rule
    ((BLOCKS, range(1), range(1), -1), ValueError, r"^src_batch_index's value"),
    ((BLOCKS, range(1), range(1), "1"), TypeError, r"^src_batch_index only support"),
    ((BY_ID, range(2), range(1), -1), LLMException, r"same length"),
]


@pytest.mark.parametrize(("args", "exc", "pattern"), WITH_KEY_BAD)
def test_with_key_config_rejects(args: tuple[Any, ...], exc: type[Exception], pattern: str) -> None:
    with pytest.raises(exc, match=pattern) as info:
        TransferWithCacheKeyConfig(*args)
    _assert_param_invalid(info.value)


def test_with_key_config_equal_lengths_at_any_offset() -> None:
    TransferWithCacheKeyConfig(BY_ID, range(3, 5), range(2))
    TransferWithCacheKeyConfig(BY_ID, range(2), range(6, 8))


def test_with_key_config_setters() -> None:
    cfg = TransferWithCacheKeyConfig(BY_ID, range(2), range(2), 1)
    cfg.src_layer_range = None
    cfg.dst_layer_range = range(5, 9)  # lengths are not re-checked by setters
    assert (cfg.src_layer_range, cfg.dst_layer_range) == (None, range(5, 9))
    cfg.cache_key = BLOCKS
    assert cfg.cache_key is BLOCKS
    assert cfg.dst_cluster_id == 2  # set at construction, not refreshed
    cfg.src_batch_index = 0
    cfg.cache_key = None
    assert cfg.cache_key is None
    cfg.src_batch_index = 9


# (initial key, field, value, exception, message regex)
WITH_KEY_SETTER_BAD: list[tuple[Any, str, Any, type[Exception], str]] = [
    (BY_ID, "cache_key", CacheKey(1, 1), TypeError, r"^cache_key only support"),
    (BY_ID, "cache_key", "k", TypeError, r"^cache_key only support"),
    (BY_ID, "src_layer_range", [0], TypeError, r"^src_layer_range only support"),
    (BY_ID, "src_layer_range", range(0), LLMException, r"src_layer_range must satisfy"),
    (BY_ID, "dst_layer_range", range(0, 4, 2), LLMException, r"dst_layer_range\.step"),
    (BY_ID, "src_batch_index", -1, ValueError, r"^src_batch_index's value"),
    (BY_ID, "src_batch_index", None, TypeError, r"^src_batch_index only support"),
    (BLOCKS, "src_batch_index", 1, LLMException, r"must be 0 when cache_key is a BlocksCacheKey"),
    # setter: the BlocksCacheKey rule runs before the uint32 check
    (BLOCKS, "src_batch_index", -1, LLMException, r"must be 0 when cache_key is a BlocksCacheKey"),
    (BLOCKS, "src_batch_index", "1", LLMException, r"must be 0 when cache_key is a BlocksCacheKey"),
    (BLOCKS, "src_batch_index", None, LLMException, r"must be 0"),
]


@pytest.mark.parametrize(("key", "field", "value", "exc", "pattern"), WITH_KEY_SETTER_BAD)
def test_with_key_config_setter_rejects(
    key: Any, field: str, value: Any, exc: type[Exception], pattern: str
) -> None:
    cfg = TransferWithCacheKeyConfig(key, range(1), range(1))
    before = getattr(cfg, field)
    with pytest.raises(exc, match=pattern) as info:
        setattr(cfg, field, value)
    _assert_param_invalid(info.value)
    assert getattr(cfg, field) == before
