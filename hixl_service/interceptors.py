"""Request ids for every RPC, carried into every log record of its handling.

The id comes from the caller's ``x-request-id`` metadata when present (so one
id can follow a pull from client to daemon to peer), else a fresh one; it
lives in a ContextVar set inside the handler's own task, and a log record
factory copies it onto each record as ``request_id``.
"""

from __future__ import annotations

import contextvars
import logging
import secrets
from collections.abc import Awaitable, Callable
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

    factory._hixl_request_id = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def _id_from(details: grpc.HandlerCallDetails) -> str:
    for key, value in details.invocation_metadata or ():  # type: ignore[attr-defined]
        if key == REQUEST_ID_METADATA_KEY and isinstance(value, str) and len(value) <= 64:
            return value
    return secrets.token_hex(4)


class RequestIdInterceptor(grpc.aio.ServerInterceptor):
    """Sets ``request_id`` around each unary and server-streaming handler."""

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        rid = _id_from(handler_call_details)
        if handler.unary_unary is not None:
            inner_unary = handler.unary_unary

            async def unary(request: Any, context: Any) -> Any:
                request_id.set(rid)
                return await inner_unary(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary, handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: Any) -> Any:
                request_id.set(rid)
                return await inner_stream(request, context)

            return grpc.unary_stream_rpc_method_handler(
                stream, handler.request_deserializer, handler.response_serializer)
        return handler
