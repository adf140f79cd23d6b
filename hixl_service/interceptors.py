"""Request ids for every RPC, carried into every log record of its handling.

The id comes from the caller's ``x-request-id`` metadata when present (so one
id can follow a pull from client to daemon to peer), else a fresh one; it
lives in a ContextVar set inside the handler's own task, and a log record
factory copies it onto each record as ``request_id``.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

REQUEST_ID_METADATA_KEY = "x-request-id"
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("hixl_request_id", default="-")


def install_log_record_factory() -> None:
    """Make every log record carry the current request id (process-wide, once)."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "_hixl_request_id", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        record.request_id = request_id.get()
        return record

    factory._hixl_request_id = True  # type: ignore[attr-defined,unused-ignore]
    logging.setLogRecordFactory(factory)


def _id_from(details: grpc.HandlerCallDetails) -> str:
    metadata: Any = getattr(details, "invocation_metadata", None) or ()
    for key, value in metadata:
        if key == REQUEST_ID_METADATA_KEY and isinstance(value, str) and len(value) <= 64:
            return value
    return secrets.token_hex(4)


def _with_request_id(behavior: Any, rid: str) -> Any:
    """Wrap a handler so that it runs with ``request_id`` set, in its own task."""
    if inspect.isasyncgenfunction(behavior):
        async def generator(request: Any, context: Any) -> AsyncIterator[Any]:
            request_id.set(rid)
            async for item in behavior(request, context):
                yield item

        return generator

    async def coroutine(request: Any, context: Any) -> Any:
        request_id.set(rid)
        return await behavior(request, context)

    return coroutine


class RequestIdInterceptor(grpc.aio.ServerInterceptor):
    """Sets ``request_id`` around each unary-request handler (streams from clients pass)."""

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
            handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        rid = _id_from(handler_call_details)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _with_request_id(handler.unary_unary, rid),
                handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _with_request_id(handler.unary_stream, rid),
                handler.request_deserializer, handler.response_serializer)
        return handler
