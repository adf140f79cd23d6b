"""The check helpers: messages name the argument, bools are not ints, ranges are exact."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hixl_client._validation import (
    check_dict,
    check_inner,
    check_int32,
    check_int64,
    check_isinstance,
    check_layer_range,
    check_list_int32,
    check_list_int64,
    check_list_uint64,
    check_positive_or_set_default,
    check_uint8,
    check_uint16,
    check_uint32,
    check_uint64,
    layer_range_to_tensor_indices,
)
from hixl_client.status import LLMException, LLMStatusCode

# ---- check_isinstance ---------------------------------------------------------------------------

ISINSTANCE_OK: list[tuple[Any, Any, dict[str, Any]]] = [
    (1, [int], {}),
    (1, int, {}),
    (None, [int], {}),
    ([], [list, tuple], {"inner_class": int}),
    ((1, 2), [list, tuple], {"inner_class": int}),
    ({1: "a"}, dict, {"inner_class": int}),
    (True, [bool], {}),
    (False, bool, {"allow_none": False}),
    (True, [int, bool], {}),
    ("s", [str, int], {}),
    ([True], list, {"inner_class": bool}),
]


@pytest.mark.parametrize(("value", "classes", "kwargs"), ISINSTANCE_OK)
def test_check_isinstance_returns_value(value: Any, classes: Any, kwargs: dict[str, Any]) -> None:
    assert check_isinstance("x", value, classes, **kwargs) is value


ISINSTANCE_BAD: list[tuple[Any, Any, dict[str, Any], str]] = [
    (1.0, [list, tuple], {}, r"^x only support \['list', 'tuple'\], but got <class 'float'>\.$"),
    (None, int, {"allow_none": False}, r"^x only support \['int'\], but got <class 'NoneType'>\.$"),
    ("1", int, {"extra_fmt": "The first param "}, r"^The first param x only support \['int'\]"),
    (
        [1, "2"],
        [list],
        {"inner_class": int},
        r"^x inner type only support \[<class 'int'>\], but got <class 'str'>\.$",
    ),
    ({"k": 1}, dict, {"inner_class": int}, r"^x inner type only support"),
    # NEWER: bool is not an int unless bool is accepted.
    (True, [int], {"allow_none": False}, r"^x only support \['int'\], but got <class 'bool'>\.$"),
    (False, int, {}, r"only support \['int'\]"),
    (
        [0, True],
        [list, tuple],
        {"inner_class": int},
        r"inner type only support \[<class 'int'>\], but got <class 'bool'>",
    ),
    (True, [int, str], {}, r"only support \['int', 'str'\]"),
]


@pytest.mark.parametrize(("value", "classes", "kwargs", "pattern"), ISINSTANCE_BAD)
def test_check_isinstance_rejects(
    value: Any, classes: Any, kwargs: dict[str, Any], pattern: str
) -> None:
    with pytest.raises(TypeError, match=pattern):
        check_isinstance("x", value, classes, **kwargs)


def test_check_inner() -> None:
    check_inner("seq", [1, 2], int)
    check_inner("seq", [], int)
    with pytest.raises(
        TypeError, match=r"^seq inner type only support \[<class 'int'>\], but got <class 'str'>\.$"
    ):
        check_inner("seq", [1, "2"], int)
    with pytest.raises(TypeError, match=r"^seq inner type only support"):
        check_inner("seq", [True], int)


CHECK_DICT_BAD: list[tuple[dict[Any, Any], tuple[Any, ...], str]] = [
    ({"0": 1}, (int, int), r"^d dict key only support \['int'\], but got <class 'str'>\.$"),
    ({0: "1"}, (int, int), r"^d dict value only support \['int'\], but got <class 'str'>\.$"),
    (
        {0: ["1"]},
        (int, list, int),
        r"^dict value inner type only support \[<class 'int'>\], but got <class 'str'>\.$",
    ),
    ({0: "1"}, (int, list, int), r"^d dict value only support \['list'\]"),
    ({True: 0}, (int, int), r"^d dict key only support"),
    ({0: True}, (int, int), r"^d dict value only support"),
    ({0: None}, (int, int), r"^d dict value only support"),
    ({0: [True]}, (int, list, int), r"^dict value inner type only support"),
]


@pytest.mark.parametrize(("value", "classes", "pattern"), CHECK_DICT_BAD)
def test_check_dict_rejects(value: dict[Any, Any], classes: tuple[Any, ...], pattern: str) -> None:
    with pytest.raises(TypeError, match=pattern):
        check_dict("d", value, *classes)


def test_check_dict_accepts() -> None:
    assert check_dict("d", {}, int, int) is None  # type: ignore[func-returns-value]
    assert check_dict("d", {0: [1, 2], 3: []}, int, list, int) is None  # type: ignore[func-returns-value]
    assert check_dict("d", {"a": "b"}, str, str) is None  # type: ignore[func-returns-value]


# ---- integer checks -----------------------------------------------------------------------------

INT_CHECKS: list[tuple[Callable[[str, object], None], int, int, str]] = [
    (check_uint8, 0, 2**8 - 1, "uint8"),
    (check_uint16, 0, 2**16 - 1, "uint16"),
    (check_uint32, 0, 2**32 - 1, "uint32"),
    (check_uint64, 0, 2**64 - 1, "uint64"),
    (check_int32, -(2**31), 2**31 - 1, "int32"),
    (check_int64, -(2**63), 2**63 - 1, "int64"),
]
INT_IDS = [kind for *_, kind in INT_CHECKS]


@pytest.mark.parametrize(("check", "low", "high", "kind"), INT_CHECKS, ids=INT_IDS)
def test_int_check_bounds_pass(
    check: Callable[[str, object], None], low: int, high: int, kind: str
) -> None:
    assert check("v", low) is None  # type: ignore[func-returns-value]
    assert check("v", high) is None  # type: ignore[func-returns-value]


@pytest.mark.parametrize(("check", "low", "high", "kind"), INT_CHECKS, ids=INT_IDS)
@pytest.mark.parametrize("side", ["below", "above"])
def test_int_check_out_of_range(
    check: Callable[[str, object], None], low: int, high: int, kind: str, side: str
) -> None:
    bad = low - 1 if side == "below" else high + 1
    pattern = rf"^v's value is out of range,{bad} is not a {kind} value\.$"
    with pytest.raises(ValueError, match=pattern):
        check("v", bad)


@pytest.mark.parametrize(("check", "low", "high", "kind"), INT_CHECKS, ids=INT_IDS)
@pytest.mark.parametrize("bad", [None, "1", 1.0, True, False, [1]], ids=repr)
def test_int_check_type(
    check: Callable[[str, object], None], low: int, high: int, kind: str, bad: object
) -> None:
    with pytest.raises(TypeError, match=r"^v only support \['int'\]"):
        check("v", bad)


LIST_CHECKS: list[tuple[Callable[[str, object], None], int, str]] = [
    (check_list_int32, 2**31, "int32"),
    (check_list_int64, 2**63, "int64"),
    (check_list_uint64, -1, "uint64"),
]


@pytest.mark.parametrize(("check", "bad", "kind"), LIST_CHECKS, ids=[k for *_, k in LIST_CHECKS])
def test_list_checks(check: Callable[[str, object], None], bad: int, kind: str) -> None:
    good = [0, 1, 2]
    check("ids", good)
    check("ids", (0, 1))
    check("ids", [])
    assert good == [0, 1, 2]
    with pytest.raises(
        ValueError, match=rf"^ids's value is out of range,{bad} is not a {kind} value\.$"
    ):
        check("ids", [0, bad])
    with pytest.raises(TypeError, match=r"^ids only support"):
        check("ids", [0, "1"])
    with pytest.raises(TypeError, match=r"^ids only support"):
        check("ids", [True])
    with pytest.raises(TypeError, match=r"^ids only support \['list', 'tuple'\]"):
        check("ids", {0, 1})
    with pytest.raises(TypeError, match=r"^ids only support \['list', 'tuple'\]"):
        check("ids", None)


@pytest.mark.parametrize(
    ("value", "default", "expected"),
    [(None, -1, -1), (None, 7, 7), (0, -1, 0), (5, -1, 5), (2**63 - 1, -1, 2**63 - 1)],
)
def test_positive_or_default_ok(value: int | None, default: int, expected: int) -> None:
    assert check_positive_or_set_default("n", value, default) == expected


@pytest.mark.parametrize(
    ("value", "exc", "pattern"),
    [
        (-1, ValueError, r"^n's value -1 is invalid, it should be >= 0\.$"),
        (2**63, ValueError, r"is not a int64 value"),
        ("1", TypeError, r"^n only support \['int'\]"),
        (True, TypeError, r"^n only support \['int'\]"),
    ],
)
def test_positive_or_default_bad(value: object, exc: type[Exception], pattern: str) -> None:
    with pytest.raises(exc, match=pattern):
        check_positive_or_set_default("n", value)  # type: ignore[arg-type]


# ---- layer ranges -------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [range(1), range(3, 10), range(5)])
def test_layer_range_ok(value: range) -> None:
    assert check_layer_range("r", value) is value
    assert check_layer_range("r", value, allow_none=False) is value


def test_layer_range_none() -> None:
    assert check_layer_range("r", None) is None
    with pytest.raises(TypeError, match=r"^r only support \['range'\], but got <class 'NoneType'>"):
        check_layer_range("r", None, allow_none=False)


@pytest.mark.parametrize(
    ("value", "exc", "pattern"),
    [
        ([0, 1], TypeError, r"^r only support \['range'\]"),
        ((0, 1), TypeError, r"^r only support \['range'\]"),
        (range(0, 5, 2), LLMException, r"r\.step"),
        (range(0, 1, -1), LLMException, r"r\.step"),
        (range(4, 1), LLMException, r"^r must satisfy 0 <= start < stop"),
        (range(0), LLMException, r"^r must satisfy"),
        (range(-1, 2), LLMException, r"^r must satisfy"),
    ],
)
def test_layer_range_bad(value: Any, exc: type[Exception], pattern: str) -> None:
    with pytest.raises(exc, match=pattern) as info:
        check_layer_range("r", value)
    if isinstance(info.value, LLMException):
        assert info.value.status_code is LLMStatusCode.LLM_PARAM_INVALID


@pytest.mark.parametrize(
    ("src", "dst", "tnpl", "expected"),
    [
        (None, None, 2, ([], [])),
        (range(0), range(3, 3), 2, ([], [])),
        (range(1), range(1), 2, ([0, 1], [0, 1])),
        (range(1, 3), None, 2, ([2, 3, 4, 5], [])),
        (None, range(2, 3), 3, ([], [6, 7, 8])),
        (range(2), range(4, 6), 1, ([0, 1], [4, 5])),
    ],
)
def test_layer_range_to_tensor_indices(
    src: range | None, dst: range | None, tnpl: int, expected: tuple[list[int], list[int]]
) -> None:
    assert layer_range_to_tensor_indices(src, dst, tnpl) == expected


@pytest.mark.parametrize(
    ("src", "dst", "exc", "pattern"),
    [
        ([0], None, TypeError, r"^src_layer_range only support \['range'\]"),
        (None, (0, 1), TypeError, r"^dst_layer_range only support \['range'\]"),
        # Both type checks run before any step check.
        (range(0, 4, 2), [0], TypeError, r"^dst_layer_range only support"),
        (range(0, 4, 2), None, LLMException, r"src_layer_range\.step"),
        (None, range(0, 4, 2), LLMException, r"dst_layer_range\.step"),
        (range(-1, 1), None, LLMException, r"src_layer_range is invalid"),
        (range(2**32, 2**32 + 1), None, ValueError, r"^src_layer_range's value is out of range"),
        (
            None,
            range(2**32 - 1, 2**32 + 1),
            ValueError,
            r"^dst_layer_range's value is out of range,4294967296",
        ),
    ],
)
def test_layer_range_to_tensor_indices_bad(
    src: Any, dst: Any, exc: type[Exception], pattern: str
) -> None:
    with pytest.raises(exc, match=pattern):
        layer_range_to_tensor_indices(src, dst, 2)
