"""The daemon's end of the transfer lane.

The lane (framing in ``hixl_client._lane`` and ``proto/hixl/v1/client.proto``)
carries the transfer calls without gRPC's per-call cost. Each call runs
through the ClientServicer's own handler (see ``call_context``), so a call
gives the same result, error and LLMStatusCode on either path, and the lane
adds no rules of its own beyond framing and the deadline.

A connection is bound to one session by its first frame (HELLO). Each call
runs in its own task, so calls of one client overlap as on gRPC; a CANCEL
frame, the call's deadline or the client going away cancel its handler, as
gRPC cancels a handler whose call ended.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import grpc

from hixl_client._lane import (
    HEADER,
    KIND_CANCEL,
    KIND_HELLO,
    METHODS,
    REPLY_ERROR,
    REPLY_OK,
    FrameReader,
)
from hixl_client._transport import SESSION_METADATA_KEY
from hixl_client.status import LLMException, LLMStatusCode

from .call_context import CallAborted, CallContext, Context, call_error, deadline_error
from .engine import Engine, Session
from .interceptors import new_request_id, request_id
from .servicer_client import ClientServicer

logger = logging.getLogger(__name__)

Handler = Callable[[Any, Context], Awaitable[Any]]


class _Connection(asyncio.Protocol):
    """One client's lane: frames in, handler tasks, replies out."""

    def __init__(self, server: LaneServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._reader = FrameReader()
        self._context: Context | None = None
        self._session: Session | None = None
        self._calls: dict[int, asyncio.Task[None]] = {}
        self._timed_out: set[int] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._server.connections.discard(self)
        if self._session is not None:
            self._session.lane_connections -= 1
        for task in self._calls.values():
            task.cancel()  # nobody is left to answer, as gRPC cancels a dropped call

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    @property
    def calls(self) -> list[asyncio.Task[None]]:
        return list(self._calls.values())

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except ValueError as exc:
            logger.warning("closing a transfer lane: %s", exc)
            self.close()
            return
        for call_id, kind, timeout_ms, body in frames:
            self._dispatch(call_id, kind, timeout_ms, body)

    def _reply(self, call_id: int, kind: int, body: bytes) -> None:
        if self._transport is not None:
            self._transport.write(HEADER.pack(len(body), call_id, kind, 0) + body)

    def _refuse(self, call_id: int, status: LLMStatusCode, message: str,
                code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> None:
        self._reply(call_id, REPLY_ERROR,
                    call_error(code, int(status), message).SerializeToString())

    def _dispatch(self, call_id: int, kind: int, timeout_ms: int, body: bytes) -> None:
        if kind == KIND_CANCEL:
            task = self._calls.get(call_id)
            if task is not None:
                task.cancel()
            return
        if kind == KIND_HELLO:
            self._hello(call_id, body)
            return
        if self._context is None or self._session is None:
            self._refuse(call_id, LLMStatusCode.LLM_FAILED,
                         "the lane carries no session; send HELLO first",
                         grpc.StatusCode.FAILED_PRECONDITION)
            return
        entry = self._server.handlers.get(kind)
        if entry is None:
            self._refuse(call_id, LLMStatusCode.LLM_PARAM_INVALID, f"unknown lane call kind {kind}",
                         grpc.StatusCode.UNIMPLEMENTED)
            return
        if call_id in self._calls:
            self._refuse(call_id, LLMStatusCode.LLM_PARAM_INVALID,
                         f"call id {call_id} is already in flight")
            return
        request_type, handler = entry
        try:
            request = request_type.FromString(body)
        except Exception as exc:
            self._refuse(call_id, LLMStatusCode.LLM_PARAM_INVALID, f"invalid request: {exc}")
            return
        self._session.lane_calls += 1
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._run(call_id, handler, request, self._context))
        self._calls[call_id] = task
        if timeout_ms:
            deadline = loop.call_later(timeout_ms / 1000.0, self._expire, call_id, task)
            task.add_done_callback(lambda _: deadline.cancel())

    def _hello(self, call_id: int, body: bytes) -> None:
        try:
            session_id = body.decode()
            session = self._server.engine.session(session_id)
        except (UnicodeDecodeError, LLMException) as exc:
            self._refuse(call_id, LLMStatusCode.LLM_FAILED, f"no such session: {exc}",
                         grpc.StatusCode.FAILED_PRECONDITION)
            return
        if self._session is not None:
            self._session.lane_connections -= 1
        self._session = session
        session.lane_connections += 1
        self._context = CallContext(((SESSION_METADATA_KEY, session_id),)).as_context()
        self._reply(call_id, REPLY_OK, b"")

    def _expire(self, call_id: int, task: asyncio.Task[None]) -> None:
        if not task.done():
            self._timed_out.add(call_id)
            task.cancel()

    async def _run(self, call_id: int, handler: Handler, request: Any,
                   context: Context) -> None:
        request_id.set(new_request_id())
        try:
            reply = await handler(request, context)
        except CallAborted as exc:
            self._reply(call_id, REPLY_ERROR, exc.error.SerializeToString())
        except asyncio.CancelledError:
            if call_id in self._timed_out:  # our deadline, not the client's cancel
                self._reply(call_id, REPLY_ERROR, deadline_error().SerializeToString())
                return
            raise
        else:
            self._reply(call_id, REPLY_OK, reply.SerializeToString())
        finally:
            self._calls.pop(call_id, None)
            self._timed_out.discard(call_id)


class LaneServer:
    """The lane's unix socket, next to the client socket."""

    def __init__(self, path: Path, engine: Engine, servicer: ClientServicer) -> None:
        self.path = path
        self.engine = engine
        # kind -> (request type, the servicer's bound handler)
        self.handlers: dict[int, tuple[type[Any], Handler]] = {
            kind: (request_type, getattr(servicer, name))
            for name, (kind, request_type, _) in METHODS.items()}
        self.connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Connection(self), str(self.path))
        os.chmod(self.path, 0o660)

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
        self.path.unlink(missing_ok=True)
