"""Timeouts, dead peers and dead clients: bounded failures, nothing leaked."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

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
)
from hixl_service.testing import DaemonProcess, start_daemon

from .conftest import daemon_status, make_pair, options

pytestmark = pytest.mark.asyncio

BUDGET = {"pool__max_bytes": "512MiB"}


async def test_paused_peer_times_out_and_both_daemons_survive(
        next_cluster_id: Callable[[], int]) -> None:
    async with start_daemon(**BUDGET) as prefill, start_daemon(**BUDGET) as decode:
        pair = await make_pair(prefill, decode, next_cluster_id, sync_kv_timeout=500)
        desc = CacheDesc(2, [1, 4096], DataType.DT_UINT8)
        key = CacheKey(pair.prompt.cluster_id, req_id=1)
        await pair.prompt.cache_manager.allocate_cache(desc, [key])
        dst = await pair.decoder.cache_manager.allocate_cache(desc)
        prefill.pause()
        try:
            started = time.monotonic()
            with pytest.raises(LLMException) as info:
                await pair.decoder.cache_manager.pull_cache(key, dst)
            elapsed = time.monotonic() - started
        finally:
            prefill.resume()
        assert info.value.status_code == LLMStatusCode.LLM_TIMEOUT
        assert elapsed < 5.0, f"a 500 ms sync_kv_timeout took {elapsed:.1f} s"
        await pair.decoder.cache_manager.pull_cache(key, dst)  # both daemons still serve
        await pair.decoder.finalize()
        await pair.prompt.finalize()


async def test_sliced_pull_from_a_paused_peer_times_out_whole(
        next_cluster_id: Callable[[], int]) -> None:
    # A pull of about 40k ranges goes out in slices; with the owner stopped
    # after it resolved the cache, every slice must end by the deadline, the
    # call with LLM_TIMEOUT, and the next pull must work.
    async with start_daemon(**BUDGET) as prefill, start_daemon(**BUDGET) as decode:
        pair = await make_pair(prefill, decode, next_cluster_id, sync_kv_timeout=500)
        count = 20_000
        desc = CacheDesc(2, [count, 64], DataType.DT_UINT8)
        key = BlocksCacheKey(pair.prompt.cluster_id, model_id=1)
        await pair.prompt.cache_manager.allocate_blocks_cache(desc, key)
        dst = await pair.decoder.cache_manager.allocate_blocks_cache(desc)
        blocks = list(range(count))[::-1]  # reversed: no two blocks merge
        await pair.decoder.cache_manager.pull_blocks(key, dst, blocks, list(range(count)))
        prefill.pause()
        try:
            started = time.monotonic()
            with pytest.raises(LLMException) as info:
                await pair.decoder.cache_manager.pull_blocks(key, dst, blocks,
                                                             list(range(count)))
            elapsed = time.monotonic() - started
        finally:
            prefill.resume()
        assert info.value.status_code == LLMStatusCode.LLM_TIMEOUT
        assert elapsed < 5.0, f"a 500 ms sync_kv_timeout took {elapsed:.1f} s"
        await pair.decoder.cache_manager.pull_blocks(key, dst, blocks, list(range(count)))
        await pair.decoder.finalize()
        await pair.prompt.finalize()


async def test_dead_peer_fails_pulls_promptly(next_cluster_id: Callable[[], int]) -> None:
    async with start_daemon(**BUDGET) as prefill, start_daemon(**BUDGET) as decode:
        pair = await make_pair(prefill, decode, next_cluster_id, sync_kv_timeout=3000)
        desc = CacheDesc(2, [1, 4096], DataType.DT_UINT8)
        key = CacheKey(pair.prompt.cluster_id, req_id=1)
        await pair.prompt.cache_manager.allocate_cache(desc, [key])
        dst = await pair.decoder.cache_manager.allocate_cache(desc)
        prefill.kill()
        started = time.monotonic()
        with pytest.raises(LLMException) as info:
            await pair.decoder.cache_manager.pull_cache(key, dst)
        assert info.value.status_code in (LLMStatusCode.LLM_LINK_FAILED,
                                          LLMStatusCode.LLM_TIMEOUT)
        assert time.monotonic() - started < 5.0
        status = await daemon_status(decode.client_target)  # the decode daemon still serves
        assert any(c.cluster_id == pair.decoder.cluster_id for c in status.clusters)
        await pair.decoder.finalize()


CLIENT_SCRIPT = textwrap.dedent("""
    import asyncio, json, sys
    from hixl_client import CacheDesc, CacheKey, DataType, LLMConfig, LLMDataDist, LLMRole

    async def main():
        config = LLMConfig()
        config.enable_cache_manager = True
        config.mem_pool_cfg = json.dumps({"memory_size": 64 * 2**20})
        dd = LLMDataDist(LLMRole.PROMPT, int(sys.argv[2]), daemon=sys.argv[1])
        await dd.init(config.generate_options())
        desc = CacheDesc(4, [1, 2**20], DataType.DT_UINT8)
        cache = await dd.cache_manager.allocate_cache(desc, [CacheKey(1, 7)])
        cache.numpy(0)[...] = 1
        print("ready", flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
""")


async def test_killed_client_leaks_nothing(prefill_daemon: DaemonProcess,
                                           next_cluster_id: Callable[[], int]) -> None:
    cluster_id = next_cluster_id()
    with subprocess.Popen([sys.executable, "-c", CLIENT_SCRIPT, prefill_daemon.client_target,
                           str(cluster_id)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as client:
        assert client.stdout is not None and client.stderr is not None
        try:
            line = await asyncio.wait_for(asyncio.to_thread(client.stdout.readline), 30)
            assert line.strip() == b"ready", client.stderr.read()
            status = await daemon_status(prefill_daemon.client_target)
            assert any(c.cluster_id == cluster_id and c.caches == 1 for c in status.clusters)
        finally:
            client.kill()
            client.wait()
    deadline = time.monotonic() + 10
    while True:
        status = await daemon_status(prefill_daemon.client_target)
        gone = not any(c.cluster_id == cluster_id for c in status.clusters)
        pools = [p for p in status.pools if p.cluster_id == cluster_id]
        if gone and not pools:
            break
        assert time.monotonic() < deadline, f"cluster {cluster_id} still present: {status}"
        await asyncio.sleep(0.05)


TASK_CLIENT_SCRIPT = textwrap.dedent("""
    import asyncio, json, sys, time
    from hixl_client import (CacheDesc, CacheKeyByIdAndIndex, DataType, LayerSynchronizer,
                             LLMClusterInfo, LLMConfig, LLMDataDist, LLMRole,
                             TransferWithCacheKeyConfig)

    class Forever(LayerSynchronizer):
        def synchronize_layer(self, layer_index, timeout_in_millis):
            if layer_index >= 1:
                print("in flight", flush=True)
                time.sleep(60)
            return True

    async def main():
        daemon, cluster_id, peer, remote_id, remote_cache = sys.argv[1:6]
        config = LLMConfig()
        config.enable_cache_manager = True
        config.enable_remote_cache_accessible = True
        config.mem_pool_cfg = json.dumps({"memory_size": 16 * 2**20})
        dd = LLMDataDist(LLMRole.DECODER, int(cluster_id), daemon=daemon)
        await dd.init(config.generate_options())
        info = LLMClusterInfo()
        info.remote_cluster_id = int(remote_id)
        info.append_local_ip_info("127.0.0.1", 0)
        host, port = peer.rsplit(":", 1)
        info.append_remote_ip_info(host, int(port))
        await dd.link_clusters([info])
        src = await dd.cache_manager.allocate_cache(CacheDesc(8, [1, 4096], DataType.DT_UINT8))
        key = CacheKeyByIdAndIndex(int(remote_id), int(remote_cache))
        task = dd.cache_manager.transfer_cache_async(
            src, Forever(), [TransferWithCacheKeyConfig(key, range(0, 4), range(0, 4))])
        await task

    asyncio.run(main())
""")


async def test_client_killed_with_a_task_in_flight(
        prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
        next_cluster_id: Callable[[], int]) -> None:
    receiver = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill_daemon.client_target)
    await receiver.init(options(remote_accessible=True))
    dst = await receiver.cache_manager.allocate_cache(CacheDesc(8, [1, 4096], DataType.DT_UINT8))
    sender_id = next_cluster_id()
    try:
        with subprocess.Popen([sys.executable, "-c", TASK_CLIENT_SCRIPT,
                               decode_daemon.client_target, str(sender_id),
                               prefill_daemon.peer_address, str(receiver.cluster_id),
                               str(dst.cache_id)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) as client:
            assert client.stdout is not None and client.stderr is not None
            try:
                line = await asyncio.wait_for(asyncio.to_thread(client.stdout.readline), 30)
                assert line.strip() == b"in flight", client.stderr.read()
            finally:
                client.kill()
                client.wait()
        deadline = time.monotonic() + 10
        while True:  # the sender's daemon frees the session; the receiver's is told
            sender_status = await daemon_status(decode_daemon.client_target)
            receiver_status = await daemon_status(prefill_daemon.client_target)
            sender_gone = not any(c.cluster_id == sender_id for c in sender_status.clusters)
            inbound_gone = not any(l.remote_cluster_id == sender_id
                                   for l in receiver_status.links)
            if sender_gone and inbound_gone:
                break
            assert time.monotonic() < deadline, (sender_status, receiver_status)
            await asyncio.sleep(0.05)
        # the receiving cache is still usable
        await receiver.cache_manager.deallocate_cache(dst)
    finally:
        await receiver.finalize()
