"""The daemon's count of transfer calls under way (``hixl_service.load``).

It decides whether a small TCP transfer may wait for its reply on the event
loop's thread, so it must count every call from the moment the daemon
accepts it and count it out however it ends; a call left counted would keep
the daemon from ever waiting inline again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np
import pytest

from hixl_client import (
    CacheDesc,
    CacheKeyByIdAndIndex,
    DataType,
    LLMException,
    LLMStatusCode,
)
from hixl_service.testing import DaemonProcess, start_daemon

from .conftest import daemon_status, make_pair

pytestmark = pytest.mark.asyncio

BUDGET = {"pool__max_bytes": "256MiB"}


async def _under_way(daemon: DaemonProcess) -> int:
    return (await daemon_status(daemon.client_target)).transfers_under_way


async def _until_under_way(daemon: DaemonProcess, count: int, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    seen = await _under_way(daemon)
    while seen != count:
        assert time.monotonic() < deadline, f"{seen} transfers under way, expected {count}"
        await asyncio.sleep(0.02)
        seen = await _under_way(daemon)


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "grpc"])
async def test_calls_count_while_under_way_and_out_when_they_end(
        next_cluster_id: Callable[[], int], monkeypatch: pytest.MonkeyPatch,
        lane: bool) -> None:
    # Pulls from a stopped owner stay under way until their deadline: the
    # decode daemon counts each, and counts it out when the caller cancels it
    # and when it times out.
    monkeypatch.setenv("HIXL_TRANSFER_LANE", "1" if lane else "0")
    async with start_daemon(**BUDGET) as prefill, start_daemon(**BUDGET) as decode:
        pair = await make_pair(prefill, decode, next_cluster_id, sync_kv_timeout=3000)
        desc = CacheDesc(1, [1, 4096], DataType.DT_UINT8)
        src = await pair.prompt.cache_manager.allocate_cache(desc)
        key = CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id, 0)
        dsts = [await pair.decoder.cache_manager.allocate_cache(desc) for _ in range(3)]
        # The first pull resolves the cache, so the stopped owner is reached
        # only by the data link (whose requests end by the deadline).
        await pair.decoder.cache_manager.pull_cache(key, dsts[0])
        assert await _under_way(decode) == 0
        prefill.pause()
        try:
            pulls = [asyncio.create_task(pair.decoder.cache_manager.pull_cache(key, dst))
                     for dst in dsts]
            await _until_under_way(decode, 3)
            pulls[0].cancel()
            await _until_under_way(decode, 2)
            outcomes = await asyncio.gather(*pulls, return_exceptions=True)
        finally:
            prefill.resume()
        assert isinstance(outcomes[0], asyncio.CancelledError)
        for outcome in outcomes[1:]:
            assert isinstance(outcome, LLMException), outcome
            assert outcome.status_code == LLMStatusCode.LLM_TIMEOUT
        await _until_under_way(decode, 0)
        await pair.decoder.cache_manager.pull_cache(key, dsts[0])  # the link still works
        assert await _under_way(decode) == 0
        await pair.decoder.finalize()
        await pair.prompt.finalize()


@pytest.mark.parametrize("where", ["tcp", "local"])
async def test_pulls_in_flight_land_exactly_off_the_loop(
        prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
        next_cluster_id: Callable[[], int], where: str) -> None:
    # 16 pulls in flight: the daemon hands their bytes to the data link's
    # workers (tcp) or to its native copy threads (local) instead of the
    # loop's thread; every slot must land where it belongs.
    owner = prefill_daemon if where == "tcp" else decode_daemon
    pair = await make_pair(owner, decode_daemon, next_cluster_id)
    slots, tensors, block = 16, 8, 64 * 1024  # 16 requests of 8 x 64 KiB
    desc = CacheDesc(tensors, [slots, block], DataType.DT_UINT8)
    src = await pair.prompt.cache_manager.allocate_cache(desc)
    rng = np.random.default_rng(5)
    for i in range(tensors):
        view = np.frombuffer(src.tensor_view(i), dtype=np.uint8)
        view[:] = rng.integers(0, 256, view.size, dtype=np.uint8)
    dst = await pair.decoder.cache_manager.allocate_cache(desc)
    await asyncio.gather(*(
        pair.decoder.cache_manager.pull_cache(
            CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id, slot), dst,
            batch_index=slots - 1 - slot)
        for slot in range(slots)))
    for i in range(tensors):
        sent = np.frombuffer(src.tensor_view(i), dtype=np.uint8).reshape(slots, block)
        got = np.frombuffer(dst.tensor_view(i), dtype=np.uint8).reshape(slots, block)
        np.testing.assert_array_equal(got, sent[::-1])
    assert await _under_way(decode_daemon) == 0
    await pair.decoder.finalize()
    await pair.prompt.finalize()
