"""Lanes: unary calls as framed messages on one plain stream socket.

A gRPC call's round trip is most of a small transfer's time; a message on a
plain socket between two uvloop processes costs a small fraction of it
(docs/architecture.md has the figures). A lane carries the request and reply
messages of chosen unary methods, framed by a 17-byte header (documented at the
top of ``proto/hixl/v1/client.proto``), and the far side runs them through the
same handlers as their gRPC twins: validation, errors and status codes are the
same. Two lanes exist: the transfer lane from a client to its daemon (a unix
socket, :data:`CLIENT_METHODS`) and the peer lane between daemons (TCP,
:data:`PEER_METHODS` and the transports' own). This module holds what both ends
share: the framing, the method tables, the lane's own bodies
(:class:`RepeatFrame`, and the ``CallError`` of a failed call:
:func:`call_error_of` writes it, :func:`error_from_call` reads it),
:class:`LaneEnd`, what every calling end shares whatever does its I/O (the
HELLO that binds a connection, reading replies, failing once), and
:class:`Lane`, the calling end on the event loop, which the client uses towards
its daemon and a daemon towards its peers (the client's thread-written and
blocking ends are ``hixl_client._thread_lane`` and ``_blocking_lane``);
``hixl_service.lane_server`` is the answering end.

Calls are multiplexed by call id; replies come back in completion order. A
call that is cancelled or outlives its timeout sends CANCEL, so the far side
stops its handler as a gRPC deadline would.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, cast

import grpc

from ._proto.hixl.v1 import client_pb2, common_pb2, peer_pb2
from .status import STATUS_TO_GRPC, LLMException, LLMStatusCode

# body bytes, call id, kind, timeout in ms, request tag (the caller's request
# id for the far side's log, 0: none)
HEADER = struct.Struct("<IIBII")
Frame = tuple[int, int, int, int, bytes]  # call id, kind, timeout ms, request tag, body
MAX_BODY = 4 * 1024 * 1024       # gRPC's default message limit: the same requests fit
KIND_HELLO = 0
# The trace context (a W3C traceparent) of the call whose id it carries, sent
# just before that call's frame while tracing is on; never answered.
KIND_TRACE = 254
KIND_CANCEL = 255
REPLY_OK = 0
REPLY_ERROR = 1


@dataclass(slots=True)
class RepeatFrame:
    """The body of a RepeatPull or RepeatPush call: a transfer of the shape
    ``handle`` names (``repeat_handle`` of a PullCacheReply or PushReply),
    between two batch slots. Not a protobuf message: 16 bytes the daemon
    reads without decoding anything."""

    handle: int
    src_batch_index: int
    dst_batch_index: int

    def pack(self) -> bytes:
        """The frame body; raises struct.error for a value out of its field's range."""
        return _REPEAT.pack(self.handle, self.src_batch_index, self.dst_batch_index)

    @classmethod
    def unpack(cls, body: bytes) -> RepeatFrame:
        """Raises struct.error for a body of any other length."""
        return cls(*_REPEAT.unpack(body))


_REPEAT = struct.Struct("<QII")


class LaneMethod(NamedTuple):
    """One call a lane carries: its kind (a wire value) and how its bodies are
    written and read. Replies are protobuf messages; requests are too, but
    for the repeats' :class:`RepeatFrame`."""

    kind: int
    write_request: Callable[[Any], bytes]
    read_request: Callable[[bytes], Any]
    read_reply: Callable[[bytes], Any]


def message_method(kind: int, request_type: Any, reply_type: Any) -> LaneMethod:
    """A call whose request and reply are the protobuf messages of its gRPC twin."""
    return LaneMethod(kind, request_type.SerializeToString, request_type.FromString,
                      reply_type.FromString)


# Method name -> LaneMethod.
Methods = dict[str, LaneMethod]
CLIENT_METHODS: Methods = {
    "PullCache": message_method(1, client_pb2.PullCacheRequest, client_pb2.PullCacheReply),
    "PullBlocks": message_method(2, client_pb2.PullCacheRequest, client_pb2.PullCacheReply),
    "PushCache": message_method(3, client_pb2.PushRequest, client_pb2.PushReply),
    "PushBlocks": message_method(4, client_pb2.PushRequest, client_pb2.PushReply),
    "CopyCache": message_method(5, client_pb2.CopyCacheRequest, client_pb2.CopyReply),
    "CopyBlocks": message_method(6, client_pb2.CopyBlocksRequest, client_pb2.CopyReply),
    "SwapBlocks": message_method(7, client_pb2.SwapBlocksRequest, client_pb2.CopyReply),
    "LayerReady": message_method(8, client_pb2.LayerReadyRequest, client_pb2.LayerReadyReply),
    # Lane only: no gRPC methods of these names (see RepeatFrame).
    "RepeatPull": LaneMethod(9, RepeatFrame.pack, RepeatFrame.unpack,
                             client_pb2.PullCacheReply.FromString),
    "RepeatPush": LaneMethod(10, RepeatFrame.pack, RepeatFrame.unpack,
                             client_pb2.PushReply.FromString),
    "SendNotify": message_method(11, client_pb2.SendNotifyRequest, client_pb2.SendNotifyReply),
}
# The peer lane: the Peer calls a transfer may make, whatever its transport.
# Transports add their own (kinds 3 and 4 are taken); the daemon's full table
# is ``hixl_service.transports.factory.PEER_LANE_METHODS``.
PEER_METHODS: Methods = {
    "ResolveCache": message_method(1, peer_pb2.ResolveCacheRequest,
                                   peer_pb2.ResolveCacheReply),
    "ReleaseKey": message_method(2, peer_pb2.ReleaseKeyRequest, peer_pb2.ReleaseKeyReply),
    "Notify": message_method(5, peer_pb2.NotifyRequest, peer_pb2.NotifyReply),
}
# Bounds the wait for a daemon that stopped answering, just beyond the call's
# own deadline (which the daemon enforces and answers with LLM_TIMEOUT); a
# lane may be given another (a client's lane to its own daemon: a unix socket).
DEADLINE_GRACE_S = 0.5
# How often a lane with calls in flight looks for calls past that bound: one
# timer per lane rather than one per call (arming and cancelling a timer is
# a noticeable part of a small call), so the bound holds to within a tick.
WATCHDOG_TICK_S = 0.1
_CALL_IDS = 2**32


class FrameReader:
    """Splits a byte stream into frames (see :data:`Frame`)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        """Frames completed by ``data``; raises ValueError on an oversized body."""
        frames: list[Frame] = []
        if not self._buffer and len(data) >= HEADER.size:
            size, call_id, kind, timeout_ms, tag = HEADER.unpack_from(data)
            if size <= MAX_BODY and HEADER.size + size == len(data):
                # The most usual case by far: one read, one whole frame.
                return [(call_id, kind, timeout_ms, tag, data[HEADER.size:])]
            # Whole frames in one read, parsed without copying the stream.
            view, start = memoryview(data), 0
            while len(data) - start >= HEADER.size:
                size, call_id, kind, timeout_ms, tag = HEADER.unpack_from(data, start)
                if size > MAX_BODY:
                    raise ValueError(f"a lane frame of {size} bytes exceeds {MAX_BODY}")
                end = start + HEADER.size + size
                if end > len(data):
                    break
                frames.append((call_id, kind, timeout_ms, tag,
                               bytes(view[start + HEADER.size:end])))
                start = end
            self._buffer += view[start:]
            return frames
        buffer = self._buffer
        buffer += data
        while len(buffer) >= HEADER.size:
            size, call_id, kind, timeout_ms, tag = HEADER.unpack_from(buffer)
            if size > MAX_BODY:
                raise ValueError(f"a lane frame of {size} bytes exceeds {MAX_BODY}")
            end = HEADER.size + size
            if end > len(buffer):
                break
            frames.append((call_id, kind, timeout_ms, tag, bytes(buffer[HEADER.size:end])))
            del buffer[:end]
        return frames


def call_error(code: grpc.StatusCode, llm_status: int, message: str) -> common_pb2.CallError:
    """The body of an ERROR reply: what the same gRPC call would have ended with."""
    return common_pb2.CallError(grpc_code=code.value[0], llm_status=llm_status, message=message)


def call_error_of(exc: LLMException) -> common_pb2.CallError:
    """The CallError of a call that failed with ``exc``: the gRPC code a daemon
    aborts the same call with (``STATUS_TO_GRPC``, unless the exception names
    its own ``grpc_code``) and the exact status."""
    code = getattr(exc, "grpc_code", None) or STATUS_TO_GRPC.get(exc.status_code,
                                                                 grpc.StatusCode.UNKNOWN)
    return call_error(code, int(exc.status_code), str(exc))


def error_from_reply(body: bytes, what: str) -> LLMException:
    """The LLMException of an ERROR reply."""
    return error_from_call(common_pb2.CallError.FromString(body), what)


def error_from_call(error: common_pb2.CallError, what: str) -> LLMException:
    """The LLMException of a CallError, as error_from_rpc builds it for a failed gRPC call."""
    try:
        status = LLMStatusCode(error.llm_status)
    except ValueError:
        status = LLMStatusCode.LLM_FAILED
    if status == LLMStatusCode.LLM_SUCCESS:  # no LLM status: name the gRPC code
        status = LLMStatusCode.LLM_FAILED
        code = next((c.name for c in grpc.StatusCode if c.value[0] == error.grpc_code), "")
        return LLMException(f"{what}: {code}: {error.message}", status_code=status)
    return LLMException(error.message or status.name, status_code=status)


def unanswered(what: str) -> LLMException:
    """The error of a call whose answer did not come in time (the far side,
    ``what``, is deemed gone): LLM_TIMEOUT."""
    return LLMException(f"{what} did not answer a lane call in time",
                        status_code=LLMStatusCode.LLM_TIMEOUT)


class ReplySpin(Protocol):
    """A calling end's wait for a reply that looks at the connection's socket
    for a while before it sleeps (the client's: ``hixl_client._spin``)."""

    async def reply(self, future: asyncio.Future[tuple[int, bytes]],
                    fd: int) -> tuple[int, bytes]:
        """The future's result, looking at ``fd`` first."""


class Posted(NamedTuple):
    """An open call: its id, and the future its reply settles."""

    call_id: int
    future: asyncio.Future[tuple[int, bytes]]


class CallBook:
    """The calls of one lane connection awaiting replies, by call id, and the
    bound on waiting for a far side that stopped answering. Whether the
    connection may take calls is its :class:`LaneEnd`'s to say.

    Runs on the event loop thread only.
    """

    def __init__(self, what: str, lost_status: LLMStatusCode,
                 grace_s: float = DEADLINE_GRACE_S) -> None:
        self.what = what  # "hixl daemon at ...", for messages
        self.lost_status = lost_status  # of calls in flight when the connection drops
        self.grace_s = grace_s  # how long past a call's deadline its reply may come
        self._pending: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        # call id -> loop time past which the far side is deemed gone (see _watch)
        self._give_up_at: dict[int, float] = {}
        self._watchdog: asyncio.TimerHandle | None = None
        self._next_id = 0

    def open(self) -> Posted:
        """A new call id and the future its reply settles; not yet bounded (see sent)."""
        call_id = self._next_id
        self._next_id = (call_id + 1) % _CALL_IDS
        future: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        return Posted(call_id, future)

    def sent(self, call_id: int, timeout_s: float) -> None:
        """The call's frame is out: bound the wait for its reply."""
        # The far side answers a late call itself (LLM_TIMEOUT); the watchdog only
        # bounds the wait for a far side that stopped answering altogether.
        loop = asyncio.get_running_loop()
        self._give_up_at[call_id] = loop.time() + timeout_s + self.grace_s
        if self._watchdog is None:
            self._watchdog = loop.call_later(WATCHDOG_TICK_S, self._watch)

    def forget(self, call_id: int) -> bool:
        """Stop waiting for a call; whether it was still unanswered."""
        self._give_up_at.pop(call_id, None)
        return self._pending.pop(call_id, None) is not None

    def answer(self, frames: list[Frame]) -> None:
        """Settle the calls the reply frames answer (unknown ids: calls given up)."""
        pending = self._pending
        for call_id, kind, _, _, body in frames:
            future = pending.pop(call_id, None)
            if future is not None and not future.done():
                future.set_result((kind, body))

    def _watch(self) -> None:
        """Fail the calls left unanswered past their bound; runs every
        WATCHDOG_TICK_S while calls are in flight."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for call_id in [c for c, at in self._give_up_at.items() if at <= now]:
            del self._give_up_at[call_id]
            future = self._pending.get(call_id)
            if future is not None and not future.done():
                future.set_exception(unanswered(self.what))
        self._watchdog = loop.call_later(WATCHDOG_TICK_S, self._watch) \
            if self._give_up_at else None

    def fail(self, reason: str) -> None:
        """The connection is gone: fail every call in flight with ``reason``."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._give_up_at.clear()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(LLMException(f"{self.what}: {reason}",
                                                  status_code=self.lost_status))


def reply_of(kind: int, body: bytes, read_reply: Callable[[bytes], Any], what: str) -> Any:
    """A reply frame's message, or its error raised as LLMException."""
    if kind != REPLY_OK:
        raise error_from_reply(body, what)
    return read_reply(body)


# Why a lane closed, when no failure says more.
LANE_CLOSED = "the lane was closed"
FAR_END_CLOSED = "the daemon closed the lane"


class LaneEnd:
    """What every calling end of a lane connection shares, whatever does its
    I/O (:class:`Lane` on the event loop, the client's ``ThreadLane`` written
    by a worker thread and ``BlockingLane`` driven by a calling thread): the
    HELLO that binds a connection, reading reply frames, and failing.

    An end fails once: the first reason is kept (:attr:`closed_because`), the
    connection is released (:meth:`_release`, which also fails the calls in
    flight), and every later call is refused with that reason.
    """

    def __init__(self, what: str, lost_status: LLMStatusCode) -> None:
        self._what = what  # "hixl daemon at ...", for messages
        self._lost_status = lost_status  # of calls the lost connection fails
        self._reader = FrameReader()
        self._closed_because: str | None = None

    @property
    def closed_because(self) -> str | None:
        """Why the lane closed (None while open)."""
        return self._closed_because

    @property
    def is_open(self) -> bool:
        return self._closed_because is None

    def close(self) -> None:
        """Close the connection: calls in flight fail, later ones are refused."""
        self._fail(LANE_CLOSED)

    def _fail(self, reason: str) -> None:
        if self._closed_because is None:
            self._closed_because = reason
            self._release(reason)

    def _release(self, reason: str) -> None:
        """Close the connection and fail the calls in flight with ``reason``;
        runs once, from :meth:`_fail`."""
        raise NotImplementedError

    def _refusal(self) -> LLMException:
        """The error of a call on the lane once it failed."""
        return LLMException(f"{self._what}: {self._closed_because or LANE_CLOSED}",
                            status_code=self._lost_status)

    def _lost(self, reason: str, status: LLMStatusCode | None = None) -> LLMException:
        """Fail the lane for ``reason`` and return the error of the call it ended."""
        self._fail(reason)
        return LLMException(f"{self._what}: {reason}", status_code=status or self._lost_status)

    @contextlib.contextmanager
    def _greeting(self) -> Iterator[None]:
        """Around opening a connection and its HELLO: any failure closes it."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _hello_frame(call_id: int, hello: bytes, timeout_s: float) -> bytes:
        """The HELLO frame: the connection's first, binding it (to a session: its id)."""
        return frame_of(call_id, KIND_HELLO, timeout_s, 0, hello)

    def _greeted(self, kind: int, body: bytes) -> None:
        """Raise the far side's refusal of the HELLO, given its reply frame's kind and body."""
        if kind != REPLY_OK:
            raise error_from_reply(body, self._what)

    def _received(self, data: bytes) -> list[Frame] | None:
        """The reply frames ``data`` completes; None when the lane failed on it:
        ``data`` is empty (the far side closed) or holds a malformed frame."""
        if not data:
            self._fail(FAR_END_CLOSED)
            return None
        try:
            return self._reader.feed(data)
        except ValueError as exc:
            self._fail(f"the daemon sent a malformed frame: {exc}")
            return None


class Lane(LaneEnd, asyncio.Protocol):
    """The calling end of one lane connection to a daemon (a client's to its
    daemon, a daemon's to a peer), on the event loop; open with
    :meth:`connect_unix` or :meth:`connect_tcp`.

    The client's async carrier of transfer calls (``hixl_client._carrier``):
    :meth:`begin` sends a call at once and gives its reply's coroutine.
    """

    def __init__(self, methods: Methods, what: str,
                 lost_status: LLMStatusCode = LLMStatusCode.LLM_FAILED,
                 grace_s: float = DEADLINE_GRACE_S, spin: ReplySpin | None = None) -> None:
        super().__init__(what, lost_status)
        self._methods = methods
        self._transport: asyncio.Transport | None = None
        self._fd = -1  # the connection's socket, for spin
        self._calls = CallBook(what, lost_status, grace_s)
        self._spin = spin

    @classmethod
    async def connect_unix(cls, path: str, methods: Methods, what: str, timeout_s: float,
                           hello: bytes | None = None, grace_s: float = DEADLINE_GRACE_S,
                           spin: ReplySpin | None = None) -> Lane:
        """Connect to a lane's unix socket; ``hello`` binds it (the session id);
        ``grace_s``: how long past a call's deadline its reply may come;
        ``spin``: how a call waits the first microseconds for its reply."""
        loop = asyncio.get_running_loop()
        _, lane = await asyncio.wait_for(
            loop.create_unix_connection(
                lambda: cls(methods, what, LLMStatusCode.LLM_FAILED, grace_s, spin), path),
            timeout_s)
        return await lane._greet(hello, timeout_s)

    @classmethod
    async def connect_tcp(cls, host: str, port: int, methods: Methods, what: str,
                          timeout_s: float, hello: bytes | None = None,
                          lost_status: LLMStatusCode = LLMStatusCode.LLM_FAILED) -> Lane:
        """Connect to a lane's TCP port (asyncio sets TCP_NODELAY: frames are small)."""
        loop = asyncio.get_running_loop()
        _, lane = await asyncio.wait_for(
            loop.create_connection(lambda: cls(methods, what, lost_status), host, port),
            timeout_s)
        return await lane._greet(hello, timeout_s)

    async def _greet(self, hello: bytes | None, timeout_s: float) -> Lane:
        if hello is not None:
            with self._greeting():
                self._greeted(*await self._wait(self._post(KIND_HELLO, hello, timeout_s, 0)))
        return self

    @property
    def is_open(self) -> bool:
        return self._closed_because is None and self._transport is not None

    async def call(self, method: str, request: Any, timeout_s: float, tag: int = 0,
                   trace: bytes = b"") -> Any:
        """Run one call of ``method``; failures raise LLMException as over gRPC.

        ``tag``: a request id (32 bits) under which the far side logs the call;
        ``trace``: its traceparent (see :meth:`begin`).
        """
        return await self.begin(method, request, timeout_s, tag, trace)

    def begin(self, method: str, request: Any, timeout_s: float,
              tag: int = 0, trace: bytes = b"") -> Coroutine[Any, Any, Any]:
        """Send a call of ``method`` now and return a coroutine giving its reply.

        The frame is written before this returns, so a caller that hands the
        reply to a new task does not also wait for that task's first step to
        send it. The coroutine must be awaited (it ends the call's bookkeeping).
        Raises LLMException at once when the lane is closed. ``trace``: the
        call's traceparent, sent in a TRACE frame before it (tracing on).
        """
        lane_method = self._methods[method]
        posted = self._post(lane_method.kind, lane_method.write_request(request), timeout_s, tag,
                            trace)
        return self._reply(posted, lane_method.read_reply)

    async def _reply(self, posted: Posted, read_reply: Callable[[bytes], Any]) -> Any:
        kind, body = await self._wait(posted)
        return reply_of(kind, body, read_reply, self._what)

    def _post(self, kind: int, body: bytes, timeout_s: float, tag: int,
              trace: bytes = b"") -> Posted:
        transport = self._transport
        if transport is None or self._closed_because is not None:
            raise self._refusal()
        posted = self._calls.open()
        frame = frame_of(posted.call_id, kind, timeout_s, tag, body)
        if trace:  # one write: the far side reads the context with its call
            frame = frame_of(posted.call_id, KIND_TRACE, 0, 0, trace) + frame
        transport.write(frame)
        self._calls.sent(posted.call_id, timeout_s)
        return posted

    async def _wait(self, posted: Posted) -> tuple[int, bytes]:
        call_id, future = posted
        try:
            spin = self._spin
            return await (future if spin is None else spin.reply(future, self._fd))
        finally:
            if self._calls.forget(call_id) and self._transport is not None:
                # Cancelled or expired before the answer: stop the far handler too.
                self._transport.write(HEADER.pack(0, call_id, KIND_CANCEL, 0, 0))

    def _release(self, reason: str) -> None:
        self._calls.fail(reason)
        if self._transport is not None:
            self._transport.close()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None else -1

    def data_received(self, data: bytes) -> None:
        frames = self._received(data)
        if frames:
            self._calls.answer(frames)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(FAR_END_CLOSED)
        self._transport = None


def frame_of(call_id: int, kind: int, timeout_s: float, tag: int, body: bytes) -> bytes:
    """One call's frame: header and body."""
    return HEADER.pack(len(body), call_id, kind, min(int(timeout_s * 1000), _CALL_IDS - 1),
                       tag) + body
