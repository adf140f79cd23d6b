"""CRC-32C of TCP transfers between two real daemons, with a relay in the data
path that damages one byte in flight.

The prompt daemon listens on 127.0.0.2 and advertises 127.0.0.1, where two
relays forward its peer port and its data port; so the decoder daemon's data
streams run through a relay that can flip a payload byte. The decoder daemon
has ``[transfer] checksum = true``: calls that pass nothing are checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import pytest_asyncio

from hixl_client import (
    Cache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    DataType,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
)
from hixl_service.config import dump_toml
from hixl_service.testing import DaemonProcess
from tests.clusters import cluster_info
from tests.native._native_support import REPLY, REQUEST, FlipRelay

from ._metrics_support import ascrape, value
from .conftest import daemon_process, fill_random, logged, options

pytestmark = pytest.mark.asyncio

KIB = 1 << 10
MISMATCH = "CRC-32C did not match"


@dataclass
class Relayed:
    prompt_daemon: DaemonProcess
    decoder_daemon: DaemonProcess
    data: FlipRelay


@pytest.fixture(scope="module")
def relayed() -> Iterator[Relayed]:
    data = FlipRelay(0, target_host="127.0.0.2")
    peer = FlipRelay(0, target_host="127.0.0.2")
    try:
        with daemon_process(server__peer_host="127.0.0.2", server__advertise_host="127.0.0.1",
                            server__data_port=data.port, server__peer_port=peer.port,
                            server__peer_lane=False,
                            metrics__listen="127.0.0.1:0") as prompt_daemon, \
                daemon_process(transfer__checksum=True,
                               metrics__listen="127.0.0.1:0") as decoder_daemon:
            yield Relayed(prompt_daemon, decoder_daemon, data)
    finally:
        data.close()
        peer.close()


@dataclass
class Clusters:
    prompt: LLMDataDist
    decoder: LLMDataDist
    relay: FlipRelay
    decoder_daemon: DaemonProcess
    prompt_daemon: DaemonProcess


@contextlib.asynccontextmanager
async def linked(relayed: Relayed, next_cluster_id: Callable[[], int],
                 remote_accessible: bool = False) -> AsyncIterator[Clusters]:
    prompt = LLMDataDist(LLMRole.PROMPT, next_cluster_id(),
                         daemon=relayed.prompt_daemon.client_target)
    decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(),
                          daemon=relayed.decoder_daemon.client_target)
    await prompt.init(options(remote_accessible=remote_accessible))
    await decoder.init(options(remote_accessible=remote_accessible))
    try:
        status, results = await decoder.link_clusters(
            [cluster_info(prompt.cluster_id, relayed.prompt_daemon.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS, results
        yield Clusters(prompt, decoder, relayed.data, relayed.decoder_daemon,
                       relayed.prompt_daemon)
    finally:
        await decoder.finalize()
        await prompt.finalize()


@pytest_asyncio.fixture
async def clusters(relayed: Relayed, next_cluster_id: Callable[[], int]
                   ) -> AsyncIterator[Clusters]:
    async with linked(relayed, next_cluster_id) as made:
        yield made


def tensors(cache: Cache) -> list[np.ndarray]:
    return [np.frombuffer(cache.tensor_view(i), dtype=np.uint8).copy()
            for i in range(cache.cache_desc.num_tensors)]


# Two tensors of 32 KiB: one contiguous 64 KiB extent, one range on the wire.
DESC = CacheDesc(2, [1, 32 * KIB], DataType.DT_UINT8)


async def test_a_pull_damaged_in_flight_fails_and_the_next_one_lands(clusters: Clusters) -> None:
    key = CacheKey(clusters.prompt.cluster_id, req_id=1)
    src = await clusters.prompt.cache_manager.allocate_cache(DESC, [key])
    expected = fill_random(src, 1)
    dst = await clusters.decoder.cache_manager.allocate_cache(DESC)
    by_id = CacheKeyByIdAndIndex(clusters.prompt.cluster_id, src.cache_id)
    before = await mismatches(clusters)
    try:
        clusters.relay.arm(REPLY.size + 1000, "s2c")
        with pytest.raises(LLMException) as info:  # the daemon's checksum = true
            await clusters.decoder.cache_manager.pull_cache(by_id, dst)
        assert info.value.status_code == LLMStatusCode.LLM_LINK_FAILED
        assert MISMATCH in str(info.value)
        assert clusters.relay.flipped.is_set()
        assert logged(clusters.decoder_daemon, MISMATCH)
        # The link is still up: the same pull, checked again, lands exactly.
        await clusters.decoder.cache_manager.pull_cache(by_id, dst, checksum=True)
        for got, want in zip(tensors(dst), expected, strict=True):
            np.testing.assert_array_equal(got, want)
        # checksum=False beats the daemon's default: the damage lands unseen.
        clusters.relay.arm(REPLY.size + 1000, "s2c")
        await clusters.decoder.cache_manager.pull_cache(by_id, dst, checksum=False)
        assert clusters.relay.flipped.is_set()
        damaged = tensors(dst)[0]
        assert damaged[1000] == expected[0][1000] ^ 1
        damaged[1000] ^= 1
        np.testing.assert_array_equal(damaged, expected[0])
        # A pull by key is checked the same way, and its key survives the failure.
        clusters.relay.arm(REPLY.size + 5000, "s2c")
        with pytest.raises(LLMException) as info:
            await clusters.decoder.cache_manager.pull_cache(key, dst, checksum=True)
        assert info.value.status_code == LLMStatusCode.LLM_LINK_FAILED
        await clusters.decoder.cache_manager.pull_cache(key, dst, checksum=True)
        for got, want in zip(tensors(dst), expected, strict=True):
            np.testing.assert_array_equal(got, want)
        # the two pulls that failed, on the side that found them
        assert await mismatches(clusters) == (before[0] + 2, before[1])
    finally:
        await clusters.decoder.cache_manager.deallocate_cache(dst)
        await clusters.prompt.cache_manager.deallocate_cache(src)


async def mismatches(clusters: Clusters) -> tuple[float, float]:
    """(the decoder daemon's calls failed by their CRC, the prompt daemon's
    refused writes) from their /metrics."""
    decoder = await ascrape(clusters.decoder_daemon)
    prompt = await ascrape(clusters.prompt_daemon)
    return (value(decoder, "hixl_checksum_mismatches_total", side="initiator"),
            value(prompt, "hixl_checksum_mismatches_total", side="target"))


async def test_repeated_pulls_keep_the_checksum_of_their_shape(clusters: Clusters) -> None:
    """A pull by cache id repeats by handle; the handle's transfers are checked
    as the call that made it asked."""
    src = await clusters.prompt.cache_manager.allocate_cache(CacheDesc(2, [4, 8 * KIB],
                                                                       DataType.DT_UINT8))
    expected = fill_random(src, 2)
    dst = await clusters.decoder.cache_manager.allocate_cache(CacheDesc(2, [4, 8 * KIB],
                                                                        DataType.DT_UINT8))
    try:
        for slot in range(4):
            key = CacheKeyByIdAndIndex(clusters.prompt.cluster_id, src.cache_id, slot)
            await clusters.decoder.cache_manager.pull_cache(key, dst, batch_index=slot,
                                                            checksum=True)
        clusters.relay.arm(REPLY.size + 100, "s2c")
        key = CacheKeyByIdAndIndex(clusters.prompt.cluster_id, src.cache_id, 3)
        with pytest.raises(LLMException) as info:
            await clusters.decoder.cache_manager.pull_cache(key, dst, batch_index=0,
                                                            checksum=True)
        assert info.value.status_code == LLMStatusCode.LLM_LINK_FAILED
        await clusters.decoder.cache_manager.pull_cache(key, dst, batch_index=0, checksum=True)
        for got, want in zip(tensors(dst), expected, strict=True):
            g, w = got.reshape(4, -1), want.reshape(4, -1)
            np.testing.assert_array_equal(g[0], w[3])
            np.testing.assert_array_equal(g[1:], w[1:])
    finally:
        await clusters.decoder.cache_manager.deallocate_cache(dst)
        await clusters.prompt.cache_manager.deallocate_cache(src)


async def test_a_push_damaged_in_flight_is_refused_by_the_far_daemon(
        relayed: Relayed, next_cluster_id: Callable[[], int]) -> None:
    async with linked(relayed, next_cluster_id, remote_accessible=True) as clusters:
        await _push_damaged(clusters)


async def _push_damaged(clusters: Clusters) -> None:
    dst = await clusters.prompt.cache_manager.allocate_cache(DESC)
    src = await clusters.decoder.cache_manager.allocate_cache(DESC)
    expected = fill_random(src, 3)
    target = CacheKeyByIdAndIndex(clusters.prompt.cluster_id, dst.cache_id)
    before = await mismatches(clusters)
    try:
        # Past the request header and its range list, into the payload.
        clusters.relay.arm(REQUEST.size + 2048, "c2s")
        with pytest.raises(LLMException) as info:
            await clusters.decoder.cache_manager.push_cache(target, src, checksum=True)
        assert info.value.status_code == LLMStatusCode.LLM_LINK_FAILED
        assert MISMATCH in str(info.value)
        await clusters.decoder.cache_manager.push_cache(target, src, checksum=True)
        for got, want in zip(tensors(dst), expected, strict=True):
            np.testing.assert_array_equal(got, want)
        # found by the far daemon, which refused the write; failed the call here
        assert await mismatches(clusters) == (before[0] + 1, before[1] + 1)
    finally:
        await clusters.decoder.cache_manager.deallocate_cache(src)
        await clusters.prompt.cache_manager.deallocate_cache(dst)


def reload_checksum(daemon: DaemonProcess, on: bool) -> None:
    """Rewrite the daemon's [transfer] checksum and SIGHUP it; wait for the report."""
    settings = {name: dict(fields) for name, fields in daemon.settings.items()}
    settings.setdefault("transfer", {})["checksum"] = on
    daemon.config_path.write_text(dump_toml(settings))
    os.kill(daemon.pid, signal.SIGHUP)
    # each direction is reloaded once in this module's daemon, so its line is new
    assert logged(daemon, f"reloaded: transfer.checksum {not on} -> {on}", 10), \
        daemon.log_tail()


async def test_the_daemons_checksum_default_reloads_on_sighup(clusters: Clusters) -> None:
    src = await clusters.prompt.cache_manager.allocate_cache(DESC)
    expected = fill_random(src, 4)
    dst = await clusters.decoder.cache_manager.allocate_cache(DESC)
    by_id = CacheKeyByIdAndIndex(clusters.prompt.cluster_id, src.cache_id)
    try:
        await asyncio.to_thread(reload_checksum, clusters.decoder_daemon, False)
        clusters.relay.arm(REPLY.size + 1000, "s2c")
        await clusters.decoder.cache_manager.pull_cache(by_id, dst)  # unchecked now
        assert clusters.relay.flipped.is_set()
        assert tensors(dst)[0][1000] == expected[0][1000] ^ 1
    finally:
        await asyncio.to_thread(reload_checksum, clusters.decoder_daemon, True)
    # Another destination, so not a repeat of the unchecked pull (a repeat keeps
    # the choice of the call it repeats).
    other = await clusters.decoder.cache_manager.allocate_cache(DESC)
    try:
        clusters.relay.arm(REPLY.size + 1000, "s2c")
        with pytest.raises(LLMException) as info:  # checked again, as the daemon starts
            await clusters.decoder.cache_manager.pull_cache(by_id, other)
        assert MISMATCH in str(info.value)
    finally:
        await clusters.decoder.cache_manager.deallocate_cache(other)
        await clusters.decoder.cache_manager.deallocate_cache(dst)
        await clusters.prompt.cache_manager.deallocate_cache(src)
