"""register_cache / register_blocks_cache of memory the engine allocated itself
(numpy, anonymous mmap, torch CPU tensors), reached by the daemons with
process_vm_readv / process_vm_writev: transfers byte-exact over TCP and inside
one daemon, revocation at unregistration and client death, and the refusals."""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable

import numpy as np
import pytest

from hixl_client import (
    BlocksCacheKey,
    CacheDesc,
    CacheKeyByIdAndIndex,
    DataType,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
)
from hixl_service.testing import DaemonProcess
from tests.clusters import cluster_info

from .conftest import Pair, daemon_status, options

pytestmark = pytest.mark.asyncio

INVALID = LLMStatusCode.LLM_PARAM_INVALID
RNG = np.random.default_rng(20)


def mmap_array(nbytes: int) -> tuple[mmap.mmap, int]:
    """An anonymous private mapping and its address."""
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return region, ctypes.addressof(ctypes.c_char.from_buffer(region))


def tensor_addrs(array: np.ndarray) -> list[int]:
    """One address per tensor of a (tensors, ...) array."""
    return [array.ctypes.data + i * array[0].nbytes for i in range(array.shape[0])]


async def test_numpy_and_mmap_blocks_over_tcp(accessible: Pair) -> None:
    """Both sides register their own memory; pull_blocks by BlocksCacheKey with
    fragmented tables and layer ranges, and push_blocks back, byte-exact."""
    prompt, decoder = accessible.prompt, accessible.decoder
    layers, blocks, block_bytes = 4, 64, 16 << 10
    desc = CacheDesc(2 * layers, [blocks, block_bytes], DataType.DT_UINT8)
    kv = RNG.integers(0, 256, (2 * layers, blocks, block_bytes), dtype=np.uint8)
    key = BlocksCacheKey(prompt.cluster_id, 5)
    src = await prompt.cache_manager.register_blocks_cache(desc, tensor_addrs(kv), key,
                                                          remote_accessible=True)
    region, base = mmap_array(desc.size * desc.num_tensors)
    dst_kv = np.frombuffer(region, dtype=np.uint8).reshape(kv.shape)
    dst = await decoder.cache_manager.register_blocks_cache(
        desc, [base + i * desc.size for i in range(desc.num_tensors)])
    src_blocks = [int(b) for b in RNG.permutation(blocks)[:40]]
    dst_blocks = [int(b) for b in RNG.permutation(blocks)[:40]]
    await decoder.cache_manager.pull_blocks(key, dst, src_blocks, dst_blocks,
                                            src_layer_range=range(1, 3),
                                            dst_layer_range=range(0, 2))
    for layer in range(2):
        for half in range(2):
            np.testing.assert_array_equal(dst_kv[2 * layer + half][dst_blocks],
                                          kv[2 * (layer + 1) + half][src_blocks])
    untouched = np.setdiff1d(np.arange(blocks), dst_blocks)
    assert not dst_kv[:, untouched].any() and not dst_kv[4:].any()
    # A whole-cache pull (every block, contiguous: large ranges over several pieces).
    await decoder.cache_manager.pull_blocks(key, dst, list(range(blocks)), list(range(blocks)))
    np.testing.assert_array_equal(dst_kv, kv)
    # And back: the decoder's mmap into the prompt's numpy memory.
    dst_kv[...] = RNG.integers(0, 256, dst_kv.shape, dtype=np.uint8)
    await decoder.cache_manager.push_blocks(key, dst, [1, 2, 3, 9], [60, 61, 62, 7])
    np.testing.assert_array_equal(kv[:, [60, 61, 62, 7]], dst_kv[:, [1, 2, 3, 9]])
    await decoder.cache_manager.unregister_cache(dst.cache_id)
    await prompt.cache_manager.unregister_cache(src.cache_id)
    del dst_kv
    region.close()


async def test_pull_cache_into_a_torch_tensor(pair: Pair) -> None:
    torch = pytest.importorskip("torch")
    desc = CacheDesc(2, [3, 1 << 20], DataType.DT_FLOAT16)
    src = await pair.prompt.cache_manager.allocate_cache(desc)
    for i in range(2):
        src.numpy(i)[...] = RNG.standard_normal((3, 1 << 20)).astype(np.float16)
    dst_tensor = torch.zeros((2, 3, 1 << 20), dtype=torch.float16)
    dst = await pair.decoder.cache_manager.register_cache(
        desc, [dst_tensor[i].data_ptr() for i in range(2)])
    await pair.decoder.cache_manager.pull_cache(
        CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id, 2), dst, batch_index=0)
    for i in range(2):
        np.testing.assert_array_equal(dst_tensor[i, 0].numpy(), src.numpy(i)[2])
    await pair.decoder.cache_manager.unregister_cache(dst.cache_id)
    await pair.prompt.cache_manager.deallocate_cache(src)


async def test_local_transfers_between_engine_memories(
        prefill_daemon: DaemonProcess, next_cluster_id: Callable[[], int]) -> None:
    """Two clusters of one daemon: engine memory to engine memory (a bounce
    buffer), pool to engine memory and back (direct cross-memory copies)."""
    prompt = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill_daemon.client_target)
    decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(),
                          daemon=prefill_daemon.client_target)
    await prompt.init(options(remote_accessible=True))
    await decoder.init(options(remote_accessible=True))
    try:
        status, _ = await decoder.link_clusters(
            [cluster_info(prompt.cluster_id, prefill_daemon.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS
        desc = CacheDesc(2, [32, 64 << 10], DataType.DT_UINT8)
        kv = RNG.integers(0, 256, (2, 32, 64 << 10), dtype=np.uint8)
        key = BlocksCacheKey(prompt.cluster_id, 1)
        await prompt.cache_manager.register_blocks_cache(desc, tensor_addrs(kv), key,
                                                         remote_accessible=True)
        mine = np.zeros_like(kv)
        dst = await decoder.cache_manager.register_blocks_cache(desc, tensor_addrs(mine))
        await decoder.cache_manager.pull_blocks(key, dst, [3, 4, 5, 30], [0, 1, 2, 31])
        np.testing.assert_array_equal(mine[:, [0, 1, 2, 31]], kv[:, [3, 4, 5, 30]])
        pooled = await decoder.cache_manager.allocate_blocks_cache(desc)
        await decoder.cache_manager.pull_blocks(key, pooled, list(range(32)), list(range(32)))
        for i in range(2):
            np.testing.assert_array_equal(pooled.numpy(i), kv[i])
        pooled.numpy(0)[7] = 1
        await decoder.cache_manager.push_blocks(key, pooled, [7], [8])
        assert (kv[0, 8] == 1).all()
    finally:
        await decoder.finalize()
        await prompt.finalize()


async def test_pool_memory_registers_as_pool_offsets(pair: Pair) -> None:
    """A cache whose memory lies in the cluster's own pool maps to the pool."""
    cm = pair.decoder.cache_manager
    desc = CacheDesc(2, [1, 4096], DataType.DT_UINT8)
    owned = await cm.allocate_cache(desc)
    again = await cm.register_cache(desc, list(owned.tensor_addrs))
    again.numpy(1)[...] = 9  # a view of the pool: zero copy
    assert (owned.numpy(1) == 9).all()
    await cm.unregister_cache(again.cache_id)
    await cm.deallocate_cache(owned)


async def test_unregistration_ends_access(pair: Pair) -> None:
    """A pull in flight at unregistration completes before it returns or fails;
    afterwards no byte of the memory is written."""
    desc = CacheDesc(4, [1, 16 << 20], DataType.DT_UINT8)
    src = await pair.prompt.cache_manager.allocate_cache(desc)
    mine = np.zeros((4, 16 << 20), dtype=np.uint8)
    for round_ in range(3):
        dst = await pair.decoder.cache_manager.register_cache(desc, tensor_addrs(mine))
        pull = asyncio.ensure_future(pair.decoder.cache_manager.pull_cache(
            CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id, 0), dst))
        await asyncio.sleep(0.002 * round_)
        await pair.decoder.cache_manager.unregister_cache(dst.cache_id)
        mine[...] = 0xAB
        try:
            await pull
        except LLMException as exc:
            assert exc.status_code in (INVALID, LLMStatusCode.LLM_KV_CACHE_NOT_EXIST)
        await asyncio.sleep(0.05)
        assert (mine == 0xAB).all()
        mine[...] = 0
    await pair.prompt.cache_manager.deallocate_cache(src)


CHILD = textwrap.dedent("""
    import asyncio, sys
    import numpy as np
    from hixl_client import BlocksCacheKey, CacheDesc, DataType, LLMDataDist, LLMRole
    from tests.integration.conftest import options

    async def main():
        dd = LLMDataDist(LLMRole.PROMPT, int(sys.argv[2]), daemon=sys.argv[1])
        await dd.init(options())
        kv = np.full((2, 8, 4096), 7, dtype=np.uint8)
        desc = CacheDesc(2, [8, 4096], DataType.DT_UINT8)
        await dd.cache_manager.register_blocks_cache(
            desc, [kv.ctypes.data, kv.ctypes.data + kv[0].nbytes],
            BlocksCacheKey(dd.cluster_id, 3))
        print("ready", flush=True)
        await asyncio.sleep(120)

    asyncio.run(main())
""")


async def test_client_death_ends_access(prefill_daemon: DaemonProcess,
                                        decode_daemon: DaemonProcess,
                                        next_cluster_id: Callable[[], int]) -> None:
    """SIGKILL of a client whose engine memory is registered: its cluster goes,
    a pull of it fails with a status, and both daemons serve on."""
    prompt_id = next_cluster_id()
    child = subprocess.Popen([sys.executable, "-c", CHILD, prefill_daemon.client_target,
                              str(prompt_id)], stdout=subprocess.PIPE,
                             cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(),
                          daemon=decode_daemon.client_target)
    await decoder.init(options())
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)
        assert line.strip() == b"ready"
        status, _ = await decoder.link_clusters(
            [cluster_info(prompt_id, prefill_daemon.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS
        desc = CacheDesc(2, [8, 4096], DataType.DT_UINT8)
        dst = await decoder.cache_manager.allocate_blocks_cache(desc)
        key = BlocksCacheKey(prompt_id, 3)
        await decoder.cache_manager.pull_blocks(key, dst, [0, 5], [1, 2])
        assert (dst.numpy(1)[[1, 2]] == 7).all()
        os.kill(child.pid, signal.SIGKILL)
        await asyncio.to_thread(child.wait, 30)
        for _ in range(200):  # bounded: until the daemon saw the session end
            status_now = await daemon_status(prefill_daemon.client_target)
            if all(c.cluster_id != prompt_id for c in status_now.clusters):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the dead client's cluster stayed")
        with pytest.raises(LLMException):
            await decoder.cache_manager.pull_blocks(key, dst, [0], [0])
        await decoder.unlink_clusters([cluster_info(prompt_id, prefill_daemon.peer_address)],
                                      timeout=5000, force=True)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        if child.stdout is not None:
            child.stdout.close()
        await decoder.finalize()


async def test_bad_addresses_are_refused_at_registration(pair: Pair) -> None:
    cm = pair.decoder.cache_manager
    desc = CacheDesc(1, [1, 4096], DataType.DT_UINT8)
    with pytest.raises(LLMException, match="not mapped") as info:
        await cm.register_cache(desc, [4096])
    assert info.value.status_code == INVALID
    readonly = mmap.mmap(-1, 8192, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                         prot=mmap.PROT_READ)
    base = int(np.frombuffer(readonly, dtype=np.uint8).ctypes.data)
    with pytest.raises(LLMException, match="writable") as info:
        await cm.register_cache(desc, [base])
    assert info.value.status_code == INVALID
    readonly.close()
    status = await daemon_status(pair.decoder_daemon.client_target)
    assert status.engine_memory.startswith("ok")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the daemon as another user")
async def test_a_daemon_the_kernel_forbids_gives_a_clear_error(
        next_cluster_id: Callable[[], int]) -> None:
    """The daemon runs as nobody, the client as root: process_vm_readv is EPERM."""
    daemon = DaemonProcess(user=65534, pool__max_bytes="64MiB")
    await asyncio.to_thread(daemon.start)
    dd = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=daemon.client_target)
    try:
        await dd.init(options(pool_bytes=2 << 20))
        mine = np.zeros((1, 4096), dtype=np.uint8)
        with pytest.raises(LLMException, match="CAP_SYS_PTRACE") as info:
            await dd.cache_manager.register_cache(CacheDesc(1, [1, 4096], DataType.DT_UINT8),
                                                  tensor_addrs(mine))
        assert info.value.status_code == INVALID
        assert "alloc_shareable" in str(info.value)
        await dd.finalize()
    finally:
        await asyncio.to_thread(daemon.close)
