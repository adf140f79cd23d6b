"""The copier (``copier``) on the daemon's real host memory (``memory.host``,
memfd mappings) and a real completion dispatcher, without a daemon: bytes land
at the planned offsets whichever way the copy goes (on the loop's thread,
helped, posted to the copy threads, split among them), a range outside either
memory is refused before a byte moves, and a copy its caller stops waiting
for still ends whole and leaves its memories unpinned. Share cutting and the
size classes in depth: test_copy_split.py; the other memory kinds:
test_memory_kinds.py."""

from __future__ import annotations

import asyncio
import os

import hixl_native
import numpy as np
import pytest

from hixl_service.copier import (
    HELPED_COPY_BYTES,
    INLINE_COPY_BYTES,
    LOOP_COPY_MAX_BYTES,
    triples_of,
)
from hixl_service.memory.host import HostMemory
from hixl_wire.types import Placement

from .fakes import running_copier

KIB, MIB = 1 << 10, 1 << 20


def _host(size: int) -> HostMemory:
    fd = os.memfd_create("hixl-test")
    try:
        os.ftruncate(fd, size)
        return HostMemory(1, Placement.HOST, hixl_native.Mapping(fd, size))
    finally:
        os.close(fd)


def _bytes(memory: HostMemory) -> np.ndarray:
    return np.frombuffer(memoryview(memory.native), dtype=np.uint8)


def _filled(size: int, seed: int) -> HostMemory:
    memory = _host(size)
    _bytes(memory)[:] = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    return memory


def _ranges(*rows: tuple[int, int, int]) -> np.ndarray:
    """(src offset, dst offset, length) rows, as the planner hands them over."""
    return np.array(rows, dtype=np.uint64)



def test_triples_are_the_native_calls_dst_src_length_rows() -> None:
    triples = triples_of(_ranges((1, 2, 3), (4, 5, 6)))
    assert triples.tolist() == [[2, 1, 3], [5, 4, 6]]
    assert triples.flags.c_contiguous and triples.dtype == np.uint64


# Each way a host copy goes: (bytes per range, ranges, busy).
WAYS = {
    "inline": (4 * KIB, 8, False),
    "helped": (64 * KIB, HELPED_COPY_BYTES // (64 * KIB) + 2, False),
    "posted": (4 * KIB, 8, True),
    "split": (256 * KIB, INLINE_COPY_BYTES // (256 * KIB) + 2, True),
    "large-alone": (1 * MIB, LOOP_COPY_MAX_BYTES // MIB + 1, False),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("way", WAYS)
async def test_bytes_land_where_the_ranges_say_whichever_way(way: str) -> None:
    block, count, busy = WAYS[way]
    size = (2 * count + 1) * block
    src, dst = _filled(size, count), _host(size)
    # Source blocks in order, landing reversed and shifted by one block.
    rows = [(i * block, (count - i) * block, block) for i in range(count)]
    async with running_copier(busy=busy) as (copier, _, _):
        await copier.copy(dst, src, _ranges(*rows))
    landed, sent = _bytes(dst), _bytes(src)
    for s, d, length in rows:
        assert np.array_equal(landed[d:d + length], sent[s:s + length])
    assert not landed[:block].any()  # nothing outside the ranges
    assert src._pins == dst._pins == 0


@pytest.mark.asyncio
async def test_copy_now_copies_here_with_shifts_only_when_alone_and_small() -> None:
    src, dst = _filled(64 * KIB, 1), _host(64 * KIB)
    triples = triples_of(_ranges((0, 0, 4 * KIB)))
    async with running_copier() as (copier, _, _):
        # A repeat moves between other slots by shifting the same triples.
        assert copier.copy_now(dst, src, triples, 4 * KIB, dst_shift=8 * KIB, src_shift=4 * KIB)
        assert np.array_equal(_bytes(dst)[8 * KIB:12 * KIB], _bytes(src)[4 * KIB:8 * KIB])
        assert not _bytes(dst)[:8 * KIB].any()
        # Within one memory only a copy up to INLINE_COPY_BYTES runs here.
        assert not copier.copy_now(dst, dst, triples, INLINE_COPY_BYTES + 1)
        assert not copier.copy_now(dst, src, triples, LOOP_COPY_MAX_BYTES + 1)
    async with running_copier(busy=True) as (copier, _, _):
        before = _bytes(dst).copy()
        assert not copier.copy_now(dst, src, triples, 4 * KIB)  # nothing copied: copy() it
        assert np.array_equal(_bytes(dst), before)


@pytest.mark.asyncio
@pytest.mark.parametrize("way", ["inline", "helped", "posted"])
@pytest.mark.parametrize("outside", ["dst", "src", "huge"])
async def test_a_range_outside_either_memory_is_refused_before_a_byte_moves(
        way: str, outside: str) -> None:
    length = {"inline": 4 * KIB, "helped": HELPED_COPY_BYTES, "posted": 4 * KIB}[way]
    size = 2 * length
    src, dst = _filled(size, 2), _host(size)
    bad = {"dst": (0, size - length + 1, length), "src": (size - length + 1, 0, length),
           "huge": (0, 2**63, length)}[outside]
    async with running_copier(busy=way == "posted") as (copier, _, _):
        with pytest.raises(ValueError, match="outside"):
            await copier.copy(dst, src, _ranges((0, 0, length), bad))
    assert not _bytes(dst).any()
    assert src._pins == dst._pins == 0


@pytest.mark.asyncio
async def test_a_copy_its_caller_stops_waiting_for_still_lands_whole_and_unpins() -> None:
    # A native copy cannot be interrupted: the memories stay pinned until it ends.
    size = 8 * MIB
    src, dst = _filled(size, 3), _host(size)
    async with running_copier(busy=True) as (copier, _, _):
        copy = asyncio.ensure_future(copier.copy(dst, src, _ranges((0, 0, size))))
        # One pass of the loop: the copy's first step posts it, then this resumes;
        # its completion comes through an fd the loop has not read yet.
        await asyncio.sleep(0)
        copy.cancel()
        with pytest.raises(asyncio.CancelledError):
            await copy
        await dst.wait_unpinned()
        await src.wait_unpinned()
    assert np.array_equal(_bytes(dst), _bytes(src))
    assert src._pins == dst._pins == 0
