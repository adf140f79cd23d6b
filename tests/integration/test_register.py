"""register_cache / register_blocks_cache / unregister_cache over shareable user memory."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import numpy as np
import pytest

from hixl_client import (
    BlocksCacheKey,
    CacheDesc,
    CacheKey,
    DataType,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
    alloc_shareable,
)
from hixl_service.testing import DaemonProcess

from .conftest import Pair, daemon_status, options

pytestmark = pytest.mark.asyncio

INVALID = LLMStatusCode.LLM_PARAM_INVALID


async def test_registered_cache_is_pulled_and_keeps_its_keys(pair: Pair) -> None:
    desc = CacheDesc(4, [2, 1024], DataType.DT_FLOAT16)
    buffer = alloc_shareable(4 * desc.size)
    kv = buffer.numpy(np.float16, (4, 2, 1024))
    kv[...] = np.arange(kv.size, dtype=np.float16).reshape(kv.shape)
    key = CacheKey(pair.prompt.cluster_id, req_id=3)
    addrs = [buffer.address + i * desc.size for i in range(4)]
    cache = await pair.prompt.cache_manager.register_cache(desc, addrs, [key])
    assert repr(cache).endswith("is_blocks_cache = False)") and cache.tensor_addrs == addrs
    np.testing.assert_array_equal(cache.numpy(2), kv[2])  # the cache views the user's memory
    dst = await pair.decoder.cache_manager.allocate_cache(desc)
    for _ in range(2):  # pulls from registered caches never drop keys
        await pair.decoder.cache_manager.pull_cache(key, dst, batch_index=1)
    for i in range(4):
        np.testing.assert_array_equal(dst.numpy(i)[1], kv[i][0])
    await pair.prompt.cache_manager.deallocate_cache(cache)  # not owned: a no-op
    await pair.prompt.cache_manager.remove_cache_key(key)  # key of a registered cache: a no-op
    await pair.decoder.cache_manager.pull_cache(key, dst)
    await pair.prompt.cache_manager.unregister_cache(cache.cache_id)
    await pair.prompt.cache_manager.unregister_cache(cache.cache_id)  # unknown: success
    with pytest.raises(LLMException) as info:
        await pair.decoder.cache_manager.pull_cache(key, dst)
    assert info.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    assert kv[3, 1, 5] == np.float16(kv.shape[1] * kv.shape[2] * 3 + 1024 + 5)  # still ours
    await pair.decoder.cache_manager.deallocate_cache(dst)
    with pytest.raises(BufferError):  # views of the buffer are alive
        buffer.close()
    del kv
    buffer.close()


async def test_push_blocks_into_registered_user_memory(accessible: Pair) -> None:
    sender, receiver = accessible.decoder, accessible.prompt
    desc = CacheDesc(2, [16, 4096], DataType.DT_UINT8)
    buffer = alloc_shareable(2 * desc.size)
    target = await receiver.cache_manager.register_blocks_cache(
        desc, [buffer.address, buffer.address + desc.size], BlocksCacheKey(receiver.cluster_id, 8),
        remote_accessible=True)
    assert target.is_blocks_cache
    src = await sender.cache_manager.allocate_blocks_cache(desc)
    for i in range(2):
        src.numpy(i)[...] = (np.arange(16, dtype=np.uint8) + 10 * i)[:, None]
    await sender.cache_manager.push_blocks(BlocksCacheKey(receiver.cluster_id, 8), src,
                                           [0, 1, 2], [13, 14, 15])
    user = buffer.numpy(np.uint8, (2, 16, 4096))
    for i in range(2):
        np.testing.assert_array_equal(user[i, 13:16, 0], np.array([0, 1, 2]) + 10 * i)
        assert not user[i, :13].any()
    await receiver.cache_manager.unregister_cache(target.cache_id)
    del user
    buffer.close()


async def test_register_rules(pair: Pair) -> None:
    cm = pair.prompt.cache_manager
    desc = CacheDesc(2, [1, 64], DataType.DT_UINT8)
    buffer = alloc_shareable(4096)
    addrs = [buffer.address, buffer.address + 64]
    cases: list[tuple[tuple[object, ...], dict[str, object], type[Exception]]] = [
        ((desc, tuple(addrs)), {}, TypeError),
        ((desc, ["1"]), {}, TypeError),
        ((desc, addrs, [1]), {}, TypeError),
        ((desc, addrs), {"remote_accessible": "yes"}, TypeError),
        ((desc, []), {}, LLMException),
        ((desc, addrs[:1]), {}, LLMException),
        ((desc, [0, addrs[1]]), {}, LLMException),
    ]
    for args, kwargs, error in cases:
        with pytest.raises(error):
            await cm.register_cache(*args, **kwargs)  # type: ignore[arg-type]
    # Memory that is in no shareable buffer is the process's own: the daemon
    # reaches it (tests/integration/test_engine_memory.py); an unmapped address
    # is refused.
    with pytest.raises(LLMException, match="not mapped") as info:
        await cm.register_cache(desc, [4096, 8192])
    assert info.value.status_code == INVALID
    other = alloc_shareable(4096)
    with pytest.raises(LLMException) as info:  # the daemon checks the count for blocks
        await cm.register_blocks_cache(desc, addrs[:1])
    assert info.value.status_code == INVALID
    with pytest.raises(TypeError):
        await cm.unregister_cache("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await cm.unregister_cache(2**63)
    other.close()
    buffer.close()


async def test_ids_are_shared_by_register_and_allocate(
        prefill_daemon: DaemonProcess, next_cluster_id: Callable[[], int]) -> None:
    dd = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill_daemon.client_target)
    await dd.init(options(pool_bytes=2**20))
    buffer = alloc_shareable(8192)
    try:
        desc = CacheDesc(1, [1, 64], DataType.DT_UINT8)
        first = await dd.cache_manager.register_cache(desc, [buffer.address])
        second = await dd.cache_manager.register_blocks_cache(desc, [buffer.address + 4096])
        third = await dd.cache_manager.allocate_cache(desc)
        assert (first.cache_id, second.cache_id, third.cache_id) == (1, 2, 3)
        status = await daemon_status(prefill_daemon.client_target)
        assert sum(c.cluster_id == dd.cluster_id for c in status.caches) == 3
    finally:
        await dd.finalize()  # unmaps the buffer in the daemon; the memory stays ours
    buffer.view()[:4] = b"kept"
    assert bytes(buffer.view(0, 4)) == b"kept"
    buffer.close()


def _daemon_maps(daemon: DaemonProcess, inode: int) -> bool:
    """Whether the daemon maps the memfd with this inode (its /proc maps)."""
    with open(f"/proc/{daemon.pid}/maps", encoding="ascii", errors="replace") as maps:
        return any(len(f := line.split()) > 4 and f[4] == str(inode) for line in maps)


async def _unmapped(daemon: DaemonProcess, inode: int, timeout_s: float = 5.0) -> bool:
    """Whether the daemon lets go of the memfd within ``timeout_s`` (after a
    close(), it unmaps a buffer without caches after its answer)."""
    deadline = time.monotonic() + timeout_s
    while _daemon_maps(daemon, inode):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_a_closed_buffer_is_unmapped_once_its_caches_are_unregistered(
        pair: Pair) -> None:
    """A long-running engine allocates and closes shareable buffers: the daemon
    must not keep each one until its cluster ends."""
    cm = pair.prompt.cache_manager
    desc = CacheDesc(1, [4, 4096], DataType.DT_UINT8)
    buffer = alloc_shareable(desc.size)
    inode = os.fstat(buffer.fd).st_ino
    buffer.view()[:] = bytes(range(256)) * (desc.size // 256)
    key = CacheKey(pair.prompt.cluster_id, req_id=41)
    cache = await cm.register_cache(desc, [buffer.address], [key])
    assert _daemon_maps(pair.prompt_daemon, inode)
    buffer.close()  # the registered cache keeps its bytes for peers until unregistered
    dst = await pair.decoder.cache_manager.allocate_cache(desc)
    await pair.decoder.cache_manager.pull_cache(key, dst)
    assert bytes(dst.numpy(0).tobytes()[:256]) == bytes(range(256))
    assert _daemon_maps(pair.prompt_daemon, inode)
    await cm.unregister_cache(cache.cache_id)
    assert not _daemon_maps(pair.prompt_daemon, inode)  # unregister returns after the unmap

    shared = alloc_shareable(2 * desc.size)  # two caches in one buffer, let go at once
    inode = os.fstat(shared.fd).st_ino
    both = [await cm.register_cache(desc, [shared.address + i * desc.size]) for i in range(2)]
    shared.close()
    await asyncio.gather(*(cm.unregister_cache(c.cache_id) for c in both))
    assert await _unmapped(pair.prompt_daemon, inode)

    unused = alloc_shareable(4096)  # a buffer with no cache left goes at once
    inode = os.fstat(unused.fd).st_ino
    first = await cm.register_cache(CacheDesc(1, [4096], DataType.DT_UINT8), [unused.address])
    await cm.unregister_cache(first.cache_id)
    assert _daemon_maps(pair.prompt_daemon, inode)  # still open here: it may be registered again
    unused.close()
    assert await _unmapped(pair.prompt_daemon, inode)
    await pair.decoder.cache_manager.deallocate_cache(dst)
