"""Timeouts, dead peers and dead clients: bounded failures, nothing leaked."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

import pytest

from hixl_client import CacheDesc, CacheKey, DataType, LLMException, LLMStatusCode
from hixl_service.testing import DaemonProcess, start_daemon

from .conftest import daemon_status, make_pair

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
