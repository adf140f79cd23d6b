"""Repeated transfers: pull_cache and push_cache by cache id of a shape moved
before go by handle.

Each test checks the bytes that land, the daemon's count of transfers that
reused the remembered plan (Admin status), and that whatever changed since
(an index out of range, a cache freed, a link replaced) gives exactly what
the full call gives, over gRPC as over the lane.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from hixl_client import (
    CacheDesc,
    CacheKeyByIdAndIndex,
    DataType,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
)
from hixl_client.cache import Cache
from hixl_service.testing import DaemonProcess
from hixl_wire.lane import CLIENT_METHODS, KIND_HELLO, REPLY_OK, RepeatFrame
from tests.clusters import cluster_info

from .conftest import Pair, daemon_status, make_pair, options
from .raw_lane import RawLane

pytestmark = pytest.mark.asyncio

SLOTS = 4
DESC = CacheDesc(3, [SLOTS, 16 * 1024], DataType.DT_UINT8)
SLOT_BYTES = DESC.shape[1]


@contextlib.asynccontextmanager
async def _pair(path: str, prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
                next_cluster_id: Callable[[], int], **option_args: Any) -> AsyncIterator[Pair]:
    """``decoder`` on the decode daemon linked to ``prompt``: on the prefill daemon
    over TCP, or on the decode daemon itself (a local link)."""
    prompt_daemon = prefill_daemon if path == "tcp" else decode_daemon
    made = await make_pair(prompt_daemon, decode_daemon, next_cluster_id, **option_args)
    try:
        yield made
    finally:
        await made.decoder.finalize()
        await made.prompt.finalize()


@pytest_asyncio.fixture(params=["tcp", "local"])
async def linked(request: pytest.FixtureRequest, prefill_daemon: DaemonProcess,
                 decode_daemon: DaemonProcess,
                 next_cluster_id: Callable[[], int]) -> AsyncIterator[Pair]:
    """A pair whose decoder pulls, over TCP or a local link."""
    async with _pair(request.param, prefill_daemon, decode_daemon, next_cluster_id) as made:
        yield made


def _fill(cache: Cache, seed: int) -> list[np.ndarray]:
    """Random bytes in every tensor of ``cache``; returns their (slots, bytes) copies."""
    contents = []
    for tensor in range(DESC.num_tensors):
        array = np.frombuffer(cache.tensor_view(tensor), dtype=np.uint8)
        array[:] = np.random.default_rng(seed + tensor).integers(0, 256, array.size, np.uint8)
        contents.append(array.reshape(SLOTS, SLOT_BYTES).copy())
    return contents


def _slot(cache: Cache, tensor: int, slot: int) -> np.ndarray:
    """The bytes of one batch slot of one tensor, whatever the cache's shape."""
    slots = cache.cache_desc.shape[0]
    return np.frombuffer(cache.tensor_view(tensor), dtype=np.uint8).reshape(slots, -1)[slot]


async def _cluster_status(daemon: DaemonProcess, cluster_id: int) -> Any:
    status = await daemon_status(daemon.client_target)
    return next(c for c in status.clusters if c.cluster_id == cluster_id)


async def _repeated(daemon: DaemonProcess, cluster_id: int) -> tuple[int, int]:
    cluster = await _cluster_status(daemon, cluster_id)
    return cluster.repeat_shapes, cluster.repeated_transfers


async def _counts(pair: Pair) -> tuple[int, int]:
    """The decoder's transfers by handle, and those answered at once."""
    cluster = await _cluster_status(pair.decoder_daemon, pair.decoder.cluster_id)
    return cluster.repeated_transfers, cluster.repeats_answered_at_once


async def test_pulls_of_one_shape_repeat_by_handle(linked: Pair) -> None:
    prompt, decoder = linked.prompt, linked.decoder
    src = await prompt.cache_manager.allocate_cache(DESC)
    expected = _fill(src, 1)
    # More and smaller slots than the source: a pull takes the first half of a
    # source slot, and both sides' slot sizes count.
    dst_slots, half = SLOTS + 2, SLOT_BYTES // 2
    dst = await decoder.cache_manager.allocate_cache(
        CacheDesc(DESC.num_tensors, [dst_slots, half], DataType.DT_UINT8))
    moves = [(0, 0), (1, 5), (3, 1), (2, 4), (1, 0)]  # (source slot, destination slot)
    for src_slot, dst_slot in moves:
        await decoder.cache_manager.pull_cache(
            CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, src_slot), dst,
            batch_index=dst_slot)
        for tensor in range(DESC.num_tensors):
            np.testing.assert_array_equal(_slot(dst, tensor, dst_slot),
                                          expected[tensor][src_slot][:half])
    # One shape; every pull after the first went by its handle and reused the plan.
    assert len(decoder.cache_manager._repeat_handles) == 1
    assert await _repeated(linked.decoder_daemon, decoder.cluster_id) == (1, len(moves) - 1)

    # A layer range and a size make other shapes, each repeated in turn.
    for _ in range(2):
        await decoder.cache_manager.pull_cache(
            CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, 2), dst, batch_index=1,
            size=100, src_layer_range=range(1, 2), dst_layer_range=range(0, 1),
            tensor_num_per_layer=1)
    np.testing.assert_array_equal(_slot(dst, 0, 1)[:100], expected[1][2][:100])
    assert await _repeated(linked.decoder_daemon, decoder.cluster_id) == (2, len(moves))


async def test_a_repeat_fails_exactly_as_the_full_call(linked: Pair,
                                                       next_cluster_id: Callable[[], int]) -> None:
    prompt, decoder = linked.prompt, linked.decoder
    plain = LLMDataDist(LLMRole.DECODER, next_cluster_id(),
                        daemon=linked.decoder_daemon.client_target, transfer_lane=False)
    await plain.init(options())
    try:
        status, _ = await plain.link_clusters(
            [cluster_info(prompt.cluster_id, linked.prompt_daemon.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS
        src = await prompt.cache_manager.allocate_cache(DESC)
        failures: list[list[tuple[LLMStatusCode, str]]] = []
        for llm in (decoder, plain):
            dst = await llm.cache_manager.allocate_cache(DESC)
            key = CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, 0)
            await llm.cache_manager.pull_cache(key, dst)  # the shape gets its handle
            seen = []
            for bad in (CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, SLOTS), None):
                with pytest.raises(LLMException) as failed:
                    if bad is None:  # the destination slot out of range
                        await llm.cache_manager.pull_cache(key, dst, batch_index=SLOTS)
                    else:
                        await llm.cache_manager.pull_cache(bad, dst)
                seen.append((failed.value.status_code, str(failed.value)))
            failures.append(seen)
        over_lane, over_grpc = failures
        assert over_lane == over_grpc
        assert {code for code, _ in over_lane} == {LLMStatusCode.LLM_PARAM_INVALID}
        assert decoder.cache_manager._repeat_handles  # the lane's pulls went by handle
    finally:
        await plain.finalize()


async def test_a_freed_source_or_destination_fails_the_repeat_as_the_full_call(
        linked: Pair) -> None:
    prompt, decoder = linked.prompt, linked.decoder
    src = await prompt.cache_manager.allocate_cache(DESC)
    dst = await decoder.cache_manager.allocate_cache(DESC)
    key = CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, 0)
    await decoder.cache_manager.pull_cache(key, dst)
    await decoder.cache_manager.pull_cache(key, dst, batch_index=1)
    await prompt.cache_manager.deallocate_cache(src)
    with pytest.raises(LLMException) as gone:
        await decoder.cache_manager.pull_cache(key, dst, batch_index=2)
    assert gone.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST

    # A new source cache is a new shape; freeing the destination then fails its repeat.
    other = await prompt.cache_manager.allocate_cache(DESC)
    expected = _fill(other, 7)
    key = CacheKeyByIdAndIndex(prompt.cluster_id, other.cache_id, 3)
    await decoder.cache_manager.pull_cache(key, dst, batch_index=3)
    np.testing.assert_array_equal(_slot(dst, 2, 3), expected[2][3])
    await decoder.cache_manager.deallocate_cache(dst)
    with pytest.raises(LLMException) as freed:
        await decoder.cache_manager.pull_cache(key, dst)
    assert freed.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    assert await _repeated(linked.decoder_daemon, decoder.cluster_id) == (2, 1)


async def _pulled_once(pair: Pair, seed: int) -> tuple[Cache, list[np.ndarray], Cache]:
    """A filled source cache on the prompt, its contents, and a destination on the
    decoder that pulled slot 0 of it once (so the shape has its handle)."""
    src = await pair.prompt.cache_manager.allocate_cache(DESC)
    expected = _fill(src, seed)
    dst = await pair.decoder.cache_manager.allocate_cache(DESC)
    await pair.decoder.cache_manager.pull_cache(
        CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id, 0), dst)
    return src, expected, dst


async def test_a_repeat_after_the_link_was_replaced_moves_the_bytes(linked: Pair) -> None:
    prompt, decoder = linked.prompt, linked.decoder
    src, expected, dst = await _pulled_once(linked, 3)
    info = [cluster_info(prompt.cluster_id, linked.prompt_daemon.peer_address)]
    await decoder.unlink_clusters(info, timeout=5000)
    with pytest.raises(LLMException) as unlinked:
        await decoder.cache_manager.pull_cache(
            CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, 1), dst, batch_index=1)
    assert unlinked.value.status_code == LLMStatusCode.LLM_NOT_YET_LINK
    status, _ = await decoder.link_clusters(info, timeout=5000)
    assert status == LLMStatusCode.LLM_SUCCESS
    for slot in (1, 2):  # the first finds the new link, the second reuses it
        await decoder.cache_manager.pull_cache(
            CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, slot), dst, batch_index=slot)
        np.testing.assert_array_equal(_slot(dst, 0, slot), expected[0][slot])
    assert await _repeated(linked.decoder_daemon, decoder.cluster_id) == (1, 1)


async def test_repeats_in_flight_at_once_each_land(linked: Pair) -> None:
    prompt, decoder = linked.prompt, linked.decoder
    src, expected, dst = await _pulled_once(linked, 5)
    await asyncio.gather(*(decoder.cache_manager.pull_cache(
        CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, slot), dst,
        batch_index=SLOTS - 1 - slot) for slot in range(SLOTS)))
    for slot in range(SLOTS):
        for tensor in range(DESC.num_tensors):
            np.testing.assert_array_equal(_slot(dst, tensor, SLOTS - 1 - slot),
                                          expected[tensor][slot])


async def test_the_lane_refuses_unknown_handles_and_malformed_repeats(linked: Pair) -> None:
    decoder = linked.decoder
    assert decoder._connection is not None and decoder._connection.lane_socket
    kind = CLIENT_METHODS["RepeatPull"][0]
    lane = await asyncio.to_thread(RawLane.unix, decoder._connection.lane_socket)
    try:
        lane.send(1, KIND_HELLO, decoder._connection.session_id.encode())
        assert await asyncio.to_thread(lane.receive) == (1, REPLY_OK, b"")
        lane.send(2, kind, RepeatFrame(2**63, 0, 0).pack())
        call_id, error = await asyncio.to_thread(lane.error)
        assert call_id == 2 and error.llm_status == LLMStatusCode.LLM_PARAM_INVALID
        assert "unknown" in error.message
        lane.send(3, kind, b"\x01" * 15)  # one byte short
        call_id, error = await asyncio.to_thread(lane.error)
        assert call_id == 3 and error.llm_status == LLMStatusCode.LLM_PARAM_INVALID
    finally:
        lane.close()


async def test_repeats_racing_frees_and_relinks_end_cleanly(linked: Pair) -> None:
    """Pulls by handle in flight while their caches are freed and reallocated and
    the link replaced: each pull lands its bytes or fails with an LLMException, and
    the daemon serves on."""
    prompt, decoder = linked.prompt, linked.decoder
    info = [cluster_info(prompt.cluster_id, linked.prompt_daemon.peer_address)]
    caches = {"src": await prompt.cache_manager.allocate_cache(DESC),
              "dst": await decoder.cache_manager.allocate_cache(DESC)}
    outcomes = {"landed": 0, "failed": 0}
    churned = asyncio.Event()

    async def pull_until_churned(slot: int) -> None:
        while not churned.is_set():
            src, dst = caches["src"], caches["dst"]
            expected = bytes(_slot(src, 0, slot))
            try:
                await decoder.cache_manager.pull_cache(
                    CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, slot), dst,
                    batch_index=slot)
            except LLMException as exc:
                assert exc.status_code in (LLMStatusCode.LLM_KV_CACHE_NOT_EXIST,
                                           LLMStatusCode.LLM_NOT_YET_LINK,
                                           LLMStatusCode.LLM_LINK_FAILED), exc
                outcomes["failed"] += 1
                continue
            if caches["src"] is src and caches["dst"] is dst:  # nothing replaced meanwhile
                assert bytes(_slot(dst, 0, slot)) == expected
            outcomes["landed"] += 1

    async def churn() -> None:
        for round_ in range(9):
            await asyncio.sleep(0.005)
            if round_ % 3 == 2:
                await decoder.unlink_clusters(info, timeout=5000)
                status, _ = await decoder.link_clusters(info, timeout=5000)
                assert status == LLMStatusCode.LLM_SUCCESS
                continue
            side, manager = (("src", prompt.cache_manager) if round_ % 2
                             else ("dst", decoder.cache_manager))
            old = caches[side]
            caches[side] = await manager.allocate_cache(DESC)
            _fill(caches[side], round_)
            await manager.deallocate_cache(old)
        churned.set()

    _fill(caches["src"], 0)
    await asyncio.gather(churn(), *(pull_until_churned(slot) for slot in range(SLOTS)))
    assert outcomes["landed"] > 0
    # Afterwards the current caches pull by handle again, byte for byte.
    src, dst = caches["src"], caches["dst"]
    expected = _fill(src, 99)
    for slot in range(SLOTS):
        await decoder.cache_manager.pull_cache(
            CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, slot), dst, batch_index=slot)
        np.testing.assert_array_equal(_slot(dst, 1, slot), expected[1][slot])


@pytest_asyncio.fixture(params=["tcp", "local"])
async def pushing(request: pytest.FixtureRequest, prefill_daemon: DaemonProcess,
                  decode_daemon: DaemonProcess,
                  next_cluster_id: Callable[[], int]) -> AsyncIterator[Pair]:
    """A pair in remote-cache-accessible mode whose decoder pushes into prompt."""
    async with _pair(request.param, prefill_daemon, decode_daemon, next_cluster_id,
                     remote_accessible=True) as made:
        yield made


async def test_pushes_of_one_shape_repeat_by_handle(pushing: Pair) -> None:
    receiver, pusher = pushing.prompt, pushing.decoder
    # The target has more and larger slots than the source: a push fills the
    # first SLOT_BYTES of a target slot, and both sides' slot sizes count.
    target_slots = SLOTS + 2
    target = await receiver.cache_manager.allocate_cache(
        CacheDesc(DESC.num_tensors, [target_slots, 2 * SLOT_BYTES], DataType.DT_UINT8))
    src = await pusher.cache_manager.allocate_cache(DESC)
    expected = _fill(src, 11)
    moves = [(0, 0), (1, 5), (3, 1), (2, 4)]  # (source slot, destination slot)
    for src_slot, dst_slot in moves:
        await pusher.cache_manager.push_cache(
            CacheKeyByIdAndIndex(receiver.cluster_id, target.cache_id, dst_slot), src,
            src_batch_index=src_slot, tensor_num_per_layer=1)
        for tensor in range(DESC.num_tensors):
            np.testing.assert_array_equal(_slot(target, tensor, dst_slot)[:SLOT_BYTES],
                                          expected[tensor][src_slot])
    assert await _repeated(pushing.decoder_daemon, pusher.cluster_id) == (1, len(moves) - 1)

    # Out of range, a repeat fails as the full call does; a freed target too.
    key = CacheKeyByIdAndIndex(receiver.cluster_id, target.cache_id, target_slots)
    with pytest.raises(LLMException) as out_of_range:
        await pusher.cache_manager.push_cache(key, src, tensor_num_per_layer=1)
    assert out_of_range.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    await receiver.cache_manager.deallocate_cache(target)
    with pytest.raises(LLMException) as gone:
        await pusher.cache_manager.push_cache(
            CacheKeyByIdAndIndex(receiver.cluster_id, target.cache_id, 0), src,
            tensor_num_per_layer=1)
    assert gone.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST


async def test_a_pull_handle_is_not_a_push_handle(linked: Pair) -> None:
    decoder = linked.decoder
    src = await linked.prompt.cache_manager.allocate_cache(DESC)
    dst = await decoder.cache_manager.allocate_cache(DESC)
    await decoder.cache_manager.pull_cache(
        CacheKeyByIdAndIndex(linked.prompt.cluster_id, src.cache_id, 0), dst)
    (handle,) = decoder.cache_manager._repeat_handles.values()
    assert decoder._connection is not None and decoder._connection.lane is not None
    with pytest.raises(LLMException) as crossed:
        await decoder._connection.lane.begin("RepeatPush", RepeatFrame(handle, 0, 0), 5.0)
    assert crossed.value.status_code == LLMStatusCode.LLM_PARAM_INVALID


async def _pull_and_push(pair: Pair, remote: Cache, local: Cache, slot: int) -> None:
    """Pull ``remote``'s slot into ``local``'s, then push it back to the next slot."""
    cm, target = pair.decoder.cache_manager, pair.prompt.cluster_id
    await cm.pull_cache(CacheKeyByIdAndIndex(target, remote.cache_id, slot), local,
                        batch_index=slot)
    slots = remote.cache_desc.shape[0]
    await cm.push_cache(CacheKeyByIdAndIndex(target, remote.cache_id, (slot + 1) % slots),
                        local, src_batch_index=slot, tensor_num_per_layer=1)


async def test_small_repeats_take_the_shortest_path(pushing: Pair) -> None:
    """A small local repeat ends in the lane's frame callback; a small TCP repeat
    from pool memory is run by the client's native lane, with no Python in
    the daemon (native_lanes.py), once its shape moved by a full call."""
    remote = await pushing.prompt.cache_manager.allocate_cache(DESC)
    local = await pushing.decoder.cache_manager.allocate_cache(DESC)
    expected = _fill(remote, 13)
    await _pull_and_push(pushing, remote, local, 0)  # both shapes get their handles
    rounds = 4 if pushing.prompt_daemon is pushing.decoder_daemon else 20
    for round_ in range(rounds):
        await _pull_and_push(pushing, remote, local, 1 + round_ % (SLOTS - 1))
    # Each round pulled a slot and pushed it on: slot 0's bytes went round.
    for tensor in range(DESC.num_tensors):
        for slot in range(SLOTS):
            np.testing.assert_array_equal(_slot(remote, tensor, slot), expected[tensor][0])
    repeated, at_once = await _counts(pushing)
    native = (await _cluster_status(pushing.decoder_daemon,
                                    pushing.decoder.cluster_id)).repeats_native
    assert repeated == 2 * rounds
    if pushing.prompt_daemon is pushing.decoder_daemon:
        assert (at_once, native) == (repeated, 0)
    else:
        assert (at_once, native) == (0, repeated)


async def test_large_repeats_are_answered_once_their_bytes_land(pushing: Pair) -> None:
    """Too large to end in the frame callback (6 MiB a slot: above the inline TCP
    request and the copy the loop's thread makes), a repeat goes on as a task."""
    desc = CacheDesc(DESC.num_tensors, [2, 2 << 20], DataType.DT_UINT8)
    remote = await pushing.prompt.cache_manager.allocate_cache(desc)
    local = await pushing.decoder.cache_manager.allocate_cache(desc)
    first = np.frombuffer(remote.tensor_view(1), dtype=np.uint8).reshape(2, -1)[0]
    first[:] = np.random.default_rng(17).integers(0, 256, first.size, np.uint8)
    expected = first.copy()
    for _ in range(3):  # 12 transfers: the first pull and push find the shapes
        await _pull_and_push(pushing, remote, local, 0)
        await _pull_and_push(pushing, remote, local, 1)
    for slot in range(2):
        np.testing.assert_array_equal(_slot(remote, 1, slot), expected)
        np.testing.assert_array_equal(_slot(local, 1, slot), expected)
    assert await _counts(pushing) == (10, 0)
