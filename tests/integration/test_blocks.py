"""Paged (blocks) caches: allocate, pull_blocks and cache-to-blocks across daemons."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest
import pytest_asyncio

from hixl_client import (
    BlocksCacheKey,
    Cache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    DataType,
    LLMException,
    LLMStatusCode,
)
from hixl_service.testing import DaemonProcess
from hixl_service.transports.tcp import SLICE_RANGES

from .conftest import Pair, daemon_status, make_pair

pytestmark = pytest.mark.asyncio

BLOCK = 4096
RNG = np.random.default_rng(99)


def blocks_of(cache: Cache, tensor: int) -> np.ndarray:
    desc = cache.cache_desc
    raw = np.frombuffer(cache.tensor_view(tensor), dtype=np.uint8)
    return raw.reshape(desc.shape[0], -1)


def fill(cache: Cache) -> None:
    for i in range(cache.cache_desc.num_tensors):
        view = np.frombuffer(cache.tensor_view(i), dtype=np.uint8)
        view[:] = RNG.integers(0, 256, view.size, dtype=np.uint8)


@pytest_asyncio.fixture
async def local_pair(prefill_daemon: DaemonProcess,
                     next_cluster_id: Callable[[], int]) -> AsyncIterator[Pair]:
    """Two clusters in one daemon, linked with the local transport."""
    made = await make_pair(prefill_daemon, prefill_daemon, next_cluster_id)
    yield made
    await made.decoder.finalize()
    await made.prompt.finalize()


@pytest.mark.parametrize("where", ["tcp", "local"])
async def test_pull_blocks_with_gaps_and_runs(pair: Pair, local_pair: Pair, where: str) -> None:
    use = pair if where == "tcp" else local_pair
    desc = CacheDesc(4, [64, BLOCK // 2], DataType.DT_FLOAT16)  # 4 tensors x 64 blocks of 4 KiB
    src = await use.prompt.cache_manager.allocate_blocks_cache(
        desc, BlocksCacheKey(use.prompt.cluster_id, model_id=3))
    fill(src)
    assert src.is_blocks_cache and not desc._is_blocks  # the desc is not mutated
    dst = await use.decoder.cache_manager.allocate_blocks_cache(desc)
    src_blocks = [0, 1, 2, 3, 10, 20, 21, 63]  # runs and gaps
    dst_blocks = [5, 6, 7, 8, 0, 30, 31, 1]
    before = [blocks_of(dst, i).copy() for i in range(4)]
    await use.decoder.cache_manager.pull_blocks(BlocksCacheKey(use.prompt.cluster_id, 3), dst,
                                                src_blocks, dst_blocks)
    for i in range(4):
        got, want = blocks_of(dst, i), blocks_of(src, i)
        np.testing.assert_array_equal(got[dst_blocks], want[src_blocks])
        untouched = [b for b in range(64) if b not in dst_blocks]
        np.testing.assert_array_equal(got[untouched], before[i][untouched])
    # layer subsets: only layer 1 (tensors 2, 3) of block 4 into block 4
    await use.decoder.cache_manager.pull_blocks(
        BlocksCacheKey(use.prompt.cluster_id, 3), dst, [4], [4],
        src_layer_range=range(1, 2), dst_layer_range=range(1, 2))
    np.testing.assert_array_equal(blocks_of(dst, 3)[4], blocks_of(src, 3)[4])
    assert not np.array_equal(blocks_of(dst, 0)[4], blocks_of(src, 0)[4])
    await use.prompt.cache_manager.deallocate_blocks_cache(src)
    await use.decoder.cache_manager.deallocate_blocks_cache(dst)


async def test_pull_blocks_of_more_ranges_than_one_slice(pair: Pair) -> None:
    # 2 tensors x 20k shuffled blocks: about 40k ranges, which reach the data
    # link as three slices (transports.tcp.SLICE_RANGES); every block must land.
    count = 20_000
    assert 2 * count > 2 * SLICE_RANGES
    desc = CacheDesc(2, [count, 64], DataType.DT_UINT8)
    src = await pair.prompt.cache_manager.allocate_blocks_cache(
        desc, BlocksCacheKey(pair.prompt.cluster_id, model_id=7))
    fill(src)
    dst = await pair.decoder.cache_manager.allocate_blocks_cache(desc)
    src_blocks = [int(b) for b in RNG.permutation(count)]
    dst_blocks = [int(b) for b in RNG.permutation(count)]
    await pair.decoder.cache_manager.pull_blocks(BlocksCacheKey(pair.prompt.cluster_id, 7), dst,
                                                 src_blocks, dst_blocks)
    for i in range(2):
        np.testing.assert_array_equal(blocks_of(dst, i)[dst_blocks], blocks_of(src, i)[src_blocks])
    await pair.prompt.cache_manager.deallocate_blocks_cache(src)
    await pair.decoder.cache_manager.deallocate_blocks_cache(dst)


async def test_continuous_slot_into_blocks_drops_the_key(pair: Pair) -> None:
    src_desc = CacheDesc(2, [2, 8 * BLOCK], DataType.DT_UINT8)  # slots of 8 blocks
    key = CacheKey(pair.prompt.cluster_id, req_id=7)
    src = await pair.prompt.cache_manager.allocate_cache(src_desc, [CacheKey(1, 2**64 - 1), key])
    fill(src)
    dst = await pair.decoder.cache_manager.allocate_blocks_cache(
        CacheDesc(2, [16, BLOCK], DataType.DT_UINT8))
    dst_blocks = [3, 4, 5, 9, 0, 1, 2, 15]
    await pair.decoder.cache_manager.pull_blocks(key, dst, dst_blocks=dst_blocks)
    for i in range(2):
        slot = np.frombuffer(src.tensor_view(i), dtype=np.uint8).reshape(2, 8, BLOCK)[1]
        np.testing.assert_array_equal(blocks_of(dst, i)[dst_blocks], slot)
    with pytest.raises(LLMException) as info:
        await pair.decoder.cache_manager.pull_blocks(key, dst, dst_blocks=[0])
    assert info.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    by_id = CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id, 0)
    await pair.decoder.cache_manager.pull_blocks(by_id, dst, [], [6, 7])
    slot0 = np.frombuffer(src.tensor_view(0), dtype=np.uint8).reshape(2, 8, BLOCK)[0]
    np.testing.assert_array_equal(blocks_of(dst, 0)[[6, 7]], slot0[:2])
    await pair.prompt.cache_manager.deallocate_cache(src)
    await pair.decoder.cache_manager.deallocate_blocks_cache(dst)


async def test_block_rules(pair: Pair) -> None:
    cm = pair.decoder.cache_manager
    desc = CacheDesc(2, [8, BLOCK], DataType.DT_UINT8)
    src = await pair.prompt.cache_manager.allocate_blocks_cache(
        desc, BlocksCacheKey(pair.prompt.cluster_id, 0))
    with pytest.raises(LLMException) as info:  # one blocks cache per model id
        await pair.prompt.cache_manager.allocate_blocks_cache(
            desc, BlocksCacheKey(pair.prompt.cluster_id, 0))
    assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    dst = await cm.allocate_blocks_cache(desc)
    other = await cm.allocate_blocks_cache(CacheDesc(2, [8, BLOCK * 2], DataType.DT_UINT8))
    key = BlocksCacheKey(pair.prompt.cluster_id, 0)
    bad_calls = [
        (key, dst, [0, 1], [0]),       # lengths differ
        (key, dst, [8], [0]),          # source block out of range
        (key, dst, [0], [8]),          # destination block out of range
        (key, other, [0], [0]),        # block sizes differ
    ]
    for args in bad_calls:
        with pytest.raises(LLMException) as info:
            await cm.pull_blocks(*args)
        assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID, args
    client_side: list[tuple[tuple[object, ...], type[Exception]]] = [
        ((key, dst, [], [0]), LLMException),             # BlocksCacheKey needs src_blocks
        ((key, dst, [0], []), LLMException),             # dst_blocks empty
        ((CacheKey(1, 1), dst, [0], [0]), LLMException),  # a slot source takes no src_blocks
        ((key, dst, ["0"], [0]), TypeError),
        ((key, dst, [-1], [0]), ValueError),
        ((key, "dst", [0], [0]), TypeError),
    ]
    for args, error in client_side:
        with pytest.raises(error):
            await cm.pull_blocks(*args)  # type: ignore[arg-type]
    continuous = await cm.allocate_cache(CacheDesc(1, [1, 16], DataType.DT_UINT8))
    with pytest.raises(LLMException):
        await cm.pull_blocks(key, continuous, [0], [0])
    with pytest.raises(LLMException):
        await cm.deallocate_cache(dst)  # blocks caches go through deallocate_blocks_cache
    with pytest.raises(LLMException):
        await cm.deallocate_blocks_cache(continuous)
    for cache in (dst, other):
        await cm.deallocate_blocks_cache(cache)
    await cm.deallocate_cache(continuous)
    await pair.prompt.cache_manager.deallocate_blocks_cache(src)
    status = await daemon_status(pair.prompt_daemon.client_target)
    assert not [c for c in status.caches if c.cluster_id == pair.prompt.cluster_id]


async def test_reallocated_blocks_cache_is_found_again(pair: Pair) -> None:
    """The link remembers resolved caches; a replaced one is resolved afresh."""
    desc = CacheDesc(2, [8, BLOCK], DataType.DT_UINT8)
    key = BlocksCacheKey(pair.prompt.cluster_id, 6)
    dst = await pair.decoder.cache_manager.allocate_blocks_cache(desc)
    for generation in range(3):
        src = await pair.prompt.cache_manager.allocate_blocks_cache(desc, key)
        for i in range(2):
            src.numpy(i)[...] = generation + 1
        await pair.decoder.cache_manager.pull_blocks(key, dst, [0, 1], [2, 3])
        assert (blocks_of(dst, 1)[[2, 3]] == generation + 1).all()
        await pair.prompt.cache_manager.deallocate_blocks_cache(src)
    with pytest.raises(LLMException) as info:
        await pair.decoder.cache_manager.pull_blocks(key, dst, [0], [0])
    assert info.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    await pair.decoder.cache_manager.deallocate_blocks_cache(dst)


async def test_replaced_blocks_cache_of_another_shape(pair: Pair) -> None:
    """A remembered far end that no longer fits the plan is resolved afresh, not refused."""
    key = BlocksCacheKey(pair.prompt.cluster_id, 12)
    small, large = (CacheDesc(2, [8, BLOCK], DataType.DT_UINT8),
                    CacheDesc(4, [32, BLOCK], DataType.DT_UINT8))
    src = await pair.prompt.cache_manager.allocate_blocks_cache(small, key)
    dst_small = await pair.decoder.cache_manager.allocate_blocks_cache(small)
    await pair.decoder.cache_manager.pull_blocks(key, dst_small, [1], [1])
    await pair.prompt.cache_manager.deallocate_blocks_cache(src)
    src = await pair.prompt.cache_manager.allocate_blocks_cache(large, key)
    for i in range(4):
        src.numpy(i)[...] = 40 + i
    dst_large = await pair.decoder.cache_manager.allocate_blocks_cache(large)
    await pair.decoder.cache_manager.pull_blocks(key, dst_large, [20, 31], [0, 1])
    for i in range(4):
        assert (blocks_of(dst_large, i)[[0, 1]] == 40 + i).all()
    await pair.prompt.cache_manager.deallocate_blocks_cache(src)
    for cache in (dst_small, dst_large):
        await pair.decoder.cache_manager.deallocate_blocks_cache(cache)
