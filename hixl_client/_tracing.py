"""Optional OpenTelemetry spans of transfer calls (the ``tracing`` extra), off by default.

With ``HIXL_TRACING=1`` in the environment and ``opentelemetry-api``
installed, each pull, push, repeat and layer-wise task is a client span of
the application's tracer provider (``opentelemetry.trace``'s global one,
which the application configures), and its W3C ``traceparent`` travels to
the daemon: as gRPC metadata, or in a TRACE frame before the call's frame on
the transfer lane. The daemon continues the trace, and so does the peer
daemon it calls (``hixl_service.tracing``). Off, the transfer path pays one
module-level flag test per call.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Coroutine
from typing import Any

TRACING_ENV = "HIXL_TRACING"
TRACEPARENT = "traceparent"


def _wanted() -> bool:
    if os.environ.get(TRACING_ENV, "").strip().lower() not in ("1", "true", "yes", "on"):
        return False
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True


ENABLED = _wanted()


def start(name: str) -> tuple[Any, bytes]:
    """A client span named ``name``, started, and the traceparent of its context."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    span = trace.get_tracer("hixl_client").start_span(name, kind=trace.SpanKind.CLIENT)
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(span))
    return span, carrier.get(TRACEPARENT, "").encode()


async def finish(span: Any, reply: Awaitable[Any]) -> Any:
    """Await ``reply`` and end ``span``, recording a failure on it."""
    from opentelemetry.trace import Status, StatusCode

    try:
        return await reply
    except BaseException as exc:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, str(exc)))
        raise
    finally:
        span.end()


def traced(name: str, begin: Any) -> Coroutine[Any, Any, Any]:
    """``begin(traceparent)`` (which sends the call and returns its reply's
    awaitable) inside a client span ``hixl.<name>``."""
    span, traceparent = start(f"hixl.{name}")
    try:
        reply = begin(traceparent)
    except BaseException:
        span.end()
        raise
    return finish(span, reply)
