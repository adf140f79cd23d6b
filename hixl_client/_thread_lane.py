"""A transfer lane connection whose call frames one worker thread writes itself.

A layer-wise task's blocking synchronizer runs on a thread of the task's own
(``_layerwise``). Handing each "layer ready" to the event loop before the
layer's LayerReady frame could go out put a wake-up of the loop and the
driver's next step between the layer being computed and its bytes starting
to move, on every layer. On a ThreadLane the thread writes the frame the
moment the synchronizer returns.

The event loop owns everything else: it opens each call beforehand (its id
and reply future, :class:`~hixl_wire.lane.CallBook`), reads the replies,
and bounds the wait for one once the thread has sent it. Only the thread
writes to the connection after HELLO, so frames never interleave; a lock
covers writes against closing.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hixl_wire.lane import (
    DEADLINE_GRACE_S,
    CallBook,
    LaneEnd,
    Methods,
    Posted,
    frame_of,
    reply_of,
)

from ._spin import ReplySpin
from .status import LLMException, LLMStatusCode

# A frame is tens of bytes and the daemon reads its lane at once: a write that
# blocks this long means the daemon stopped reading, and the thread gives up.
SEND_TIMEOUT_S = 5.0
_READ_BYTES = 256 * 1024


@dataclass
class ThreadCall:
    """A call opened on the loop, to be sent from the worker thread."""

    posted: Posted
    frame: bytes
    read_reply: Callable[[bytes], Any]
    timeout_s: float
    sent: bool = False  # set by the thread once the whole frame is written
    failure: LLMException | None = None  # set by the thread when it could not be


class ThreadLane(LaneEnd):
    """One lane connection: frames written by a worker thread, replies read by
    the loop; HELLO, reading and failing as every lane end (``LaneEnd``)."""

    def __init__(self, sock: socket.socket, methods: Methods, what: str,
                 grace_s: float = DEADLINE_GRACE_S) -> None:
        super().__init__(what, LLMStatusCode.LLM_FAILED)
        self._sock = sock
        self._fd = sock.fileno()
        self._methods = methods
        self._loop = asyncio.get_running_loop()
        self._calls = CallBook(what, LLMStatusCode.LLM_FAILED, grace_s)
        self._writing = threading.Lock()
        self._spin = ReplySpin()
        self._loop.add_reader(self._fd, self._readable)

    @classmethod
    async def connect_unix(cls, path: str, methods: Methods, what: str, timeout_s: float,
                           hello: bytes, grace_s: float = DEADLINE_GRACE_S) -> ThreadLane:
        """Connect to the transfer lane's unix socket and bind it with ``hello``;
        ``grace_s``: how long past a call's deadline its reply may come."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await asyncio.wait_for(loop.sock_connect(sock, path), timeout_s)
            lane = cls(sock, methods, what, grace_s)
        except BaseException:
            sock.close()
            raise
        with lane._greeting():
            posted = lane._calls.open()
            await asyncio.wait_for(
                loop.sock_sendall(sock, lane._hello_frame(posted.call_id, hello, timeout_s)),
                timeout_s)
            lane._calls.sent(posted.call_id, timeout_s)
            lane._greeted(*await posted.future)
            # From here on only the worker thread writes, blocking but bounded;
            # the descriptor stays non-blocking for the loop's reads.
            sock.settimeout(SEND_TIMEOUT_S)
        return lane

    def open_call(self, method: str, request: Any, timeout_s: float) -> ThreadCall:
        """Open a call of ``method`` for the thread to send (event loop only);
        raises LLMException when the lane failed."""
        if self._closed_because is not None:
            raise self._refusal()
        lane_method = self._methods[method]
        posted = self._calls.open()
        frame = frame_of(posted.call_id, lane_method.kind, timeout_s, 0,
                         lane_method.write_request(request))
        return ThreadCall(posted, frame, lane_method.read_reply, timeout_s)

    def send(self, call: ThreadCall) -> None:
        """Write the call's frame (any thread; blocks at most SEND_TIMEOUT_S).

        Never raises: a failure is left on ``call.failure``, and the lane is
        failed, since part of the frame may be out.
        """
        with self._writing:
            if self._closed_because is not None:
                call.failure = self._refusal()
                return
            try:
                self._sock.sendall(call.frame)
            except OSError as exc:
                error: OSError = exc
            else:
                call.sent = True
                return
        reason = f"writing to the lane failed: {error or type(error).__name__}"
        call.failure = LLMException(f"{self._what}: {reason}", status_code=LLMStatusCode.LLM_FAILED)
        try:
            self._loop.call_soon_threadsafe(self._fail, reason)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            pass

    async def reply(self, call: ThreadCall) -> Any:
        """The reply of a call the thread handled; raises LLMException as a lane call does."""
        call_id = call.posted.call_id
        try:
            if not call.sent:
                raise call.failure or LLMException(f"{self._what}: the call was not sent",
                                                   status_code=LLMStatusCode.LLM_FAILED)
            self._calls.sent(call_id, call.timeout_s)
            kind, body = await self._spin.reply(call.posted.future, self._fd)
        finally:
            self._calls.forget(call_id)
        return reply_of(kind, body, call.read_reply, self._what)

    def drop(self, call: ThreadCall) -> None:
        """Stop waiting for a call nobody will await. Sent already, its handler runs
        on in the daemon: only the thread writes here, so no CANCEL follows."""
        self._calls.forget(call.posted.call_id)
        future = call.posted.future
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            future.exception()  # a failure nobody awaits: not "never retrieved"

    def _readable(self) -> None:
        try:
            # os.read: the descriptor is non-blocking, and socket.recv on a socket
            # with a timeout would first poll.
            data = os.read(self._fd, _READ_BYTES)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(f"reading the lane failed: {exc}")
            return
        frames = self._received(data)
        if frames:
            self._calls.answer(frames)

    def _release(self, reason: str) -> None:
        self._calls.fail(reason)
        self._loop.remove_reader(self._fd)
        try:
            # A thread blocked in sendall returns at once, so the lock below is
            # never held for long.
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        with self._writing:
            self._sock.close()
