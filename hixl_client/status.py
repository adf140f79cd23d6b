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
"""

from __future__ import annotations

import enum
import logging
import types
from collections.abc import Mapping
from typing import Any, NoReturn

import grpc

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

STATUS_METADATA_KEY = "hixl-llm-status"
"""Trailing-metadata key whose value is the decimal `LLMStatusCode` of a failed RPC."""

_GE_BASE = 0x5010B000


class QualifiedIntEnum(enum.IntEnum):
    """An IntEnum whose ``str()`` and ``format()`` read ``"Class.MEMBER"``.

    LLM-DataDist's enums print that way and its messages embed them; a plain
    IntEnum would print the bare integer.
    """

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    # Python 3.12 gives IntEnum subclasses int.__format__; pin the Enum one, which uses str().
    __format__ = enum.Enum.__format__


class LLMStatusCode(QualifiedIntEnum):
    """Result codes of LLM-DataDist, with the reference build's integer values."""

    LLM_SUCCESS = 0
    LLM_FAILED = 0xFFFFFFFF
    LLM_WAIT_PROCESS_TIMEOUT = _GE_BASE + 0x01
    LLM_KV_CACHE_NOT_EXIST = _GE_BASE + 0x02
    LLM_REPEAT_REQUEST = _GE_BASE + 0x03
    LLM_REQUEST_ALREADY_COMPLETED = _GE_BASE + 0x04
    LLM_PARAM_INVALID = _GE_BASE + 0x05
    LLM_ENGINE_FINALIZED = _GE_BASE + 0x06
    LLM_NOT_YET_LINK = _GE_BASE + 0x07
    LLM_ALREADY_LINK = _GE_BASE + 0x08
    LLM_LINK_FAILED = _GE_BASE + 0x09
    LLM_UNLINK_FAILED = _GE_BASE + 0x0A
    LLM_NOTIFY_PROMPT_UNLINK_FAILED = _GE_BASE + 0x0B
    LLM_CLUSTER_NUM_EXCEED_LIMIT = _GE_BASE + 0x0C
    LLM_PROCESSING_LINK = _GE_BASE + 0x0D
    LLM_DEVICE_OUT_OF_MEMORY = _GE_BASE + 0x0E
    LLM_PREFIX_ALREADY_EXIST = _GE_BASE + 0x0F
    LLM_PREFIX_NOT_EXIST = _GE_BASE + 0x10
    # Spelled without the underscore of the native name; user code uses this spelling.
    LLM_SEQ_LENOVERLIMIT = _GE_BASE + 0x11
    LLM_NO_FREE_BLOCK = _GE_BASE + 0x12
    LLM_BLOCKS_OUT_OF_MEMORY = _GE_BASE + 0x13
    # 0x14..0x17 exist only inside the native library and are deliberately absent:
    # code_2_status turns them into LLM_FAILED, as the reference does.
    LLM_EXIST_LINK = _GE_BASE + 0x18
    LLM_FEATURE_NOT_ENABLED = _GE_BASE + 0x19
    LLM_TIMEOUT = _GE_BASE + 0x1A
    LLM_LINK_BUSY = _GE_BASE + 0x1B
    LLM_OUT_OF_MEMORY = _GE_BASE + 0x1C
    LLM_DEVICE_MEM_ERROR = 507053
    LLM_SUSPECT_REMOTE_ERROR = 507057
    LLM_UNKNOWN_ERROR = -1


# LLM_UNKNOWN_ERROR is left out on purpose: the reference never produces it from a code.
_CODE_TO_STATUS: Mapping[int, LLMStatusCode] = types.MappingProxyType(
    {int(m): m for m in LLMStatusCode if m is not LLMStatusCode.LLM_UNKNOWN_ERROR}
)


def code_2_status(code: int) -> LLMStatusCode:
    """Turn a raw status integer into an `LLMStatusCode`.

    Args:
        code: a status integer, e.g. from the daemon or a native call.

    Returns:
        The matching member; unknown integers (and -1) become ``LLM_FAILED``.
    """
    return _CODE_TO_STATUS.get(code, LLMStatusCode.LLM_FAILED)


class LLMException(RuntimeError):
    """The error raised for broken rules and failed operations.

    Args:
        *args: the usual exception arguments, normally one message.
        status_code: the failure's code. It defaults to ``LLM_SUCCESS`` because the
            reference does so for errors that carry no code (e.g. ``CacheDesc.size``).
    """

    def __init__(
        self, *args: object, status_code: LLMStatusCode = LLMStatusCode.LLM_SUCCESS
    ) -> None:
        super().__init__(*args)
        self._status_code = status_code

    @property
    def status_code(self) -> LLMStatusCode:
        """The `LLMStatusCode` of the failure."""
        return self._status_code

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions pickle as cls(*args), which would drop the keyword-only code
        # (matters for multiprocessing and executor pools).
        return (_rebuild_exception, (type(self), self.args, self._status_code))


def _rebuild_exception(
    cls: type[LLMException], args: tuple[object, ...], status_code: LLMStatusCode
) -> LLMException:
    return cls(*args, status_code=status_code)


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


_S = LLMStatusCode
_G = grpc.StatusCode

STATUS_TO_GRPC: Mapping[LLMStatusCode, grpc.StatusCode] = types.MappingProxyType(
    {
        _S.LLM_SUCCESS: _G.OK,
        _S.LLM_FAILED: _G.INTERNAL,
        _S.LLM_WAIT_PROCESS_TIMEOUT: _G.DEADLINE_EXCEEDED,
        _S.LLM_KV_CACHE_NOT_EXIST: _G.NOT_FOUND,
        _S.LLM_REPEAT_REQUEST: _G.ALREADY_EXISTS,
        _S.LLM_REQUEST_ALREADY_COMPLETED: _G.FAILED_PRECONDITION,
        _S.LLM_PARAM_INVALID: _G.INVALID_ARGUMENT,
        _S.LLM_ENGINE_FINALIZED: _G.FAILED_PRECONDITION,
        _S.LLM_NOT_YET_LINK: _G.FAILED_PRECONDITION,
        _S.LLM_ALREADY_LINK: _G.ALREADY_EXISTS,
        _S.LLM_LINK_FAILED: _G.UNAVAILABLE,
        _S.LLM_UNLINK_FAILED: _G.UNAVAILABLE,
        _S.LLM_NOTIFY_PROMPT_UNLINK_FAILED: _G.UNAVAILABLE,
        _S.LLM_CLUSTER_NUM_EXCEED_LIMIT: _G.RESOURCE_EXHAUSTED,
        # gRPC's guidance: ABORTED for concurrency conflicts the caller retries.
        _S.LLM_PROCESSING_LINK: _G.ABORTED,
        _S.LLM_DEVICE_OUT_OF_MEMORY: _G.RESOURCE_EXHAUSTED,
        _S.LLM_PREFIX_ALREADY_EXIST: _G.ALREADY_EXISTS,
        _S.LLM_PREFIX_NOT_EXIST: _G.NOT_FOUND,
        _S.LLM_SEQ_LENOVERLIMIT: _G.OUT_OF_RANGE,
        _S.LLM_NO_FREE_BLOCK: _G.RESOURCE_EXHAUSTED,
        _S.LLM_BLOCKS_OUT_OF_MEMORY: _G.RESOURCE_EXHAUSTED,
        _S.LLM_EXIST_LINK: _G.FAILED_PRECONDITION,
        _S.LLM_FEATURE_NOT_ENABLED: _G.FAILED_PRECONDITION,
        _S.LLM_TIMEOUT: _G.DEADLINE_EXCEEDED,
        _S.LLM_LINK_BUSY: _G.ABORTED,
        _S.LLM_OUT_OF_MEMORY: _G.RESOURCE_EXHAUSTED,
        _S.LLM_DEVICE_MEM_ERROR: _G.DATA_LOSS,
        _S.LLM_SUSPECT_REMOTE_ERROR: _G.DATA_LOSS,
        _S.LLM_UNKNOWN_ERROR: _G.UNKNOWN,
    }
)
"""The gRPC status code a daemon uses for each `LLMStatusCode` (many-to-one)."""

GRPC_TO_STATUS: Mapping[grpc.StatusCode, LLMStatusCode] = types.MappingProxyType(
    {
        _G.OK: _S.LLM_SUCCESS,
        _G.INVALID_ARGUMENT: _S.LLM_PARAM_INVALID,
        _G.NOT_FOUND: _S.LLM_KV_CACHE_NOT_EXIST,
        _G.DEADLINE_EXCEEDED: _S.LLM_TIMEOUT,
        _G.RESOURCE_EXHAUSTED: _S.LLM_OUT_OF_MEMORY,
        _G.INTERNAL: _S.LLM_FAILED,
    }
)
"""Fallback for RPCs that fail without `STATUS_METADATA_KEY`; other gRPC codes mean LLM_FAILED.

Each entry is a preimage in `STATUS_TO_GRPC`, so a round trip keeps the gRPC code.
"""

del _S, _G


def status_metadata(code: LLMStatusCode) -> tuple[tuple[str, str], ...]:
    """Build the trailing metadata that carries ``code`` next to a gRPC status.

    Args:
        code: the status to send.

    Returns:
        Metadata suitable for ``context.set_trailing_metadata`` or ``abort``.
    """
    return ((STATUS_METADATA_KEY, str(int(code))),)


def status_from_grpc(
    code: grpc.StatusCode, metadata_value: str | bytes | None = None
) -> LLMStatusCode:
    """Recover the `LLMStatusCode` of a failed RPC.

    Args:
        code: the RPC's gRPC status code.
        metadata_value: the value of `STATUS_METADATA_KEY` in its trailing metadata, if any.

    Returns:
        The exact code from the metadata when it parses, else the `GRPC_TO_STATUS`
        fallback for ``code``, else ``LLM_FAILED``.
    """
    if metadata_value is not None:
        text = (
            metadata_value.decode("ascii", "replace")
            if isinstance(metadata_value, bytes)
            else metadata_value
        )
        try:
            return code_2_status(int(text))
        except ValueError:
            _LOG.warning("ignoring malformed %s metadata %r", STATUS_METADATA_KEY, metadata_value)
    return GRPC_TO_STATUS.get(code, LLMStatusCode.LLM_FAILED)
