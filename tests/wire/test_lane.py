"""hixl_wire.lane beyond the framing (test_lane_frames.py): the method tables,
RepeatFrame, CallError both ways, and the calling end ``Lane`` over a real
socketpair whose far end the test plays by hand: replies in any order, CANCEL
and TRACE frames, a far end that closes or never answers."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
import pytest_asyncio

from hixl_wire._proto.hixl.v1 import client_pb2, common_pb2
from hixl_wire.lane import (
    CLIENT_METHODS,
    FAR_END_CLOSED,
    HEADER,
    KIND_CANCEL,
    KIND_HELLO,
    KIND_TRACE,
    LANE_CLOSED,
    MAX_BODY,
    PEER_METHODS,
    REPLY_ERROR,
    REPLY_OK,
    Frame,
    FrameReader,
    Lane,
    Methods,
    RepeatFrame,
    call_error,
    call_error_of,
    error_from_call,
    frame_of,
    reply_of,
)
from hixl_wire.status import STATUS_TO_GRPC, LLMException, LLMStatusCode

RESERVED_KINDS = {KIND_HELLO, KIND_TRACE, KIND_CANCEL}
WHAT = "hixl daemon at unix:/test"
REQUEST = client_pb2.LayerReadyRequest(task_id="t", layer=1)

# ---- method tables ------------------------------------------------------------------------------


@pytest.mark.parametrize("methods", [CLIENT_METHODS, PEER_METHODS], ids=["client", "peer"])
def test_each_method_has_its_own_kind_and_none_is_reserved(methods: Methods) -> None:
    kinds = [method.kind for method in methods.values()]
    assert len(set(kinds)) == len(kinds)
    assert not set(kinds) & RESERVED_KINDS
    assert all(0 < kind < 256 for kind in kinds)  # one header byte


def test_the_peer_table_leaves_the_transports_kinds_free() -> None:
    # Transports add their own peer calls at kinds 3 and 4 (hccl_peer.LANE_METHODS).
    assert not {method.kind for method in PEER_METHODS.values()} & {3, 4}


@pytest.mark.parametrize("name", sorted(set(CLIENT_METHODS) - {"RepeatPull", "RepeatPush"}))
def test_a_client_method_carries_its_grpc_twins_messages(name: str) -> None:
    method = CLIENT_METHODS[name]
    request_type = method.read_request(b"").__class__
    request = request_type()
    assert method.read_request(method.write_request(request)) == request
    assert type(method.read_reply(b"")).__name__.endswith("Reply")


@pytest.mark.parametrize("name", ["RepeatPull", "RepeatPush"])
def test_repeats_carry_a_repeat_frame(name: str) -> None:
    method = CLIENT_METHODS[name]
    frame = RepeatFrame(handle=2**64 - 1, src_batch_index=3, dst_batch_index=2**32 - 1)
    body = method.write_request(frame)
    assert len(body) == 16
    assert method.read_request(body) == frame


# ---- RepeatFrame --------------------------------------------------------------------------------


@pytest.mark.parametrize("fields", [(-1, 0, 0), (2**64, 0, 0), (1, -1, 0), (1, 0, 2**32)])
def test_a_repeat_frame_out_of_range_is_refused(fields: tuple[int, int, int]) -> None:
    with pytest.raises(struct.error):
        RepeatFrame(*fields).pack()


@pytest.mark.parametrize("length", [0, 15, 17, 32])
def test_a_repeat_body_of_another_length_is_refused(length: int) -> None:
    with pytest.raises(struct.error):
        RepeatFrame.unpack(bytes(length))


# ---- CallError both ways ------------------------------------------------------------------------


@pytest.mark.parametrize("status", [s for s in LLMStatusCode if s is not LLMStatusCode.LLM_SUCCESS])
def test_a_call_error_round_trips_every_failure(status: LLMStatusCode) -> None:
    error = call_error_of(LLMException("why", status_code=status))
    assert error.grpc_code == STATUS_TO_GRPC[status].value[0]
    back = error_from_call(common_pb2.CallError.FromString(error.SerializeToString()), WHAT)
    assert back.status_code is status and str(back) == "why"


def test_a_call_error_keeps_a_refusals_own_grpc_code() -> None:
    refusal = LLMException("no session", status_code=LLMStatusCode.LLM_FAILED)
    refusal.grpc_code = grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    error = call_error_of(refusal)
    assert error.grpc_code == grpc.StatusCode.UNAUTHENTICATED.value[0]
    assert error.llm_status == int(LLMStatusCode.LLM_FAILED)


def test_an_unknown_status_reads_as_failed_and_an_empty_message_as_its_name() -> None:
    unknown = error_from_call(common_pb2.CallError(grpc_code=13, llm_status=12345, message="x"),
                              WHAT)
    assert unknown.status_code is LLMStatusCode.LLM_FAILED and str(unknown) == "x"
    bare = error_from_call(call_error(grpc.StatusCode.NOT_FOUND,
                                      int(LLMStatusCode.LLM_KV_CACHE_NOT_EXIST), ""), WHAT)
    assert str(bare) == "LLM_KV_CACHE_NOT_EXIST"


def test_reply_of_reads_an_ok_body_and_raises_an_error_body() -> None:
    ok = client_pb2.LayerReadyReply(reports=[client_pb2.TransferProgress(layer=2)])
    assert reply_of(REPLY_OK, ok.SerializeToString(), client_pb2.LayerReadyReply.FromString,
                    WHAT) == ok
    body = call_error(grpc.StatusCode.DEADLINE_EXCEEDED, int(LLMStatusCode.LLM_TIMEOUT),
                      "late").SerializeToString()
    with pytest.raises(LLMException) as info:
        reply_of(REPLY_ERROR, body, client_pb2.LayerReadyReply.FromString, WHAT)
    assert info.value.status_code is LLMStatusCode.LLM_TIMEOUT


# ---- framing edges ------------------------------------------------------------------------------


@pytest.mark.parametrize(("timeout_s", "timeout_ms"), [(0.0, 0), (0.0004, 0), (2.5, 2500),
                                                       (10.0**9, 2**32 - 1)])
def test_a_frames_timeout_is_milliseconds_clamped_to_its_field(timeout_s: float,
                                                               timeout_ms: int) -> None:
    ((_, _, got, _, _),) = FrameReader().feed(frame_of(7, 1, timeout_s, 0, b"x"))
    assert got == timeout_ms


def test_a_body_of_max_size_is_accepted_and_an_oversized_one_after_a_partial_read_refused() -> None:
    big = frame_of(1, 1, 1.0, 0, bytes(MAX_BODY))
    reader = FrameReader()
    assert reader.feed(big[:10]) == []
    ((call_id, _, _, _, body),) = reader.feed(big[10:])
    assert call_id == 1 and len(body) == MAX_BODY
    oversized = HEADER.pack(MAX_BODY + 1, 1, 1, 0, 0)
    reader = FrameReader()
    assert reader.feed(oversized[:1]) == []  # the buffered path from here on
    with pytest.raises(ValueError, match="exceeds"):
        reader.feed(oversized[1:])


# ---- the calling end ----------------------------------------------------------------------------


@dataclass
class FarEnd:
    """The daemon's side of a lane, played by hand on a non-blocking socket."""

    sock: socket.socket
    reader: FrameReader

    async def frames(self, count: int) -> list[Frame]:
        loop = asyncio.get_running_loop()
        got: list[Frame] = []
        while len(got) < count:
            data = await loop.sock_recv(self.sock, 1 << 16)
            assert data, "the lane closed its end"
            got.extend(self.reader.feed(data))
        return got

    async def answer(self, call_id: int, message: object, kind: int = REPLY_OK) -> None:
        body = message.SerializeToString()  # type: ignore[attr-defined]
        await asyncio.get_running_loop().sock_sendall(
            self.sock, HEADER.pack(len(body), call_id, kind, 0, 0) + body)


@pytest_asyncio.fixture
async def lane_pair() -> AsyncIterator[tuple[Lane, FarEnd]]:
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, lane = await loop.create_unix_connection(
        lambda: Lane(CLIENT_METHODS, WHAT, LLMStatusCode.LLM_LINK_FAILED, grace_s=0.0), sock=ours)
    try:
        yield lane, FarEnd(theirs, FrameReader())
    finally:
        transport.close()
        theirs.close()


@pytest.mark.asyncio
async def test_replies_settle_their_own_calls_in_completion_order(
        lane_pair: tuple[Lane, FarEnd]) -> None:
    lane, far = lane_pair
    first = asyncio.ensure_future(lane.begin("LayerReady", REQUEST, 5.0))
    second = asyncio.ensure_future(lane.begin("LayerReady", REQUEST, 5.0))
    (a, *_), (b, *_) = await far.frames(2)
    assert a != b
    await far.answer(b, client_pb2.LayerReadyReply(reports=[client_pb2.TransferProgress(layer=2)]))
    await far.answer(a, call_error(grpc.StatusCode.NOT_FOUND,
                                   int(LLMStatusCode.LLM_KV_CACHE_NOT_EXIST), "gone"), REPLY_ERROR)
    assert (await second).reports[0].layer == 2
    with pytest.raises(LLMException, match="^gone$") as info:
        await first
    assert info.value.status_code is LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    assert lane.is_open  # a failed call leaves the lane open


@pytest.mark.asyncio
async def test_a_cancelled_call_sends_cancel_and_its_late_reply_is_ignored(
        lane_pair: tuple[Lane, FarEnd]) -> None:
    lane, far = lane_pair
    call = asyncio.ensure_future(lane.begin("LayerReady", REQUEST, 5.0, tag=0xABC))
    ((call_id, kind, timeout_ms, tag, _),) = await far.frames(1)
    assert (kind, timeout_ms, tag) == (CLIENT_METHODS["LayerReady"].kind, 5000, 0xABC)
    # The reply's coroutine waits for its answer (asyncio's sock_recv may not have
    # yielded yet; a coroutine cancelled before its first step sends nothing).
    await asyncio.sleep(0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await far.frames(1) == [(call_id, KIND_CANCEL, 0, 0, b"")]
    await far.answer(call_id, client_pb2.LayerReadyReply())  # too late: nobody waits
    after = asyncio.ensure_future(lane.begin("LayerReady", REQUEST, 5.0))
    ((next_id, *_),) = await far.frames(1)
    assert next_id != call_id
    await far.answer(next_id, client_pb2.LayerReadyReply())
    assert await after == client_pb2.LayerReadyReply()


@pytest.mark.asyncio
async def test_a_traced_call_sends_its_context_first_in_the_same_write(
        lane_pair: tuple[Lane, FarEnd]) -> None:
    lane, far = lane_pair
    trace = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    call = asyncio.ensure_future(lane.begin("LayerReady", REQUEST, 1.0, trace=trace))
    (trace_frame, call_frame) = await far.frames(2)
    assert trace_frame == (call_frame[0], KIND_TRACE, 0, 0, trace)
    assert client_pb2.LayerReadyRequest.FromString(call_frame[4]) == REQUEST
    await far.answer(call_frame[0], client_pb2.LayerReadyReply())
    await call


@pytest.mark.asyncio
async def test_a_far_end_that_closes_fails_the_calls_in_flight_and_every_later_one(
        lane_pair: tuple[Lane, FarEnd]) -> None:
    lane, far = lane_pair
    call = asyncio.ensure_future(lane.begin("LayerReady", REQUEST, 5.0))
    await far.frames(1)
    far.sock.close()
    with pytest.raises(LLMException, match=FAR_END_CLOSED) as info:
        await call
    assert info.value.status_code is LLMStatusCode.LLM_LINK_FAILED  # the lane's lost status
    assert lane.closed_because == FAR_END_CLOSED and not lane.is_open
    with pytest.raises(LLMException, match=FAR_END_CLOSED) as later:
        lane.begin("LayerReady", REQUEST, 5.0)  # refused at once, nothing sent
    assert later.value.status_code is LLMStatusCode.LLM_LINK_FAILED


@pytest.mark.asyncio
async def test_closing_the_lane_fails_its_calls_with_the_first_reason(
        lane_pair: tuple[Lane, FarEnd]) -> None:
    lane, far = lane_pair
    call = asyncio.ensure_future(lane.begin("LayerReady", REQUEST, 5.0))
    await far.frames(1)
    lane.close()
    lane.close()  # once is enough; the reason stays the first
    with pytest.raises(LLMException, match=LANE_CLOSED):
        await call
    assert lane.closed_because == LANE_CLOSED


@pytest.mark.asyncio
async def test_a_far_end_that_never_answers_times_the_call_out_and_cancels_it(
        lane_pair: tuple[Lane, FarEnd]) -> None:
    # No grace and no timeout: the watchdog's next tick gives the call up.
    lane, far = lane_pair
    call = asyncio.ensure_future(lane.begin("LayerReady", REQUEST, 0.0))
    ((call_id, *_),) = await far.frames(1)
    with pytest.raises(LLMException, match="did not answer a lane call in time") as info:
        await call
    assert info.value.status_code is LLMStatusCode.LLM_TIMEOUT
    assert await far.frames(1) == [(call_id, KIND_CANCEL, 0, 0, b"")]
    assert lane.is_open  # a late call is not a lost lane
