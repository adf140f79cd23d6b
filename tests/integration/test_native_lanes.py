"""Native lanes with real daemons: which repeats they run, and when the daemon
takes a shape back from them (native_lanes.py). The paths the repeats tests
cover (bytes landing, caches freed, links replaced, slots out of range) run
through the lanes too; these are the events only the lanes have."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

import numpy as np
import pytest
from grpc import aio

from hixl_client import (
    CacheDesc,
    CacheKeyByIdAndIndex,
    DataType,
    LLMException,
)
from hixl_service.testing import DaemonProcess, start_daemon
from hixl_wire._proto.hixl.v1 import admin_pb2, admin_pb2_grpc

from .conftest import daemon_status, logged, make_pair

pytestmark = pytest.mark.asyncio

SLOTS = 4
DESC = CacheDesc(2, [SLOTS, 4096], DataType.DT_UINT8)


async def _native(daemon: DaemonProcess, cluster_id: int) -> int:
    status = await daemon_status(daemon.client_target)
    return next(c for c in status.clusters if c.cluster_id == cluster_id).repeats_native


async def test_a_reload_takes_shapes_back_until_they_move_again(
        prefill_daemon: DaemonProcess, next_cluster_id: Callable[[], int]) -> None:
    async with start_daemon() as decode:
        pair = await make_pair(prefill_daemon, decode, next_cluster_id)
        src = await pair.prompt.cache_manager.allocate_cache(DESC)
        for i in range(DESC.num_tensors):
            np.frombuffer(src.tensor_view(i), np.uint8)[:] = np.arange(SLOTS * 4096) % 251
        dst = await pair.decoder.cache_manager.allocate_cache(DESC)
        cm, cluster = pair.decoder.cache_manager, pair.decoder.cluster_id

        async def pull(slot: int) -> None:
            await cm.pull_cache(CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id, slot),
                                dst, batch_index=slot)

        for slot in range(3):  # the full call, then two repeats on the lane's thread
            await pull(slot)
        assert await _native(decode, cluster) == 2
        os.kill(decode.pid, signal.SIGHUP)
        assert await asyncio.to_thread(logged, decode, "reloaded: nothing changed", 10), \
            decode.log_tail()
        await pull(3)  # the lane answered it: the shape was taken back
        assert await _native(decode, cluster) == 2
        await pull(0)  # published again by that one
        assert await _native(decode, cluster) == 3
        for i in range(DESC.num_tensors):
            np.testing.assert_array_equal(np.frombuffer(dst.tensor_view(i), np.uint8),
                                          np.frombuffer(src.tensor_view(i), np.uint8))
        await pair.decoder.finalize()
        await pair.prompt.finalize()


async def test_the_drain_takes_shapes_back_and_waits_for_the_lanes(
        next_cluster_id: Callable[[], int]) -> None:
    """A repeat the lane has out keeps the drain waiting (it counts as under
    way) and lands; a new one meanwhile goes to the lane, which refuses it."""
    async with start_daemon() as prefill, start_daemon() as decode:
        pair = await make_pair(prefill, decode, next_cluster_id, sync_kv_timeout=2000)
        src = await pair.prompt.cache_manager.allocate_cache(DESC)
        for i in range(DESC.num_tensors):
            view = np.frombuffer(src.tensor_view(i), np.uint8)
            view[:] = np.random.default_rng(i).integers(1, 256, view.size, np.uint8)
        dst = await pair.decoder.cache_manager.allocate_cache(DESC)
        cm = pair.decoder.cache_manager

        def key(slot: int) -> CacheKeyByIdAndIndex:
            return CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id, slot)

        for slot in range(2):
            await cm.pull_cache(key(slot), dst, batch_index=slot)
        assert await _native(decode, pair.decoder.cluster_id) == 1
        prefill.pause()
        try:
            stuck = asyncio.ensure_future(cm.pull_cache(key(2), dst, batch_index=2))
            deadline = asyncio.get_running_loop().time() + 5
            while (await daemon_status(decode.client_target)).transfers_under_way != 1:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            async with aio.insecure_channel(decode.client_target) as channel:
                await admin_pb2_grpc.AdminStub(channel).Drain(admin_pb2.DrainRequest(),
                                                              timeout=10)
            # Drain answers before the daemon's stop begins the drain: wait for it.
            assert await asyncio.to_thread(logged, decode, "draining: refusing", 10), \
                decode.log_tail()
            with pytest.raises(LLMException, match="draining"):
                await cm.pull_cache(key(3), dst, batch_index=3)
        finally:
            prefill.resume()
        await stuck  # the far daemon answered within its deadline: the drain waited
        for i in range(DESC.num_tensors):
            got = np.frombuffer(dst.tensor_view(i), np.uint8).reshape(SLOTS, -1)
            want = np.frombuffer(src.tensor_view(i), np.uint8).reshape(SLOTS, -1)
            np.testing.assert_array_equal(got[2], want[2])
        await pair.prompt.finalize()
