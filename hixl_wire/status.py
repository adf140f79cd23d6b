"""Status codes, the exception that carries them, and how they travel over gRPC.

`LLMStatusCode` keeps LLM-DataDist's integers (GE error numbers, two ACL codes
and ``0xFFFFFFFF`` for the generic failure) because user code and the
published C++ docs compare against them.

On the wire a failed RPC carries two things: a gRPC status code from
`STATUS_TO_GRPC`, chosen so that generic gRPC tooling (retries, dashboards,
grpcurl) sees something sensible, and the exact `LLMStatusCode` integer in
the trailing metadata entry `STATUS_METADATA_KEY`. Several LLM codes share a
gRPC code, so only the metadata entry can be mapped back exactly;
`status_from_grpc` and `error_from_rpc` fall back to `GRPC_TO_STATUS` when
the entry is missing (errors raised by gRPC itself, such as an unreachable
daemon or an expired deadline). A lane carries the same two numbers in a
``CallError`` (``lane``).

Both sides raise and catch these: the daemon's handlers and the client
library. Their public home is ``hixl_client.status``, which re-exports them;
their ``__module__`` says so, so that tracebacks, reprs and pickles name them
as users know them.
"""

from __future__ import annotations

import enum
import logging
import types
from collections.abc import Mapping
from typing import Any

import grpc
import grpc.aio

__all__ = [
    "GRPC_TO_STATUS",
    "STATUS_METADATA_KEY",
    "STATUS_TO_GRPC",
    "LLMException",
    "LLMStatusCode",
    "QualifiedIntEnum",
    "code_2_status",
    "error_from_rpc",
    "param_invalid",
    "status_from_grpc",
    "status_metadata",
]

_LOG = logging.getLogger(__name__)
PUBLIC_HOME = "hixl_client.status"

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


def param_invalid(message: str) -> LLMException:
    """The error of a broken rule: ``LLMException(message, LLM_PARAM_INVALID)``."""
    return LLMException(message, status_code=LLMStatusCode.LLM_PARAM_INVALID)


def _rebuild_exception(
    cls: type[LLMException], args: tuple[object, ...], status_code: LLMStatusCode
) -> LLMException:
    return cls(*args, status_code=status_code)


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


def error_from_rpc(err: grpc.aio.AioRpcError, what: str,
                   unavailable: LLMStatusCode = LLMStatusCode.LLM_FAILED) -> LLMException:
    """Turn a failed call into an LLMException carrying the far side's status code.

    Args:
        err: the failed call.
        what: who was called, for the message ("hixl daemon at unix:/run/hixl/hixl.sock").
        unavailable: the code to use when nobody answered at all.
    """
    status: LLMStatusCode | None = None
    for key, value in err.trailing_metadata() or ():
        if key == STATUS_METADATA_KEY:
            try:
                status = LLMStatusCode(int(value))
            except ValueError:
                status = LLMStatusCode.LLM_FAILED
    if status is None:
        if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
            status = unavailable
        else:
            status = GRPC_TO_STATUS.get(err.code(), LLMStatusCode.LLM_FAILED)
        return LLMException(f"{what}: {err.code().name}: {err.details()}", status_code=status)
    return LLMException(err.details() or status.name, status_code=status)


for _public in (QualifiedIntEnum, LLMStatusCode, LLMException):
    _public.__module__ = PUBLIC_HOME
del _public
