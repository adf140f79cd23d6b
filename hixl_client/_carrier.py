"""Carriers: what takes one unary call of a session to the local daemon.

Every call the client makes goes through one carrier protocol, in two
colours as httpcore's network backends are: a :class:`Carrier` for the async
client and a :class:`BlockingCarrier` for a thread of the blocking facade.
The implementations:

* async: ``_transport.GrpcCarrier`` (the session's gRPC channel, every
  call) and ``hixl_wire.lane.Lane`` (the transfer lane: transfer calls and
  the lane-only repeats);
* blocking: ``_blocking_lane.BlockingLane`` (a calling thread's own lane
  connection) and ``_blocking_lane.LoopCarrier`` (the async carriers, run on
  the facade's loop thread, for a thread without a lane).

``_tracing`` wraps any of them in client spans (``TracedCarrier``,
``TracedBlockingCarrier``); the code that picks a carrier never knows
whether tracing is on. The layer-wise task's ``ThreadLane`` is the one lane
end that is no carrier: its calls are opened on the loop, written by another
thread and answered on the loop again.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, Protocol


class Carrier(Protocol):
    """Carries unary calls to the daemon, for coroutines."""

    @property
    def is_open(self) -> bool:
        """Whether calls may still go this way."""

    def begin(self, method: str, request: Any, timeout_s: float, *,
              trace: bytes = b"") -> Coroutine[Any, Any, Any]:
        """Start a call of ``method`` (the daemon's method name) and return the
        coroutine of its reply, which must be awaited.

        ``timeout_s`` bounds the whole call (the call's own timeout plus the
        margin for a daemon that stopped answering); ``trace``: the call's W3C
        traceparent, empty when not traced. A call's failure raises
        LLMException with the daemon's status code, from this method or from
        awaiting the coroutine.
        """

    def close(self) -> None:
        """Stop carrying calls; calls in flight fail."""


class BlockingCarrier(Protocol):
    """Carries unary calls to the daemon, for a plain thread."""

    @property
    def is_open(self) -> bool:
        """Whether calls may still go this way."""

    def call(self, method: str, request: Any, timeout_s: float, *,
             trace: bytes = b"") -> Any:
        """Run a call of ``method`` and return its reply; the arguments and
        failures are :meth:`Carrier.begin`'s."""

    def close(self) -> None:
        """Stop carrying calls; a call in flight fails."""
