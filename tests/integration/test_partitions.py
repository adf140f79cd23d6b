"""Partitions between two network namespaces: a silent drop and a link down.

In-flight transfers end with a status within their deadline, both daemons
show the link's state truthfully during the partition, and the link comes
back up by itself once traffic flows again (no unlink, no link_clusters).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from hixl_client import (
    CacheDesc,
    CacheKeyByIdAndIndex,
    DataType,
    LinkState,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
)
from hixl_service.testing import start_daemon
from tests.clusters import cluster_info

from .conftest import daemon_status, options
from .netns import NetnsPair
from .test_link_health import FAST, admin_link, in_state, outbound_state, wait_until

# About the daemons' links and processes: once, on uvloop (scripts/test.sh).
pytestmark = [pytest.mark.asyncio, pytest.mark.one_loop]

DESC = CacheDesc(2, [1, 65536], DataType.DT_UINT8)
SYNC_KV_TIMEOUT_MS = 1000
# The lease outlasts the partitions, so the same link must come back.
SETTINGS: dict[str, Any] = {**FAST, "links__lease_s": 60.0, "security__insecure": True}


@pytest.fixture
def namespaces() -> Iterator[NetnsPair]:
    NetnsPair.skip_unless_possible()
    pair = NetnsPair().create()
    try:
        yield pair
    finally:
        pair.close()


async def _partition_and_heal(namespaces: NetnsPair, next_cluster_id: Callable[[], int],
                              cut: Callable[[], None], heal: Callable[[], None]) -> None:
    async with start_daemon(netns=namespaces.a, server__peer_host=namespaces.a_ip,
                            **SETTINGS) as prefill, \
            start_daemon(netns=namespaces.b, server__peer_host=namespaces.b_ip,
                         **SETTINGS) as decode:
        prompt = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill.client_target)
        decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=decode.client_target)
        await prompt.init(options(sync_kv_timeout=SYNC_KV_TIMEOUT_MS))
        await decoder.init(options(sync_kv_timeout=SYNC_KV_TIMEOUT_MS))
        status, _ = await decoder.link_clusters(
            [cluster_info(prompt.cluster_id, prefill.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS
        src = await prompt.cache_manager.allocate_cache(DESC)
        data = np.random.default_rng(7).integers(0, 256, 65536, dtype=np.uint8)
        np.frombuffer(src.tensor_view(0), np.uint8)[:] = data
        source = CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, 0)
        dst = await decoder.cache_manager.allocate_cache(DESC)
        await decoder.cache_manager.pull_cache(source, dst)

        await asyncio.to_thread(cut)
        try:
            # A pull during the partition ends with a status, by its deadline
            # (bounded here far more loosely, against a hang).
            with pytest.raises(LLMException) as failed:
                await asyncio.wait_for(decoder.cache_manager.pull_cache(source, dst), 30)
            assert failed.value.status_code in (LLMStatusCode.LLM_TIMEOUT,
                                                LLMStatusCode.LLM_LINK_FAILED)
            down = await wait_until(
                lambda: _state(decoder, prompt.cluster_id, LinkState.DOWN),
                "the linking side shows the partitioned link down")
            assert "heartbeat" in down.last_error

            async def owner_sees_it_down() -> bool:
                seen = admin_link(await daemon_status(prefill.client_target), "inbound",
                                  prompt.cluster_id, decoder.cluster_id)
                return seen is not None and seen.health.state == "down"
            await wait_until(owner_sees_it_down, "the owner shows the unrenewed link down")
        finally:
            await asyncio.to_thread(heal)
        up = await wait_until(lambda: _state(decoder, prompt.cluster_id, LinkState.UP),
                              "the link is up again once traffic flows")
        assert up.remote_daemon_id == prefill.daemon_id and up.streams_up == up.streams
        await decoder.cache_manager.pull_cache(source, dst)
        np.testing.assert_array_equal(np.frombuffer(dst.tensor_view(0), np.uint8), data)
        [inbound] = await prompt.query_link_states()
        assert inbound.state is LinkState.UP and inbound.direction == "inbound"
        await decoder.finalize()
        await prompt.finalize()


async def _state(client: LLMDataDist, remote: int, state: LinkState) -> Any:
    link = await outbound_state(client, remote)
    return link if in_state(state)(link) else None


async def test_a_silent_drop_marks_the_link_down_and_it_heals(
        namespaces: NetnsPair, next_cluster_id: Callable[[], int]) -> None:
    await _partition_and_heal(namespaces, next_cluster_id, namespaces.drop, namespaces.undrop)


async def test_a_link_down_marks_the_link_down_and_it_heals(
        namespaces: NetnsPair, next_cluster_id: Callable[[], int]) -> None:
    await _partition_and_heal(namespaces, next_cluster_id, namespaces.link_down,
                              namespaces.link_up)
