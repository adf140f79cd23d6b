"""Link communicators of hccl daemons: built from a rank table (the default)
or from root info, their HCCL buffers counted against the device budget and
shown in the admin status, refused when they do not fit."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from hixl_client import CacheDesc, CacheKeyByIdAndIndex, DataType, LLMDataDist, LLMRole
from hixl_client.status import LLMStatusCode

from ..integration.conftest import daemon_status
from .daemons import TensorIO, cluster_info, daemon_process, options

pytestmark = pytest.mark.asyncio

IO = TensorIO()
_ids = itertools.count(9100)
MIB = 1 << 20


async def _pull_once(prompt_target: str, prompt_peer: str, decoder_target: str) -> int:
    """Link, pull one cache byte-exact; returns the link status code."""
    prompt = LLMDataDist(LLMRole.PROMPT, next(_ids), daemon=prompt_target)
    decoder = LLMDataDist(LLMRole.DECODER, next(_ids), daemon=decoder_target)
    await prompt.init(options(device_id=0))
    await decoder.init(options(device_id=1))
    try:
        status, results = await decoder.link_clusters(
            [cluster_info(prompt.cluster_id, prompt_peer)], timeout=5000)
        if status != LLMStatusCode.LLM_SUCCESS:
            return int(results[0]) if results else int(status)
        desc = CacheDesc(2, [1, 4096], DataType.DT_INT8)  # one slot: the pull moves it all
        src = await prompt.cache_manager.allocate_cache(desc)
        data = [os.urandom(desc.size) for _ in range(2)]
        for i, d in enumerate(data):
            IO.write(src, i, d)
        dst = await decoder.cache_manager.allocate_cache(desc)
        await decoder.cache_manager.pull_cache(
            CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, 0), dst)
        assert [IO.read(dst, i) for i in range(2)] == data
        return int(status)
    finally:
        await decoder.finalize()
        await prompt.finalize()


@pytest.mark.parametrize("comm_init", ["rank_table", "root_info"])
async def test_link_communicators_and_their_buffers(double_dir: Path, runtime: object,
                                                    comm_init: str) -> None:
    with daemon_process("hccl", double_dir, ascend__comm_init=comm_init) as prompt, \
            daemon_process("hccl", double_dir, ascend__comm_init=comm_init) as decoder:
        idle = await daemon_status(decoder.client_target)
        assert [(d.device_id, d.communicators, d.hccl_buffer_bytes) for d in idle.devices] \
            == [(0, 0, 0), (1, 0, 0)]
        prompt_cluster = LLMDataDist(LLMRole.PROMPT, next(_ids), daemon=prompt.client_target)
        decoder_cluster = LLMDataDist(LLMRole.DECODER, next(_ids), daemon=decoder.client_target)
        await prompt_cluster.init(options(device_id=0))
        await decoder_cluster.init(options(device_id=1))
        try:
            status, results = await decoder_cluster.link_clusters(
                [cluster_info(prompt_cluster.cluster_id, prompt.peer_address)], timeout=5000)
            assert status == LLMStatusCode.LLM_SUCCESS, results
            for daemon, device in ((decoder, 1), (prompt, 0)):
                status = await daemon_status(daemon.client_target)
                shown = status.devices[device]
                # one communicator, twice hccl_buffer_mb (1 MB in these daemons)
                assert (shown.communicators, shown.hccl_buffer_bytes) == (1, 2 * MIB)
                assert shown.reserved_bytes >= 2 * MIB
                # HCCL's one-sided bookkeeping covers rank-table communicators only
                # (hcomm op_base.cc; issue 30): root-info links move two-sided
                expected = "one-sided" if comm_init == "rank_table" else "two-sided"
                assert [link.data_path for link in status.links] == [expected]
        finally:
            await decoder_cluster.finalize()
            await prompt_cluster.finalize()
        code = await _pull_once(prompt.client_target, prompt.peer_address,
                                decoder.client_target)
        assert code == LLMStatusCode.LLM_SUCCESS
        after = await daemon_status(decoder.client_target)
        assert all(d.communicators == 0 and d.hccl_buffer_bytes == 0 for d in after.devices)


async def test_buffers_that_exceed_the_budget_refuse_the_link(double_dir: Path,
                                                              runtime: object) -> None:
    # 2 x 32 MB of HCCL buffers on top of a 16 MiB pool exceed the 48 MiB device budget
    with daemon_process("hccl", double_dir, ascend__hccl_buffer_mb=32) as prompt, \
            daemon_process("hccl", double_dir, ascend__hccl_buffer_mb=32) as decoder:
        code = await _pull_once(prompt.client_target, prompt.peer_address,
                                decoder.client_target)
        assert code == LLMStatusCode.LLM_LINK_FAILED
        status = await daemon_status(decoder.client_target)
        assert all(d.communicators == 0 for d in status.devices)
