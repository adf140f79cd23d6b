"""Optional OpenTelemetry spans of transfer calls (the ``tracing`` extra), off by default.

With ``HIXL_TRACING=1`` in the environment and ``opentelemetry-api``
installed, each pull, push, repeat and layer-wise task is a client span of
the application's tracer provider (``opentelemetry.trace``'s global one,
which the application configures), and its W3C ``traceparent`` travels to
the daemon: as gRPC metadata, or in a TRACE frame before the call's frame on
the transfer lane. The daemon continues the trace, and so does the peer
daemon it calls (``hixl_service.tracing``). Tracing is a wrapper around a
carrier (``_carrier``), put on when the session opens its carriers: off, a
call pays nothing for it.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from ._carrier import BlockingCarrier, Carrier



class _Wrapped(Protocol):
    @property
    def is_open(self) -> bool: ...
    def close(self) -> None: ...


CarrierT = TypeVar("CarrierT", bound=_Wrapped)

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
    headers: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(headers, trace.set_span_in_context(span))
    return span, headers.get(TRACEPARENT, "").encode()


async def finish(span: Any, reply: Awaitable[Any]) -> Any:
    """Await ``reply`` and end ``span``, recording a failure on it."""
    try:
        return await reply
    except BaseException as exc:
        _failed(span, exc)
        raise
    finally:
        span.end()


def _failed(span: Any, exc: BaseException) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, str(exc)))


class _Wrapper(Generic[CarrierT]):
    """What both traced carriers pass straight through to the carrier they wrap."""

    def __init__(self, carrier: CarrierT) -> None:
        self._carrier = carrier

    @property
    def is_open(self) -> bool:
        return self._carrier.is_open

    def close(self) -> None:
        self._carrier.close()


class TracedCarrier(_Wrapper["Carrier"]):
    """A :class:`~hixl_client._carrier.Carrier` whose every call is a client
    span ``hixl.<method>``, its traceparent carried to the daemon."""

    def begin(self, method: str, request: Any, timeout_s: float, *,
              trace: bytes = b"") -> Coroutine[Any, Any, Any]:
        span, traceparent = start(f"hixl.{method}")
        try:
            reply = self._carrier.begin(method, request, timeout_s, trace=traceparent)
        except BaseException:
            span.end()
            raise
        return finish(span, reply)


class TracedBlockingCarrier(_Wrapper["BlockingCarrier"]):
    """A :class:`~hixl_client._carrier.BlockingCarrier` whose every call is a
    client span, as :class:`TracedCarrier`."""

    def call(self, method: str, request: Any, timeout_s: float, *,
             trace: bytes = b"") -> Any:
        span, traceparent = start(f"hixl.{method}")
        try:
            return self._carrier.call(method, request, timeout_s, trace=traceparent)
        except BaseException as exc:
            _failed(span, exc)
            raise
        finally:
            span.end()


def traced(carrier: Carrier) -> Carrier:
    """``carrier`` in client spans when tracing is on, else ``carrier`` itself."""
    return TracedCarrier(carrier) if ENABLED else carrier


def traced_blocking(carrier: BlockingCarrier) -> BlockingCarrier:
    """``carrier`` in client spans when tracing is on, else ``carrier`` itself."""
    return TracedBlockingCarrier(carrier) if ENABLED else carrier
