"""The client's transport (``hixl_client._transport``) against a real grpc.aio
server in this process whose Client servicer is a small double of the
daemon's, and a real lane server (``hixl_service.lane_server``) of a double
where the double daemon offers a transfer lane: attaching, the session's
metadata on every call, the daemon's exact status on every failure, a
session that ends, and the choice between the lane and gRPC."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio

from hixl_client._transport import DaemonConnection
from hixl_client.status import LLMException, LLMStatusCode
from hixl_service.calls import CallInfo
from hixl_service.lane_server import Binding, LaneServer
from hixl_wire._proto.hixl.v1 import client_pb2, client_pb2_grpc
from hixl_wire.defaults import SESSION_METADATA_KEY
from hixl_wire.lane import CLIENT_METHODS
from hixl_wire.status import status_metadata

SESSION = "0123456789abcdef"


class ClientServicerDouble(client_pb2_grpc.ClientServicer):
    """Stands in for the daemon's Client service. Attach answers as ``attach``
    says (``ok``, ``refuse``, ``silent``: ends without Attached), then sends
    ``notifies`` and holds the stream until ``end_session`` is set. PullCache
    records its metadata and answers by the request's ``size``: 0 a reply, 1
    an abort with the exact status, 2 an abort without one, 3 never."""

    def __init__(self) -> None:
        self.attach = "ok"
        self.lane_socket = ""
        self.notifies: list[client_pb2.Notify] = []
        self.end_session = asyncio.Event()
        self.pulls: list[dict[str, str]] = []

    async def Attach(self, request: client_pb2.AttachRequest,
                     context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        if self.attach == "refuse":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the daemon is stopping",
                                trailing_metadata=status_metadata(LLMStatusCode.LLM_FAILED))
        if self.attach == "silent":
            return
        yield client_pb2.SessionEvent(attached=client_pb2.Attached(
            session_id=SESSION, daemon_id="daemon-1", fd_socket="/fd.sock",
            lane_socket=self.lane_socket, peer_address="127.0.0.1:1"))
        for notify in self.notifies:
            yield client_pb2.SessionEvent(notify=notify)
        await self.end_session.wait()

    async def PullCache(self, request: client_pb2.PullCacheRequest,
                        context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        self.pulls.append({key: str(value) for key, value in context.invocation_metadata()})
        if request.size == 1:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such prefix",
                                trailing_metadata=status_metadata(
                                    LLMStatusCode.LLM_PREFIX_NOT_EXIST))
        if request.size == 2:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "pool full")
        if request.size == 3:
            await asyncio.Event().wait()
        return client_pb2.PullCacheReply(repeat_handle=11)


class LaneServicerDouble:
    """The daemon's transfer-lane handlers, for PullCache only: records the session."""

    def __init__(self) -> None:
        self.pulls: list[str | None] = []

    async def PullCache(self, request: client_pb2.PullCacheRequest,
                        call: CallInfo) -> client_pb2.PullCacheReply:
        self.pulls.append(call.session_id)
        return client_pb2.PullCacheReply(repeat_handle=22)


class Daemon:
    def __init__(self, tmp_path: Path) -> None:
        self.servicer = ClientServicerDouble()
        self.target = f"unix:{tmp_path / 'client.sock'}"
        self.lane_path = tmp_path / "lane.sock"
        self.lane_servicer = LaneServicerDouble()
        self.lane: LaneServer | None = None

    async def offer_lane(self, accept: bool = True) -> None:
        def bind(body: bytes) -> Binding:
            if not accept or body.decode() != SESSION:
                raise LLMException("no such session", status_code=LLMStatusCode.LLM_FAILED)
            return Binding(CallInfo(body.decode()))

        self.lane = LaneServer("transfer lane", {"PullCache": CLIENT_METHODS["PullCache"]},
                               self.lane_servicer, bind, needs_hello=True)
        await self.lane.start_unix(self.lane_path)
        self.servicer.lane_socket = str(self.lane_path)


@pytest_asyncio.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemon]:
    double = Daemon(tmp_path)
    server = grpc.aio.server()
    client_pb2_grpc.add_ClientServicer_to_server(double.servicer, server)
    server.add_insecure_port(double.target)
    await server.start()
    try:
        yield double
    finally:
        double.servicer.end_session.set()
        if double.lane is not None:
            await double.lane.stop(1.0)
        await server.stop(None)


@pytest_asyncio.fixture
async def connect(daemon: Daemon) -> AsyncIterator[Any]:
    opened: list[DaemonConnection] = []

    async def open_one(transfer_lane: bool = False) -> DaemonConnection:
        connection = DaemonConnection(daemon.target, "test", transfer_lane=transfer_lane,
                                      control_timeout_s=5.0)
        opened.append(connection)
        await connection.open()
        return connection

    yield open_one
    for connection in opened:
        await connection.close()


def _pull(size: int = 0) -> client_pb2.PullCacheRequest:
    return client_pb2.PullCacheRequest(size=size)


@pytest.mark.asyncio
async def test_attach_gives_the_session_and_every_call_carries_it(daemon: Daemon,
                                                                  connect: Any) -> None:
    connection = await connect()
    assert (connection.session_id, connection.daemon_id, connection.fd_socket,
            connection.peer_address) == (SESSION, "daemon-1", "/fd.sock", "127.0.0.1:1")
    assert (await connection.call("PullCache", _pull())).repeat_handle == 11
    trace = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    grpc_carrier = connection.transfer_carrier(_pull())
    assert (await grpc_carrier.begin("PullCache", _pull(), 5.0, trace=trace)).repeat_handle == 11
    assert [pull[SESSION_METADATA_KEY] for pull in daemon.servicer.pulls] == [SESSION] * 2
    assert daemon.servicer.pulls[1]["traceparent"] == trace.decode()
    assert not connection.has_lane and connection.lost is None


@pytest.mark.asyncio
@pytest.mark.parametrize(("size", "status", "message"), [
    (1, LLMStatusCode.LLM_PREFIX_NOT_EXIST, "^no such prefix$"),
    (2, LLMStatusCode.LLM_OUT_OF_MEMORY, r"^hixl daemon at unix:.*: RESOURCE_EXHAUSTED: pool full$"),
])
async def test_a_failed_call_raises_the_daemons_status(connect: Any, size: int,
                                                       status: LLMStatusCode,
                                                       message: str) -> None:
    connection = await connect()
    with pytest.raises(LLMException, match=message) as info:
        await connection.call("PullCache", _pull(size))
    assert info.value.status_code is status
    assert info.value.__cause__ is None  # no grpc error leaks through


@pytest.mark.asyncio
async def test_a_daemon_that_never_answers_ends_the_call_by_its_timeout(connect: Any) -> None:
    connection = await connect()
    with pytest.raises(LLMException, match="DEADLINE_EXCEEDED") as info:
        await connection.call("PullCache", _pull(3), timeout=0.0)  # ends after CALL_MARGIN_S
    assert info.value.status_code is LLMStatusCode.LLM_TIMEOUT


@pytest.mark.asyncio
@pytest.mark.parametrize(("attach", "message"), [
    ("refuse", "^the daemon is stopping$"), ("silent", "refused the session")])
async def test_a_refused_session_raises_and_leaves_nothing_open(
        daemon: Daemon, attach: str, message: str) -> None:
    daemon.servicer.attach = attach
    connection = DaemonConnection(daemon.target, transfer_lane=False)
    with pytest.raises(LLMException, match=message) as info:
        await connection.open()
    assert info.value.status_code is LLMStatusCode.LLM_FAILED
    assert connection._channel is None and connection._attach is None


@pytest.mark.asyncio
async def test_no_daemon_listening_fails_at_once_as_llm_failed(tmp_path: Path) -> None:
    connection = DaemonConnection(f"unix:{tmp_path / 'nobody.sock'}", transfer_lane=False)
    with pytest.raises(LLMException, match="UNAVAILABLE") as info:
        await connection.open()
    assert info.value.status_code is LLMStatusCode.LLM_FAILED


@pytest.mark.asyncio
async def test_notifications_arrive_and_a_session_the_daemon_ends_fails_later_calls(
        daemon: Daemon, connect: Any) -> None:
    daemon.servicer.notifies = [client_pb2.Notify(src_cluster_id=3, name="n", message=b"m")]
    connection = await connect()
    await connection.notifies.wait()
    (notify,) = connection.notifies.take()
    assert (notify.name, notify.notify_msg, notify.remote_cluster_id) == ("n", b"m", 3)
    daemon.servicer.end_session.set()
    assert connection._watch is not None
    await connection._watch  # the stream's end is the session's
    assert connection.lost == "the daemon closed the session"
    with pytest.raises(LLMException, match="the daemon closed the session") as info:
        await connection.call("PullCache", _pull())
    assert info.value.status_code is LLMStatusCode.LLM_FAILED
    assert daemon.servicer.pulls == []  # refused without a call


@pytest.mark.asyncio
async def test_a_closed_session_refuses_calls(connect: Any) -> None:
    connection = await connect()
    await connection.close()
    with pytest.raises(LLMException, match="the session was closed"):
        await connection.call("PullCache", _pull())


@pytest.mark.asyncio
async def test_transfers_take_the_lane_when_the_daemon_offers_one(daemon: Daemon,
                                                                  connect: Any) -> None:
    await daemon.offer_lane()
    on_lane = await connect(transfer_lane=True)
    assert on_lane.has_lane
    assert (await on_lane.transfer("PullCache", _pull())).repeat_handle == 22
    assert (await on_lane.call("PullCache", _pull())).repeat_handle == 11  # control: gRPC
    without = await connect(transfer_lane=False)
    assert not without.has_lane
    assert (await without.transfer("PullCache", _pull())).repeat_handle == 11
    assert daemon.lane_servicer.pulls == [SESSION]
    assert len(daemon.servicer.pulls) == 2


@pytest.mark.asyncio
async def test_a_refused_lane_leaves_transfers_on_grpc(daemon: Daemon, connect: Any,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    await daemon.offer_lane(accept=False)
    with caplog.at_level(logging.WARNING, logger="hixl_client._transport"):
        connection = await connect(transfer_lane=True)
    assert "transfer lane" in caplog.text and "unavailable" in caplog.text
    assert not connection.has_lane
    assert (await connection.transfer("PullCache", _pull())).repeat_handle == 11
    assert await connection.take_thread_lane() is None
    assert daemon.lane_servicer.pulls == []
