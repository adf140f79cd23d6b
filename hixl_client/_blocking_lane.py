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
wait for. Control calls still go through the loop thread.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
import weakref
from typing import Any

from hixl_wire.lane import (
    CLIENT_METHODS,
    KIND_HELLO,
    MAX_BODY,
    REPLY_OK,
    FrameReader,
    error_from_reply,
    frame_of,
    reply_of,
)

from ._transport import LANE_GRACE_S
from .status import LLMException, LLMStatusCode

logger = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0
_READ_BYTES = 256 * 1024


class BlockingLane:
    """One lane connection for one thread: a call is a write and a blocking read.

    Args:
        path: the daemon's transfer-lane socket.
        session_id: the session the connection is bound to.
        what: names the daemon in error messages.
    """

    def __init__(self, path: str, session_id: str, what: str) -> None:
        self._what = what
        self._reader = FrameReader()
        self._next_id = 0
        self._bound_s = 0.0  # the kernel's bound on each send and receive now
        self._sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(HELLO_TIMEOUT_S)
            self._sock.connect(path)
            self._sock.settimeout(None)  # blocking from now on, bounded by _bound
            self._exchange(KIND_HELLO, session_id.encode(), HELLO_TIMEOUT_S, lambda body: body)
        except BaseException:
            self.close()
            raise

    @property
    def is_open(self) -> bool:
        return self._sock is not None

    def call(self, method: str, request: Any, timeout_s: float) -> Any:
        """Run ``method`` with ``request`` under the deadline ``timeout_s`` (the
        frame carries it to the daemon), waiting LANE_GRACE_S longer at most;
        raises LLMException as a lane call does."""
        lane_method = CLIENT_METHODS[method]
        return self._exchange(lane_method.kind, lane_method.write_request(request), timeout_s,
                              lane_method.read_reply)

    def _exchange(self, kind: int, body: bytes, timeout_s: float, read_reply: Any) -> Any:
        sock = self._sock
        if sock is None:
            raise LLMException(f"{self._what}: the lane was closed",
                               status_code=LLMStatusCode.LLM_FAILED)
        self._next_id = call_id = (self._next_id + 1) & 0xFFFFFFFF
        wait_s = timeout_s + LANE_GRACE_S
        try:
            self._bound(sock, wait_s)
            give_up = time.monotonic() + wait_s
            sock.sendall(frame_of(call_id, kind, timeout_s, 0, body))
            while True:
                data = sock.recv(_READ_BYTES)
                if not data:
                    raise self._lost("the daemon closed the lane", LLMStatusCode.LLM_FAILED)
                for frame_id, reply_kind, _, _, reply_body in self._reader.feed(data):
                    if frame_id == call_id:
                        if kind == KIND_HELLO and reply_kind != REPLY_OK:
                            raise error_from_reply(reply_body, self._what)
                        return reply_of(reply_kind, reply_body, read_reply, self._what)
                # A part of the reply: the rest within what is left of the bound.
                left_s = give_up - time.monotonic()
                if left_s <= 0:
                    raise BlockingIOError
                self._bound(sock, left_s)
        except (BlockingIOError, TimeoutError):  # the kernel's bound ran out
            # The reply may still come: the connection is of no further use.
            raise self._lost(f"no answer from the daemon within {wait_s:.1f} s",
                             LLMStatusCode.LLM_TIMEOUT) from None
        except ValueError as exc:  # a malformed frame (FrameReader)
            raise self._lost(f"malformed reply: {exc}", LLMStatusCode.LLM_FAILED) from None
        except OSError as exc:
            raise self._lost(f"the lane failed: {exc}", LLMStatusCode.LLM_FAILED) from None

    def _bound(self, sock: socket.socket, seconds: float) -> None:
        """Bound each send and receive on ``sock`` by ``seconds`` (set only when it
        changes: calls of one cluster share their timeout)."""
        if seconds != self._bound_s:
            whole = int(seconds)
            bound = struct.pack("ll", whole, int((seconds - whole) * 1e6) or 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, bound)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, bound)
            self._bound_s = seconds

    def _lost(self, reason: str, status: LLMStatusCode) -> LLMException:
        self.close()
        return LLMException(f"{self._what}: {reason}", status_code=status)

    def close(self) -> None:
        """Close the connection (any thread: a thread waiting on it gets an error)."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv
        except OSError:
            pass
        sock.close()


class ThreadLanes:
    """The blocking lane of each calling thread, for one session.

    A thread's lane lives as long as the thread (a ``threading.local``) or
    until :meth:`close`, which the facade calls at finalize.

    Args:
        connection: the async client's ``DaemonConnection``, read for the
            session and the lane socket (its attributes are plain values).
    """

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self._local = threading.local()
        self._all: weakref.WeakSet[BlockingLane] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False

    def lane(self) -> BlockingLane | None:
        """This thread's lane, connected on first use; None when the session has
        no transfer lane (or it was lost): the call then goes through the loop,
        which reports why."""
        connection = self._connection
        lane: BlockingLane | None = getattr(self._local, "lane", None)
        if lane is not None and lane.is_open and connection.has_lane:
            return lane
        if self._closed or not connection.has_lane or getattr(self._local, "refused", False):
            return None
        try:
            lane = BlockingLane(connection.lane_socket, connection.session_id,
                                f"hixl daemon at {connection.target}")
        except (OSError, LLMException) as exc:
            # The loop thread's lane still works: this thread uses it from now on.
            self._local.refused = True
            logger.warning("hixl daemon at %s: no lane for thread %s, its transfers go "
                           "through the loop thread: %s", connection.target,
                           threading.current_thread().name, exc or type(exc).__name__)
            return None
        with self._lock:
            if self._closed:
                lane.close()
                return None
            self._all.add(lane)
        self._local.lane = lane
        return lane

    @staticmethod
    def fits(request: Any) -> bool:
        """Whether ``request`` fits one lane frame (larger ones go over gRPC)."""
        return bool(request.ByteSize() <= MAX_BODY)

    def close(self) -> None:
        """Close every thread's lane; later calls go through the loop."""
        with self._lock:
            self._closed = True
            lanes = list(self._all)
        for lane in lanes:
            lane.close()
