"""The three calling ends of a lane (``Lane`` on the event loop, ``ThreadLane``
written by a worker thread, ``BlockingLane`` driven by a calling thread) share
HELLO and failing (``hixl_wire.lane.LaneEnd``): a refused HELLO raises the
daemon's status and closes the connection; a malformed reply fails the lane
once, and every later call is refused with that first reason.

The far end is a real unix socket answering real frames from a thread.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from hixl_client._blocking_lane import BlockingLane
from hixl_client._thread_lane import ThreadLane
from hixl_client.status import LLMException, LLMStatusCode
from hixl_wire._proto.hixl.v1 import client_pb2
from hixl_wire.lane import (
    CLIENT_METHODS,
    HEADER,
    KIND_HELLO,
    MAX_BODY,
    REPLY_ERROR,
    REPLY_OK,
    FrameReader,
    Lane,
    call_error,
)

Answer = Callable[[int], bytes]  # call id -> the bytes the far end sends back

REQUEST = client_pb2.LayerReadyRequest(task_id="t", layer=0)
MALFORMED = "the daemon sent a malformed frame"


def ok(call_id: int) -> bytes:
    return HEADER.pack(0, call_id, REPLY_OK, 0, 0)


def refused(call_id: int) -> bytes:
    body = call_error(grpc.StatusCode.UNAUTHENTICATED, int(LLMStatusCode.LLM_FAILED),
                      "no such session").SerializeToString()
    return HEADER.pack(len(body), call_id, REPLY_ERROR, 0, 0) + body


def malformed(call_id: int) -> bytes:
    return HEADER.pack(MAX_BODY + 1, call_id, REPLY_OK, 0, 0)


@pytest.fixture
def far_end(tmp_path: Path) -> Iterator[Callable[[list[Answer]], str]]:
    """Start a far end answering one connection's frames in turn; gives its path."""
    threads: list[threading.Thread] = []
    listeners: list[socket.socket] = []

    def start(answers: list[Answer]) -> str:
        path = str(tmp_path / f"lane{len(listeners)}.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        listeners.append(listener)

        def serve() -> None:
            conn, _ = listener.accept()
            reader, pending = FrameReader(), list(answers)
            with conn:
                while pending and (data := conn.recv(1 << 16)):
                    for call_id, kind, _, _, _ in reader.feed(data):
                        if pending and kind in (KIND_HELLO, CLIENT_METHODS["LayerReady"].kind):
                            conn.sendall(pending.pop(0)(call_id))
                conn.recv(1 << 16)  # until the client closes

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        threads.append(thread)
        return path

    yield start
    for listener in listeners:
        listener.close()
    for thread in threads:
        thread.join(5)


def assert_refused_with(lane: Any, reason: str, call: Callable[[], Any]) -> None:
    assert not lane.is_open and reason in (lane.closed_because or "")
    with pytest.raises(LLMException) as info:
        call()
    assert reason in str(info.value) and info.value.status_code == LLMStatusCode.LLM_FAILED


def test_blocking_lane(far_end: Callable[[list[Answer]], str]) -> None:
    with pytest.raises(LLMException, match="no such session") as info:
        BlockingLane(far_end([refused]), "s", "test daemon")
    assert info.value.status_code == LLMStatusCode.LLM_FAILED
    lane = BlockingLane(far_end([ok, malformed]), "s", "test daemon")
    assert lane.is_open
    with pytest.raises(LLMException, match=MALFORMED):
        lane.call("LayerReady", REQUEST, 5.0)
    assert_refused_with(lane, MALFORMED, lambda: lane.call("LayerReady", REQUEST, 5.0))


@pytest.mark.asyncio
async def test_thread_lane(far_end: Callable[[list[Answer]], str]) -> None:
    with pytest.raises(LLMException, match="no such session"):
        await ThreadLane.connect_unix(far_end([refused]), CLIENT_METHODS, "test daemon", 5.0,
                                      b"s")
    lane = await ThreadLane.connect_unix(far_end([ok, malformed]), CLIENT_METHODS,
                                         "test daemon", 5.0, b"s")
    try:
        call = lane.open_call("LayerReady", REQUEST, 5.0)
        await asyncio.to_thread(lane.send, call)
        with pytest.raises(LLMException, match=MALFORMED):
            await asyncio.wait_for(lane.reply(call), 5)
        assert_refused_with(lane, MALFORMED, lambda: lane.open_call("LayerReady", REQUEST, 5.0))
    finally:
        lane.close()


@pytest.mark.asyncio
async def test_lane(far_end: Callable[[list[Answer]], str]) -> None:
    with pytest.raises(LLMException, match="no such session"):
        await Lane.connect_unix(far_end([refused]), CLIENT_METHODS, "test daemon", 5.0,
                                hello=b"s")
    lane = await Lane.connect_unix(far_end([ok, malformed]), CLIENT_METHODS, "test daemon",
                                   5.0, hello=b"s")
    try:
        with pytest.raises(LLMException, match=MALFORMED):
            await asyncio.wait_for(lane.begin("LayerReady", REQUEST, 5.0), 5)
        assert_refused_with(lane, MALFORMED, lambda: lane.begin("LayerReady", REQUEST, 5.0))
        lane.close()  # a later close keeps the first reason
        assert MALFORMED in (lane.closed_because or "")
    finally:
        lane.close()
