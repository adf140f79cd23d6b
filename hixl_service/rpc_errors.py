"""One place where daemon exceptions become gRPC statuses.

Every handler is wrapped by :func:`handles_errors`: an ``LLMException``
becomes its table gRPC code plus the exact LLMStatusCode in trailing
metadata; anything unexpected becomes INTERNAL with a generic message, and the
traceback goes to the log only, never to the caller.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio

from hixl_client.status import STATUS_METADATA_KEY, STATUS_TO_GRPC, LLMException, LLMStatusCode

logger = logging.getLogger(__name__)

Servicer = TypeVar("Servicer")
Request = TypeVar("Request")
Reply = TypeVar("Reply")
Handler = Callable[[Servicer, Request, grpc.aio.ServicerContext[Any, Any]], Awaitable[Reply]]


def status_metadata(code: LLMStatusCode) -> tuple[tuple[str, str], ...]:
    return ((STATUS_METADATA_KEY, str(int(code))),)


async def abort_with(context: grpc.aio.ServicerContext[Any, Any], exc: LLMException) -> None:
    code = STATUS_TO_GRPC.get(exc.status_code, grpc.StatusCode.UNKNOWN)
    await context.abort(code, str(exc), trailing_metadata=status_metadata(exc.status_code))


def handles_errors(handler: Handler[Servicer, Request, Reply]) -> Handler[Servicer, Request, Reply]:
    """Wrap a unary handler with the daemon's error translation."""

    @functools.wraps(handler)
    async def wrapper(self: Servicer, request: Request,
                      context: grpc.aio.ServicerContext[Any, Any]) -> Reply:
        try:
            return await handler(self, request, context)
        except LLMException as exc:
            logger.debug("%s failed: %s", handler.__name__, exc)
            await abort_with(context, exc)
        except (ValueError, TypeError) as exc:
            # Malformed wire values that the client library would never send.
            logger.info("%s got an invalid request: %s", handler.__name__, exc)
            await abort_with(context, LLMException(f"invalid request: {exc}",
                                                   status_code=LLMStatusCode.LLM_PARAM_INVALID))
        except Exception:
            logger.exception("%s failed unexpectedly", handler.__name__)
            await context.abort(grpc.StatusCode.INTERNAL,
                                "internal daemon error; see the daemon log",
                                trailing_metadata=status_metadata(LLMStatusCode.LLM_FAILED))
        raise AssertionError("unreachable: context.abort raises")

    return wrapper
