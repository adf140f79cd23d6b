"""One place where a handler's failure becomes what its call answers.

:func:`handler_error` says it for every unary handler and every path: an
``LLMException`` answers as it is; ValueError and TypeError (malformed wire
values that the client library would never send) answer LLM_PARAM_INVALID;
anything unexpected answers LLM_FAILED with a generic message, and the
traceback goes to the log only, never to the caller. Over gRPC
:func:`abort_with` ends the call with the table gRPC code of that status
plus the exact LLMStatusCode in trailing metadata (``calls.unary``); a lane
writes the same two numbers into its CallError reply
(``hixl_wire.lane.call_error_of``, in ``lane_server``).
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn, Protocol

import grpc
import grpc.aio

from hixl_wire.status import STATUS_TO_GRPC, LLMException, LLMStatusCode, status_metadata

from .log_keys import keys

logger = logging.getLogger(__name__)


class CallRefused(LLMException):
    """A refusal whose gRPC code is not the table's for its LLMStatusCode: a call
    with no valid session or credentials (UNAUTHENTICATED), a peer that may not
    link (PERMISSION_DENIED), a limit hit (RESOURCE_EXHAUSTED). The lanes'
    CallError carries the same code (``hixl_wire.lane.call_error_of``)."""

    def __init__(self, message: str, status_code: LLMStatusCode,
                 grpc_code: grpc.StatusCode, reason: str = "") -> None:
        super().__init__(message, status_code=status_code)
        self.grpc_code = grpc_code
        # A short label for the refusals metric (stats.DaemonStats.refused): what
        # was refused, without ids; the gRPC code's name when the raiser names none.
        self.reason = reason or grpc_code.name.lower()


def handler_error(name: str, exc: Exception, session: str | None = None) -> LLMException:
    """What handler ``name`` answers for failing with ``exc`` (logged here, with the
    caller's ``session`` and the answer's status as log keys)."""
    if isinstance(exc, LLMException):
        logger.debug("%s failed: %s", name, exc,
                     extra=keys(session=session, status=exc.status_code.name))
        return exc
    if isinstance(exc, (ValueError, TypeError)):
        logger.info("%s got an invalid request: %s", name, exc,
                    extra=keys(session=session, status=LLMStatusCode.LLM_PARAM_INVALID.name))
        return LLMException(f"invalid request: {exc}",
                            status_code=LLMStatusCode.LLM_PARAM_INVALID)
    logger.error("%s failed unexpectedly", name, exc_info=exc,
                 extra=keys(session=session, status=LLMStatusCode.LLM_FAILED.name))
    return LLMException("internal daemon error; see the daemon log",
                        status_code=LLMStatusCode.LLM_FAILED)


class FailureHook(Protocol):
    """A servicer's ``call_failed``: told of each handler failure, after
    :func:`handler_error` made it the call's answer (for counting)."""

    def __call__(self, method: str, error: LLMException) -> None: ...


def report_failure(servicer: object, method: str, error: LLMException) -> None:
    """Tell ``servicer`` that its handler of ``method`` answered ``error``, if it listens."""
    hook: FailureHook | None = getattr(servicer, "call_failed", None)
    if hook is not None:
        hook(method, error)


async def abort_with(context: grpc.aio.ServicerContext[Any, Any], exc: LLMException) -> NoReturn:
    """End a gRPC call with ``exc``'s status (raises, as ``context.abort`` does)."""
    code = getattr(exc, "grpc_code", None) or STATUS_TO_GRPC.get(exc.status_code,
                                                                 grpc.StatusCode.UNKNOWN)
    await context.abort(code, str(exc), trailing_metadata=status_metadata(exc.status_code))
    raise AssertionError("unreachable: context.abort raises")
