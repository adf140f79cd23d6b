"""Caches (``caches``) on real host memory (memfd pools and shareable buffers of
``memory.host``, this process's own memory through ``memory.process``),
without a daemon: the native data server they expose regions to is a double
that records them. A cache takes an extent of its pool and a region, both come
back when it is freed, a refused allocation or registration leaves nothing
behind, and a cache is not freed while a transfer still moves its bytes."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from hixl_service.caches import Caches, NewCache, peer_writable
from hixl_service.cluster import Cluster, ClusterSettings
from hixl_service.memory.base import TENSOR_ALIGN, Pool, PoolSpec
from hixl_service.memory.host import HostBackend, SharedBuffer
from hixl_service.memory.process import ClientProcess, ProcessBackend, ProcessMemory
from hixl_service.pools import PoolManager
from hixl_service.regions import Regions
from hixl_service.registry import KeySpec
from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.types import LLMRole, Placement

POOL_BYTES = 1 << 20
PAGE_SHIFT = 12


class DataServerDouble:
    """Stands in for ``hixl_native.DataServer``: records the regions exposed to
    peers (their id, memory kind and writability); ``refuse`` makes the next
    registration fail."""

    def __init__(self) -> None:
        self.regions: dict[int, tuple[str, int, int, bool]] = {}
        self.refuse = False
        self._lock = threading.Lock()  # unregister runs on a worker thread

    def register_region(self, region_id: int, mapping: Any, offset: int, size: int,
                        cluster_id: int, writable: bool) -> None:
        self._add(region_id, "host", offset, size, writable)

    def register_process_region(self, region_id: int, span: Any, offset: int, size: int,
                                cluster_id: int, writable: bool) -> None:
        self._add(region_id, "process", offset, size, writable)

    def _add(self, region_id: int, kind: str, offset: int, size: int, writable: bool) -> None:
        if self.refuse:
            raise OSError("the data server refused the region")
        with self._lock:
            self.regions[region_id] = (kind, offset, size, writable)

    def unregister_region(self, region_id: int) -> None:
        with self._lock:
            del self.regions[region_id]


@dataclass
class World:
    caches: Caches
    cluster: Cluster
    pool: Pool
    server: DataServerDouble


def _cluster(remote_cache_accessible: bool = False) -> Cluster:
    return Cluster(7, LLMRole.PROMPT, "session", {},
                   ClusterSettings(remote_cache_accessible=remote_cache_accessible))


@pytest_asyncio.fixture
async def world() -> AsyncIterator[World]:
    server = DataServerDouble()
    pools = PoolManager(HostBackend(4 * POOL_BYTES, populate=False))
    cluster = _cluster()
    pool = await pools.create(cluster.cluster_id, Placement.HOST,
                              PoolSpec(POOL_BYTES, PAGE_SHIFT))
    cluster.pools[Placement.HOST] = pool
    caches = Caches({cluster.cluster_id: cluster}, Regions(server),  # type: ignore[arg-type]
                    pools, ProcessBackend())
    try:
        yield World(caches, cluster, pool, server)
    finally:
        await caches.free_all(cluster.registry.drain())
        for buffer in cluster.buffers.values():
            buffer.release()
        pool.release()


@pytest.fixture
def process() -> Iterator[ClientProcess]:
    me = ClientProcess(os.getpid(), os.getuid(), os.pidfd_open(os.getpid()))
    yield me
    me.close()


def _spec(num_tensors: int = 2, tensor_size: int = 1000, batch_size: int = 4) -> NewCache:
    return NewCache(num_tensors, tensor_size, batch_size, Placement.HOST)


def _shareable(size: int) -> int:
    fd = os.memfd_create("hixl-test")
    os.ftruncate(fd, size)
    return fd


@pytest.mark.parametrize(("accessible", "everyone_writes", "expected"),
                         [(True, False, True), (False, False, True), (True, True, True),
                          (False, True, False)])
def test_peers_write_only_remote_accessible_caches_in_that_mode(
        accessible: bool, everyone_writes: bool, expected: bool) -> None:
    # In remote-cache-accessible mode only caches marked so; otherwise every cache.
    assert peer_writable(_cluster(remote_cache_accessible=everyone_writes),
                         accessible) is expected


# ---- allocated caches ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_cache_takes_an_aligned_extent_and_a_region_and_gives_both_back(
        world: World) -> None:
    free_before = world.pool.allocator.free_bytes
    entry = world.caches.allocate(world.cluster, _spec(), [KeySpec(1, 0), KeySpec(2, 0)])
    assert all(offset % TENSOR_ALIGN == 0 for offset in entry.tensor_offsets)
    assert entry.tensor_offsets[1] - entry.tensor_offsets[0] >= 1000
    assert world.pool.allocator.free_bytes == free_before - entry.extent_size
    assert world.server.regions == {entry.region_id: ("host", entry.extent_offset,
                                                      entry.extent_size, True)}
    assert world.cluster.registry.lookup_key(KeySpec(2, 0)).batch_index == 1
    # The id reference goes; the keys still hold it.
    await world.caches.deallocate(world.cluster, entry.cache_id, blocks=False)
    assert world.server.regions and not entry.gone
    await world.caches.remove_key(world.cluster, KeySpec(1, 0))
    await world.caches.remove_key(world.cluster, KeySpec(2, 0))
    assert entry.gone and world.server.regions == {}
    assert world.pool.allocator.free_bytes == free_before


@pytest.mark.asyncio
async def test_a_refused_allocation_leaves_nothing_behind(world: World) -> None:
    free_before = world.pool.allocator.free_bytes
    refusals = [
        (_spec(batch_size=1), [KeySpec(1, 0), KeySpec(2, 0)], LLMStatusCode.LLM_PARAM_INVALID),
        (_spec(tensor_size=POOL_BYTES), [], LLMStatusCode.LLM_OUT_OF_MEMORY),
        (NewCache(1, 64, 1, Placement.DEVICE), [], LLMStatusCode.LLM_FEATURE_NOT_ENABLED),
    ]
    for spec, keys, status in refusals:
        with pytest.raises(LLMException) as info:
            world.caches.allocate(world.cluster, spec, keys)
        assert info.value.status_code is status
    world.server.refuse = True
    with pytest.raises(OSError):
        world.caches.allocate(world.cluster, _spec(), [])
    assert world.pool.allocator.free_bytes == free_before
    assert world.server.regions == {} and len(world.cluster.registry) == 0


@pytest.mark.asyncio
async def test_a_taken_key_is_refused_before_memory_is_taken(world: World) -> None:
    world.caches.allocate(world.cluster, _spec(), [KeySpec(1, 0)])
    used = world.pool.allocator.used_bytes
    with pytest.raises(LLMException, match="already bound") as info:
        world.caches.allocate(world.cluster, _spec(), [KeySpec(1, 0)])
    assert info.value.status_code is LLMStatusCode.LLM_PARAM_INVALID
    assert world.pool.allocator.used_bytes == used


@pytest.mark.asyncio
async def test_a_cache_is_not_freed_while_a_transfer_moves_its_bytes(world: World) -> None:
    free_before = world.pool.allocator.free_bytes
    entry = world.caches.allocate(world.cluster, _spec(), [])
    with entry.in_use():
        freeing = asyncio.ensure_future(
            world.caches.deallocate(world.cluster, entry.cache_id, blocks=False))
        await asyncio.sleep(0)  # its first step: the registry drops it at once
        assert entry.gone  # so the transfer starts nothing more in it
        with pytest.raises(LLMException) as info:
            entry.check_present()
        assert info.value.status_code is LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
        assert world.pool.allocator.free_bytes < free_before
    await freeing
    assert world.pool.allocator.free_bytes == free_before
    assert world.server.regions == {}


@pytest.mark.asyncio
async def test_a_key_pulled_whole_frees_a_cache_its_id_no_longer_holds(world: World) -> None:
    free_before = world.pool.allocator.free_bytes
    entry = world.caches.allocate(world.cluster, _spec(num_tensors=2), [KeySpec(5, 0)])
    await world.caches.deallocate(world.cluster, entry.cache_id, blocks=False)
    await world.caches.record_pull(world.cluster, KeySpec(5, 0), [0])
    assert not entry.gone  # tensor 1 not pulled yet
    await world.caches.record_pull(world.cluster, KeySpec(5, 0), [1])
    assert entry.gone and world.pool.allocator.free_bytes == free_before


# ---- registered user memory ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_shareable_buffer_is_registered_and_unmapped_once_dropped_and_unused(
        world: World) -> None:
    fd = _shareable(64 * 1024)
    try:
        buffer_id = await world.caches.add_user_buffer(world.cluster.upload_token, fd)
    finally:
        os.close(fd)
    buffer = world.cluster.buffers[buffer_id]
    assert isinstance(buffer, SharedBuffer)
    entry, orphans = await world.caches.register(
        world.cluster, _spec(num_tensors=2, tensor_size=4096), buffer_id, [8192, 0],
        [KeySpec(9, 0)], remote_accessible=False)
    assert orphans == [] and entry.registered and buffer.caches == 1
    # One region over both tensors; peers may write it although it is not
    # remote-accessible: outside that mode every cache is open to them.
    assert world.server.regions == {entry.region_id: ("host", 0, 8192 + 4096, True)}
    assert await world.caches.drop_user_buffer(world.cluster.upload_token, buffer_id)
    assert not buffer.closed  # a cache still lies in it
    with pytest.raises(LLMException, match="was closed") as info:
        await world.caches.register(world.cluster, _spec(num_tensors=1, tensor_size=64),
                                    buffer_id, [0], [], remote_accessible=False)
    assert info.value.status_code is LLMStatusCode.LLM_PARAM_INVALID
    await world.caches.unregister(world.cluster, entry.cache_id)
    assert buffer.closed and buffer_id not in world.cluster.buffers
    assert world.server.regions == {}


@pytest.mark.asyncio
@pytest.mark.parametrize(("offsets", "num_tensors", "message"), [
    ([0, 60 * 1024], 2, "runs past the end"),
    ([0], 2, "1 addresses for 2 tensors"),
])
async def test_a_registration_past_its_buffer_or_miscounted_is_refused(
        world: World, offsets: list[int], num_tensors: int, message: str) -> None:
    fd = _shareable(64 * 1024)
    try:
        buffer_id = await world.caches.add_user_buffer(world.cluster.upload_token, fd)
    finally:
        os.close(fd)
    with pytest.raises(LLMException, match=message) as info:
        await world.caches.register(world.cluster, _spec(num_tensors, 8192), buffer_id,
                                    offsets, [], remote_accessible=True)
    assert info.value.status_code is LLMStatusCode.LLM_PARAM_INVALID
    assert world.cluster.buffers[buffer_id].caches == 0 and world.server.regions == {}


@pytest.mark.asyncio
async def test_uploads_need_the_clusters_token_and_some_bytes(world: World) -> None:
    fd = _shareable(4096)
    empty = _shareable(0)
    try:
        with pytest.raises(LLMException, match="unknown upload token") as info:
            await world.caches.add_user_buffer(b"x" * 16, fd)
        assert info.value.status_code is LLMStatusCode.LLM_FAILED
        with pytest.raises(LLMException, match="empty") as info:
            await world.caches.add_user_buffer(world.cluster.upload_token, empty)
        assert info.value.status_code is LLMStatusCode.LLM_PARAM_INVALID
    finally:
        os.close(fd)
        os.close(empty)
    with pytest.raises(LLMException, match="not handed over") as info:
        await world.caches.drop_user_buffer(world.cluster.upload_token, 12345)
    assert info.value.status_code is LLMStatusCode.LLM_PARAM_INVALID
    with pytest.raises(LLMException, match="no host pool 99") as info:
        await world.caches.register(world.cluster, _spec(1, 64), 0, [0], [],
                                    remote_accessible=False, pool_id=99)
    assert info.value.status_code is LLMStatusCode.LLM_PARAM_INVALID


@pytest.mark.asyncio
async def test_engine_memory_of_the_bound_process_is_reached_and_revoked(
        world: World, process: ClientProcess) -> None:
    engine = np.arange(8192, dtype=np.uint8)
    addrs = [engine.ctypes.data, engine.ctypes.data + 4096]
    with pytest.raises(LLMException, match="did not bind its process") as info:
        await world.caches.register(world.cluster, _spec(2, 4096), 0, [], [],
                                    remote_accessible=True, client_addrs=addrs)
    assert info.value.status_code is LLMStatusCode.LLM_PARAM_INVALID
    world.caches.bind_process(world.cluster.upload_token, process)
    entry, _ = await world.caches.register(world.cluster, _spec(2, 4096), 0, [], [],
                                           remote_accessible=True, client_addrs=addrs)
    assert isinstance(entry.memory, ProcessMemory) and entry.tensor_offsets == [0, 4096]
    assert world.server.regions == {entry.region_id: ("process", 0, 8192, True)}
    await world.caches.unregister(world.cluster, entry.cache_id)
    assert entry.memory.closed and world.server.regions == {}
    other = ClientProcess(os.getppid(), os.getuid(), os.pidfd_open(os.getppid()))
    try:
        with pytest.raises(LLMException, match="another process") as info:
            world.caches.bind_process(world.cluster.upload_token, other)
        assert info.value.status_code is LLMStatusCode.LLM_PARAM_INVALID
    finally:
        other.close()
