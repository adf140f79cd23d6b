"""Key argument parsing, reprs, value equality and the req/prefix validity rule."""

from __future__ import annotations

from typing import Any

import pytest

from hixl_client.keys import (
    PLACEHOLDER_ID,
    BlocksCacheKey,
    CacheKey,
    CacheKeyByIdAndIndex,
    check_cache_key,
)
from hixl_client.status import LLMException, LLMStatusCode

MAX = 2**64 - 1


def test_placeholder_id() -> None:
    assert PLACEHOLDER_ID == 2**64 - 1


# ---- CacheKey -------------------------------------------------------------------------------------

# (args, kwargs, expected (cluster_id, req_id, model_id, prefix_id))
CACHE_KEY_OK: list[tuple[tuple[Any, ...], dict[str, Any], tuple[int, int, int, int]]] = [
    ((1, 2), {}, (1, 2, 0, MAX)),
    ((1, 2, 3), {}, (1, 2, 3, MAX)),
    ((1, 2, 3, 4), {}, (1, 2, 3, 4)),
    ((), {"cluster_id": 1, "req_id": 2}, (1, 2, 0, MAX)),
    ((), {"prompt_cluster_id": 5, "req_id": 2, "model_id": 1}, (5, 2, 1, MAX)),
    ((), {"prompt_cluster_id": 5, "cluster_id": 6, "req_id": 2}, (6, 2, 0, MAX)),
    ((1,), {"req_id": 9, "prefix_id": 3}, (1, 9, 0, 3)),
    # positional values override same-named keywords
    ((1, 2), {"cluster_id": 7}, (1, 2, 0, MAX)),
    ((1,), {"prompt_cluster_id": 7, "req_id": 2}, (1, 2, 0, MAX)),
    ((0, MAX, MAX, 0), {}, (0, MAX, MAX, 0)),
]


@pytest.mark.parametrize(("args", "kwargs", "expected"), CACHE_KEY_OK)
def test_cache_key_parsing(
    args: tuple[Any, ...], kwargs: dict[str, Any], expected: tuple[int, ...]
) -> None:
    key = CacheKey(*args, **kwargs)
    assert (key.cluster_id, key.req_id, key.model_id, key.prefix_id) == expected
    assert key.prompt_cluster_id == key.cluster_id


CACHE_KEY_BAD: list[tuple[tuple[Any, ...], dict[str, Any], type[Exception], str]] = [
    ((1, 2, 3, 4, 5), {}, LLMException, r"^Param num is over limit$"),
    ((1, 2, 3, 4), {"cluster_id": 1}, LLMException, r"^Param num is over limit$"),
    ((), {}, LLMException, r"^Param prompt_cluster_id or cluster_id is required$"),
    ((), {"req_id": 1}, LLMException, r"^Param prompt_cluster_id or cluster_id is required$"),
    ((1,), {}, LLMException, r"^Param req_id is required$"),
    ((1,), {"model_id": 1}, LLMException, r"^Param req_id is required$"),
    ((1, 2), {"foo": 1}, LLMException, r"^Unsupported param:foo$"),
    # the required-parameter checks come before the unknown-keyword check
    ((), {"foo": 1}, LLMException, r"cluster_id is required"),
    ((1,), {"foo": 1}, LLMException, r"req_id is required"),
    ((-1, 2), {}, ValueError, r"^cluster_id's value is out of range,-1 is not a uint64 value\.$"),
    ((1, -1), {}, ValueError, r"^req_id's value is out of range"),
    ((1, 2, 2**64), {}, ValueError, r"^model_id's value is out of range"),
    ((1, 2, 0, -5), {}, ValueError, r"^prefix_id's value is out of range"),
    (("1", 2), {}, TypeError, r"^cluster_id only support \['int'\]"),
    ((1, None), {}, TypeError, r"^req_id only support"),
    ((True, 2), {}, TypeError, r"^cluster_id only support"),
    ((1, 2, False), {}, TypeError, r"^model_id only support"),
    ((), {"prompt_cluster_id": "x", "req_id": 1}, TypeError, r"^cluster_id only support"),
]


@pytest.mark.parametrize(("args", "kwargs", "exc", "pattern"), CACHE_KEY_BAD)
def test_cache_key_rejects(
    args: tuple[Any, ...], kwargs: dict[str, Any], exc: type[Exception], pattern: str
) -> None:
    with pytest.raises(exc, match=pattern) as info:
        CacheKey(*args, **kwargs)
    if isinstance(info.value, LLMException):
        assert info.value.status_code is LLMStatusCode.LLM_PARAM_INVALID


def test_cache_key_repr() -> None:
    assert repr(CacheKey(1, 1)) == f"CacheKey(cluster_id=1, req_id=1, prefix_id={MAX}, model_id=0)"
    assert repr(CacheKey(prompt_cluster_id=2, req_id=3, model_id=4, prefix_id=5)) == (
        "CacheKey(cluster_id=2, req_id=3, prefix_id=5, model_id=4)"
    )


def test_cache_key_is_read_only() -> None:
    key = CacheKey(1, 2)
    with pytest.raises(AttributeError):
        key.req_id = 3  # type: ignore[misc]


# ---- CacheKeyByIdAndIndex ---------------------------------------------------------------------------


def test_cache_key_by_id() -> None:
    key = CacheKeyByIdAndIndex(1, 2)
    assert (key.cluster_id, key.cache_id, key.batch_index) == (1, 2, 0)
    assert (
        repr(CacheKeyByIdAndIndex(3, -1, 4))
        == "CacheKeyByIdAndIndex(cluster_id=3, cache_id=-1, batch_index=4)"
    )
    CacheKeyByIdAndIndex(MAX, 2**63 - 1, 2**32 - 1)
    CacheKeyByIdAndIndex(0, -(2**63), 0)


@pytest.mark.parametrize(
    ("args", "exc", "pattern"),
    [
        ((-1, 1), ValueError, r"^cluster_id's value is out of range,-1 is not a uint64"),
        ((1, 2**63), ValueError, r"^cache_id's value is out of range,.* is not a int64"),
        ((1, 1, 2**32), ValueError, r"^batch_index's value is out of range,.* is not a uint32"),
        ((1, 1, -1), ValueError, r"^batch_index's value is out of range"),
        (("1", 1), TypeError, r"^cluster_id only support"),
        ((1, None), TypeError, r"^cache_id only support"),
        ((1, 1, True), TypeError, r"^batch_index only support"),
    ],
)
def test_cache_key_by_id_rejects(args: tuple[Any, ...], exc: type[Exception], pattern: str) -> None:
    with pytest.raises(exc, match=pattern):
        CacheKeyByIdAndIndex(*args)


# ---- BlocksCacheKey ---------------------------------------------------------------------------------

BLOCKS_OK: list[tuple[tuple[Any, ...], dict[str, Any], tuple[int, int], str]] = [
    ((1,), {}, (1, 0), "BlocksCacheKey(cluster_id=1, model_id=0)"),
    ((1, 2), {}, (1, 2), "BlocksCacheKey(cluster_id=1, model_id=2)"),
    ((), {"cluster_id": 3}, (3, 0), "BlocksCacheKey(cluster_id=3, model_id=0)"),
    (
        (),
        {"prompt_cluster_id": 4, "model_id": 1},
        (4, 1),
        "BlocksCacheKey(prompt_cluster_id=4, model_id=1)",
    ),
    (
        (),
        {"prompt_cluster_id": 4, "cluster_id": 5},
        (5, 0),
        "BlocksCacheKey(cluster_id=5, model_id=0)",
    ),
    ((6,), {"prompt_cluster_id": 4}, (6, 0), "BlocksCacheKey(cluster_id=6, model_id=0)"),
    # type checks only: no range check
    ((-1, 2**70), {}, (-1, 2**70), f"BlocksCacheKey(cluster_id=-1, model_id={2**70})"),
]


@pytest.mark.parametrize(("args", "kwargs", "expected", "text"), BLOCKS_OK)
def test_blocks_cache_key(
    args: tuple[Any, ...], kwargs: dict[str, Any], expected: tuple[int, int], text: str
) -> None:
    key = BlocksCacheKey(*args, **kwargs)
    assert (key.cluster_id, key.model_id) == expected
    assert key.prompt_cluster_id == key.cluster_id
    assert repr(key) == text


BLOCKS_BAD: list[tuple[tuple[Any, ...], dict[str, Any], type[Exception], str]] = [
    ((1, 2, 3), {}, LLMException, r"^Param num is over limit$"),
    ((1,), {"model_id": 1, "cluster_id": 2}, LLMException, r"^Param num is over limit$"),
    ((), {}, LLMException, r"^Param prompt_cluster_id or cluster_id is required$"),
    ((), {"model_id": 1}, LLMException, r"cluster_id is required"),
    ((1,), {"req_id": 1}, LLMException, r"^Unsupported param:req_id$"),
    (
        ("aa",),
        {},
        TypeError,
        r"^The first param cluster_id only support \['int'\], but got <class 'str'>\.$",
    ),
    ((True,), {}, TypeError, r"^The first param cluster_id only support"),
    ((None,), {}, TypeError, r"^The first param cluster_id only support"),
    ((1, "0"), {}, TypeError, r"^The second param model_id only support \['int'\]"),
    ((1, None), {}, TypeError, r"^The second param model_id only support"),
]


@pytest.mark.parametrize(("args", "kwargs", "exc", "pattern"), BLOCKS_BAD)
def test_blocks_cache_key_rejects(
    args: tuple[Any, ...], kwargs: dict[str, Any], exc: type[Exception], pattern: str
) -> None:
    with pytest.raises(exc, match=pattern) as info:
        BlocksCacheKey(*args, **kwargs)
    if isinstance(info.value, LLMException):
        assert info.value.status_code is LLMStatusCode.LLM_PARAM_INVALID


# ---- equality and hashing -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (CacheKey(1, 2), CacheKey(cluster_id=1, req_id=2), True),
        (CacheKey(1, 2), CacheKey(prompt_cluster_id=1, req_id=2, model_id=0, prefix_id=MAX), True),
        (CacheKey(1, 2), CacheKey(1, 2, 1), False),
        (CacheKey(1, 2), CacheKey(2, 2), False),
        (CacheKey(1, 2, 0, 3), CacheKey(1, 2, 0, 4), False),
        (BlocksCacheKey(1), BlocksCacheKey(prompt_cluster_id=1, model_id=0), True),
        (BlocksCacheKey(1, 1), BlocksCacheKey(1, 2), False),
        (CacheKeyByIdAndIndex(1, 2, 3), CacheKeyByIdAndIndex(1, 2, 3), True),
        (CacheKeyByIdAndIndex(1, 2, 3), CacheKeyByIdAndIndex(1, 2, 4), False),
        (CacheKeyByIdAndIndex(1, 0, 0), BlocksCacheKey(1, 0), False),
        (CacheKey(1, 0), BlocksCacheKey(1, 0), False),
    ],
)
def test_value_equality(a: object, b: object, equal: bool) -> None:
    assert (a == b) is equal
    assert (a != b) is not equal
    if equal:
        assert hash(a) == hash(b)
        assert len({a, b}) == 1


def test_keys_compare_unequal_to_other_types() -> None:
    assert CacheKey(1, 2) != (1, 2, 0, MAX)
    assert BlocksCacheKey(1) != 1


# ---- check_cache_key ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("req_id", "prefix_id", "valid"),
    [
        (0, MAX, True),
        (MAX - 1, MAX, True),
        (MAX, 0, True),
        (MAX, MAX - 1, True),
        (MAX, MAX, False),
        (1, 2, False),
        (0, 0, False),
    ],
)
def test_check_cache_key(req_id: int, prefix_id: int, valid: bool) -> None:
    key = CacheKey(1, req_id, 0, prefix_id)
    if valid:
        check_cache_key(key)
        return
    with pytest.raises(LLMException, match=r"exactly one of req_id and prefix_id") as info:
        check_cache_key(key)
    assert info.value.status_code is LLMStatusCode.LLM_PARAM_INVALID
