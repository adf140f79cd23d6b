"""The answering end of a lane (framing and calling end: ``hixl_wire.lane``).

A lane carries unary calls without gRPC's per-call cost. Each call runs
through the servicer's own handler (see ``calls``) with the CallInfo its
connection is bound to, and a failure answers with the CallError of what
``rpc_errors.handler_error`` makes of it, so a call gives the same result,
error and LLMStatusCode as its gRPC twin; the lane adds no rules of its own
beyond framing and the deadline. Two lanes exist:

* the transfer lane: a unix socket next to the client socket; a connection
  is bound to one client session by its first frame (HELLO with the session
  id), and the session's lane use is counted for the admin status. A HELLO
  tagged ``RINGS_TAG`` asks for a native lane instead: its reply hands the
  client the lane's two rings (``hixl_wire.rings``, ``native_lanes``), and
  the connection carries nothing more; it ends the native lane when it closes;
* the peer lane: a TCP port next to the peer port, for the Peer calls a
  transfer makes; its calls name their link by token, as over gRPC, so a
  connection needs no HELLO.

Each call runs in its own task, so calls of one connection overlap; a CANCEL
frame, the call's deadline or the connection closing cancel its handler, as
gRPC cancels a handler whose call ended. A call that arrives alone starts in
the frame's own callback instead (eager.py), and a servicer may answer some
calls there without any coroutine (``AtOnce``: repeated transfers).
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, cast

import grpc
import hixl_native

from hixl_wire.lane import (
    CLIENT_METHODS,
    HEADER,
    KIND_CANCEL,
    KIND_HELLO,
    KIND_TRACE,
    REPLY_ERROR,
    REPLY_OK,
    Frame,
    FrameReader,
    Methods,
    call_error,
    call_error_of,
)
from hixl_wire.rings import RINGS_TAG, RingPair, send_with_fds
from hixl_wire.status import LLMException, LLMStatusCode

from . import tracing
from .calls import NO_CALL_INFO, CallInfo, LaneHandler, lane_handler
from .eager import start_eagerly
from .engine import Engine
from .inbound import PeerLaneInfo
from .interceptors import new_request_id, request_id
from .listeners import socket_umask
from .load import TransferLoad
from .native_lanes import NativeLanes
from .rpc_errors import handler_error, report_failure
from .sessions import Session
from .transports.factory import PEER_LANE_METHODS

logger = logging.getLogger(__name__)

# Calls one connection may have running at once (gRPC's servers take 256).
# Beyond it the lane stops reading that connection until calls end, and so
# it does while the peer does not read its replies: flow control, not errors.
MAX_CALLS_IN_FLIGHT = 256

# A servicer's way to answer a call in the frame's callback: the reply, an
# awaitable of it (the call then goes on as a task, like any other), or None
# (the call runs its handler as usual). It may raise only before it did
# anything; the handler then runs and answers with the error.
AtOnce = Callable[[Any, CallInfo], Any]
# The ERROR reply body of a call cancelled by its own deadline.
DEADLINE_EXCEPTION = LLMException("the call's deadline passed",
                                  status_code=LLMStatusCode.LLM_TIMEOUT)
DEADLINE_ERROR = call_error_of(DEADLINE_EXCEPTION).SerializeToString()


class Binding:
    """What a connection's calls run as: their CallInfo, and accounting hooks."""

    def __init__(self, call: CallInfo) -> None:
        self.call = call

    def called(self) -> None:
        """A call was accepted."""

    def released(self) -> None:
        """The connection closed or was bound again."""


class SessionBinding(Binding):
    """A transfer lane bound to a client session (counted in the admin status)."""

    def __init__(self, session: Session) -> None:
        super().__init__(CallInfo(session.session_id))
        self._session = session
        session.lane_connections += 1

    def called(self) -> None:
        self._session.lane_calls += 1

    def released(self) -> None:
        self._session.lane_connections -= 1


class CountingBinding(Binding):
    """A peer lane connection: no binding, its calls counted for the admin status."""

    def __init__(self, info: PeerLaneInfo) -> None:
        super().__init__(NO_CALL_INFO)
        self._info = info

    def called(self) -> None:
        self._info.calls += 1


class _Connection(asyncio.Protocol):
    """One connection of a lane: frames in, handler tasks, replies out."""

    def __init__(self, server: LaneServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._reader = FrameReader()
        self._binding = server.default_binding()
        self._calls: dict[int, asyncio.Task[None]] = {}
        self._timed_out: set[int] = set()
        self._reading = True
        self._writable = True
        # Frames read while MAX_CALLS_IN_FLIGHT calls run, started as calls end.
        self._backlog: collections.deque[Frame] = collections.deque()
        # Trace contexts (TRACE frames) of calls about to arrive; tracing on only.
        self._traces: dict[int, bytes] = {}
        # A connection that asked for rings: its native lane and the daemon's rings.
        self._native: tuple[hixl_native.NativeLane, RingPair] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._native is not None and self._server.native is not None:
            self._server.native.close(*self._native)
            self._native = None
        self._backlog.clear()
        self._server.connections.discard(self)
        if self._binding is not None:
            self._binding.released()
            self._binding = None
        for task in self._calls.values():
            task.cancel()  # nobody is left to answer, as gRPC cancels a dropped call

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def pause_writing(self) -> None:
        self._writable = False
        self._throttle()

    def resume_writing(self) -> None:
        self._writable = True
        self._throttle()

    def _throttle(self) -> None:
        """Start backlogged calls while below the limit; read only while calls may
        start and replies flow."""
        while self._writable and self._backlog and len(self._calls) < MAX_CALLS_IN_FLIGHT:
            self._dispatch(*self._backlog.popleft())
        wanted = self._writable and not self._backlog and len(self._calls) < MAX_CALLS_IN_FLIGHT
        if wanted != self._reading and self._transport is not None:
            self._reading = wanted
            if wanted:
                self._transport.resume_reading()
            else:
                self._transport.pause_reading()

    @property
    def calls(self) -> list[asyncio.Task[None]]:
        return list(self._calls.values())

    def data_received(self, data: bytes) -> None:
        if self._native is not None:  # its rings carry everything after HELLO
            logger.warning("closing a %s connection: bytes after its rings were given",
                           self._server.name)
            self.close()
            return
        try:
            frames = self._reader.feed(data)
        except ValueError as exc:
            logger.warning("closing a %s connection: %s", self._server.name, exc)
            self.close()
            return
        # A call that arrives alone starts in this callback (see eager.py); with
        # others beside it, each gets its task first, so that all are counted
        # under way before any of them runs (load.py).
        eager = len(frames) == 1
        for frame in frames:
            call_id, kind = frame[0], frame[1]
            if kind == KIND_CANCEL:
                self._cancel(call_id)
            elif self._backlog or len(self._calls) >= MAX_CALLS_IN_FLIGHT:
                self._backlog.append(frame)
            else:
                self._dispatch(*frame, eager=eager)
        self._throttle()

    def _cancel(self, call_id: int) -> None:
        task = self._calls.get(call_id)
        if task is not None:
            task.cancel()
            return
        for frame in self._backlog:  # not started yet: it never will be
            if frame[0] == call_id and frame[1] != KIND_HELLO:
                self._backlog.remove(frame)
                return

    def _reply(self, call_id: int, kind: int, body: bytes) -> None:
        if self._transport is not None:
            self._transport.write(HEADER.pack(len(body), call_id, kind, 0, 0) + body)

    def _refuse(self, call_id: int, status: LLMStatusCode, message: str,
                code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> None:
        self._reply(call_id, REPLY_ERROR,
                    call_error(code, int(status), message).SerializeToString())

    def _dispatch(self, call_id: int, kind: int, timeout_ms: int, tag: int,
                  body: bytes, eager: bool = False) -> None:
        if kind == KIND_HELLO:
            self._hello(call_id, body, tag)
            return
        binding = self._binding
        if binding is None:
            self._refuse(call_id, LLMStatusCode.LLM_FAILED,
                         "the lane carries no session; send HELLO first",
                         grpc.StatusCode.UNAUTHENTICATED)
            return
        entry = self._server.handlers.get(kind)
        if entry is None and kind == KIND_TRACE:
            # Kept for the call that follows; bounded like the calls themselves.
            if tracing.ENABLED and len(self._traces) < MAX_CALLS_IN_FLIGHT:
                self._traces[call_id] = body
            return
        # Taken before any refusal, so that a refused call leaves none behind.
        trace = self._traces.pop(call_id, None) if self._traces else None
        if entry is None:
            self._refuse(call_id, LLMStatusCode.LLM_PARAM_INVALID, f"unknown lane call kind {kind}",
                         grpc.StatusCode.UNIMPLEMENTED)
            return
        if call_id in self._calls:
            self._refuse(call_id, LLMStatusCode.LLM_PARAM_INVALID,
                         f"call id {call_id} is already in flight")
            return
        read_request, handler, name = entry
        try:
            request = read_request(body)
        except Exception as exc:
            self._refuse(call_id, LLMStatusCode.LLM_PARAM_INVALID, f"invalid request: {exc}")
            return
        binding.called()
        if trace is not None:  # in a task, in a span that continues the caller's trace
            eager = False
            handler = tracing.traced(handler, f"{self._server.span_prefix}.{name}", trace)
        if eager and kind in self._server.at_once:
            answer = self._answer_at_once(self._server.at_once[kind], request, binding.call)
            if answer is not None and not inspect.isawaitable(answer):
                self._reply(call_id, REPLY_OK, answer.SerializeToString())
                return
            if answer is not None:
                handler = _answered_by(answer)
        loop = asyncio.get_running_loop()
        load = self._server.load
        if load is not None:  # from now on, not when the task first runs (load.py)
            load.begin()
        # The deadline counts from here, whether the call starts now or in a task.
        deadline = loop.time() + timeout_ms / 1000.0
        call = self._run(call_id, name, handler, request, binding.call, tag)
        try:
            task = start_eagerly(loop, call) if eager else loop.create_task(call)
        except BaseException:  # _run answers its own errors, but keep the count right
            if load is not None:
                load.end()
            raise
        if task is None:  # it ended in its first step: answered already
            if load is not None:
                load.end()
            return
        self._calls[call_id] = task
        if load is not None:
            task.add_done_callback(load.end)
        if timeout_ms:
            timer = loop.call_at(deadline, self._expire, call_id, task)
            task.add_done_callback(lambda _: timer.cancel())

    def _answer_at_once(self, at_once: AtOnce, request: Any, call: CallInfo) -> Any:
        load = self._server.load
        if load is not None:  # under way while it runs, as a handler would be (load.py)
            load.begin()
        try:
            return at_once(request, call)
        except Exception:  # nothing was done: the call's handler answers with the error
            logger.debug("answering a %s call at once failed", self._server.name, exc_info=True)
            return None
        finally:
            if load is not None:
                load.end()

    def _hello(self, call_id: int, body: bytes, tag: int = 0) -> None:
        if self._native is not None:
            return  # its rings were given: data_received closes it
        try:
            binding = self._server.bind(body)
        except LLMException as exc:
            self._refuse(call_id, exc.status_code, str(exc),
                         getattr(exc, "grpc_code", None) or grpc.StatusCode.FAILED_PRECONDITION)
            return
        if self._binding is not None:
            self._binding.released()
        self._binding = binding
        if tag == RINGS_TAG and self._server.native is not None:
            # Rings instead of a lane: the connection carries no calls, and is
            # not one of the session's lane connections.
            binding.released()
            self._binding = None
            self._open_native(call_id, body.decode())
            return
        self._reply(call_id, REPLY_OK, b"")

    def _open_native(self, call_id: int, session_id: str) -> None:
        """Answer a HELLO for rings: a native lane, its client's descriptors sent
        with the reply; a refusal when none can be made."""
        native, transport = self._server.native, self._transport
        if native is None or transport is None:
            return
        try:
            lane, pair, far = native.open(session_id)
        except (OSError, ValueError, hixl_native.NativeError) as exc:
            self._refuse(call_id, LLMStatusCode.LLM_FAILED, f"no rings: {exc}",
                         grpc.StatusCode.UNAVAILABLE)
            return
        try:
            # A socket object of our own over a copy of the descriptor: the event
            # loop's transport sends no descriptors, and has nothing queued yet.
            sock = socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
            try:
                send_with_fds(sock, HEADER.pack(0, call_id, REPLY_OK, 0, 0), far)
            finally:
                sock.close()  # the copy only
        except OSError as exc:
            native.close(lane, pair)
            logger.warning("closing a %s connection: its rings could not be sent: %s",
                           self._server.name, exc)
            self.close()
            return
        finally:
            for fd in far:
                os.close(fd)
        self._native = (lane, pair)

    def _expire(self, call_id: int, task: asyncio.Task[None]) -> None:
        if not task.done():
            self._timed_out.add(call_id)
            task.cancel()

    async def _run(self, call_id: int, name: str, handler: LaneHandler, request: Any,
                   call: CallInfo, tag: int) -> None:
        request_id.set(f"{tag:08x}" if tag else new_request_id())
        try:
            reply = await handler(request, call)
        except asyncio.CancelledError:
            if call_id in self._timed_out:  # our deadline, not the caller's cancel
                report_failure(self._server.servicer, name, DEADLINE_EXCEPTION)
                self._reply(call_id, REPLY_ERROR, DEADLINE_ERROR)
                return
            raise
        except Exception as exc:  # what the same gRPC call would end with
            error = handler_error(name, exc, call.session_id)
            report_failure(self._server.servicer, name, error)
            self._reply(call_id, REPLY_ERROR, call_error_of(error).SerializeToString())
        else:
            self._reply(call_id, REPLY_OK, reply.SerializeToString())
        finally:
            self._calls.pop(call_id, None)
            self._timed_out.discard(call_id)
            self._throttle()


def _answered_by(answer: Awaitable[Any]) -> LaneHandler:
    """The handler of a call an ``AtOnce`` started: it awaits what that returned."""

    def handler(_request: Any, _call: CallInfo) -> Awaitable[Any]:
        return answer

    return handler


class LaneServer:
    """A lane's listener and its connections; build with for_clients or for_peers."""

    def __init__(self, name: str, methods: Methods, servicer: object,
                 bind: Callable[[bytes], Binding], needs_hello: bool,
                 load: TransferLoad | None = None, native: NativeLanes | None = None) -> None:
        """``bind`` turns a HELLO's body into the connection's binding; without
        ``needs_hello`` a new connection is bound at once (with an empty body).
        ``load``: where calls count from their frame on (the transfer lane's);
        ``native``: the daemon's native lanes, given to HELLOs that ask for rings."""
        self.name = name
        self.native = native
        self.servicer = servicer
        # Names the handlers' spans when tracing (see tracing.py).
        self.span_prefix = "hixl.daemon" if needs_hello else "hixl.peer"
        self.load = load
        # kind -> (request reader, the servicer's handler, the method's name)
        self.handlers: dict[int, tuple[Callable[[bytes], Any], LaneHandler, str]] = {
            lane_method.kind: (lane_method.read_request, lane_handler(servicer, method), method)
            for method, lane_method in methods.items()}
        at_once: Mapping[str, AtOnce] = getattr(servicer, "at_once", {})
        self.at_once: dict[int, AtOnce] = {
            lane_method.kind: at_once[method] for method, lane_method in methods.items()
            if method in at_once}
        self.bind = bind
        self._needs_hello = needs_hello
        self.connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._path: Path | None = None

    @classmethod
    def for_clients(cls, engine: Engine, servicer: object) -> LaneServer:
        """The transfer lane: ClientServicer handlers, connections bound to a session."""

        def bind(body: bytes) -> Binding:
            try:
                session_id = body.decode()
            except UnicodeDecodeError:
                session_id = ""
            return SessionBinding(engine.sessions.get(session_id))

        return cls("transfer lane", CLIENT_METHODS, servicer, bind, needs_hello=True,
                   load=engine.deps.load, native=engine.native)

    @classmethod
    def for_peers(cls, servicer: object, info: PeerLaneInfo) -> LaneServer:
        """The peer lane: PeerServicer handlers, no binding (calls carry link tokens)."""
        return cls("peer lane", PEER_LANE_METHODS, servicer, lambda _: CountingBinding(info),
                   needs_hello=False)

    def default_binding(self) -> Binding | None:
        """A new connection's binding: none until HELLO where the lane needs one."""
        return None if self._needs_hello else self.bind(b"")

    async def start_unix(self, path: Path) -> None:
        _replace_socket(path)
        loop = asyncio.get_running_loop()
        with socket_umask():  # 0660 from the start, never chmod'ed once it listens
            self._server = await loop.create_unix_server(lambda: _Connection(self), str(path))
        self._path = path

    async def start_tcp(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: an ephemeral port); returns the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float) -> None:
        """Refuse new connections, let calls in flight finish within ``grace_s``, then end."""
        if self._server is not None:
            self._server.close()
        calls = [task for conn in self.connections for task in conn.calls]
        if calls:
            _, late = await asyncio.wait(calls, timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self._path is not None:
            _remove_socket(self._path)


# Plain functions: quick filesystem calls that the async start and stop make
# (ruff's ASYNC240 keeps pathlib calls out of async bodies).
def _replace_socket(path: Path) -> None:
    path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    path.unlink(missing_ok=True)


def _remove_socket(path: Path) -> None:
    path.unlink(missing_ok=True)
