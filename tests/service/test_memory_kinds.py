"""One ``Memory`` subtype per kind (``hixl_service.memory``): each carries its own
copies, regions and release, so the copier, the region table and the caches
never ask which kind they hold. Host and client-process memory are real here;
device memory is a kind of copy rank 2 whose copy job is recorded."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, ClassVar

import hixl_native
import numpy as np
import pytest

from hixl_client.status import LLMException, LLMStatusCode
from hixl_client.types import Placement
from hixl_service.completions import CompletionDispatcher
from hixl_service.copier import INLINE_COPY_BYTES, Copier
from hixl_service.load import TransferLoad
from hixl_service.memory.base import Memory, PoolSpec
from hixl_service.memory.host import HostBackend, HostMemory, SharedBuffer
from hixl_service.memory.process import (
    ClientProcess,
    CrossMemoryPolicy,
    ProcessBackend,
)
from hixl_service.regions import Regions

MIB = 1 << 20


def _mapping(size: int) -> hixl_native.Mapping:
    fd = os.memfd_create("hixl-test")
    try:
        os.ftruncate(fd, size)
        return hixl_native.Mapping(fd, size)
    finally:
        os.close(fd)


def _host(size: int) -> HostMemory:
    return HostMemory(1, Placement.HOST, _mapping(size))


def _bytes(memory: HostMemory) -> np.ndarray:
    return np.frombuffer(memoryview(memory.native), dtype=np.uint8)


@pytest.fixture
def process() -> Iterator[ClientProcess]:
    me = ClientProcess(os.getpid(), os.getuid(), os.pidfd_open(os.getpid()))
    yield me
    me.close()


@contextlib.asynccontextmanager
async def _copier(busy: bool = False) -> AsyncIterator[Copier]:
    load = TransferLoad()
    dispatcher = CompletionDispatcher(asyncio.get_running_loop(), load)
    copier = Copier(2, dispatcher)
    if busy:  # another transfer under way: nothing is copied on the loop's thread
        load.begin()
        load.begin()
    try:
        yield copier
    finally:
        copier.close()
        dispatcher.close()


class _Device(Memory):
    """A kind with its own copy job (as device memory's ACL copies): recorded."""

    copy_rank: ClassVar[int] = 2
    on_device: ClassVar[bool] = True
    host_copies: ClassVar[bool] = False

    def __init__(self, jobs: list[tuple[Memory, Memory, list[int]]]) -> None:
        super().__init__(1, Placement.DEVICE, MIB)
        self.jobs = jobs

    def copy_job(self, dst: Memory, src: Memory, triples: np.ndarray) -> Callable[[], object]:
        def job() -> None:
            self.jobs.append((dst, src, triples.ravel().tolist()))
        return job

    def expose(self, server: hixl_native.DataServer, region_id: int, offset: int, size: int,
               cluster_id: int, writable: bool) -> bool:
        return False

    def _close(self) -> None:
        pass


@pytest.mark.asyncio
@pytest.mark.parametrize("device_is_dst", [True, False])
async def test_a_copy_goes_the_way_of_its_higher_ranked_end(device_is_dst: bool) -> None:
    jobs: list[tuple[Memory, Memory, list[int]]] = []
    device, host = _Device(jobs), _host(MIB)
    dst, src = (device, host) if device_is_dst else (host, device)
    ranges = np.array([[0, 64, 128]], dtype=np.uint64)  # (src, dst, length)
    async with _copier() as copier:
        assert not copier.copy_now(dst, src, ranges[:, [1, 0, 2]].copy(), 128)
        await copier.copy(dst, src, ranges)
    assert jobs == [(dst, src, [64, 0, 128])]  # (dst, src, length), run on a copy thread
    assert device._pins == host._pins == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("busy", [False, True], ids=["inline", "executor"])
@pytest.mark.parametrize("into_process", [True, False])
async def test_client_process_memory_copies_by_cross_memory_calls(
        process: ClientProcess, busy: bool, into_process: bool) -> None:
    engine = np.zeros(2 * INLINE_COPY_BYTES, dtype=np.uint8)
    backend = ProcessBackend(CrossMemoryPolicy(None, False), 2, 65536)
    reached = backend.reach(process, 1, [engine.ctypes.data], engine.nbytes)
    host = _host(engine.nbytes)
    try:
        source = _bytes(host) if into_process else engine
        source[:] = np.random.default_rng(3).integers(0, 256, engine.nbytes, dtype=np.uint8)
        dst, src = (reached, host) if into_process else (host, reached)
        ranges = np.array([[0, 4096, INLINE_COPY_BYTES]], dtype=np.uint64)
        async with _copier(busy) as copier:
            await copier.copy(dst, src, ranges)
        landed = engine if into_process else _bytes(host)
        assert np.array_equal(landed[4096:4096 + INLINE_COPY_BYTES],
                              source[:INLINE_COPY_BYTES])
        assert reached._pins == host._pins == 0
    finally:
        assert reached.revoke() and reached.closed
    with pytest.raises(LLMException) as info:
        async with _copier() as copier:
            await copier.copy(reached, _host(4096), np.array([[0, 0, 64]], dtype=np.uint64))
    assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID  # revoked: refused


def test_shared_memory_is_fenced_not_revoked() -> None:
    host = _host(4096)
    assert not host.revoke() and not host.closed
    host.release()


def test_memory_without_a_mapping_says_why() -> None:
    device = _Device([])
    with pytest.raises(NotImplementedError):
        device.native  # noqa: B018 (a kind says what it lacks in its own words)


def test_process_backend_refusals(process: ClientProcess) -> None:
    locked = ProcessBackend(page_locked=True)
    with pytest.raises(LLMException, match="only on its host backend") as info:
        locked.check(process)
    assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    assert locked.summary().startswith("refused: the hccl backend")
    with pytest.raises(LLMException, match="did not bind its process"):
        ProcessBackend().check(None)
    assert ProcessBackend().check(process) is process


class _Server:
    """What a memory registers its region with (the native data server)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def register_region(self, region_id: int, mapping: Any, *rest: Any) -> None:
        self.calls.append(("host", mapping))

    def register_process_region(self, region_id: int, span: Any, *rest: Any) -> None:
        self.calls.append(("process", span))


def test_each_kind_registers_its_own_region(process: ClientProcess) -> None:
    server = _Server()
    regions = Regions(server)  # type: ignore[arg-type]
    engine = np.zeros(4096, dtype=np.uint8)
    reached = ProcessBackend().reach(process, 1, [engine.ctypes.data], engine.nbytes)
    host, device = _host(4096), _Device([])
    try:
        ids = [regions.add(memory, 0, 64, 1, True) for memory in (host, reached, device)]
        assert server.calls == [("host", host.native), ("process", reached.span)]
        assert regions.device(ids[0]) is None and regions.device(ids[1]) is None
        kept = regions.device(ids[2])
        assert kept is not None and kept.memory is device  # for HCCL's peer calls
    finally:
        reached.revoke()
        host.release()


class _Pinned:
    def __init__(self, log: list[str]) -> None:
        self._log = log

    def close(self) -> None:
        self._log.append("unpinned")


@pytest.mark.asyncio
async def test_host_backend_pins_what_it_maps_and_refuses_device_buffers() -> None:
    log: list[str] = []

    def pin(mapping: hixl_native.Mapping) -> _Pinned:
        log.append("pinned")
        return _Pinned(log)

    backend = HostBackend(8 * MIB, populate=False, pin=pin)
    pool = await backend.create(1, 1, Placement.HOST, PoolSpec(MIB, 16), 0)
    fd = os.memfd_create("hixl-test")
    os.ftruncate(fd, 4096)
    try:
        buffer = await backend.map_buffer(7, 1, fd, 4096)
    finally:
        os.close(fd)
    assert isinstance(buffer, SharedBuffer) and buffer.buffer_id == 7
    assert not buffer.close_on_drop  # unmapped off the answer's path
    assert pool.fd is not None and await pool.share_with(os.getpid()) is None
    with pytest.raises(LLMException) as info:
        pool.alloc_cache(2, MIB)
    assert info.value.status_code == LLMStatusCode.LLM_OUT_OF_MEMORY
    await backend.release(pool)
    buffer.release()
    assert log == ["pinned", "pinned", "unpinned", "unpinned"]
    with pytest.raises(LLMException) as info:
        await backend.import_buffer(8, 1, 0, "key", 4096, 0)
    assert info.value.status_code == LLMStatusCode.LLM_FEATURE_NOT_ENABLED
