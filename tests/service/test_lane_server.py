"""The answering end of a lane (``lane_server``) on a real unix socket, without
a daemon: the servicer it calls is a double that records its calls, and the
calling end is hixl_wire's own ``Lane`` (or frames written by hand, for what
no client library sends). A call gives what its handler gave, a failure the
status its gRPC twin would, and every handler ends: answered, cancelled by
CANCEL, by its deadline, by its connection closing or by the lane stopping."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from hixl_service import lane_server
from hixl_service.calls import CallInfo
from hixl_service.lane_server import Binding, LaneServer, SessionBinding
from hixl_service.load import TransferLoad
from hixl_service.sessions import Session, Sessions
from hixl_wire._proto.hixl.v1 import client_pb2, common_pb2
from hixl_wire.lane import (
    CLIENT_METHODS,
    HEADER,
    KIND_CANCEL,
    KIND_TRACE,
    MAX_BODY,
    REPLY_ERROR,
    REPLY_OK,
    FrameReader,
    Lane,
    frame_of,
)
from hixl_wire.status import LLMException, LLMStatusCode

METHODS = {name: CLIENT_METHODS[name] for name in ("LayerReady", "PullCache")}
LAYER_READY = METHODS["LayerReady"].kind
WHAT = "test daemon"


@dataclass
class ServicerDouble:
    """Stands in for the engine's servicer: records each call and answers by the
    request's task id: ``ok``, ``llm`` (an LLMException), ``value`` (a
    ValueError), ``boom`` (an unexpected error) or ``hold`` (waits for
    ``release``, noting whether it was cancelled)."""

    calls: list[tuple[str, str, str | None]] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)  # of the LayerReady calls run
    failures: list[tuple[str, LLMStatusCode]] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def LayerReady(self, request: client_pb2.LayerReadyRequest,
                         call: CallInfo) -> client_pb2.LayerReadyReply:
        self.calls.append(("LayerReady", request.task_id, call.session_id))
        self.layers.append(request.layer)
        async with self._changed:
            self._changed.notify_all()
        if request.task_id == "llm":
            raise LLMException("no such cache", status_code=LLMStatusCode.LLM_KV_CACHE_NOT_EXIST)
        if request.task_id == "value":
            raise ValueError("layer out of range")
        if request.task_id == "boom":
            raise RuntimeError("secret detail")
        if request.task_id == "hold":
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.append(request.layer)
                async with self._changed:
                    self._changed.notify_all()
                raise
        return client_pb2.LayerReadyReply(reports=[client_pb2.TransferProgress(layer=request.layer)])

    async def PullCache(self, request: client_pb2.PullCacheRequest,
                        call: CallInfo) -> client_pb2.PullCacheReply:
        self.calls.append(("PullCache", str(request.size), call.session_id))
        return client_pb2.PullCacheReply()

    def call_failed(self, method: str, error: LLMException) -> None:
        self.failures.append((method, error.status_code))

    async def until(self, started: int = 0, cancelled: int = 0) -> None:
        """Wait until that many calls started and that many were cancelled."""
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.calls) >= started
                                         and len(self.cancelled) >= cancelled)


@dataclass
class Served:
    server: LaneServer
    servicer: ServicerDouble
    path: Path
    session: Session
    load: TransferLoad


@pytest_asyncio.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    """A transfer-lane server of the double, bound by HELLO to a real session table."""
    sessions = Sessions()
    session = sessions.attach(1, "test")
    servicer, load = ServicerDouble(), TransferLoad()
    server = LaneServer(WHAT, METHODS, servicer,
                        lambda body: SessionBinding(sessions.get(body.decode())),
                        needs_hello=True, load=load)
    path = tmp_path / "lane.sock"
    await server.start_unix(path)
    try:
        yield Served(server, servicer, path, session, load)
    finally:
        servicer.release.set()
        await server.stop(5.0)


async def _lane(served: Served, hello: bytes | None = None) -> Lane:
    return await Lane.connect_unix(str(served.path), METHODS, WHAT, 5.0,
                                   hello=served.session.session_id.encode() if hello is None
                                   else hello)


def _layer(task_id: str, layer: int = 0) -> client_pb2.LayerReadyRequest:
    return client_pb2.LayerReadyRequest(task_id=task_id, layer=layer)


class RawEnd:
    """A connection to the lane whose frames the test writes by hand."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = FrameReader()

    @classmethod
    async def open(cls, served: Served, hello: bool = True) -> RawEnd:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, str(served.path))
        end = cls(sock)
        if hello:
            await end.send(frame_of(0, 0, 5.0, 0, served.session.session_id.encode()))
            assert await end.replies(1) == [(0, REPLY_OK, b"")]
        return end

    async def send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def replies(self, count: int) -> list[tuple[int, int, bytes]]:
        got: list[tuple[int, int, bytes]] = []
        while len(got) < count:
            data = await asyncio.get_running_loop().sock_recv(self.sock, 1 << 16)
            if not data:
                break
            got.extend((call_id, kind, body) for call_id, kind, _, _, body
                       in self.reader.feed(data))
        return got

    async def closed_by_server(self) -> bool:
        return await asyncio.get_running_loop().sock_recv(self.sock, 1 << 16) == b""

    def close(self) -> None:
        self.sock.close()


def _error(body: bytes) -> common_pb2.CallError:
    return common_pb2.CallError.FromString(body)


def _call(call_id: int, request: Any, timeout_s: float = 5.0, kind: int = LAYER_READY) -> bytes:
    return frame_of(call_id, kind, timeout_s, 0, request.SerializeToString())


# ---- binding ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_call_runs_its_handler_as_the_session_hello_bound(served: Served) -> None:
    lane = await _lane(served)
    try:
        reply = await lane.call("LayerReady", _layer("ok", 4), 5.0)
        await lane.call("PullCache", client_pb2.PullCacheRequest(size=64), 5.0)
    finally:
        lane.close()
    assert reply.reports[0].layer == 4
    session_id = served.session.session_id
    assert served.servicer.calls == [("LayerReady", "ok", session_id),
                                     ("PullCache", "64", session_id)]
    assert served.session.lane_calls == 2
    assert served.load.running == 0  # each call counted while under way only


@pytest.mark.asyncio
async def test_a_hello_naming_no_session_is_refused_as_grpc_refuses_it(served: Served) -> None:
    with pytest.raises(LLMException, match="session is unknown") as info:
        await _lane(served, hello=b"not-a-session")
    assert info.value.status_code is LLMStatusCode.LLM_FAILED
    assert served.servicer.calls == []


@pytest.mark.asyncio
async def test_a_call_before_hello_is_refused_unauthenticated(served: Served) -> None:
    end = await RawEnd.open(served, hello=False)
    try:
        await end.send(_call(1, _layer("ok")))
        ((call_id, kind, body),) = await end.replies(1)
    finally:
        end.close()
    error = _error(body)
    assert (call_id, kind) == (1, REPLY_ERROR)
    assert error.grpc_code == grpc.StatusCode.UNAUTHENTICATED.value[0]
    assert error.llm_status == int(LLMStatusCode.LLM_FAILED) and "HELLO" in error.message
    assert served.servicer.calls == []


def test_a_session_binding_counts_the_lane_for_the_admin_status() -> None:
    session = Session("s", 1, "c")
    binding = SessionBinding(session)
    binding.called()
    binding.called()
    assert (session.lane_connections, session.lane_calls) == (1, 2)
    assert binding.call == CallInfo("s")
    binding.released()
    assert session.lane_connections == 0


# ---- failures -----------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(("task_id", "status", "message"), [
    ("llm", LLMStatusCode.LLM_KV_CACHE_NOT_EXIST, "^no such cache$"),
    ("value", LLMStatusCode.LLM_PARAM_INVALID, "^invalid request: layer out of range$"),
    ("boom", LLMStatusCode.LLM_FAILED, "^internal daemon error; see the daemon log$"),
])
async def test_a_failed_handler_answers_what_its_grpc_twin_would(
        served: Served, task_id: str, status: LLMStatusCode, message: str) -> None:
    lane = await _lane(served)
    try:
        with pytest.raises(LLMException, match=message) as info:
            await lane.call("LayerReady", _layer(task_id), 5.0)
        assert info.value.status_code is status
        assert lane.is_open  # the connection serves on
        assert (await lane.call("LayerReady", _layer("ok", 1), 5.0)).reports[0].layer == 1
    finally:
        lane.close()
    assert served.servicer.failures == [("LayerReady", status)]


@pytest.mark.asyncio
async def test_frames_no_client_sends_are_refused_and_the_connection_serves_on(
        served: Served) -> None:
    end = await RawEnd.open(served)
    try:
        await end.send(frame_of(1, 99, 5.0, 0, b""))  # no such kind
        await end.send(frame_of(2, LAYER_READY, 5.0, 0, b"\xff\xff\xff"))  # no protobuf
        await end.send(frame_of(3, KIND_TRACE, 0, 0, b"00-ab-cd-01"))  # tracing off: dropped
        await end.send(_call(3, _layer("ok", 3)))
        replies = await end.replies(3)
    finally:
        end.close()
    (unknown_id, unknown_kind, unknown), (bad_id, bad_kind, bad), (ok_id, ok_kind, ok) = replies
    assert (unknown_id, unknown_kind, bad_id, bad_kind) == (1, REPLY_ERROR, 2, REPLY_ERROR)
    assert _error(unknown).grpc_code == grpc.StatusCode.UNIMPLEMENTED.value[0]
    assert _error(unknown).llm_status == int(LLMStatusCode.LLM_PARAM_INVALID)
    assert _error(bad).llm_status == int(LLMStatusCode.LLM_PARAM_INVALID)
    assert _error(bad).message.startswith("invalid request")
    assert (ok_id, ok_kind) == (3, REPLY_OK)
    assert client_pb2.LayerReadyReply.FromString(ok).reports[0].layer == 3


@pytest.mark.asyncio
async def test_a_call_id_already_in_flight_is_refused(served: Served) -> None:
    end = await RawEnd.open(served)
    try:
        await end.send(_call(7, _layer("hold")))
        await served.servicer.until(started=1)
        await end.send(_call(7, _layer("ok")))
        ((call_id, kind, body),) = await end.replies(1)
        assert (call_id, kind) == (7, REPLY_ERROR)
        assert "already in flight" in _error(body).message
        served.servicer.release.set()
        assert [(c, k) for c, k, _ in await end.replies(1)] == [(7, REPLY_OK)]
    finally:
        end.close()
    assert len(served.servicer.calls) == 1


@pytest.mark.asyncio
async def test_an_oversized_frame_closes_the_connection(served: Served) -> None:
    end = await RawEnd.open(served)
    try:
        await end.send(HEADER.pack(MAX_BODY + 1, 1, LAYER_READY, 0, 0))
        assert await end.closed_by_server()
    finally:
        end.close()


# ---- every handler ends -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_cancel_stops_the_handler_without_an_answer(served: Served) -> None:
    end = await RawEnd.open(served)
    try:
        await end.send(_call(1, _layer("hold", 1)))
        await served.servicer.until(started=1)
        await end.send(HEADER.pack(0, 1, KIND_CANCEL, 0, 0))
        await served.servicer.until(cancelled=1)
        await end.send(_call(2, _layer("ok", 2)))
        assert [(c, k) for c, k, _ in await end.replies(1)] == [(2, REPLY_OK)]
    finally:
        end.close()
    assert served.servicer.cancelled == [1] and served.servicer.failures == []


@pytest.mark.asyncio
async def test_the_calls_deadline_cancels_its_handler_and_answers_llm_timeout(
        served: Served) -> None:
    lane = await _lane(served)
    try:
        with pytest.raises(LLMException, match="deadline passed") as info:
            await lane.call("LayerReady", _layer("hold", 5), 0.001)
    finally:
        lane.close()
    assert info.value.status_code is LLMStatusCode.LLM_TIMEOUT
    assert served.servicer.cancelled == [5]
    assert served.servicer.failures == [("LayerReady", LLMStatusCode.LLM_TIMEOUT)]


@pytest.mark.asyncio
async def test_a_connection_closing_cancels_its_handlers(served: Served) -> None:
    end = await RawEnd.open(served)
    await end.send(_call(1, _layer("hold", 1)) + _call(2, _layer("hold", 2)))
    await served.servicer.until(started=2)
    (connection,) = served.server.connections
    tasks = connection.calls
    end.close()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(result, asyncio.CancelledError) for result in done)
    assert sorted(served.servicer.cancelled) == [1, 2]
    assert served.load.running == 0  # counted from its frame until its task ended
    assert served.server.connections == set()


@pytest.mark.asyncio
async def test_beyond_its_calls_in_flight_a_connection_waits_and_a_waiting_call_can_be_cancelled(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lane_server, "MAX_CALLS_IN_FLIGHT", 2)
    end = await RawEnd.open(served)
    try:
        # 3 and 4 wait behind 1 and 2; the CANCEL finds 3 still waiting: dropped.
        await end.send(b"".join(_call(i, _layer("hold", i)) for i in (1, 2, 3, 4))
                       + HEADER.pack(0, 3, KIND_CANCEL, 0, 0))
        await served.servicer.until(started=2)
        assert served.servicer.layers == [1, 2]
        served.servicer.release.set()
        replies = await end.replies(3)
    finally:
        end.close()
    assert sorted((c, k) for c, k, _ in replies) == [(1, REPLY_OK), (2, REPLY_OK), (4, REPLY_OK)]
    assert sorted(served.servicer.layers) == [1, 2, 4]  # 3 never ran
    assert served.servicer.cancelled == []


@pytest.mark.asyncio
async def test_stop_lets_calls_finish_within_the_grace_then_cancels_the_rest(
        tmp_path: Path) -> None:
    servicer = ServicerDouble()
    server = LaneServer(WHAT, METHODS, servicer, lambda _: Binding(CallInfo()),
                        needs_hello=False)
    path = tmp_path / "lane.sock"
    await server.start_unix(path)
    lane = await Lane.connect_unix(str(path), METHODS, WHAT, 5.0)
    try:
        held = asyncio.ensure_future(lane.call("LayerReady", _layer("hold", 1), 5.0))
        await servicer.until(started=1)
        stopping = asyncio.ensure_future(server.stop(30.0))
        servicer.release.set()  # finishes within the grace
        assert (await held).reports[0].layer == 1
        await stopping
        assert not path.exists()
        servicer.release.clear()
        server = LaneServer(WHAT, METHODS, servicer, lambda _: Binding(CallInfo()),
                            needs_hello=False)
        await server.start_unix(path)
        late_lane = await Lane.connect_unix(str(path), METHODS, WHAT, 5.0)
        try:
            late = asyncio.ensure_future(late_lane.call("LayerReady", _layer("hold", 2), 5.0))
            await servicer.until(started=2)
            await server.stop(0.0)  # no grace: cancelled, the connection closed
            with pytest.raises(LLMException, match="closed the lane") as info:
                await late
        finally:
            late_lane.close()
        assert info.value.status_code is LLMStatusCode.LLM_FAILED
        assert servicer.cancelled == [2]
    finally:
        lane.close()
