"""Cluster ids up to 2**64-1, as connectors pack ip and port into one integer."""

from __future__ import annotations

import pytest

from hixl_client import BlocksCacheKey, CacheDesc, CacheKey, DataType
from hixl_service.testing import DaemonProcess

from .conftest import daemon_status, make_pair

pytestmark = pytest.mark.asyncio

# 10.1.2.3:26000 packed into one integer, as engine connectors do, and the largest id.
PACKED = 0x0A010203 << 32 | 26000
LARGEST = 2**64 - 1


async def test_largest_ids_link_and_pull(prefill_daemon: DaemonProcess,
                                        decode_daemon: DaemonProcess) -> None:
    ids = iter([LARGEST, PACKED])
    pair = await make_pair(prefill_daemon, decode_daemon, lambda: next(ids))
    try:
        assert (pair.prompt.cluster_id, pair.decoder.cluster_id) == (LARGEST, PACKED)
        desc = CacheDesc(2, [1, 4096], DataType.DT_UINT8)
        src = await pair.prompt.cache_manager.allocate_cache(desc, [CacheKey(LARGEST, req_id=7)])
        for i in range(2):
            src.numpy(i)[...] = 17 + i
        dst = await pair.decoder.cache_manager.allocate_cache(desc)
        await pair.decoder.cache_manager.pull_cache(CacheKey(LARGEST, req_id=7), dst)
        assert [int(dst.numpy(i).min()) for i in range(2)] == [17, 18]
        assert [int(dst.numpy(i).max()) for i in range(2)] == [17, 18]

        blocks = CacheDesc(2, [8, 256], DataType.DT_UINT8)
        remote = await pair.prompt.cache_manager.allocate_blocks_cache(
            blocks, BlocksCacheKey(LARGEST, 3))
        remote.numpy(1)[5] = 99
        local = await pair.decoder.cache_manager.allocate_blocks_cache(
            blocks, BlocksCacheKey(PACKED, 3))
        await pair.decoder.cache_manager.pull_blocks(BlocksCacheKey(LARGEST, 3), local, [5], [2])
        assert int(local.numpy(1)[2].min()) == 99

        status = await daemon_status(decode_daemon.client_target)
        assert PACKED in {c.cluster_id for c in status.clusters}
        links = [link for link in status.links if link.local_cluster_id == PACKED]
        assert [(link.remote_cluster_id, link.direction) for link in links] == [
            (LARGEST, "outbound")]
    finally:
        await pair.decoder.finalize()
        await pair.prompt.finalize()
