"""Optional OpenTelemetry tracing of the daemon (``[tracing]``, the ``tracing`` extra).

Off by default; then nothing of OpenTelemetry is imported, no interceptor
is installed, and the lanes and the peer client test one module-level flag
(:data:`ENABLED`) per call. On:

* a transfer call that carries a W3C ``traceparent`` (gRPC metadata, or a
  TRACE frame before its lane frame; ``hixl_client._tracing`` sends them)
  runs in a server span ``hixl.daemon.<Method>`` that continues the
  client's trace; the transfer lane then starts the call in a task, never
  at once, so that the span covers it;
* a layer-wise task (``TransferCache``) is one span, each layer written to
  a target a child span;
* peer calls the daemon makes meanwhile (resolves, key releases) carry the
  current span's traceparent to the peer daemon, whose handler spans
  (``hixl.peer.<Method>``) join the same trace.

The daemon keeps its own TracerProvider (never the process-global one), so
a daemon run inside another program does not take over that program's
tracing. Spans are exported in batches off the event loop.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from .interceptors import Handler
from .listeners import StartRefused

if TYPE_CHECKING:
    from .config import TracingConfig

logger = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
# Whether spans are made; set once by configure().
ENABLED = False
_state: dict[str, Any] = {}


def configure(config: TracingConfig, daemon_id: str) -> None:
    """Start exporting spans as ``config`` says; nothing when it is off."""
    global ENABLED
    if not config.enabled:
        return
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError as exc:
        raise StartRefused(f"tracing.enabled needs OpenTelemetry ({exc}): install the "
                           f"tracing extra, pip install 'hixl[tracing]'") from None
    exporter: SpanExporter
    if config.exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        out = (open(config.console_file, "a", encoding="utf-8")
               if config.console_file is not None else None)
        exporter = ConsoleSpanExporter(
            out=out, formatter=lambda span: span.to_json(indent=None) + "\n") \
            if out is not None else ConsoleSpanExporter()
        if out is not None:
            _state["file"] = out
    else:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise StartRefused(f"tracing.exporter = \"otlp\" needs the OTLP exporter ({exc}): "
                               f"pip install 'hixl[tracing]'") from None
        exporter = OTLPSpanExporter(endpoint=config.endpoint) if config.endpoint \
            else OTLPSpanExporter()
    provider = TracerProvider(resource=Resource.create({
        "service.name": config.service_name, "service.instance.id": daemon_id}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _state.update(provider=provider, tracer=provider.get_tracer("hixl_service"),
                  propagator=TraceContextTextMapPropagator())
    ENABLED = True
    logger.info("tracing: exporting spans (%s)", config.exporter)


def shutdown() -> None:
    """Export what is pending and stop (the daemon's stop)."""
    global ENABLED
    provider = _state.pop("provider", None)
    if provider is None:
        return
    ENABLED = False
    provider.shutdown()
    out = _state.pop("file", None)
    if out is not None:
        out.close()
    _state.clear()


def _context_of(traceparent: str | bytes | None) -> Any:
    if not traceparent:
        return None
    if isinstance(traceparent, bytes):
        traceparent = traceparent.decode("ascii", "replace")
    return _state["propagator"].extract({TRACEPARENT: traceparent})


@contextlib.contextmanager
def server_span(name: str, traceparent: str | bytes | None,
                **attributes: Any) -> Iterator[None]:
    """A server span continuing ``traceparent``'s trace (a new one without it);
    a no-op when tracing is off."""
    if not ENABLED:
        yield
        return
    from opentelemetry.trace import SpanKind

    with _state["tracer"].start_as_current_span(name, context=_context_of(traceparent),
                                                kind=SpanKind.SERVER, attributes=attributes):
        yield


@contextlib.contextmanager
def child_span(name: str, parent: Any = None, **attributes: Any) -> Iterator[None]:
    """A span inside ``parent`` (a context from :func:`current_context`), else
    inside the current span (tracing on only)."""
    with _state["tracer"].start_as_current_span(name, context=parent, attributes=attributes):
        yield


def current_context() -> Any:
    """The current trace context, for spans made later in another task."""
    from opentelemetry import context

    return context.get_current()


def current_traceparent() -> str:
    """The current span's traceparent, for a call to a peer; "" without one."""
    carrier: dict[str, str] = {}
    _state["propagator"].inject(carrier)
    return carrier.get(TRACEPARENT, "")


def traceparent_of(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == TRACEPARENT and isinstance(value, str):
            return value
    return None


def traced(handler: Callable[[Any, Any], Awaitable[Any]], name: str,
           traceparent: bytes) -> Callable[[Any, Any], Awaitable[Any]]:
    """A lane handler run in a server span continuing ``traceparent``."""

    async def run(request: Any, call: Any) -> Any:
        with server_span(name, traceparent):
            return await handler(request, call)

    return run


class TracingInterceptor(grpc.aio.ServerInterceptor):
    """Runs each unary handler of a server in a server span ``<prefix>.<Method>``
    that continues the call's ``traceparent`` metadata (installed only while
    tracing); each method's handler is wrapped once."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._wrapped: dict[int, tuple[Handler, Handler]] = {}

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
            handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        known = self._wrapped.get(id(handler))
        if known is None or known[0] is not handler:
            name = f"{self._prefix}.{handler_call_details.method.rsplit('/', 1)[-1]}"
            known = (handler, _spanned(handler, name))
            self._wrapped[id(handler)] = known
        return known[1]


def _spanned(handler: Handler, name: str) -> Handler:
    behavior = handler.unary_unary
    assert behavior is not None

    async def spanned(request: Any, context: Any) -> Any:
        with server_span(name, traceparent_of(context.invocation_metadata())):
            return await behavior(request, context)

    return grpc.unary_unary_rpc_method_handler(
        spanned, handler.request_deserializer, handler.response_serializer)
