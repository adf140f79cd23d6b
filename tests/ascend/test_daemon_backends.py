"""The same end-to-end transfers on both backends: host (real) and hccl (the CANN double),
the latter one-sided and, on a double without the one-sided API, two-sided.

Each backend gets a pair of daemons for the module; every test links a fresh
prompt and decoder cluster across them, moves bytes with the client's API and
checks them byte for byte through `TensorIO` (views on the host backend, ACL
copies at ``tensor_addrs`` on the hccl one).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from hixl_client import (
    BlocksCacheKey,
    Cache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    DataType,
    DeviceShareableBuffer,
    LayerSynchronizer,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
    Placement,
    ShareableBuffer,
    TransferConfig,
    TransferWithCacheKeyConfig,
    alloc_device_shareable,
    alloc_shareable,
)
from hixl_service.testing import DaemonProcess

from ..integration.conftest import daemon_status
from .daemons import BACKENDS, TensorIO, cluster_info, daemon_process, options

pytestmark = pytest.mark.asyncio

OK = LLMStatusCode.LLM_SUCCESS
IO = TensorIO()
_ids = itertools.count(7000)


# hccl links go one-sided (HcclBatchGet / HcclBatchPut) where CANN supports it;
# "hccl-two-sided" runs the same tests with the double's one-sided API off
# (HIXL_DOUBLE_ONE_SIDED=0: HCCL_E_NOT_SUPPORT): the fallback.
VARIANTS = (*BACKENDS, "hccl-two-sided")


@dataclass
class Daemons:
    backend: str
    prompt: DaemonProcess
    decoder: DaemonProcess
    data_path: str = ""  # hccl: "one-sided" or "two-sided"


@pytest.fixture(scope="module", params=VARIANTS)
def daemons(request: pytest.FixtureRequest, double_dir: Path,
            runtime: object) -> Iterator[Daemons]:
    backend, _, path = str(request.param).partition("-")
    env = {"HIXL_DOUBLE_ONE_SIDED": "0"} if path else None
    with daemon_process(backend, double_dir, env) as prompt, \
            daemon_process(backend, double_dir, env) as decoder:
        data_path = "" if backend == "host" else "two-sided" if path else "one-sided"
        yield Daemons(backend, prompt, decoder, data_path)


@dataclass
class Linked:
    backend: str
    prompt: LLMDataDist
    decoder: LLMDataDist
    data_path: str = ""


async def _linked(daemons: Daemons, remote_accessible: bool = False,
                  host_pool_bytes: int = 0, same_daemon: bool = False) -> Linked:
    prompt = LLMDataDist(LLMRole.PROMPT, next(_ids), daemon=daemons.prompt.client_target)
    decoder_daemon = daemons.prompt if same_daemon else daemons.decoder
    decoder = LLMDataDist(LLMRole.DECODER, next(_ids), daemon=decoder_daemon.client_target)
    await prompt.init(options(device_id=0, remote_accessible=remote_accessible,
                              host_pool_bytes=host_pool_bytes))
    # Between daemons the decoder uses another device than the prompt: links cross
    # devices. Inside one daemon both use device 0 (ACL copies stay on one device).
    await decoder.init(options(device_id=0 if same_daemon else 1,
                               remote_accessible=remote_accessible,
                               host_pool_bytes=host_pool_bytes))
    status, results = await decoder.link_clusters(
        [cluster_info(prompt.cluster_id, daemons.prompt.peer_address)], timeout=5000)
    assert status == OK, results
    return Linked(daemons.backend, prompt, decoder, daemons.data_path)


@pytest_asyncio.fixture
async def linked(daemons: Daemons) -> AsyncIterator[Linked]:
    made = await _linked(daemons)
    yield made
    await made.decoder.finalize()
    await made.prompt.finalize()


@pytest_asyncio.fixture
async def accessible(daemons: Daemons) -> AsyncIterator[Linked]:
    made = await _linked(daemons, remote_accessible=True)
    yield made
    await made.decoder.finalize()
    await made.prompt.finalize()


def fill(cache: Cache) -> list[bytes]:
    contents = []
    for i in range(cache.cache_desc.num_tensors):
        data = os.urandom(cache.cache_desc.size)
        IO.write(cache, i, data)
        contents.append(data)
    return contents


def block(cache: Cache, tensor: int, index: int) -> bytes:
    stride = cache.cache_desc.size // cache.cache_desc.shape[0]
    return IO.read(cache, tensor, stride, index * stride)


async def test_transport_is_the_backends(linked: Linked) -> None:
    expected = "hccl" if linked.backend == "hccl" else "tcp"
    assert linked.decoder.link_transports == {linked.prompt.cluster_id: expected}


async def test_hccl_links_say_which_path_they_use(linked: Linked, daemons: Daemons) -> None:
    for daemon, direction in ((daemons.decoder, "outbound"), (daemons.prompt, "inbound")):
        status = await daemon_status(daemon.client_target)
        (link,) = [link for link in status.links if link.direction == direction
                   and linked.decoder.cluster_id in (link.local_cluster_id,
                                                     link.remote_cluster_id)]
        assert (link.transport, link.data_path) == (
            "hccl" if linked.backend == "hccl" else "tcp", linked.data_path)


async def test_peer_calls_of_a_transfer_take_the_peer_lane(linked: Linked,
                                                           daemons: Daemons) -> None:
    before = (await daemon_status(daemons.prompt.client_target)).peer_lane_calls
    desc = CacheDesc(2, [2, 4096], DataType.DT_UINT8)
    src = await linked.prompt.cache_manager.allocate_cache(desc)
    dst = await linked.decoder.cache_manager.allocate_cache(desc)
    for _ in range(2):
        await linked.decoder.cache_manager.pull_cache(
            CacheKeyByIdAndIndex(linked.prompt.cluster_id, src.cache_id, 0), dst)
    calls = (await daemon_status(daemons.prompt.client_target)).peer_lane_calls - before
    # tcp: one resolve, then the link remembers the cache; one-sided hccl: also where
    # the region lies, once; two-sided hccl: a post per pull instead.
    assert calls == {"": 1, "one-sided": 2, "two-sided": 3}[linked.data_path]


async def test_pull_cache_by_key_and_by_id(linked: Linked) -> None:
    desc = CacheDesc(4, [2, 4096], DataType.DT_FLOAT16)  # 2 slots of 8 KiB per tensor
    key = CacheKey(linked.prompt.cluster_id, req_id=5)
    src = await linked.prompt.cache_manager.allocate_cache(desc, [key])
    contents = fill(src)
    dst = await linked.decoder.cache_manager.allocate_cache(desc)
    await linked.decoder.cache_manager.pull_cache(key, dst, batch_index=1)
    slot = desc.size // 2
    for i in range(4):
        assert IO.read(dst, i, slot, slot) == contents[i][:slot]  # slot 0 into slot 1
    # the key was pulled by every tensor: LLM-DataDist drops it
    with pytest.raises(LLMException) as info:
        await linked.decoder.cache_manager.pull_cache(key, dst)
    assert info.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    by_id = CacheKeyByIdAndIndex(linked.prompt.cluster_id, src.cache_id, 1)
    await linked.decoder.cache_manager.pull_cache(by_id, dst, batch_index=0)
    for i in range(4):
        assert IO.read(dst, i, slot) == contents[i][slot:]
    await linked.prompt.cache_manager.deallocate_cache(src)
    await linked.decoder.cache_manager.deallocate_cache(dst)


async def test_pull_blocks_with_gaps_and_layer_ranges(linked: Linked) -> None:
    desc = CacheDesc(4, [32, 1024], DataType.DT_UINT8)  # 4 tensors x 32 blocks of 1 KiB
    src = await linked.prompt.cache_manager.allocate_blocks_cache(
        desc, BlocksCacheKey(linked.prompt.cluster_id, model_id=2))
    fill(src)
    dst = await linked.decoder.cache_manager.allocate_blocks_cache(desc)
    before = [IO.read(dst, i) for i in range(4)]
    src_blocks, dst_blocks = [0, 1, 2, 9, 31], [4, 5, 6, 0, 20]
    await linked.decoder.cache_manager.pull_blocks(
        BlocksCacheKey(linked.prompt.cluster_id, 2), dst, src_blocks, dst_blocks)
    for i in range(4):
        for s, d in zip(src_blocks, dst_blocks, strict=True):
            assert block(dst, i, d) == block(src, i, s)
        assert block(dst, i, 1) == before[i][1024:2048]  # untouched
    await linked.decoder.cache_manager.pull_blocks(
        BlocksCacheKey(linked.prompt.cluster_id, 2), dst, [3], [3],
        src_layer_range=range(1, 2), dst_layer_range=range(1, 2))
    assert block(dst, 3, 3) == block(src, 3, 3)
    assert block(dst, 0, 3) == before[0][3072:4096]
    await linked.prompt.cache_manager.deallocate_blocks_cache(src)
    await linked.decoder.cache_manager.deallocate_blocks_cache(dst)


async def test_pull_slot_into_blocks(linked: Linked) -> None:
    src = await linked.prompt.cache_manager.allocate_cache(
        CacheDesc(2, [1, 4096], DataType.DT_UINT8), [CacheKey(linked.prompt.cluster_id, 8)])
    contents = fill(src)
    dst = await linked.decoder.cache_manager.allocate_blocks_cache(
        CacheDesc(2, [16, 1024], DataType.DT_UINT8))
    await linked.decoder.cache_manager.pull_blocks(CacheKey(linked.prompt.cluster_id, 8), dst,
                                                   [], [7, 2, 3, 11])
    for i in range(2):
        got = b"".join(block(dst, i, b) for b in (7, 2, 3, 11))
        assert got == contents[i]
    await linked.prompt.cache_manager.deallocate_cache(src)
    await linked.decoder.cache_manager.deallocate_blocks_cache(dst)


async def test_push_blocks_and_push_cache(accessible: Linked) -> None:
    receiver, pusher = accessible.prompt, accessible.decoder
    desc = CacheDesc(2, [16, 2048], DataType.DT_UINT8)
    target = await receiver.cache_manager.allocate_blocks_cache(
        desc, BlocksCacheKey(receiver.cluster_id, 9))
    src = await pusher.cache_manager.allocate_blocks_cache(desc)
    fill(src)
    await pusher.cache_manager.push_blocks(BlocksCacheKey(receiver.cluster_id, 9), src,
                                           [0, 1, 15], [3, 4, 0])
    for i in range(2):
        for s, d in ((0, 3), (1, 4), (15, 0)):
            assert block(target, i, d) == block(src, i, s)
    slots = CacheDesc(4, [2, 512], DataType.DT_FLOAT16)
    slot_target = await receiver.cache_manager.allocate_cache(slots)
    slot_src = await pusher.cache_manager.allocate_cache(slots)
    fill(slot_src)
    await pusher.cache_manager.push_cache(
        CacheKeyByIdAndIndex(receiver.cluster_id, slot_target.cache_id, 1), slot_src, 0)
    for i in range(4):
        assert block(slot_target, i, 1) == block(slot_src, i, 0)
    for cache in (target, slot_target):
        await receiver.cache_manager.deallocate_cache(cache) if not cache.is_blocks_cache \
            else await receiver.cache_manager.deallocate_blocks_cache(cache)
    await pusher.cache_manager.deallocate_blocks_cache(src)
    await pusher.cache_manager.deallocate_cache(slot_src)


class Ready(LayerSynchronizer):
    def __init__(self) -> None:
        self.calls: list[int] = []

    def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
        self.calls.append(layer_index)
        return True


async def test_layerwise_transfer(accessible: Linked) -> None:
    sender, receiver = accessible.decoder, accessible.prompt
    desc = CacheDesc(8, [2, 2048], DataType.DT_FLOAT16)  # 4 layers of K and V, 2 slots
    src = await sender.cache_manager.allocate_cache(desc)
    fill(src)
    dst = await receiver.cache_manager.allocate_cache(desc)
    sync = Ready()
    config = TransferWithCacheKeyConfig(
        CacheKeyByIdAndIndex(receiver.cluster_id, dst.cache_id, 1), range(4), range(4),
        src_batch_index=0)
    task = sender.cache_manager.transfer_cache_async(src, sync, [config])
    assert await task == [OK]
    assert sync.calls == [0, 1, 2, 3]
    for i in range(8):
        assert block(dst, i, 1) == block(src, i, 0)
    await sender.cache_manager.deallocate_cache(src)
    await receiver.cache_manager.deallocate_cache(dst)


async def test_copies_and_swaps_inside_one_cluster(daemons: Daemons) -> None:
    dd = LLMDataDist(LLMRole.DECODER, next(_ids), daemon=daemons.decoder.client_target)
    await dd.init(options(device_id=1, host_pool_bytes=4 << 20))
    try:
        cm = dd.cache_manager
        device = await cm.allocate_blocks_cache(CacheDesc(2, [16, 1024], DataType.DT_UINT8))
        host = await cm.allocate_blocks_cache(
            CacheDesc(2, [8, 1024], DataType.DT_UINT8, Placement.HOST))
        fill(device)
        await cm.copy_blocks(device, {0: [9, 10], 1: [11]})
        for i in range(2):
            assert block(device, i, 9) == block(device, i, 0) == block(device, i, 10)
            assert block(device, i, 11) == block(device, i, 1)
        await cm.swap_blocks(device, host, {4: 0, 5: 1, 15: 7})  # swap out
        for i in range(2):
            for d, h in ((4, 0), (5, 1), (15, 7)):
                assert block(host, i, h) == block(device, i, d)
        IO.write(host, 1, b"\x5a" * 1024, 2 * 1024)
        await cm.swap_blocks(host, device, {2: 12})  # swap in
        assert block(device, 1, 12) == b"\x5a" * 1024
        # CPU caches: over the host pool, and over the caller's shareable memory
        cpu = Cache.create_cpu_cache(host.cache_desc, host.tensor_addrs)
        await cm.swap_blocks(device, cpu, {3: 5})
        assert block(host, 0, 5) == block(device, 0, 3)
        with alloc_shareable(2 * 8 * 1024) as shared:
            mine = Cache.create_cpu_cache(host.cache_desc,
                                          [shared.address, shared.address + 8 * 1024])
            await cm.swap_blocks(device, mine, {6: 2})
            assert bytes(shared.view(8 * 1024 + 2 * 1024, 1024)) == block(device, 1, 6)
        slots = CacheDesc(2, [2, 4096], DataType.DT_UINT8)
        a = await cm.allocate_cache(slots)
        b = await cm.allocate_cache(slots)
        fill(a)
        await cm.copy_cache(b, a, dst_batch_index=1, src_batch_index=0)
        for i in range(2):
            assert block(b, i, 1) == block(a, i, 0)
        for cache in (a, b):
            await cm.deallocate_cache(cache)
        await cm.deallocate_blocks_cache(device)
        await cm.deallocate_blocks_cache(host)
    finally:
        await dd.finalize()


async def test_pull_between_clusters_of_one_daemon(daemons: Daemons) -> None:
    made = await _linked(daemons, same_daemon=True)
    try:
        assert made.decoder.link_transports == {made.prompt.cluster_id: "local"}
        desc = CacheDesc(2, [1, 8192], DataType.DT_UINT8)
        src = await made.prompt.cache_manager.allocate_cache(desc, [CacheKey(
            made.prompt.cluster_id, 3)])
        contents = fill(src)
        dst = await made.decoder.cache_manager.allocate_cache(desc)
        await made.decoder.cache_manager.pull_cache(CacheKey(made.prompt.cluster_id, 3), dst)
        assert [IO.read(dst, i) for i in range(2)] == contents
    finally:
        await made.decoder.finalize()
        await made.prompt.finalize()


async def test_device_memory_has_no_host_view(linked: Linked) -> None:
    cache = await linked.decoder.cache_manager.allocate_cache(
        CacheDesc(1, [1, 64], DataType.DT_UINT8))
    if linked.backend == "hccl":
        with pytest.raises(LLMException, match="no host view") as info:
            cache.tensor_view(0)
        assert info.value.status_code == LLMStatusCode.LLM_FEATURE_NOT_ENABLED
    else:
        assert len(cache.tensor_view(0)) == 64
    await linked.decoder.cache_manager.deallocate_cache(cache)


async def test_pull_from_registered_memory(linked: Linked) -> None:
    desc = CacheDesc(2, [1, 8192], DataType.DT_UINT8,
                     Placement.DEVICE if linked.backend == "hccl" else Placement.HOST)
    buffer: ShareableBuffer | DeviceShareableBuffer = (
        alloc_device_shareable(2 * desc.size, device_id=0) if linked.backend == "hccl"
        else alloc_shareable(2 * desc.size))
    try:
        key = CacheKey(linked.prompt.cluster_id, req_id=21)
        src = await linked.prompt.cache_manager.register_cache(
            desc, [buffer.address, buffer.address + desc.size], [key])
        contents = fill(src)  # writes into the caller's own buffer
        dst = await linked.decoder.cache_manager.allocate_cache(
            CacheDesc(2, [1, 8192], DataType.DT_UINT8))
        await linked.decoder.cache_manager.pull_cache(key, dst)
        assert [IO.read(dst, i) for i in range(2)] == contents
        await linked.prompt.cache_manager.unregister_cache(src.cache_id)
        await linked.decoder.cache_manager.deallocate_cache(dst)
    finally:
        await linked.prompt.finalize()  # the daemon lets go of the buffer before it is freed
        buffer.close()


DEVICE_DESC = CacheDesc(1, [1, 8192], DataType.DT_UINT8, Placement.DEVICE)


@pytest_asyncio.fixture
async def device_buffer(linked: Linked) -> AsyncIterator[DeviceShareableBuffer]:
    """A device buffer for the prompt cluster of an hccl pair (other backends
    skip); the cluster is finalized before the buffer is freed."""
    if linked.backend != "hccl":
        pytest.skip("device buffers and hccl links only")
    buffer = alloc_device_shareable(DEVICE_DESC.size, device_id=0)
    try:
        yield buffer
    finally:
        await linked.prompt.finalize()
        buffer.close()


async def test_a_device_buffer_is_freed_after_the_daemon_closed_its_import(
        linked: Linked, device_buffer: DeviceShareableBuffer) -> None:
    """Closing an alloc_device_shareable buffer while its cluster lives: the
    daemon closes its import first (the double refuses the exporter's
    aclrtIpcMemClose before that, as CANN asks), and not while caches lie in it."""
    src = await linked.prompt.cache_manager.register_cache(DEVICE_DESC, [device_buffer.address])
    contents = fill(src)
    with pytest.raises(BufferError, match="unregister them"):
        device_buffer.close()  # a cache lies in it: the daemon keeps its import
    dst = await linked.decoder.cache_manager.allocate_cache(DEVICE_DESC)
    await linked.decoder.cache_manager.pull_cache(
        CacheKeyByIdAndIndex(linked.prompt.cluster_id, src.cache_id, 0), dst)
    assert [IO.read(dst, 0)] == contents  # still the buffer's bytes
    await linked.prompt.cache_manager.unregister_cache(src.cache_id)
    device_buffer.close()  # no finalize first
    assert device_buffer.buffer.closed
    again = await linked.prompt.cache_manager.allocate_cache(DEVICE_DESC)  # the cluster goes on
    await linked.prompt.cache_manager.deallocate_cache(again)
    await linked.decoder.cache_manager.deallocate_cache(dst)


async def test_memory_registered_after_the_link_moves_one_sided(
        linked: Linked, daemons: Daemons, device_buffer: DeviceShareableBuffer) -> None:
    """The link was prepared before this memory existed: its first pull prepares a
    new communicator that binds it; later pulls ask the far daemon nothing."""
    src = await linked.prompt.cache_manager.register_cache(DEVICE_DESC, [device_buffer.address])
    contents = fill(src)
    dst = await linked.decoder.cache_manager.allocate_cache(DEVICE_DESC)
    ref = CacheKeyByIdAndIndex(linked.prompt.cluster_id, src.cache_id, 0)
    await linked.decoder.cache_manager.pull_cache(ref, dst)
    assert [IO.read(dst, 0)] == contents
    before = (await daemon_status(daemons.prompt.client_target)).peer_lane_calls
    IO.write(src, 0, contents[0][::-1])
    await linked.decoder.cache_manager.pull_cache(ref, dst)
    assert IO.read(dst, 0) == contents[0][::-1]
    calls = (await daemon_status(daemons.prompt.client_target)).peer_lane_calls - before
    assert calls == (0 if linked.data_path == "one-sided" else 1)  # two-sided: a post
    await linked.prompt.cache_manager.unregister_cache(src.cache_id)
    await linked.decoder.cache_manager.deallocate_cache(dst)


async def test_transfer_config_to_raw_addresses_of_the_receiver(linked: Linked) -> None:
    """The receiver's tensor_addrs (device addresses of its own process on the hccl
    backend) name where layers land; its daemon translates them."""
    sender, receiver = linked.decoder, linked.prompt
    desc = CacheDesc(4, [2, 1024], DataType.DT_UINT8)  # 2 layers of K and V, 2 slots
    src = await sender.cache_manager.allocate_cache(desc)
    fill(src)
    dst = await receiver.cache_manager.allocate_cache(desc)
    stride = desc.size // 2
    addrs = [a + stride for a in dst.tensor_addrs]  # every tensor's slot 1
    task = sender.cache_manager.transfer_cache_async(
        src, Ready(), [TransferConfig(receiver.cluster_id, addrs, range(2), src_batch_index=0)])
    assert await task == [OK]
    for i in range(4):
        assert block(dst, i, 1) == block(src, i, 0)
    outside = TransferConfig(receiver.cluster_id, [1 << 40, 1 << 40], range(1))
    assert await sender.cache_manager.transfer_cache_async(src, Ready(), [outside]) == [
        LLMStatusCode.LLM_PARAM_INVALID]
    await sender.cache_manager.deallocate_cache(src)
    await receiver.cache_manager.deallocate_cache(dst)


async def test_a_reallocated_blocks_cache_is_found_again(linked: Linked) -> None:
    """The linking daemon remembers where a blocks key lives; after the owner frees
    and reallocates it, the remembered region is refused and resolved afresh."""
    desc = CacheDesc(2, [8, 1024], DataType.DT_UINT8)
    key = BlocksCacheKey(linked.prompt.cluster_id, model_id=4)
    dst = await linked.decoder.cache_manager.allocate_blocks_cache(desc)
    for round_ in range(2):
        src = await linked.prompt.cache_manager.allocate_blocks_cache(desc, key)
        fill(src)
        await linked.decoder.cache_manager.pull_blocks(key, dst, [round_], [5])
        assert block(dst, 1, 5) == block(src, 1, round_)
        await linked.prompt.cache_manager.deallocate_blocks_cache(src)
    await linked.decoder.cache_manager.deallocate_blocks_cache(dst)
