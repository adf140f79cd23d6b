"""Argument checks shared by the public types, with LLM-DataDist's messages.

Every check names the argument as the caller spelled it, because users and
tests match on that text. Type errors are `TypeError`, integers out of range
are `ValueError`, and broken rules are `LLMException(LLM_PARAM_INVALID)`.

``bool`` is a subclass of ``int`` in Python, but an integer argument given
``True`` is nearly always a bug, so (as in newer LLM-DataDist) a bool is
accepted only where ``bool`` itself is among the accepted classes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias, TypeVar, cast

from hixl_client.status import raise_if_false, raise_if_true

__all__ = [
    "check_dict",
    "check_inner",
    "check_int32",
    "check_int64",
    "check_isinstance",
    "check_layer_range",
    "check_list_int32",
    "check_list_int64",
    "check_list_uint64",
    "check_positive_or_set_default",
    "check_uint8",
    "check_uint16",
    "check_uint32",
    "check_uint64",
    "layer_range_to_tensor_indices",
]

_T = TypeVar("_T")
_Classes: TypeAlias = "type | Sequence[type]"

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT8_MAX = 2**8 - 1
UINT16_MAX = 2**16 - 1
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1


def _as_list(classes: _Classes) -> list[type]:
    return [classes] if isinstance(classes, type) else list(classes)


def _matches(value: object, classes: list[type]) -> bool:
    if isinstance(value, bool) and bool not in classes and int in classes:
        return False
    return any(isinstance(value, cls) for cls in classes)


def check_inner(name: str, seq: Iterable[Any], cls: _Classes) -> None:
    """Check that every element of ``seq`` (every key, for a dict) is an instance of ``cls``.

    Args:
        name: the argument's name, used in the message.
        seq: the iterable to check.
        cls: a class or a sequence of classes.

    Raises:
        TypeError: ``"{name} inner type only support [...], but got <class ...>."``
    """
    classes = _as_list(cls)
    for item in seq:
        if not _matches(item, classes):
            raise TypeError(f"{name} inner type only support {classes}, but got {type(item)}.")


def check_isinstance(
    name: str,
    value: _T,
    classes: _Classes,
    inner_class: _Classes | None = None,
    extra_fmt: str = "",
    allow_none: bool = True,
) -> _T:
    """Check the type of ``value`` and, optionally, of its elements.

    Args:
        name: the argument's name, used in the message.
        value: the value to check.
        classes: an accepted class or a sequence of them.
        inner_class: when given, every element of ``value`` must be an instance of it.
        extra_fmt: a prefix for the message.
        allow_none: whether ``None`` passes unchecked.

    Returns:
        ``value`` itself.

    Raises:
        TypeError: ``"{extra_fmt}{name} only support ['list', 'tuple'], but got <class ...>."``
            or the inner-type message of `check_inner`.
    """
    if value is None and allow_none:
        return value
    accepted = _as_list(classes)
    if not _matches(value, accepted):
        names = [cls.__name__ for cls in accepted]
        raise TypeError(f"{extra_fmt}{name} only support {names}, but got {type(value)}.")
    if inner_class is not None:
        check_inner(f"{extra_fmt}{name}", cast("Iterable[Any]", value), inner_class)
    return value


def check_dict(
    name: str,
    value: Mapping[Any, Any],
    k_cls: _Classes,
    v_cls: _Classes,
    v_inner_cls: _Classes | None = None,
) -> None:
    """Check the key and value types of a mapping.

    Args:
        name: the argument's name, used in the message.
        value: the mapping to check (its own type is the caller's concern).
        k_cls: accepted key class(es).
        v_cls: accepted value class(es).
        v_inner_cls: when given, accepted class(es) of each value's elements.

    Raises:
        TypeError: ``"{name} dict key only support ..."``, ``"{name} dict value only
            support ..."`` or ``"dict value inner type only support ..."``.
    """
    keys, vals = _as_list(k_cls), _as_list(v_cls)
    for key, val in value.items():
        if not _matches(key, keys):
            raise TypeError(
                f"{name} dict key only support {[c.__name__ for c in keys]}, but got {type(key)}."
            )
        if not _matches(val, vals):
            raise TypeError(
                f"{name} dict value only support {[c.__name__ for c in vals]}, but got {type(val)}."
            )
        if v_inner_cls is not None:
            check_inner("dict value", val, v_inner_cls)


def _check_int_range(name: str, value: object, low: int, high: int, kind: str) -> None:
    if type(value) is int and low <= value <= high:
        return  # the usual case, decided without the general type check (bools go on)
    check_isinstance(name, value, int, allow_none=False)
    if not low <= cast(int, value) <= high:
        raise ValueError(f"{name}'s value is out of range,{value} is not a {kind} value.")


def check_uint8(name: str, value: object) -> None:
    """Check that ``value`` is an int in [0, 2**8 - 1].

    Args:
        name: the argument's name, used in the message.
        value: the value to check.

    Raises:
        TypeError: not an int (None and bool included).
        ValueError: out of range.
    """
    _check_int_range(name, value, 0, UINT8_MAX, "uint8")


def check_uint16(name: str, value: object) -> None:
    """Check that ``value`` is an int in [0, 2**16 - 1].

    Args:
        name: the argument's name, used in the message.
        value: the value to check.

    Raises:
        TypeError: not an int (None and bool included).
        ValueError: out of range.
    """
    _check_int_range(name, value, 0, UINT16_MAX, "uint16")


def check_uint32(name: str, value: object) -> None:
    """Check that ``value`` is an int in [0, 2**32 - 1].

    Args:
        name: the argument's name, used in the message.
        value: the value to check.

    Raises:
        TypeError: not an int (None and bool included).
        ValueError: out of range.
    """
    _check_int_range(name, value, 0, UINT32_MAX, "uint32")


def check_uint64(name: str, value: object) -> None:
    """Check that ``value`` is an int in [0, 2**64 - 1].

    Args:
        name: the argument's name, used in the message.
        value: the value to check.

    Raises:
        TypeError: not an int (None and bool included).
        ValueError: out of range.
    """
    _check_int_range(name, value, 0, UINT64_MAX, "uint64")


def check_int32(name: str, value: object) -> None:
    """Check that ``value`` is an int in [-2**31, 2**31 - 1].

    Args:
        name: the argument's name, used in the message.
        value: the value to check.

    Raises:
        TypeError: not an int (None and bool included).
        ValueError: out of range.
    """
    _check_int_range(name, value, INT32_MIN, INT32_MAX, "int32")


def check_int64(name: str, value: object) -> None:
    """Check that ``value`` is an int in [-2**63, 2**63 - 1].

    Args:
        name: the argument's name, used in the message.
        value: the value to check.

    Raises:
        TypeError: not an int (None and bool included).
        ValueError: out of range.
    """
    _check_int_range(name, value, INT64_MIN, INT64_MAX, "int64")


def _check_list(name: str, seq: object, low: int, high: int, kind: str) -> None:
    check_isinstance(name, seq, [list, tuple], allow_none=False)
    for item in cast("Sequence[Any]", seq):
        _check_int_range(name, item, low, high, kind)


def check_list_int32(name: str, seq: object) -> None:
    """Check that ``seq`` is a list or tuple of int32 values (empty is fine).

    Args:
        name: the argument's name, used in the message.
        seq: the sequence to check; it is not modified.

    Raises:
        TypeError: ``seq`` is not a list/tuple, or an element is not an int.
        ValueError: an element is out of range.
    """
    _check_list(name, seq, INT32_MIN, INT32_MAX, "int32")


def check_list_int64(name: str, seq: object) -> None:
    """Check that ``seq`` is a list or tuple of int64 values (empty is fine).

    Args:
        name: the argument's name, used in the message.
        seq: the sequence to check; it is not modified.

    Raises:
        TypeError: ``seq`` is not a list/tuple, or an element is not an int.
        ValueError: an element is out of range.
    """
    _check_list(name, seq, INT64_MIN, INT64_MAX, "int64")


def check_list_uint64(name: str, seq: object) -> None:
    """Check that ``seq`` is a list or tuple of uint64 values (empty is fine).

    Args:
        name: the argument's name, used in the message.
        seq: the sequence to check; it is not modified.

    Raises:
        TypeError: ``seq`` is not a list/tuple, or an element is not an int.
        ValueError: an element is out of range.
    """
    _check_list(name, seq, 0, UINT64_MAX, "uint64")


def check_positive_or_set_default(name: str, value: int | None, default: int = -1) -> int:
    """Return ``default`` for None, else ``value`` after checking it is a non-negative int64.

    Args:
        name: the argument's name, used in the message.
        value: the value to check, or None.
        default: what None stands for.

    Returns:
        ``value`` or ``default``.

    Raises:
        TypeError: not an int.
        ValueError: outside int64, or negative (0 is allowed).
    """
    if value is None:
        return default
    check_int64(name, value)
    if value < 0:
        raise ValueError(f"{name}'s value {value} is invalid, it should be >= 0.")
    return value


def check_layer_range(
    name: str, layer_range: range | None, allow_none: bool = True
) -> range | None:
    """Check a layer range: a ``range`` with step 1 and ``0 <= start < stop``.

    Args:
        name: the argument's name, used in the message.
        layer_range: the range to check.
        allow_none: whether None passes.

    Returns:
        ``layer_range`` itself.

    Raises:
        TypeError: not a range (or None when not allowed).
        LLMException: step is not 1, or the range is empty, reversed or starts below 0
            (``LLM_PARAM_INVALID``).
    """
    if layer_range is None and allow_none:
        return None
    check_isinstance(name, layer_range, range, allow_none=False)
    checked = cast(range, layer_range)
    raise_if_false(checked.step == 1, "{0}.step must be 1, but got {1}.", name, checked.step)
    raise_if_false(
        0 <= checked.start < checked.stop,
        "{0} must satisfy 0 <= start < stop, but got {1}.",
        name,
        checked,
    )
    return checked


def _range_to_indices(name: str, layer_range: range | None, tensor_num_per_layer: int) -> list[int]:
    if layer_range is None or len(layer_range) == 0:
        return []
    first, last = layer_range[0], layer_range[-1]
    # A negative start is a broken rule (LLMException) rather than a range error,
    # as in the reference; the uint32 checks then catch values that are too large.
    raise_if_true(first < 0, "{0} is invalid, its start {1} is < 0.", name, first)
    check_uint32(name, first)
    check_uint32(name, last)
    start = first * tensor_num_per_layer
    return list(range(start, start + len(layer_range) * tensor_num_per_layer))


def layer_range_to_tensor_indices(
    src_range: range | None, dst_range: range | None, tensor_num_per_layer: int
) -> tuple[list[int], list[int]]:
    """Expand layer ranges into the tensor indices they cover.

    Layer ``L`` holds tensors ``[L * tnpl, (L + 1) * tnpl)``. None or an empty range
    gives ``[]``, which the transfer code reads as "all tensors".

    Args:
        src_range: source layers, or None.
        dst_range: destination layers, or None.
        tensor_num_per_layer: tensors per layer (already validated by the caller).

    Returns:
        The source and destination tensor indices.

    Raises:
        TypeError: a range is neither a ``range`` nor None.
        LLMException: a step is not 1 or a start is negative (``LLM_PARAM_INVALID``).
        ValueError: a start or last layer exceeds uint32.
    """
    check_isinstance("src_layer_range", src_range, range)
    check_isinstance("dst_layer_range", dst_range, range)
    for name, layer_range in (("src_layer_range", src_range), ("dst_layer_range", dst_range)):
        raise_if_true(
            layer_range is not None and layer_range.step != 1,
            "{0}.step must be 1, but got {1}.",
            name,
            None if layer_range is None else layer_range.step,
        )
    return (
        _range_to_indices("src_layer_range", src_range, tensor_num_per_layer),
        _range_to_indices("dst_layer_range", dst_range, tensor_num_per_layer),
    )
