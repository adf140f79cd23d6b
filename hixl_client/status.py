"""Status codes, the public exception, and how they travel over gRPC.

`LLMStatusCode` keeps LLM-DataDist's integers (GE error numbers, two ACL codes
and ``0xFFFFFFFF`` for the generic failure) because user code and the
published C++ docs compare against them.

On the wire a failed RPC carries two things: a gRPC status code from
`STATUS_TO_GRPC`, chosen so that generic gRPC tooling (retries, dashboards,
grpcurl) sees something sensible, and the exact `LLMStatusCode` integer in
the trailing metadata entry `STATUS_METADATA_KEY`. Several LLM codes share a
gRPC code, so only the metadata entry can be mapped back exactly;
`status_from_grpc` falls back to `GRPC_TO_STATUS` when the entry is missing
(errors raised by gRPC itself, such as an unreachable daemon or an expired
deadline).

The codes, the exception and the tables are defined in ``hixl_wire.status``,
which the daemon shares; this module is their public home and adds
LLM-DataDist's helpers (`Status`, `raise_if_false`, `handle_llm_status`...).
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from hixl_wire.status import (
    GRPC_TO_STATUS,
    STATUS_METADATA_KEY,
    STATUS_TO_GRPC,
    LLMException,
    LLMStatusCode,
    QualifiedIntEnum,
    code_2_status,
    status_from_grpc,
    status_metadata,
)

__all__ = [
    "GRPC_TO_STATUS",
    "STATUS_METADATA_KEY",
    "STATUS_TO_GRPC",
    "LLMException",
    "LLMStatusCode",
    "QualifiedIntEnum",
    "Status",
    "code_2_status",
    "handle_llm_status",
    "raise_if_false",
    "raise_if_true",
    "status_from_grpc",
    "status_metadata",
]

_LOG = logging.getLogger(__name__)


class Status:
    """A status code wrapper, as returned by some LLM-DataDist calls.

    Args:
        status: the wrapped status code.
    """

    def __init__(self, status: LLMStatusCode) -> None:
        self._status_code = status

    def is_ok(self) -> bool:
        """Return True when the status is ``LLM_SUCCESS``."""
        return self._status_code == LLMStatusCode.LLM_SUCCESS

    @property
    def status_code(self) -> LLMStatusCode:
        """The wrapped status code."""
        return self._status_code

    def __repr__(self) -> str:
        return f"Status({self._status_code})"


def _fail(
    fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any], status_code: LLMStatusCode
) -> NoReturn:
    message = fmt.format(*args, **kwargs)
    # DEBUG, not ERROR: the caller receives the exception and decides whether it matters.
    _LOG.debug("%s (status %s)", message, status_code)
    raise LLMException(message, status_code=status_code)


def raise_if_false(
    pred: object,
    fmt: str,
    *args: Any,
    status_code: LLMStatusCode = LLMStatusCode.LLM_PARAM_INVALID,
    **kwargs: Any,
) -> None:
    """Raise `LLMException` unless ``pred`` is true.

    Args:
        pred: the condition that must hold.
        fmt: a `str.format` template for the message.
        *args: positional arguments for ``fmt``.
        status_code: the code of the raised exception.
        **kwargs: keyword arguments for ``fmt``.

    Raises:
        LLMException: when ``pred`` is false.
    """
    if not pred:
        _fail(fmt, args, kwargs, status_code)


def raise_if_true(
    pred: object,
    fmt: str,
    *args: Any,
    status_code: LLMStatusCode = LLMStatusCode.LLM_PARAM_INVALID,
    **kwargs: Any,
) -> None:
    """Raise `LLMException` when ``pred`` is true.

    Args:
        pred: the condition that must not hold.
        fmt: a `str.format` template for the message.
        *args: positional arguments for ``fmt``.
        status_code: the code of the raised exception.
        **kwargs: keyword arguments for ``fmt``.

    Raises:
        LLMException: when ``pred`` is true.
    """
    if pred:
        _fail(fmt, args, kwargs, status_code)


def handle_llm_status(ret: int, func_name: str, other_info: str) -> None:
    """Raise for a raw non-success status integer.

    Args:
        ret: the raw status integer.
        func_name: the operation, named in the message.
        other_info: extra context appended to the message.

    Raises:
        LLMException: with ``code_2_status(ret)`` when ``ret`` is not 0.
    """
    if ret != LLMStatusCode.LLM_SUCCESS:
        status = code_2_status(ret)
        raise LLMException(
            f"{func_name} failed, error code is {status}, {other_info}.", status_code=status
        )
