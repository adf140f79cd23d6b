"""Fenced memory: a transfer that races a free or a reallocation ends with a
status and never touches the memory's next owner.

Each scenario frees a cache while a peer (or this cluster) still names it,
allocates a new cache in the very extent it held, fills the new cache with a
pattern and checks, after the transfer ended, that the pattern is intact. Every
loop is bounded in count; every call in time (sync_kv_timeout).
"""

from __future__ import annotations

import asyncio
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
    LLMStatusCode,
    alloc_shareable,
)
from hixl_service.testing import DaemonProcess

from .conftest import Pair, fill_random, make_pair

pytestmark = pytest.mark.asyncio

KIB, MIB = 1 << 10, 1 << 20
GONE = LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
PATTERN = 0xA5
SMALL = CacheDesc(2, [4, 16 * KIB], DataType.DT_UINT8)  # 4 slots of 2 x 16 KiB
BIG = CacheDesc(2, [1, 16 * MIB], DataType.DT_UINT8)  # 32 MiB: many pieces over 4 streams


@pytest_asyncio.fixture
async def accessible(prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
                     next_cluster_id: Callable[[], int]) -> AsyncIterator[Pair]:
    made = await make_pair(prefill_daemon, decode_daemon, next_cluster_id,
                           remote_accessible=True)
    yield made
    await made.decoder.finalize()
    await made.prompt.finalize()


def fill_pattern(cache: Cache) -> None:
    for i in range(cache.cache_desc.num_tensors):
        np.frombuffer(cache.tensor_view(i), dtype=np.uint8)[:] = PATTERN


def pattern_intact(cache: Cache) -> bool:
    return all(bool((np.frombuffer(cache.tensor_view(i), dtype=np.uint8) == PATTERN).all())
               for i in range(cache.cache_desc.num_tensors))


async def reallocate(owner: LLMDataDist, old: Cache, desc: CacheDesc) -> Cache:
    """Free ``old`` and allocate a cache of ``desc`` in the extent it held, filled
    with PATTERN."""
    addrs, old_id = old.tensor_addrs, old.cache_id
    await owner.cache_manager.deallocate_cache(old)
    new = await owner.cache_manager.allocate_cache(desc)
    assert new.tensor_addrs == addrs, "the new cache took another extent"
    assert new.cache_id != old_id
    fill_pattern(new)
    return new


async def status_of(call: asyncio.Future[None] | asyncio.Task[None]) -> LLMStatusCode:
    try:
        await call
    except LLMException as exc:
        return exc.status_code
    return LLMStatusCode.LLM_SUCCESS


async def test_remembered_resolves_and_repeats_never_reach_the_new_cache(pair: Pair) -> None:
    """Pulls by cache id are remembered (the link's resolve) and repeated (by
    handle); once the cache is freed and its extent reallocated, both end with
    LLM_KV_CACHE_NOT_EXIST, for any slot."""
    old = await pair.prompt.cache_manager.allocate_cache(SMALL)
    expected = fill_random(old, 1)
    dst = await pair.decoder.cache_manager.allocate_cache(SMALL)
    fill_pattern(dst)
    for slot in range(4):  # the first resolves, the next ones repeat by handle
        key = CacheKeyByIdAndIndex(pair.prompt.cluster_id, old.cache_id, slot)
        await pair.decoder.cache_manager.pull_cache(key, dst, batch_index=slot)
    for got, want in zip((np.frombuffer(dst.tensor_view(i), np.uint8) for i in range(2)),
                         expected, strict=True):
        np.testing.assert_array_equal(got, want)
    new = await reallocate(pair.prompt, old, SMALL)
    fill_pattern(dst)
    for slot in range(4):
        key = CacheKeyByIdAndIndex(pair.prompt.cluster_id, old.cache_id, slot)
        with pytest.raises(LLMException) as info:
            await pair.decoder.cache_manager.pull_cache(key, dst, batch_index=3 - slot)
        assert info.value.status_code == GONE
    assert pattern_intact(dst)  # nothing of the new cache arrived either
    # The new cache is reached by its own id.
    await pair.decoder.cache_manager.pull_cache(
        CacheKeyByIdAndIndex(pair.prompt.cluster_id, new.cache_id, 2), dst, batch_index=0)
    assert (np.frombuffer(dst.tensor_view(0), np.uint8)[:16 * KIB] == PATTERN).all()
    await pair.prompt.cache_manager.deallocate_cache(new)
    await pair.decoder.cache_manager.deallocate_cache(dst)


async def test_pushes_by_a_freed_id_never_land_in_the_new_cache(accessible: Pair) -> None:
    pusher, owner = accessible.decoder, accessible.prompt
    old = await owner.cache_manager.allocate_cache(SMALL)
    src = await pusher.cache_manager.allocate_cache(SMALL)
    fill_random(src, 2)
    for slot in range(3):  # resolved once, then repeated by handle
        await pusher.cache_manager.push_cache(
            CacheKeyByIdAndIndex(owner.cluster_id, old.cache_id, slot), src, slot)
    new = await reallocate(owner, old, SMALL)
    for slot in range(4):
        with pytest.raises(LLMException) as info:
            await pusher.cache_manager.push_cache(
                CacheKeyByIdAndIndex(owner.cluster_id, old.cache_id, slot), src, slot)
        assert info.value.status_code == GONE
    assert pattern_intact(new)
    await owner.cache_manager.deallocate_cache(new)
    await pusher.cache_manager.deallocate_cache(src)


async def test_a_blocks_cache_registered_again_is_resolved_again(pair: Pair) -> None:
    """A pull by blocks key remembers the resolve; after unregister it ends
    LLM_KV_CACHE_NOT_EXIST, and once another buffer of another layout is
    registered under the key, pulls read that one, by its own layout."""
    owner, puller = pair.prompt, pair.decoder
    key = BlocksCacheKey(owner.cluster_id, 9)
    desc = CacheDesc(2, [16, 4 * KIB], DataType.DT_UINT8)
    first = alloc_shareable(2 * desc.size)
    first_view = first.numpy(np.uint8, (2, 16, 4 * KIB))
    first_view[...] = np.arange(16, dtype=np.uint8)[None, :, None]
    cache = await owner.cache_manager.register_blocks_cache(
        desc, [first.address, first.address + desc.size], key)
    dst = await puller.cache_manager.allocate_blocks_cache(desc)
    for _ in range(2):
        await puller.cache_manager.pull_blocks(key, dst, [3, 4], [0, 1])
    assert dst.numpy(1)[1, 0] == 4
    await owner.cache_manager.unregister_cache(cache.cache_id)
    with pytest.raises(LLMException) as info:
        await puller.cache_manager.pull_blocks(key, dst, [3, 4], [0, 1])
    assert info.value.status_code == GONE
    # Registered again: the tensors swapped and 200 + block in the second buffer.
    second = alloc_shareable(2 * desc.size)
    second_view = second.numpy(np.uint8, (2, 16, 4 * KIB))
    second_view[0] = (np.arange(16, dtype=np.uint8) + 200)[:, None]
    second_view[1] = (np.arange(16, dtype=np.uint8) + 100)[:, None]
    again = await owner.cache_manager.register_blocks_cache(
        desc, [second.address + desc.size, second.address], key)
    await puller.cache_manager.pull_blocks(key, dst, [3, 4], [0, 1])
    assert dst.numpy(0)[0, 0] == 103 and dst.numpy(1)[1, 0] == 204
    assert (first_view[:, :, 0] == np.arange(16)).all()  # the old memory: untouched
    await owner.cache_manager.unregister_cache(again.cache_id)
    await puller.cache_manager.deallocate_blocks_cache(dst)
    del first_view, second_view
    first.close()
    second.close()


@pytest.mark.parametrize("rounds", [4])
async def test_a_push_racing_a_free_never_lands_in_the_new_cache(accessible: Pair,
                                                                 rounds: int) -> None:
    """A 32 MiB push is under way while its target is freed and its extent
    reallocated: the push succeeds (it ended before the free) or ends with
    LLM_KV_CACHE_NOT_EXIST, and the new cache keeps its pattern."""
    pusher, owner = accessible.decoder, accessible.prompt
    src = await pusher.cache_manager.allocate_cache(BIG)
    fill_random(src, 3)
    seen = set()
    for attempt in range(rounds):
        old = await owner.cache_manager.allocate_cache(BIG)
        push = asyncio.ensure_future(pusher.cache_manager.push_cache(
            CacheKeyByIdAndIndex(owner.cluster_id, old.cache_id), src))
        await asyncio.sleep(0.002 * attempt)
        new = await reallocate(owner, old, BIG)
        status = await status_of(push)
        seen.add(status)
        assert status in (LLMStatusCode.LLM_SUCCESS, GONE)
        assert pattern_intact(new)
        await owner.cache_manager.deallocate_cache(new)
    await pusher.cache_manager.deallocate_cache(src)
    print("push outcomes:", sorted(s.name for s in seen))


@pytest.mark.parametrize("rounds", [4])
async def test_a_pull_into_a_freed_destination_never_lands_in_the_new_cache(
        pair: Pair, rounds: int) -> None:
    """A 32 MiB pull is under way into a local cache that is freed and whose
    extent is reallocated meanwhile: the pull ends (LLM_SUCCESS if it landed
    before the free, else LLM_KV_CACHE_NOT_EXIST) and the new cache keeps its
    pattern."""
    src = await pair.prompt.cache_manager.allocate_cache(BIG)
    fill_random(src, 4)
    key = CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id)
    seen = set()
    for attempt in range(rounds):
        dst = await pair.decoder.cache_manager.allocate_cache(BIG)
        pull = asyncio.ensure_future(pair.decoder.cache_manager.pull_cache(key, dst))
        await asyncio.sleep(0.002 * attempt)
        new = await reallocate(pair.decoder, dst, BIG)
        status = await status_of(pull)
        seen.add(status)
        assert status in (LLMStatusCode.LLM_SUCCESS, GONE)
        assert pattern_intact(new)
        await pair.decoder.cache_manager.deallocate_cache(new)
    await pair.prompt.cache_manager.deallocate_cache(src)
    print("pull outcomes:", sorted(s.name for s in seen))
