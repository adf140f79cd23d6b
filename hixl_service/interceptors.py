"""Request ids for every RPC, carried into every log record of its handling.

The id comes from the caller's ``x-request-id`` metadata when present (so one
id can follow a pull from client to daemon to peer), else a fresh one; it
lives in a ContextVar set inside the handler's own task, and a log record
factory copies it onto each record as ``request_id``.

The interceptor runs on every call, so it is kept cheap: each method's
handler is wrapped once (the wrapper reads the id from the call's own
metadata when it runs), and fresh ids come from a PRNG, not the kernel.
:class:`LoadInterceptor` wraps handlers the same way to count the transfer
calls that arrive over gRPC (``load.py``).

:func:`generic_only` lets generated ``add_*Servicer_to_server`` functions
register their methods as generic handlers only: grpc.aio's server keeps one
pending request per *registered* method and waits on all of them for every
call, a cost that grows with the number of methods a server offers.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeAlias

import grpc
import grpc.aio

from .load import TransferLoad

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
REQUEST_ID_METADATA_KEY = "x-request-id"
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("hixl_request_id", default="-")
_MAX_ID_CHARS = 64


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


def new_request_id() -> str:
    # A log correlation id, not a secret: the PRNG avoids a syscall per call
    # (the random module reseeds itself in forked children).
    return f"{random.getrandbits(32):08x}"


def _id_from_metadata(metadata: Iterable[tuple[str, Any]] | None) -> str:
    for key, value in metadata or ():
        if key == REQUEST_ID_METADATA_KEY and isinstance(value, str) and \
                len(value) <= _MAX_ID_CHARS:
            return value
    return new_request_id()


def _with_request_id(behavior: Any) -> Any:
    """Wrap a handler so that it runs with ``request_id`` set, in its own task.

    The id is read from the call's metadata when the wrapper runs, so one
    wrapper serves every call of the method.
    """
    if inspect.isasyncgenfunction(behavior):
        async def generator(request: Any, context: Any) -> AsyncIterator[Any]:
            request_id.set(_id_from_metadata(context.invocation_metadata()))
            async for item in behavior(request, context):
                yield item

        return generator

    async def coroutine(request: Any, context: Any) -> Any:
        request_id.set(_id_from_metadata(context.invocation_metadata()))
        return await behavior(request, context)

    return coroutine


def _wrap(handler: Handler) -> Handler:
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            _with_request_id(handler.unary_unary),
            handler.request_deserializer, handler.response_serializer)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            _with_request_id(handler.unary_stream),
            handler.request_deserializer, handler.response_serializer)
    return handler


class _WrappingInterceptor(grpc.aio.ServerInterceptor):
    """Wraps the handlers of the methods it applies to, each handler once."""

    def __init__(self) -> None:
        # Method handlers live as long as the server; each is wrapped once.
        self._wrapped: dict[int, tuple[Handler, Handler]] = {}

    def applies(self, method: str, handler: Handler) -> bool:
        raise NotImplementedError

    def wrap(self, handler: Handler) -> Handler:
        raise NotImplementedError

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
            handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or not self.applies(handler_call_details.method, handler):
            return handler
        known = self._wrapped.get(id(handler))
        if known is None or known[0] is not handler:
            known = (handler, self.wrap(handler))
            self._wrapped[id(handler)] = known
        return known[1]


class RequestIdInterceptor(_WrappingInterceptor):
    """Sets ``request_id`` around each unary-request handler (streams from clients pass)."""

    def applies(self, method: str, handler: Handler) -> bool:
        return not handler.request_streaming

    def wrap(self, handler: Handler) -> Handler:
        return _wrap(handler)


class LoadInterceptor(_WrappingInterceptor):
    """Counts the calls of the named unary methods in ``load`` while their handler runs.

    These are the transfer calls arriving over gRPC; the transfer lane counts
    the same calls itself, from the moment it reads their frame (load.py).
    """

    def __init__(self, load: TransferLoad, methods: Iterable[str]) -> None:
        super().__init__()
        self._load = load
        self._methods = frozenset(methods)  # full names: /package.Service/Method

    def applies(self, method: str, handler: Handler) -> bool:
        return method in self._methods and handler.unary_unary is not None

    def wrap(self, handler: Handler) -> Handler:
        behavior, load = handler.unary_unary, self._load
        assert behavior is not None  # applies() admits unary-unary handlers only

        async def counted(request: Any, context: Any) -> Any:
            load.begin()
            try:
                return await behavior(request, context)
            finally:
                load.end()

        return grpc.unary_unary_rpc_method_handler(
            counted, handler.request_deserializer, handler.response_serializer)


class _GenericOnly:
    """A server seen through a generated ``add_*Servicer_to_server``: methods are
    added as generic handlers only (the generic handler it adds first already
    serves every method)."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(
            self, generic_rpc_handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(tuple(generic_rpc_handlers))

    def add_registered_method_handlers(self, service_name: str,
                                       method_handlers: dict[str, Any]) -> None:
        del service_name, method_handlers


def generic_only(server: grpc.aio.Server) -> Any:
    """``server`` for ``add_*Servicer_to_server(servicer, generic_only(server))``.

    grpc.aio keeps one outstanding request per registered method and waits on
    all of them for each incoming call, a cost per method on every call;
    generic handlers share one.
    """
    return _GenericOnly(server)
