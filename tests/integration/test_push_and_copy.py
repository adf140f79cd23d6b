"""push_cache / push_blocks into remote-accessible caches, and local copies."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest
import pytest_asyncio

from hixl_client import (
    BlocksCacheKey,
    Cache,
    CacheDesc,
    CacheKeyByIdAndIndex,
    DataType,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
    Placement,
    alloc_shareable,
)
from hixl_service.testing import DaemonProcess

from .conftest import Pair, cluster_info, make_pair, options

pytestmark = pytest.mark.asyncio

RNG = np.random.default_rng(5)
INVALID = LLMStatusCode.LLM_PARAM_INVALID


def fill(cache: Cache) -> None:
    for i in range(cache.cache_desc.num_tensors):
        view = np.frombuffer(cache.tensor_view(i), dtype=np.uint8)
        view[:] = RNG.integers(0, 256, view.size, dtype=np.uint8)


def raw(cache: Cache, tensor: int) -> np.ndarray:
    return np.frombuffer(cache.tensor_view(tensor), dtype=np.uint8).reshape(
        cache.cache_desc.shape[0], -1)


@pytest_asyncio.fixture
async def accessible(prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
                     next_cluster_id: Callable[[], int]) -> AsyncIterator[Pair]:
    """A linked pair in remote-cache-accessible mode (the prompt side pushes)."""
    made = await make_pair(decode_daemon, prefill_daemon, next_cluster_id,
                           remote_accessible=True, host_pool_bytes=64 * 2**20)
    # make_pair links "decoder" -> "prompt": here the pusher is the linking side
    yield made
    await made.decoder.finalize()
    await made.prompt.finalize()


async def test_push_cache_layers_into_remote_slot(accessible: Pair) -> None:
    receiver, pusher = accessible.prompt, accessible.decoder
    desc = CacheDesc(6, [2, 4096], DataType.DT_FLOAT16)  # 3 layers of K, V; 2 slots
    target = await receiver.cache_manager.allocate_cache(desc)
    before = [raw(target, i).copy() for i in range(6)]
    src = await pusher.cache_manager.allocate_cache(desc)
    fill(src)
    key = CacheKeyByIdAndIndex(receiver.cluster_id, target.cache_id, 1)
    await pusher.cache_manager.push_cache(key, src, src_batch_index=0,
                                          src_layer_range=range(2),
                                          dst_layer_range=range(1, 3))
    for layer in range(2):  # source layers 0, 1 land in layers 1, 2 of slot 1
        for kv in range(2):
            s, d = layer * 2 + kv, (layer + 1) * 2 + kv
            np.testing.assert_array_equal(raw(target, d)[1], raw(src, s)[0])
    np.testing.assert_array_equal(raw(target, 0), before[0])  # layer 0 untouched
    for i in range(6):
        np.testing.assert_array_equal(raw(target, i)[0], before[i][0])  # slot 0 untouched
    await pusher.cache_manager.push_cache(key, src, 1)  # default: every layer
    for i in range(6):
        np.testing.assert_array_equal(raw(target, i)[1], raw(src, i)[1])
    await receiver.cache_manager.deallocate_cache(target)
    await pusher.cache_manager.deallocate_cache(src)


async def _push_blocks_and_check(pair: Pair, desc: CacheDesc, model_id: int,
                                 src_blocks: list[int], dst_blocks: list[int]) -> None:
    """push_blocks src_blocks of a filled cache into dst_blocks of a remote blocks
    cache; every block must land where it was sent."""
    receiver, pusher = pair.prompt, pair.decoder
    target = await receiver.cache_manager.allocate_blocks_cache(
        desc, BlocksCacheKey(receiver.cluster_id, model_id))
    src = await pusher.cache_manager.allocate_blocks_cache(desc)
    fill(src)
    await pusher.cache_manager.push_blocks(BlocksCacheKey(receiver.cluster_id, model_id), src,
                                           src_blocks, dst_blocks)
    for i in range(desc.num_tensors):
        np.testing.assert_array_equal(raw(target, i)[dst_blocks], raw(src, i)[src_blocks])
    await receiver.cache_manager.deallocate_blocks_cache(target)
    await pusher.cache_manager.deallocate_blocks_cache(src)


async def test_push_blocks(accessible: Pair) -> None:
    await _push_blocks_and_check(accessible, CacheDesc(4, [32, 2048], DataType.DT_UINT8), 9,
                                 [0, 1, 2, 7, 8], [10, 11, 12, 0, 31])


async def test_push_blocks_of_more_ranges_than_one_slice(accessible: Pair) -> None:
    # About 40k ranges: the write goes to the data link in three slices.
    count = 20_000
    order = np.random.default_rng(5)
    await _push_blocks_and_check(accessible, CacheDesc(2, [count, 64], DataType.DT_UINT8), 10,
                                 [int(b) for b in order.permutation(count)],
                                 [int(b) for b in order.permutation(count)])


async def test_push_rules(accessible: Pair, pair: Pair) -> None:
    receiver, pusher = accessible.prompt, accessible.decoder
    desc = CacheDesc(2, [1, 64], DataType.DT_UINT8)
    src = await pusher.cache_manager.allocate_cache(desc)
    target = await receiver.cache_manager.allocate_cache(desc)
    key = CacheKeyByIdAndIndex(receiver.cluster_id, target.cache_id)
    with pytest.raises(TypeError):
        await pusher.cache_manager.push_cache(BlocksCacheKey(1), src)  # type: ignore[arg-type]
    for kwargs in ({"size": 64}, {"src_layer_range": range(1), "dst_layer_range": range(2)},
                   {"src_layer_range": range(0, 3, 2)}, {"tensor_num_per_layer": 0}):
        with pytest.raises(LLMException) as info:
            await pusher.cache_manager.push_cache(key, src, **kwargs)  # type: ignore[arg-type]
        assert info.value.status_code == INVALID
    await pusher.cache_manager.push_cache(key, src, tensor_num_per_layer=3)  # no whole layer
    with pytest.raises(LLMException) as info:
        await pusher.cache_manager.push_cache(CacheKeyByIdAndIndex(receiver.cluster_id, 999), src)
    assert info.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    # push needs remote-cache-accessible mode, and a remote-accessible destination
    plain = await pair.decoder.cache_manager.allocate_cache(desc)
    with pytest.raises(LLMException, match="enable_remote_cache_accessible"):
        await pair.decoder.cache_manager.push_cache(key, plain)
    await pair.decoder.cache_manager.deallocate_cache(plain)
    for cache, owner in ((src, pusher), (target, receiver)):
        await owner.cache_manager.deallocate_cache(cache)


async def test_push_into_a_cluster_without_remote_access_is_refused(
        prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
        next_cluster_id: Callable[[], int]) -> None:
    closed = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=prefill_daemon.client_target)
    pusher = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=decode_daemon.client_target)
    await closed.init(options(remote_accessible=False))
    await pusher.init(options(remote_accessible=True))
    try:
        await pusher.link_clusters([cluster_info(closed.cluster_id, prefill_daemon.peer_address)])
        desc = CacheDesc(2, [1, 64], DataType.DT_UINT8)
        target = await closed.cache_manager.allocate_cache(desc)
        src = await pusher.cache_manager.allocate_cache(desc)
        with pytest.raises(LLMException, match="remote-accessible") as info:
            await pusher.cache_manager.push_cache(
                CacheKeyByIdAndIndex(closed.cluster_id, target.cache_id), src)
        assert info.value.status_code == INVALID
    finally:
        await pusher.finalize()
        await closed.finalize()


async def test_copy_cache_and_copy_blocks(pair: Pair) -> None:
    cm = pair.prompt.cache_manager
    desc = CacheDesc(3, [4, 1024], DataType.DT_UINT8)
    src, dst = await cm.allocate_cache(desc), await cm.allocate_cache(desc)
    fill(src)
    before = [raw(dst, i).copy() for i in range(3)]
    await cm.copy_cache(dst, src, dst_batch_index=2, src_batch_index=1, offset=100, size=200)
    for i in range(3):
        np.testing.assert_array_equal(raw(dst, i)[2, 100:300], raw(src, i)[1, 100:300])
        np.testing.assert_array_equal(raw(dst, i)[2, :100], before[i][2, :100])
        np.testing.assert_array_equal(raw(dst, i)[2, 300:], before[i][2, 300:])
    await cm.copy_cache(dst, src, 0, 3)
    for i in range(3):
        np.testing.assert_array_equal(raw(dst, i)[0], raw(src, i)[3])
    for args in ((dst, src, 4, 0), (dst, src, 0, 0, 1024), (dst, src, 0, 0, 1000, 100)):
        with pytest.raises(LLMException) as info:
            await cm.copy_cache(*args)
        assert info.value.status_code == INVALID, args
    for bad in ({"size": 0}, {"size": -2}):
        with pytest.raises(LLMException):
            await cm.copy_cache(dst, src, **bad)  # type: ignore[arg-type]
    blocks = await cm.allocate_blocks_cache(CacheDesc(2, [16, 512], DataType.DT_UINT8))
    fill(blocks)
    original = [raw(blocks, i).copy() for i in range(2)]
    await cm.copy_blocks(blocks, {0: [5, 6], 3: [15]})
    for i in range(2):
        np.testing.assert_array_equal(raw(blocks, i)[[5, 6, 15]], original[i][[0, 0, 3]])
    with pytest.raises(TypeError, match="only support"):
        await cm.copy_blocks(blocks, {0: "1"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="inner type only support"):
        await cm.copy_blocks(blocks, {0: ["1"]})  # type: ignore[list-item]
    with pytest.raises(LLMException):
        await cm.copy_blocks(blocks, {0: [16]})
    with pytest.raises(LLMException):
        await cm.copy_blocks(src, {0: [1]})
    for cache in (src, dst):
        await cm.deallocate_cache(cache)
    await cm.deallocate_blocks_cache(blocks)


async def test_swap_blocks_between_host_and_device(
        prefill_daemon: DaemonProcess, next_cluster_id: Callable[[], int]) -> None:
    dd = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=prefill_daemon.client_target)
    await dd.init(options(host_pool_bytes=32 * 2**20))
    try:
        cm = dd.cache_manager
        device = await cm.allocate_blocks_cache(CacheDesc(2, [32, 4096], DataType.DT_UINT8))
        host = await cm.allocate_blocks_cache(
            CacheDesc(2, [8, 4096], DataType.DT_UINT8, Placement.HOST))
        fill(device)
        await cm.swap_blocks(device, host, {4: 0, 5: 1, 6: 2, 20: 7})  # swap out
        for i in range(2):
            np.testing.assert_array_equal(raw(host, i)[[0, 1, 2, 7]], raw(device, i)[[4, 5, 6, 20]])
        await cm.swap_blocks(host, device, {0: 30, 7: 31})  # swap in
        for i in range(2):
            np.testing.assert_array_equal(raw(device, i)[[30, 31]], raw(device, i)[[4, 20]])
        # a CPU cache over memory of the host pool (create_cpu_cache) works as well
        cpu = Cache.create_cpu_cache(host.cache_desc, host.tensor_addrs)
        await cm.swap_blocks(device, cpu, {1: 3})
        np.testing.assert_array_equal(raw(host, 1)[3], raw(device, 1)[1])
        shared = alloc_shareable(2 * 8 * 4096)  # framework-style CPU memory, but shareable
        cpu_shared = Cache.create_cpu_cache(host.cache_desc,
                                            [shared.address, shared.address + 8 * 4096])
        await cm.swap_blocks(device, cpu_shared, {2: 5, 3: 6})
        swapped = shared.numpy(np.uint8, (2, 8, 4096))
        for i in range(2):
            np.testing.assert_array_equal(swapped[i, [5, 6]], raw(device, i)[[2, 3]])
        await cm.swap_blocks(cpu_shared, device, {5: 10})
        np.testing.assert_array_equal(raw(device, 1)[10], swapped[1, 5])
        del swapped
        shared.close()
        foreign = np.zeros(2 * 8 * 4096, dtype=np.uint8)
        stray = Cache.create_cpu_cache(host.cache_desc, [foreign.ctypes.data,
                                                         foreign.ctypes.data + 8 * 4096])
        with pytest.raises(LLMException, match="reach") as info:
            await cm.swap_blocks(device, stray, {0: 0})
        assert info.value.status_code == INVALID
        rules = [
            (device, device, {0: 1}),                      # DEVICE -> DEVICE
            (device, host, {32: 0}),                       # source block out of range
            (device, host, {0: 8}),                        # destination block out of range
        ]
        for args in rules:
            with pytest.raises(LLMException):
                await cm.swap_blocks(*args)
        with pytest.raises(TypeError):
            await cm.swap_blocks(device, host, {"0": 1})  # type: ignore[dict-item]
        await cm.deallocate_blocks_cache(device)
        await cm.deallocate_blocks_cache(host)
    finally:
        await dd.finalize()
