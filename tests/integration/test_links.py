"""link_clusters / unlink_clusters results, and the transport each link uses."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from hixl_client import (
    CacheDesc,
    CacheKey,
    DataType,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
)
from hixl_service.testing import DaemonProcess, start_daemon

from .conftest import Pair, cluster_info, daemon_status, make_pair, options

pytestmark = pytest.mark.asyncio


async def test_link_results_and_transport(pair: Pair, next_cluster_id: Callable[[], int]) -> None:
    status = await daemon_status(pair.decoder_daemon.client_target)
    [link] = [l for l in status.links if l.local_cluster_id == pair.decoder.cluster_id]
    assert link.transport == "tcp" and link.remote_cluster_id == pair.prompt.cluster_id
    assert link.streams >= 1 and link.alive
    peer = pair.prompt_daemon.peer_address
    again = await pair.decoder.link_clusters([cluster_info(pair.prompt.cluster_id, peer)])
    assert again == (LLMStatusCode.LLM_ALREADY_LINK, [LLMStatusCode.LLM_ALREADY_LINK])
    missing = next_cluster_id()
    result = await pair.decoder.link_clusters([cluster_info(missing, peer)], timeout=2000)
    assert result == (LLMStatusCode.LLM_LINK_FAILED, [LLMStatusCode.LLM_LINK_FAILED])
    nobody = await pair.decoder.link_clusters([cluster_info(missing, "127.0.0.1:1")], 1000)
    assert nobody == (LLMStatusCode.LLM_LINK_FAILED, [LLMStatusCode.LLM_LINK_FAILED])
    two_remotes = cluster_info(missing, peer)
    two_remotes.append_remote_ip_info("127.0.0.1", 2)
    mixed = await pair.decoder.link_clusters(
        [two_remotes, cluster_info(pair.prompt.cluster_id, peer)])
    assert mixed == (LLMStatusCode.LLM_ALREADY_LINK,
                     [LLMStatusCode.LLM_PARAM_INVALID, LLMStatusCode.LLM_ALREADY_LINK])


async def test_unlink_then_pull_is_not_linked(pair: Pair) -> None:
    desc = CacheDesc(1, [1, 64], DataType.DT_UINT8)
    key = CacheKey(pair.prompt.cluster_id, req_id=1)
    src = await pair.prompt.cache_manager.allocate_cache(desc, [key])
    dst = await pair.decoder.cache_manager.allocate_cache(desc)
    info = cluster_info(pair.prompt.cluster_id, pair.prompt_daemon.peer_address)
    assert await pair.decoder.unlink_clusters([info]) == (LLMStatusCode.LLM_SUCCESS,
                                                          [LLMStatusCode.LLM_SUCCESS])
    prompt_status = await daemon_status(pair.prompt_daemon.client_target)
    assert not [l for l in prompt_status.links if l.local_cluster_id == pair.prompt.cluster_id]
    assert await pair.decoder.unlink_clusters([info]) == (LLMStatusCode.LLM_UNLINK_FAILED,
                                                          [LLMStatusCode.LLM_UNLINK_FAILED])
    with pytest.raises(LLMException) as failure:
        await pair.decoder.cache_manager.pull_cache(key, dst)
    assert failure.value.status_code == LLMStatusCode.LLM_NOT_YET_LINK
    assert (await pair.decoder.link_clusters([info]))[0] == LLMStatusCode.LLM_SUCCESS
    await pair.decoder.cache_manager.pull_cache(key, dst)
    await pair.prompt.cache_manager.deallocate_cache(src)
    await pair.decoder.cache_manager.deallocate_cache(dst)


async def test_two_clusters_in_one_daemon_copy_locally(
        prefill_daemon: DaemonProcess, next_cluster_id: Callable[[], int]) -> None:
    target = prefill_daemon.client_target
    prompt = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=target)
    decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=target)
    await prompt.init(options())
    await decoder.init(options())
    try:
        result = await decoder.link_clusters(
            [cluster_info(prompt.cluster_id, prefill_daemon.peer_address)])
        assert result == (LLMStatusCode.LLM_SUCCESS, [LLMStatusCode.LLM_SUCCESS])
        status = await daemon_status(target)
        [link] = [l for l in status.links if l.local_cluster_id == decoder.cluster_id
                  and l.direction == "outbound"]
        assert link.transport == "local"
        desc = CacheDesc(4, [2, 1 << 18], DataType.DT_FLOAT16)
        key = CacheKey(prompt.cluster_id, req_id=5)
        src = await prompt.cache_manager.allocate_cache(desc, [key])
        for i in range(4):
            src.numpy(i)[...] = np.arange(2 * (1 << 18), dtype=np.float16).reshape(2, -1) + i
        dst = await decoder.cache_manager.allocate_cache(desc)
        await decoder.cache_manager.pull_cache(key, dst, batch_index=1)
        for i in range(4):
            np.testing.assert_array_equal(dst.numpy(i)[1], src.numpy(i)[0])
        await prompt.cache_manager.deallocate_cache(src)
        await decoder.cache_manager.deallocate_cache(dst)
    finally:
        await decoder.finalize()
        await prompt.finalize()
    status = await daemon_status(target)
    assert not {prompt.cluster_id, decoder.cluster_id} & {c.cluster_id for c in status.clusters}
    assert not [l for l in status.links if l.local_cluster_id in (prompt.cluster_id,
                                                                   decoder.cluster_id)]


async def test_daemons_on_asyncio_default_loop(next_cluster_id: Callable[[], int]) -> None:
    async with start_daemon(server__use_uvloop=False) as prefill, \
            start_daemon(server__use_uvloop=False) as decode:
        pair = await make_pair(prefill, decode, next_cluster_id)
        desc = CacheDesc(2, [1, 3 << 20], DataType.DT_UINT8)
        key = CacheKey(pair.prompt.cluster_id, req_id=1)
        src = await pair.prompt.cache_manager.allocate_cache(desc, [key])
        src.numpy(1)[...] = 7
        dst = await pair.decoder.cache_manager.allocate_cache(desc)
        await pair.decoder.cache_manager.pull_cache(key, dst)
        assert (dst.numpy(1) == 7).all()
        await pair.decoder.finalize()
        await pair.prompt.finalize()
        assert "asyncio loop" in prefill.log_tail()
