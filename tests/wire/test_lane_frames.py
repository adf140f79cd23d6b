"""Framing of the transfer lane: any split of the byte stream yields the same frames;
calls begun on a lane are on the socket at once."""

from __future__ import annotations

import asyncio
import socket

import pytest

from hixl_wire._proto.hixl.v1 import client_pb2, common_pb2
from hixl_wire.lane import (
    CLIENT_METHODS,
    HEADER,
    MAX_BODY,
    REPLY_OK,
    FrameReader,
    Lane,
    error_from_reply,
)
from hixl_wire.status import LLMStatusCode

FRAMES = [(1, 1, 250, 0xDEADBEEF, b"abc"), (2, 0, 0, 0, b""),
          (3, 7, 9, 1, bytes(range(256)) * 40), (4294967295, 255, 0, 0, b"")]
STREAM = b"".join(HEADER.pack(len(body), call_id, kind, timeout, tag) + body
                  for call_id, kind, timeout, tag, body in FRAMES)


@pytest.mark.parametrize("chunk", [1, 2, 5, 16, 17, 18, 100, 4096, len(STREAM)])
def test_frames_survive_any_split(chunk: int) -> None:
    reader = FrameReader()
    frames = []
    for start in range(0, len(STREAM), chunk):
        frames.extend(reader.feed(STREAM[start:start + chunk]))
    assert frames == FRAMES


def test_whole_and_partial_frames_in_one_read() -> None:
    reader = FrameReader()
    cut = len(STREAM) - 5
    assert reader.feed(STREAM[:cut]) == FRAMES[:3]
    assert reader.feed(STREAM[cut:]) == FRAMES[3:]


def test_oversized_frame_is_refused() -> None:
    reader = FrameReader()
    with pytest.raises(ValueError, match="exceeds"):
        reader.feed(HEADER.pack(MAX_BODY + 1, 1, 1, 0, 0))


def test_error_reply_carries_the_daemon_status() -> None:
    body = common_pb2.CallError(grpc_code=4, llm_status=int(LLMStatusCode.LLM_TIMEOUT),
                                message="late").SerializeToString()
    error = error_from_reply(body, "hixl daemon at unix:/x")
    assert error.status_code == LLMStatusCode.LLM_TIMEOUT and str(error) == "late"
    bare = error_from_reply(common_pb2.CallError(grpc_code=13, message="boom")
                            .SerializeToString(), "hixl daemon at unix:/x")
    assert bare.status_code == LLMStatusCode.LLM_FAILED
    assert str(bare) == "hixl daemon at unix:/x: INTERNAL: boom"


@pytest.mark.asyncio
async def test_begin_sends_the_frame_before_it_returns() -> None:
    """``Lane.begin`` writes the call at once (layer-wise transfers rely on it:
    a layer's call must not wait for a task's first step); its coroutine gets
    the reply."""
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, lane = await loop.create_unix_connection(
        lambda: Lane(CLIENT_METHODS, "test daemon"), sock=ours)
    try:
        request = client_pb2.LayerReadyRequest(task_id="t", layer=3)
        reply = lane.begin("LayerReady", request, 5.0, tag=9)
        sent = theirs.recv(1 << 16)  # no await in between: already on the socket
        ((call_id, kind, timeout_ms, tag, body),) = FrameReader().feed(sent)
        assert (kind, tag, timeout_ms) == (CLIENT_METHODS["LayerReady"][0], 9, 5000)
        assert client_pb2.LayerReadyRequest.FromString(body) == request
        answer = client_pb2.LayerReadyReply(
            reports=[client_pb2.TransferProgress(layer=3)]).SerializeToString()
        theirs.send(HEADER.pack(len(answer), call_id, REPLY_OK, 0, 0) + answer)
        assert (await reply).reports[0].layer == 3
    finally:
        transport.close()
        theirs.close()
