"""Issue 30 between two hccl daemons under the CANN double:

* defect 2: the daemon that *accepted* a one-sided link frees device memory
  bound to its communicator; the linking daemon's half (whose mapping of that
  memory lives until its HcclCommDestroy) is destroyed before the release
  returns (Peer.HcclTeardown); and the other way round, the *linking* daemon
  frees memory bound to its communicator, and the accepting daemon's half is
  destroyed before the release returns (Peer.HcclDestroy);
* defect 6: two daemons linking to each other at the same moment, each of whose
  HCCL creations blocks until the other rank joins, both link (Peer.HcclReserve
  and the tie-break of ascend/gate.py).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hixl_client import (
    CacheDesc,
    CacheKeyByIdAndIndex,
    DataType,
    LLMDataDist,
    LLMRole,
    LLMStatusCode,
    Placement,
    alloc_device_shareable,
)
from hixl_service.testing import DaemonProcess

from ..integration.conftest import daemon_status
from .daemons import TensorIO, cluster_info, daemon_process, options

pytestmark = pytest.mark.asyncio

OK = LLMStatusCode.LLM_SUCCESS
IO = TensorIO()
DESC = CacheDesc(1, [1, 8192], DataType.DT_UINT8, Placement.DEVICE)
_ids = itertools.count(9100)


@pytest.fixture(scope="module")
def pair(double_dir: Path, runtime: object) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    with daemon_process("hccl", double_dir) as first, \
            daemon_process("hccl", double_dir) as second:
        yield first, second


async def _outbound_alive(daemon: DaemonProcess, cluster_id: int) -> list[bool]:
    status = await daemon_status(daemon.client_target)
    return [link.alive for link in status.links
            if link.direction == "outbound" and link.local_cluster_id == cluster_id]


async def _inbound_alive(daemon: DaemonProcess, cluster_id: int) -> list[bool]:
    status = await daemon_status(daemon.client_target)
    return [link.alive for link in status.links
            if link.direction == "inbound" and link.local_cluster_id == cluster_id]


async def test_freeing_bound_memory_destroys_the_linking_half_first(
        pair: tuple[DaemonProcess, DaemonProcess]) -> None:
    prompt_daemon, decoder_daemon = pair
    prompt = LLMDataDist(LLMRole.PROMPT, next(_ids), daemon=prompt_daemon.client_target)
    decoder = LLMDataDist(LLMRole.DECODER, next(_ids), daemon=decoder_daemon.client_target)
    await prompt.init(options(device_id=0))
    await decoder.init(options(device_id=1))
    buffer = alloc_device_shareable(DESC.size, device_id=0)
    try:
        status, results = await decoder.link_clusters(
            [cluster_info(prompt.cluster_id, prompt_daemon.peer_address)], timeout=5000)
        assert status == OK, results
        src = await prompt.cache_manager.register_cache(DESC, [buffer.address])
        data = os.urandom(DESC.size)
        IO.write(src, 0, data)
        dst = await decoder.cache_manager.allocate_cache(DESC)
        # prepares a communicator that binds the buffer on the prompt's (accepting) side
        await decoder.cache_manager.pull_cache(
            CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, 0), dst)
        assert IO.read(dst, 0) == data
        assert await _outbound_alive(decoder_daemon, decoder.cluster_id) == [True]
        await prompt.cache_manager.unregister_cache(src.cache_id)
        buffer.close()  # the prompt daemon closes its import: memory bound to the link
        # the linking daemon's half went before the accepting daemon freed the memory
        assert await _outbound_alive(decoder_daemon, decoder.cluster_id) == [False]
        # and the link goes on: its next pull builds and prepares a new communicator
        again = await prompt.cache_manager.allocate_cache(DESC)
        IO.write(again, 0, data[::-1])
        await decoder.cache_manager.pull_cache(
            CacheKeyByIdAndIndex(prompt.cluster_id, again.cache_id, 0), dst)
        assert IO.read(dst, 0) == data[::-1]
        assert await _outbound_alive(decoder_daemon, decoder.cluster_id) == [True]
    finally:
        await decoder.finalize()
        await prompt.finalize()
        if not buffer.buffer.closed:
            buffer.close()


async def test_the_linking_daemon_freeing_bound_memory_destroys_the_accepting_half_first(
        pair: tuple[DaemonProcess, DaemonProcess]) -> None:
    """The linking (decoder) daemon frees an imported buffer bound to its one-sided
    communicator: the prompt daemon's half, which maps that buffer until its
    HcclCommDestroy, is gone by the time the release returns (before, it lived
    until the link's next HcclConnect)."""
    prompt_daemon, decoder_daemon = pair
    prompt = LLMDataDist(LLMRole.PROMPT, next(_ids), daemon=prompt_daemon.client_target)
    decoder = LLMDataDist(LLMRole.DECODER, next(_ids), daemon=decoder_daemon.client_target)
    await prompt.init(options(device_id=0))
    await decoder.init(options(device_id=1))
    buffer = alloc_device_shareable(DESC.size, device_id=1)
    try:
        status, results = await decoder.link_clusters(
            [cluster_info(prompt.cluster_id, prompt_daemon.peer_address)], timeout=5000)
        assert status == OK, results
        src = await prompt.cache_manager.allocate_cache(DESC)
        data = os.urandom(DESC.size)
        IO.write(src, 0, data)
        dst = await decoder.cache_manager.register_cache(DESC, [buffer.address])
        key = CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, 0)
        # binds the buffer on the decoder's (linking) side of a prepared communicator
        await decoder.cache_manager.pull_cache(key, dst)
        assert IO.read(dst, 0) == data
        assert await _outbound_alive(decoder_daemon, decoder.cluster_id) == [True]
        assert await _inbound_alive(prompt_daemon, prompt.cluster_id) == [True]
        await decoder.cache_manager.unregister_cache(dst.cache_id)
        buffer.close()  # the decoder daemon closes its import: memory bound to the link
        # the accepting daemon's half went before the linking daemon freed the memory
        assert await _inbound_alive(prompt_daemon, prompt.cluster_id) == [False]
        assert await _outbound_alive(decoder_daemon, decoder.cluster_id) == [False]
        # and the link goes on: its next pull builds and prepares a new communicator
        again = await decoder.cache_manager.allocate_cache(DESC)
        await decoder.cache_manager.pull_cache(key, again)
        assert IO.read(again, 0) == data
        assert await _outbound_alive(decoder_daemon, decoder.cluster_id) == [True]
        assert await _inbound_alive(prompt_daemon, prompt.cluster_id) == [True]
    finally:
        await decoder.finalize()
        await prompt.finalize()
        if not buffer.buffer.closed:
            buffer.close()


async def test_two_daemons_link_to_each_other_at_once(
        pair: tuple[DaemonProcess, DaemonProcess]) -> None:
    """Each daemon links a cluster of its own to one of the other's, both at once:
    without the reservation each would hold its creation inside HCCL waiting for
    the other (the double's creation blocks until the peer rank joins, up to its
    connect timeout) and both links would fail."""
    first, second = pair
    clusters = [LLMDataDist(role, next(_ids), daemon=daemon.client_target)
                for daemon in (first, second) for role in (LLMRole.PROMPT, LLMRole.DECODER)]
    a_prompt, a_decoder, b_prompt, b_decoder = clusters
    for cluster, device in zip(clusters, (0, 1, 0, 1), strict=True):
        await cluster.init(options(device_id=device))
    try:
        for _ in range(3):  # each round builds two new communicators crosswise
            outcomes = await asyncio.gather(
                a_decoder.link_clusters([cluster_info(b_prompt.cluster_id,
                                                      second.peer_address)], timeout=8000),
                b_decoder.link_clusters([cluster_info(a_prompt.cluster_id,
                                                      first.peer_address)], timeout=8000))
            assert [status for status, _ in outcomes] == [OK, OK], outcomes
            assert await _outbound_alive(first, a_decoder.cluster_id) == [True]
            assert await _outbound_alive(second, b_decoder.cluster_id) == [True]
            await asyncio.gather(
                a_decoder.unlink_clusters([cluster_info(b_prompt.cluster_id,
                                                        second.peer_address)], timeout=5000),
                b_decoder.unlink_clusters([cluster_info(a_prompt.cluster_id,
                                                        first.peer_address)], timeout=5000))
    finally:
        for cluster in clusters:
            await cluster.finalize()
