"""The transfer lane: transfer calls over a plain unix socket, same results as gRPC.

The first tests go through the client library (lane on, lane off, the same
errors either way); the rest speak the lane's framing on a raw socket to the
daemon, to check what a misbehaving client gets: clear error replies, a
closed lane for a broken stream, and a daemon that keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

from hixl_client import (
    Cache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    DataType,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
)
from hixl_client._manager_base import ref_to_proto
from hixl_client._transport import LANE_GRACE_S
from hixl_service.lane_server import MAX_CALLS_IN_FLIGHT
from hixl_service.testing import DaemonProcess, start_daemon
from hixl_wire._proto.hixl.v1 import client_pb2
from hixl_wire.lane import (
    CLIENT_METHODS,
    HEADER,
    KIND_CANCEL,
    KIND_HELLO,
    REPLY_OK,
    WATCHDOG_TICK_S,
)

from .conftest import Pair, daemon_status, make_pair, options
from .raw_lane import RawLane

pytestmark = pytest.mark.asyncio

DESC = CacheDesc(4, [2, 64 * 1024], DataType.DT_UINT8)


def _fill(cache_view: memoryview, seed: int) -> np.ndarray:
    array = np.frombuffer(cache_view, dtype=np.uint8)
    array[:] = np.random.default_rng(seed).integers(0, 256, array.size, dtype=np.uint8)
    return array.copy()


async def _until_under_way(daemon: DaemonProcess, count: int, within_s: float = 10.0) -> None:
    """Wait until the daemon counts ``count`` transfer calls under way (Admin status)."""
    deadline = time.monotonic() + within_s
    while (seen := (await daemon_status(daemon.client_target)).transfers_under_way) != count:
        assert time.monotonic() < deadline, f"{seen} transfers under way, expected {count}"
        await asyncio.sleep(0.01)


async def _lane_use(daemon: DaemonProcess, cluster_id: int) -> tuple[int, int]:
    status = await daemon_status(daemon.client_target)
    session = next(s for s in status.sessions if s.cluster_id == cluster_id)
    return session.lane_connections, session.lane_calls


async def test_transfers_use_the_lane_by_default(pair: Pair) -> None:
    prompt, decoder = pair.prompt, pair.decoder
    assert decoder._connection is not None and decoder._connection.lane is not None
    assert decoder._connection.lane.is_open
    key = CacheKey(prompt.cluster_id, req_id=7)
    src = await prompt.cache_manager.allocate_cache(DESC, [key])
    expected = [_fill(src.tensor_view(i), i) for i in range(DESC.num_tensors)]
    dst = await decoder.cache_manager.allocate_cache(DESC)
    _, calls_before = await _lane_use(pair.decoder_daemon, decoder.cluster_id)

    await decoder.cache_manager.pull_cache(CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, 1),
                                           dst, batch_index=1)
    await decoder.cache_manager.pull_cache(key, dst, batch_index=0)
    for i, content in enumerate(expected):
        np.testing.assert_array_equal(np.frombuffer(dst.tensor_view(i), dtype=np.uint8), content)
    copy = await decoder.cache_manager.allocate_cache(DESC)
    await decoder.cache_manager.copy_cache(copy, dst, 0, 1)
    half = DESC.shape[1]
    np.testing.assert_array_equal(np.frombuffer(copy.tensor_view(0), dtype=np.uint8)[:half],
                                  expected[0][half:])

    connections, calls_after = await _lane_use(pair.decoder_daemon, decoder.cluster_id)
    assert connections == 1  # the rings' connection carries no calls: not counted
    assert decoder._connection.rings is not None and decoder._connection.rings.is_open
    assert calls_after - calls_before == 3


async def test_lane_off_keeps_transfers_on_grpc(prefill_daemon: DaemonProcess,
                                                decode_daemon: DaemonProcess,
                                                next_cluster_id: Callable[[], int]) -> None:
    pair = await make_pair(prefill_daemon, decode_daemon, next_cluster_id)
    plain = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=decode_daemon.client_target,
                        transfer_lane=False)
    await plain.init(options())
    try:
        assert plain._connection is not None and plain._connection.lane is None
        from tests.clusters import cluster_info
        status, _ = await plain.link_clusters(
            [cluster_info(pair.prompt.cluster_id, prefill_daemon.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS
        src = await pair.prompt.cache_manager.allocate_cache(DESC)
        expected = _fill(src.tensor_view(2), 99)
        dst = await plain.cache_manager.allocate_cache(DESC)
        await plain.cache_manager.pull_cache(
            CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id, 0), dst)
        np.testing.assert_array_equal(
            np.frombuffer(dst.tensor_view(2), dtype=np.uint8)[:DESC.shape[1]],
            expected[:DESC.shape[1]])
        assert await _lane_use(decode_daemon, plain.cluster_id) == (0, 0)
    finally:
        await plain.finalize()
        await pair.decoder.finalize()
        await pair.prompt.finalize()


async def test_errors_match_grpc(pair: Pair, decode_daemon: DaemonProcess,
                                 next_cluster_id: Callable[[], int]) -> None:
    plain = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=decode_daemon.client_target,
                        transfer_lane=False)
    await plain.init(options())
    try:
        failures = []
        for llm in (pair.decoder, plain):
            dst = await llm.cache_manager.allocate_cache(DESC)
            with pytest.raises(LLMException) as missing:  # nothing at that id
                await llm.cache_manager.pull_cache(
                    CacheKeyByIdAndIndex(pair.prompt.cluster_id, 123456, 0), dst)
            with pytest.raises(LLMException) as unlinked:  # no link for that cluster
                await llm.cache_manager.pull_cache(CacheKey(987654321, req_id=1), dst)
            failures.append([(e.value.status_code, str(e.value).replace(str(llm.cluster_id), "me"))
                             for e in (missing, unlinked)])
        lane_failures, grpc_failures = failures
        assert lane_failures[1] == grpc_failures[1]
        assert lane_failures[1][0] == LLMStatusCode.LLM_NOT_YET_LINK
        assert lane_failures[0][0] == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    finally:
        await plain.finalize()


def _raw(llm: LLMDataDist) -> RawLane:
    assert llm._connection is not None and llm._connection.lane_socket
    return RawLane.unix(llm._connection.lane_socket)


def _session(llm: LLMDataDist) -> bytes:
    assert llm._connection is not None
    return llm._connection.session_id.encode()


async def test_raw_lane_refuses_bad_frames_and_keeps_serving(pair: Pair) -> None:
    pull_kind = CLIENT_METHODS["PullCache"][0]
    lane = await asyncio.to_thread(_raw, pair.decoder)
    try:
        lane.send(1, pull_kind, client_pb2.PullCacheRequest().SerializeToString())
        call_id, error = await asyncio.to_thread(lane.error)
        assert call_id == 1 and "HELLO" in error.message  # no session yet

        lane.send(2, KIND_HELLO, b"not-a-session")
        call_id, error = await asyncio.to_thread(lane.error)
        assert call_id == 2 and error.llm_status == LLMStatusCode.LLM_FAILED

        lane.send(3, KIND_HELLO, _session(pair.decoder))
        assert await asyncio.to_thread(lane.receive) == (3, REPLY_OK, b"")
        lane.send(4, pull_kind, b"\xff\xff\xff")  # not a message
        call_id, error = await asyncio.to_thread(lane.error)
        assert call_id == 4 and error.llm_status == LLMStatusCode.LLM_PARAM_INVALID
        lane.send(5, 77)  # no such call
        call_id, error = await asyncio.to_thread(lane.error)
        assert call_id == 5 and "kind 77" in error.message
        lane.send(6, pull_kind, client_pb2.PullCacheRequest(size=0).SerializeToString())
        call_id, error = await asyncio.to_thread(lane.error)
        assert call_id == 6 and error.llm_status == LLMStatusCode.LLM_PARAM_INVALID
        lane.send(7, KIND_CANCEL)  # cancelling nothing is harmless

        lane.sock.sendall(HEADER.pack(64 * 2**20, 8, pull_kind, 0, 0))  # over the frame limit
        with pytest.raises(ConnectionError):
            await asyncio.to_thread(lane.receive)
    finally:
        lane.close()
    # The daemon and the library's own lane are unaffected.
    src = await pair.prompt.cache_manager.allocate_cache(DESC)
    dst = await pair.decoder.cache_manager.allocate_cache(DESC)
    await pair.decoder.cache_manager.pull_cache(
        CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id, 0), dst)


async def test_lane_deadline_and_cancel(next_cluster_id: Callable[[], int]) -> None:
    async with start_daemon(pool__max_bytes="512MiB") as prefill, \
            start_daemon(pool__max_bytes="512MiB") as decode:
        pair = await make_pair(prefill, decode, next_cluster_id, sync_kv_timeout=20000)
        src = await pair.prompt.cache_manager.allocate_cache(DESC)
        dst = await pair.decoder.cache_manager.allocate_cache(DESC)
        request = client_pb2.PullCacheRequest(
            src=ref_to_proto(CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id, 0)),
            dst_cache_id=dst.cache_id, size=-1, tensor_num_per_layer=2).SerializeToString()
        pull_kind = CLIENT_METHODS["PullCache"][0]
        lane = await asyncio.to_thread(_raw, pair.decoder)
        try:
            lane.send(1, KIND_HELLO, _session(pair.decoder))
            assert (await asyncio.to_thread(lane.receive))[1] == REPLY_OK
            prefill.pause()  # the pull now waits on the peer until a deadline ends it
            try:
                started = time.monotonic()
                lane.send(2, pull_kind, request, timeout_ms=300)
                call_id, error = await asyncio.to_thread(lane.error)
                elapsed = time.monotonic() - started
                assert call_id == 2 and error.llm_status == LLMStatusCode.LLM_TIMEOUT
                assert elapsed < 5.0, f"a 300 ms lane deadline took {elapsed:.1f} s"
                lane.send(3, pull_kind, request, timeout_ms=20000)
                lane.send(3, KIND_CANCEL)  # the caller gives up: no answer comes for call 3
                lane.send(4, KIND_HELLO, _session(pair.decoder))
                assert await asyncio.to_thread(lane.receive) == (4, REPLY_OK, b"")
            finally:
                prefill.resume()
            lane.send(5, pull_kind, request, timeout_ms=20000)
            call_id, kind, body = await asyncio.to_thread(lane.receive)
            assert (call_id, kind) == (5, REPLY_OK)
            assert client_pb2.PullCacheReply.FromString(body).bytes == DESC.num_tensors * (
                DESC.shape[1])
        finally:
            lane.close()
        await pair.decoder.finalize()
        await pair.prompt.finalize()


@contextlib.asynccontextmanager
async def _own_pair(next_cluster_id: Callable[[], int], **option_args: Any
                    ) -> AsyncIterator[tuple[DaemonProcess, DaemonProcess, Pair, Cache, Cache]]:
    """Two daemons of the test's own (it stops or kills them), a pair linked across
    them, and a source cache on the prompt's side and a destination on the decoder's."""
    async with start_daemon(pool__max_bytes="512MiB") as prefill, \
            start_daemon(pool__max_bytes="512MiB") as decode:
        pair = await make_pair(prefill, decode, next_cluster_id, **option_args)
        src = await pair.prompt.cache_manager.allocate_cache(DESC)
        dst = await pair.decoder.cache_manager.allocate_cache(DESC)
        yield prefill, decode, pair, src, dst


def _pull_request(pair: Pair, src: Cache, dst: Cache) -> client_pb2.PullCacheRequest:
    """The PullCache request of ``src``'s slot 0 into ``dst``."""
    return client_pb2.PullCacheRequest(
        src=ref_to_proto(CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id, 0)),
        dst_cache_id=dst.cache_id, size=-1, tensor_num_per_layer=2)


def _assert_bounded(elapsed_s: float, timeout_s: float) -> None:
    """The call's deadline, the grace of a client's lane, at most one watchdog tick
    late, and a loaded host's slack."""
    assert timeout_s + LANE_GRACE_S <= elapsed_s < \
        timeout_s + LANE_GRACE_S + WATCHDOG_TICK_S + 2


async def test_lost_daemon_fails_lane_calls_promptly(next_cluster_id: Callable[[], int]) -> None:
    async with _own_pair(next_cluster_id, sync_kv_timeout=20000) as (prefill, decode, pair,
                                                                      src, dst):
        prefill.pause()
        try:
            pending = asyncio.ensure_future(pair.decoder.cache_manager.pull_cache(
                CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id, 0), dst))
            await _until_under_way(decode, 1)  # the local daemon has the call in flight
            assert not pending.done()
            started = time.monotonic()
            decode.kill()  # the local daemon dies under a call in flight on the lane
            with pytest.raises(LLMException) as info:
                await pending
            assert time.monotonic() - started < 5.0
            assert info.value.status_code == LLMStatusCode.LLM_FAILED
            assert "lane" in str(info.value)
        finally:
            prefill.resume()
        await pair.prompt.finalize()


async def test_a_stopped_daemon_fails_lane_calls_by_their_bound(
        next_cluster_id: Callable[[], int]) -> None:
    # The daemon answers a late call itself; the client's watchdog covers a daemon
    # that answers nothing at all (here: stopped with SIGSTOP).
    async with _own_pair(next_cluster_id) as (_, decode, pair, src, dst):
        connection = pair.decoder._connection
        assert connection is not None and connection.lane is not None
        request = _pull_request(pair, src, dst)
        decode.pause()
        try:
            started = time.monotonic()
            with pytest.raises(LLMException) as info:
                # wait_for: a broken watchdog fails this test instead of hanging it
                await asyncio.wait_for(
                    connection.lane.begin("PullCache", request, 0.2), 10)
            elapsed = time.monotonic() - started
        finally:
            decode.resume()
        assert info.value.status_code == LLMStatusCode.LLM_TIMEOUT
        assert "did not answer a lane call in time" in str(info.value)
        _assert_bounded(elapsed, 0.2)
        # The lane stays usable: the stopped call was cancelled on the daemon's side.
        await pair.decoder.cache_manager.pull_cache(
            CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id, 0), dst)
        assert connection.lane.is_open
        await pair.decoder.finalize()
        await pair.prompt.finalize()


async def test_thread_lane_calls_are_bounded_and_fail_once_it_closes(
        next_cluster_id: Callable[[], int]) -> None:
    """A call a worker thread sends on a ThreadLane: answered; unanswered by a
    stopped daemon, failed by its bound; sent after the lane closed, failed at once."""
    async with _own_pair(next_cluster_id) as (_, decode, pair, src, dst):
        connection = pair.decoder._connection
        assert connection is not None
        lane = await connection.take_thread_lane()
        assert lane is not None
        request = _pull_request(pair, src, dst)

        async def from_a_thread(timeout_s: float) -> client_pb2.PullCacheReply:
            call = lane.open_call("PullCache", request, timeout_s)
            await asyncio.to_thread(lane.send, call)
            return await asyncio.wait_for(lane.reply(call), 10)

        assert (await from_a_thread(5.0)).bytes == 2 * DESC.shape[1] * 2
        decode.pause()
        try:
            started = time.monotonic()
            with pytest.raises(LLMException) as info:
                await from_a_thread(0.2)
            elapsed = time.monotonic() - started
        finally:
            decode.resume()
        assert info.value.status_code == LLMStatusCode.LLM_TIMEOUT
        _assert_bounded(elapsed, 0.2)
        connection.give_back_thread_lane(lane)
        assert await connection.take_thread_lane() is lane  # kept for the next task
        late = lane.open_call("PullCache", request, 5.0)
        lane.close()
        lane.send(late)
        with pytest.raises(LLMException) as info:
            await lane.reply(late)
        assert info.value.status_code == LLMStatusCode.LLM_FAILED
        assert "closed" in str(info.value)
        lane.drop(late)
        with pytest.raises(LLMException):
            lane.open_call("PullCache", request, 5.0)
        await pair.decoder.finalize()
        await pair.prompt.finalize()


async def test_a_flood_of_calls_is_flow_controlled(decode_daemon: DaemonProcess,
                                                   next_cluster_id: Callable[[], int]) -> None:
    # LayerReady for a task that never starts waits sync_kv_timeout (1 s), then fails:
    # calls that each hold a slot for a second.
    llm = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=decode_daemon.client_target)
    await llm.init(options(sync_kv_timeout=1000))
    lane = await asyncio.to_thread(_raw, llm)
    try:
        lane.send(0, KIND_HELLO, _session(llm))
        assert await asyncio.to_thread(lane.receive) == (0, REPLY_OK, b"")
        total = MAX_CALLS_IN_FLIGHT + 44
        request = client_pb2.LayerReadyRequest(task_id="never", layer=0).SerializeToString()
        for call_id in range(1, total + 1):
            lane.send(call_id, CLIENT_METHODS["LayerReady"][0], request, timeout_ms=20000)

        def collect() -> dict[int, tuple[float, int]]:
            answers = {}
            for _ in range(total):
                call_id, error = lane.error()
                answers[call_id] = (time.monotonic(), error.llm_status)
            return answers

        answers = await asyncio.to_thread(collect)
    finally:
        lane.close()
        await llm.finalize()
    assert sorted(answers) == list(range(1, total + 1))
    assert {status for _, status in answers.values()} == {LLMStatusCode.LLM_PARAM_INVALID}
    # The calls beyond the limit started only as the first ones ended.
    first = max(answers[i][0] for i in range(1, MAX_CALLS_IN_FLIGHT + 1))
    late = min(answers[i][0] for i in range(MAX_CALLS_IN_FLIGHT + 1, total + 1))
    assert late - first > 0.5
