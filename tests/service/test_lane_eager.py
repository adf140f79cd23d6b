"""The lane starts a call that arrives alone without a task, and counts a batch first.

A real lane server on a unix socket in this process, with a servicer of one
method that records how it was run; frames are written by hand on a socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hixl_service.calls import CallInfo
from hixl_service.lane_server import Binding, LaneServer
from hixl_service.load import TransferLoad
from hixl_wire._proto.hixl.v1 import peer_pb2
from hixl_wire.lane import HEADER, REPLY_OK, message_method

KIND = 1
METHODS = {"Probe": message_method(KIND, peer_pb2.ReleaseKeyRequest, peer_pb2.ReleaseKeyReply)}


class Recorder:
    """A servicer whose one handler notes whether it ran in a task and the load."""

    def __init__(self, load: TransferLoad) -> None:
        self.load = load
        self.runs: list[tuple[bool, int]] = []

    async def Probe(self, request: Any, context: CallInfo) -> peer_pb2.ReleaseKeyReply:
        self.runs.append((asyncio.current_task() is not None, self.load.running))
        return peer_pb2.ReleaseKeyReply()


def _frame(call_id: int) -> bytes:
    body = peer_pb2.ReleaseKeyRequest(link_token=call_id).SerializeToString()
    return HEADER.pack(len(body), call_id, KIND, 5000, 0) + body


def _replies(sock: socket.socket, count: int) -> list[tuple[int, int]]:
    """(call id, reply kind) of the next ``count`` replies, read by hand."""
    got: list[tuple[int, int]] = []
    buffer = b""
    while len(got) < count:
        buffer += sock.recv(4096)
        while len(buffer) >= HEADER.size:
            size, call_id, kind, _, _ = HEADER.unpack_from(buffer)
            if len(buffer) < HEADER.size + size:
                break
            got.append((call_id, kind))
            buffer = buffer[HEADER.size + size:]
    return got


@contextlib.asynccontextmanager
async def _connected(servicer: Recorder, load: TransferLoad,
                     tmp_path: Path) -> AsyncIterator[socket.socket]:
    """A lane server of ``servicer`` on a unix socket, and a socket connected to it."""
    server = LaneServer("test lane", METHODS, servicer,
                        lambda _: Binding(CallInfo()), needs_hello=False,
                        load=load)
    path = tmp_path / "lane.sock"
    await server.start_unix(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10.0)
    try:
        await asyncio.to_thread(sock.connect, str(path))
        yield sock
    finally:
        sock.close()
        await server.stop(1.0)


@pytest.mark.asyncio
async def test_a_lone_call_runs_without_a_task_and_a_batch_is_counted_first(
        tmp_path: Path) -> None:
    load = TransferLoad()
    servicer = Recorder(load)
    async with _connected(servicer, load, tmp_path) as sock:
        await asyncio.to_thread(sock.sendall, _frame(1))
        assert await asyncio.to_thread(_replies, sock, 1) == [(1, REPLY_OK)]
        # Two frames in one write arrive in one read: each gets its task, and
        # both are under way before either runs.
        await asyncio.to_thread(sock.sendall, _frame(2) + _frame(3))
        assert sorted(await asyncio.to_thread(_replies, sock, 2)) == [(2, REPLY_OK),
                                                                      (3, REPLY_OK)]
    lone, *batch = servicer.runs
    # Python 3.12's eager tasks give the first step a task; the shim before it does not.
    assert lone == (sys.version_info >= (3, 12), 1)
    assert batch == [(True, 2), (True, 2)]
    assert load.running == 0


class AnswersAtOnce(Recorder):
    """A servicer that answers Probe at once by the request's token: 1 with the
    reply, 2 with None (the handler runs), 3 with an awaitable of the reply,
    4 by raising (the handler runs and answers)."""

    def __init__(self, load: TransferLoad) -> None:
        super().__init__(load)
        self.at_once = {"Probe": self._probe_at_once}
        self.answered: list[int] = []
        self.loads_at_once: list[int] = []

    def _probe_at_once(self, request: Any, context: CallInfo) -> Any:
        token = request.link_token
        self.loads_at_once.append(self.load.running)
        if token == 2:
            return None
        if token == 4:
            raise RuntimeError("nothing done yet")
        self.answered.append(token)
        if token == 1:
            return peer_pb2.ReleaseKeyReply()
        return self._later(token)

    async def _later(self, token: int) -> peer_pb2.ReleaseKeyReply:
        await asyncio.sleep(0)
        self.answered.append(-token)  # the awaitable ran to its end
        return peer_pb2.ReleaseKeyReply()


@pytest.mark.asyncio
async def test_a_lone_call_may_be_answered_at_once(tmp_path: Path) -> None:
    load = TransferLoad()
    servicer = AnswersAtOnce(load)
    async with _connected(servicer, load, tmp_path) as sock:
        for token in (1, 2, 3, 4):
            await asyncio.to_thread(sock.sendall, _frame(token))
            assert await asyncio.to_thread(_replies, sock, 1) == [(token, REPLY_OK)]
        assert servicer.answered == [1, 3, -3]
        assert len(servicer.runs) == 2  # tokens 2 and 4 ran the handler
        assert servicer.loads_at_once == [1, 1, 1, 1]  # each counted while it ran
        # Frames that arrive together are not answered at once: each gets its task.
        await asyncio.to_thread(sock.sendall, _frame(1) + _frame(3))
        assert sorted(await asyncio.to_thread(_replies, sock, 2)) == [(1, REPLY_OK),
                                                                      (3, REPLY_OK)]
        assert servicer.answered == [1, 3, -3] and len(servicer.runs) == 4
        assert len(servicer.loads_at_once) == 4
    assert load.running == 0
