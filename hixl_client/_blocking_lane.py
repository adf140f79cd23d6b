"""Transfer-lane connections driven by the blocking facade's calling threads.

The facade runs the async client on one loop thread (``_sync_loop``). For a
transfer that meant two thread hand-offs per call, each a wake-up of a
sleeping thread: the caller's submit to the loop, and the loop's reply back
to the caller. A blocking call can do without both: the calling thread checks
the call as the async client does, writes the lane frame itself and waits in
``recv`` (the GIL released) for the reply. Each calling thread gets its own
connection, bound to the session by HELLO like every lane connection, so
replies never need sorting between threads.

Every wait is bounded as on the other lanes (``_transport``): the frame
carries the call's deadline, the thread gives up LANE_GRACE_S after it, and a
connection that timed out is closed, since its reply may still come. The
bound is the kernel's (``SO_RCVTIMEO``, ``SO_SNDTIMEO``) on a blocking
socket, not a Python socket timeout: with one, each send and receive is a
``poll`` and then the call, two releases of the GIL where one does, and with
several threads calling at once each release is a hand-off the thread may
wait for. Control calls, and the transfers of a thread without a lane or too
large for one frame, still go through the loop thread (:class:`LoopCarrier`).
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from hixl_wire.lane import (
    CLIENT_METHODS,
    KIND_HELLO,
    KIND_TRACE,
    MAX_BODY,
    LaneEnd,
    frame_of,
    reply_of,
)

from . import _tracing
from ._spin import ReplySpin
from ._sync_loop import run
from ._transport import LANE_GRACE_S
from .status import LLMException, LLMStatusCode

if TYPE_CHECKING:
    from ._carrier import BlockingCarrier
    from ._transport import DaemonConnection

logger = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0
_READ_BYTES = 256 * 1024


class BlockingLane(LaneEnd):
    """One lane connection for one thread, a
    :class:`~hixl_client._carrier.BlockingCarrier`: a call is a write and a
    blocking read. HELLO and failing as every lane end (``LaneEnd``).

    Args:
        path: the daemon's transfer-lane socket.
        session_id: the session the connection is bound to.
        what: names the daemon in error messages.
    """

    def __init__(self, path: str, session_id: str, what: str) -> None:
        super().__init__(what, LLMStatusCode.LLM_FAILED)
        self._next_id = 0
        self._bound_s = 0.0  # the kernel's bound on each send and receive now
        self._spin = ReplySpin()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with self._greeting():
            self._sock.settimeout(HELLO_TIMEOUT_S)
            self._sock.connect(path)
            self._sock.settimeout(None)  # blocking from now on, bounded by _bound
            self._greeted(*self._exchange(KIND_HELLO, session_id.encode(), HELLO_TIMEOUT_S))

    def call(self, method: str, request: Any, timeout_s: float, *, trace: bytes = b"") -> Any:
        """Run ``method`` with ``request`` under the deadline ``timeout_s`` (the
        frame carries it to the daemon), waiting LANE_GRACE_S longer at most;
        raises LLMException as a lane call does."""
        lane_method = CLIENT_METHODS[method]
        kind, body = self._exchange(lane_method.kind, lane_method.write_request(request),
                                    timeout_s, trace)
        return reply_of(kind, body, lane_method.read_reply, self._what)

    def _exchange(self, kind: int, body: bytes, timeout_s: float,
                  trace: bytes = b"") -> tuple[int, bytes]:
        """Send one frame and wait for its reply frame's kind and body."""
        if self._closed_because is not None:
            raise self._refusal()
        sock = self._sock
        self._next_id = call_id = (self._next_id + 1) & 0xFFFFFFFF
        wait_s = timeout_s + LANE_GRACE_S
        frame = frame_of(call_id, kind, timeout_s, 0, body)
        if trace:  # one write: the daemon reads the context with its call
            frame = frame_of(call_id, KIND_TRACE, 0, 0, trace) + frame
        try:
            self._bound(sock, wait_s)
            started = time.monotonic()
            give_up = started + wait_s
            sock.sendall(frame)
            self._spin.spin(sock.fileno())  # then recv finds the reply, or sleeps for it
            while True:
                frames = self._received(sock.recv(_READ_BYTES))
                if frames is None:  # closed, by the daemon or another thread, or malformed
                    raise self._refusal()
                for frame_id, reply_kind, _, _, reply_body in frames:
                    if frame_id == call_id:
                        self._spin.took((time.monotonic() - started) * 1e6)
                        return reply_kind, reply_body
                # A part of the reply: the rest within what is left of the bound.
                left_s = give_up - time.monotonic()
                if left_s <= 0:
                    raise BlockingIOError
                self._bound(sock, left_s)
        except (BlockingIOError, TimeoutError):  # the kernel's bound ran out
            # The reply may still come: the connection is of no further use.
            raise self._lost(f"no answer from the daemon within {wait_s:.1f} s",
                             LLMStatusCode.LLM_TIMEOUT) from None
        except OSError as exc:
            raise self._lost(f"the lane failed: {exc}") from None

    def _bound(self, sock: socket.socket, seconds: float) -> None:
        """Bound each send and receive on ``sock`` by ``seconds`` (set only when it
        changes: calls of one cluster share their timeout)."""
        if seconds != self._bound_s:
            whole = int(seconds)
            bound = struct.pack("ll", whole, int((seconds - whole) * 1e6) or 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, bound)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, bound)
            self._bound_s = seconds

    def _release(self, reason: str) -> None:
        # Any thread: one waiting in recv on this connection gets an error.
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


class LoopCarrier:
    """The :class:`~hixl_client._carrier.BlockingCarrier` of a thread without a
    lane of its own: the session's async carrier of the call
    (``DaemonConnection.transfer_carrier``), run on the facade's loop thread.

    Args:
        connection: the async client's connection.
    """

    def __init__(self, connection: DaemonConnection) -> None:
        self._connection = connection

    @property
    def is_open(self) -> bool:
        return True  # the async carriers it runs report their own failures

    def call(self, method: str, request: Any, timeout_s: float, *, trace: bytes = b"") -> Any:
        return run(self._carry, method, request, timeout_s, trace)

    async def _carry(self, method: str, request: Any, timeout_s: float, trace: bytes) -> Any:
        return await self._connection.transfer_carrier(request).begin(method, request,
                                                                      timeout_s, trace=trace)

    def close(self) -> None:
        """Nothing to close: the carriers it runs are the async client's."""


class ThreadLanes:
    """The blocking carrier of each calling thread, for one session: the
    thread's own lane connection, else the loop thread's carriers.

    A thread's lane lives as long as the thread (a ``threading.local``) or
    until :meth:`close`, which the facade calls at finalize.

    Args:
        connection: the async client's ``DaemonConnection``, read for the
            session and the lane socket (its attributes are plain values).
    """

    def __init__(self, connection: DaemonConnection) -> None:
        self._connection = connection
        self._through_loop = LoopCarrier(connection)
        self._local = threading.local()
        self._all: weakref.WeakSet[BlockingLane] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False

    def carrier(self, request: Any) -> BlockingCarrier:
        """The carrier of a transfer call with ``request`` from this thread: its
        lane, or the loop thread when the request is too large for one frame or
        the thread has no lane (see :meth:`lane`)."""
        lane = self.lane() if request.ByteSize() <= MAX_BODY else None
        return self._through_loop if lane is None else lane

    def lane(self) -> BlockingCarrier | None:
        """This thread's lane, connected on first use; None when the session has
        no transfer lane (or it was lost): the call then goes through the loop,
        which reports why."""
        connection = self._connection
        lane: BlockingCarrier | None = getattr(self._local, "carrier", None)
        if lane is not None and lane.is_open and connection.has_lane:
            return lane
        if self._closed or not connection.has_lane or getattr(self._local, "refused", False):
            return None
        try:
            made = BlockingLane(connection.lane_socket, connection.session_id, connection.what)
        except (OSError, LLMException) as exc:
            # The loop thread's lane still works: this thread uses it from now on.
            self._local.refused = True
            logger.warning("hixl daemon at %s: no lane for thread %s, its transfers go "
                           "through the loop thread: %s", connection.target,
                           threading.current_thread().name, exc or type(exc).__name__)
            return None
        with self._lock:
            if self._closed:
                made.close()
                return None
            self._all.add(made)
        self._local.carrier = lane = _tracing.traced_blocking(made)
        return lane

    def close(self) -> None:
        """Close every thread's lane; later calls go through the loop."""
        with self._lock:
            self._closed = True
            lanes = list(self._all)
        for lane in lanes:
            lane.close()
