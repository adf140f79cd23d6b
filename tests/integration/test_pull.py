"""Prefill-to-decode pulls between two real daemons, verified byte for byte."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from hixl_client import (
    Cache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    DataType,
    LLMException,
    LLMStatusCode,
)
from hixl_client.keys import PLACEHOLDER_ID

from .conftest import Pair, daemon_status

pytestmark = pytest.mark.asyncio

RNG = np.random.default_rng(1234)


def fill(cache: Cache) -> list[np.ndarray]:
    """Fill every tensor with random bytes through the zero-copy views."""
    contents = []
    for i in range(cache.cache_desc.num_tensors):
        view = np.frombuffer(cache.tensor_view(i), dtype=np.uint8)
        view[:] = RNG.integers(0, 256, view.size, dtype=np.uint8)
        contents.append(view.copy())
    return contents


def tensor_bytes(cache: Cache, index: int) -> np.ndarray:
    return np.frombuffer(cache.tensor_view(index), dtype=np.uint8)


@pytest.mark.parametrize("data_type,shape,num_tensors", [
    (DataType.DT_FLOAT16, [1, 128, 8, 64], 8),
    (DataType.DT_BF16, [1, 16, 3, 5], 4),
    (DataType.DT_FLOAT, [1, 1000], 2),
    (DataType.DT_INT8, [1, 4097], 6),
    (DataType.DT_INT64, [1, 3, 7], 2),
    (DataType.DT_FLOAT16, [1, 2048, 8, 128], 4),  # 4 x 4 MiB: several streams per request
])
async def test_pull_by_key_is_byte_exact(pair: Pair, data_type: DataType, shape: list[int],
                                         num_tensors: int) -> None:
    desc = CacheDesc(num_tensors, shape, data_type)
    key = CacheKey(pair.prompt.cluster_id, req_id=11)
    src = await pair.prompt.cache_manager.allocate_cache(desc, [key])
    expected = fill(src)
    dst = await pair.decoder.cache_manager.allocate_cache(desc)
    await pair.decoder.cache_manager.pull_cache(key, dst)
    for i, content in enumerate(expected):
        np.testing.assert_array_equal(tensor_bytes(dst, i), content)
    # typed views agree too, including the zero-copy numpy helper
    np.testing.assert_array_equal(dst.numpy(0).view(np.uint8), src.numpy(0).view(np.uint8))
    await pair.prompt.cache_manager.deallocate_cache(src)
    await pair.decoder.cache_manager.deallocate_cache(dst)


async def test_batch_index_size_and_placeholder_keys(pair: Pair) -> None:
    desc = CacheDesc(2, [4, 256], DataType.DT_UINT8)
    keys = [CacheKey(pair.prompt.cluster_id, req_id=PLACEHOLDER_ID),
            CacheKey(pair.prompt.cluster_id, req_id=21),
            CacheKey(pair.prompt.cluster_id, req_id=22)]
    src = await pair.prompt.cache_manager.allocate_cache(desc, keys)
    expected = fill(src)
    dst = await pair.decoder.cache_manager.allocate_cache(desc)
    before = [tensor_bytes(dst, i).copy() for i in range(2)]
    await pair.decoder.cache_manager.pull_cache(keys[2], dst, batch_index=1, size=100)
    for i in range(2):
        got = tensor_bytes(dst, i).reshape(4, 256)
        np.testing.assert_array_equal(got[1, :100], expected[i].reshape(4, 256)[2, :100])
        # nothing outside the slot prefix changed
        np.testing.assert_array_equal(got[1, 100:], before[i].reshape(4, 256)[1, 100:])
        np.testing.assert_array_equal(got[[0, 2, 3]], before[i].reshape(4, 256)[[0, 2, 3]])
    with pytest.raises(LLMException) as info:  # the placeholder slot holds no key
        await pair.decoder.cache_manager.pull_cache(keys[0], dst)
    assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    await pair.prompt.cache_manager.deallocate_cache(src)
    await pair.decoder.cache_manager.deallocate_cache(dst)


async def test_layer_ranges_pull_only_the_chosen_layers(pair: Pair) -> None:
    desc = CacheDesc(8, [1, 512], DataType.DT_FLOAT16)  # 4 layers of K and V
    key = CacheKey(pair.prompt.cluster_id, req_id=31)
    src = await pair.prompt.cache_manager.allocate_cache(desc, [key])
    expected = fill(src)
    dst = await pair.decoder.cache_manager.allocate_cache(desc)
    untouched = [tensor_bytes(dst, i).copy() for i in range(8)]
    await pair.decoder.cache_manager.pull_cache(key, dst, src_layer_range=range(1, 3),
                                                dst_layer_range=range(2))
    for i in range(4):  # src layers 1..2 = tensors 2..5 land in tensors 0..3
        np.testing.assert_array_equal(tensor_bytes(dst, i), expected[i + 2])
    for i in range(4, 8):
        np.testing.assert_array_equal(tensor_bytes(dst, i), untouched[i])
    # the key survives a partial pull, and goes once the rest is pulled
    await pair.decoder.cache_manager.pull_cache(key, dst, src_layer_range=range(1),
                                                dst_layer_range=range(1))
    await pair.decoder.cache_manager.pull_cache(key, dst, src_layer_range=range(3, 4),
                                                dst_layer_range=range(3, 4))
    with pytest.raises(LLMException) as info:
        await pair.decoder.cache_manager.pull_cache(key, dst)
    assert info.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    await pair.prompt.cache_manager.deallocate_cache(src)
    await pair.decoder.cache_manager.deallocate_cache(dst)


async def test_layer_range_beyond_the_cache_is_rejected(pair: Pair) -> None:
    desc = CacheDesc(1, [2, 4], DataType.DT_FLOAT16)
    src = await pair.prompt.cache_manager.allocate_cache(desc)
    dst = await pair.decoder.cache_manager.allocate_cache(desc)
    key = CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id)
    with pytest.raises(LLMException) as info:
        await pair.decoder.cache_manager.pull_cache(key, dst, src_layer_range=range(1),
                                                    dst_layer_range=range(1))
    assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    await pair.decoder.cache_manager.pull_cache(key, dst, 0, 4)
    await pair.prompt.cache_manager.deallocate_cache(src)
    await pair.decoder.cache_manager.deallocate_cache(dst)


async def test_pull_by_id_and_index_keeps_the_cache(pair: Pair) -> None:
    desc = CacheDesc(2, [3, 64], DataType.DT_INT32)
    src = await pair.prompt.cache_manager.allocate_cache(desc)
    expected = fill(src)
    dst = await pair.decoder.cache_manager.allocate_cache(desc)
    for batch in range(3):
        key = CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id, batch)
        await pair.decoder.cache_manager.pull_cache(key, dst, batch_index=batch)
    for i in range(2):
        np.testing.assert_array_equal(tensor_bytes(dst, i), expected[i])
    await pair.prompt.cache_manager.deallocate_cache(src)
    with pytest.raises(LLMException) as info:
        await pair.decoder.cache_manager.pull_cache(
            CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id), dst)
    assert info.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    await pair.decoder.cache_manager.deallocate_cache(dst)


async def test_key_keeps_deallocated_cache_until_pulled(pair: Pair) -> None:
    desc = CacheDesc(2, [1, 65536], DataType.DT_UINT8)
    key = CacheKey(pair.prompt.cluster_id, req_id=41)
    src = await pair.prompt.cache_manager.allocate_cache(desc, [key])
    expected = fill(src)
    await pair.prompt.cache_manager.deallocate_cache(src)
    assert src.tensor_addrs == []
    prompt_target = pair.prompt_daemon.client_target

    def used() -> int:
        return sum(p.used for p in status.pools if p.cluster_id == pair.prompt.cluster_id)

    status = await daemon_status(prompt_target)
    assert used() > 0  # still referenced by the key
    dst = await pair.decoder.cache_manager.allocate_cache(desc)
    await pair.decoder.cache_manager.pull_cache(key, dst)
    for i in range(2):
        np.testing.assert_array_equal(tensor_bytes(dst, i), expected[i])
    status = await daemon_status(prompt_target)
    assert used() == 0  # the successful pull dropped the last reference
    with pytest.raises(LLMException) as info:
        await pair.decoder.cache_manager.pull_cache(key, dst)
    assert info.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    await pair.decoder.cache_manager.deallocate_cache(dst)


async def test_remove_cache_key_frees_and_unknown_key_fails(pair: Pair) -> None:
    desc = CacheDesc(2, [1, 1024], DataType.DT_UINT8)
    key = CacheKey(pair.prompt.cluster_id, req_id=51)
    src = await pair.prompt.cache_manager.allocate_cache(desc, [key])
    await pair.prompt.cache_manager.remove_cache_key(key)
    await pair.prompt.cache_manager.remove_cache_key(key)  # absent: a no-op
    dst = await pair.decoder.cache_manager.allocate_cache(desc)
    with pytest.raises(LLMException) as info:
        await pair.decoder.cache_manager.pull_cache(key, dst)
    assert info.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    await pair.prompt.cache_manager.deallocate_cache(src)
    await pair.decoder.cache_manager.deallocate_cache(dst)


async def test_pool_exhaustion_is_out_of_memory(pair: Pair) -> None:
    big = CacheDesc(1, [1, 200 * 2**20], DataType.DT_UINT8)
    first = await pair.prompt.cache_manager.allocate_cache(big)
    with pytest.raises(LLMException) as info:
        await pair.prompt.cache_manager.allocate_cache(big)
    assert info.value.status_code == LLMStatusCode.LLM_OUT_OF_MEMORY
    await pair.prompt.cache_manager.deallocate_cache(first)
    again = await pair.prompt.cache_manager.allocate_cache(big)  # memory came back
    await pair.prompt.cache_manager.deallocate_cache(again)


async def test_allocation_key_rules_reach_the_caller(pair: Pair) -> None:
    desc = CacheDesc(1, [2, 16], DataType.DT_UINT8)
    key = CacheKey(pair.prompt.cluster_id, req_id=61)
    cache = await pair.prompt.cache_manager.allocate_cache(desc, [key])
    for keys in ([key], [CacheKey(1, 62), CacheKey(1, 62)], [CacheKey(1, i) for i in range(3)]):
        with pytest.raises(LLMException) as info:
            await pair.prompt.cache_manager.allocate_cache(desc, keys)
        assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    await pair.prompt.cache_manager.remove_cache_key(key)
    await pair.prompt.cache_manager.deallocate_cache(cache)


async def test_pull_without_link_or_from_self(pair: Pair,
                                              next_cluster_id: Callable[[], int]) -> None:
    desc = CacheDesc(1, [1, 16], DataType.DT_UINT8)
    dst = await pair.decoder.cache_manager.allocate_cache(desc)
    with pytest.raises(LLMException) as info:
        await pair.decoder.cache_manager.pull_cache(CacheKey(next_cluster_id(), 1), dst)
    assert info.value.status_code == LLMStatusCode.LLM_NOT_YET_LINK
    with pytest.raises(LLMException) as info:
        await pair.decoder.cache_manager.pull_cache(CacheKey(pair.decoder.cluster_id, 1), dst)
    assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    await pair.decoder.cache_manager.deallocate_cache(dst)


async def test_transfer_timings_split_client_control_and_data(pair: Pair) -> None:
    from hixl_client import capture_timings
    desc = CacheDesc(2, [1, 4 << 20], DataType.DT_UINT8)
    src = await pair.prompt.cache_manager.allocate_cache(desc)
    dst = await pair.decoder.cache_manager.allocate_cache(desc)
    key = CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id)
    await pair.decoder.cache_manager.pull_cache(key, dst)  # outside: not recorded
    with capture_timings() as timings:
        await pair.decoder.cache_manager.pull_cache(key, dst)
        await pair.decoder.cache_manager.pull_cache(key, dst, size=1)
    assert [t.operation for t in timings] == ["pull_cache", "pull_cache"]
    big, tiny = timings
    for t in timings:
        assert t.control_us >= 0 and t.data_us > 0 and t.client_us >= 0
        assert t.call_us >= t.control_us + t.data_us
    assert big.data_us > tiny.data_us  # 8 MiB moved against 2 bytes
    await pair.prompt.cache_manager.deallocate_cache(src)
    await pair.decoder.cache_manager.deallocate_cache(dst)
