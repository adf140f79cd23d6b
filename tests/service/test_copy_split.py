"""Local copies: on the loop's thread (helped by a copy thread from 256 KiB) or
the native copy threads, shared among threads when large; every way copies
exactly the request's bytes, and ranges within one memory in order."""

from __future__ import annotations

import asyncio
import os

import hixl_native
import numpy as np
import pytest

from hixl_client.status import LLMException, LLMStatusCode
from hixl_service.copier import (
    HELPED_COPY_BYTES,
    INLINE_COPY_BYTES,
    LOOP_COPY_MAX_BYTES,
    split_triples,
)

from .fakes import running_copier

KIB = 1024


def _expand(triples: np.ndarray) -> list[tuple[int, int]]:
    """Every (dst byte, src byte) pair that ``triples`` copy, in order, at 1 KiB grain."""
    pairs: list[tuple[int, int]] = []
    for dst, src, length in triples.tolist():
        pairs.extend((dst + k, src + k) for k in range(0, length, KIB))
    return pairs


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("parts", [2, 3, 4])
def test_shares_cover_the_request_exactly(seed: int, parts: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    lengths = rng.integers(0, 300, n) * KIB  # zero-length ranges too
    lengths[0] += KIB
    triples = np.stack([rng.integers(0, 10**6, n) * KIB, rng.integers(0, 10**6, n) * KIB,
                        lengths], axis=1).astype(np.uint64)
    shares = split_triples(triples, parts)
    assert 1 <= len(shares) <= parts
    assert all(share[:, 2].sum() > 0 for share in shares)
    assert _expand(np.concatenate(shares)) == _expand(triples)
    cuts = np.cumsum([int(share[:, 2].sum()) for share in shares])[:-1]
    assert all(cut % 4096 == 0 for cut in cuts)


def test_one_large_range_is_cut_evenly() -> None:
    triples = np.array([[8 * 2**20, 0, 16 * 2**20]], dtype=np.uint64)
    shares = split_triples(triples, 2)
    assert [s.tolist() for s in shares] == [[[8 * 2**20, 0, 8 * 2**20]],
                                            [[16 * 2**20, 8 * 2**20, 8 * 2**20]]]


class _HostMemory:
    """A host memory as the copier sees one: a native mapping (here a memfd)."""

    copy_rank = 0  # memcpy reaches it (the copier's own threads)

    def __init__(self, size: int) -> None:
        fd = os.memfd_create("hixl-test")
        os.ftruncate(fd, size)
        self.native = hixl_native.Mapping(fd, size)
        os.close(fd)
        self.pins = 0

    def pin_until(self, job: asyncio.Future[None]) -> None:
        self.pins += 1
        job.add_done_callback(lambda _: setattr(self, "pins", self.pins - 1))

    def array(self) -> np.ndarray:
        return np.frombuffer(memoryview(self.native), dtype=np.uint8)



@pytest.mark.asyncio
@pytest.mark.parametrize("busy", [False, True], ids=["alone", "under-load"])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("block,count", [(4 * KIB, 16), (64 * KIB, HELPED_COPY_BYTES // 65536 + 3),
                                         (64 * KIB, INLINE_COPY_BYTES // 65536 + 5),
                                         (64 * KIB, LOOP_COPY_MAX_BYTES // 65536 + 7),
                                         (5 * 2**20 + 4 * KIB, 1)])
async def test_every_size_class_copies_exactly(block: int, count: int, threads: int,
                                               busy: bool) -> None:
    size = 2 * block * count + 2**20
    src, dst = _HostMemory(size), _HostMemory(size)
    src.array()[:] = np.random.default_rng(block + count).integers(0, 256, size, dtype=np.uint8)
    order = np.random.default_rng(count).permutation(count)
    # (src offset, dst offset, length) ranges, as the planner hands them over.
    ranges = np.stack([np.arange(count) * 2 * block, order * block + 4096,
                       np.full(count, block)], axis=1).astype(np.uint64)
    async with running_copier(threads, busy) as (copier, _, _):
        await copier.copy(dst, src, ranges)  # type: ignore[arg-type]
    for s, d, length in ranges.tolist():
        assert np.array_equal(dst.array()[d:d + length], src.array()[s:s + length])
    assert src.pins == dst.pins == 0


@pytest.mark.asyncio
async def test_under_load_a_small_copy_leaves_the_loop_free() -> None:
    # Alone, a 1 MiB copy runs inside copy() before it yields; with another
    # transfer under way it runs on a copy thread while the loop goes on.
    size = 4 * 2**20
    src, dst = _HostMemory(size), _HostMemory(size)
    src.array()[:] = 7
    ranges = np.array([[0, 0, INLINE_COPY_BYTES]], dtype=np.uint64)
    async with running_copier(1) as (copier, load, dispatcher):
        for busy in (False, True):
            dst.array()[:] = 0
            load.running = 2 if busy else 1
            copy = asyncio.ensure_future(copier.copy(dst, src, ranges))  # type: ignore[arg-type]
            await asyncio.sleep(0)  # the copy's first step
            assert dispatcher.idle == (not busy)
            assert (dst.pins > 0) == busy  # pinned while a copy thread has it
            await copy
            assert dst.array()[:INLINE_COPY_BYTES].min() == 7
            assert src.pins == dst.pins == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("busy", [False, True], ids=["alone", "under-load"])
@pytest.mark.parametrize("blocks", [8, 40])  # helped and split sizes, were memories apart
async def test_overlapping_ranges_in_one_memory_copy_in_order(blocks: int, busy: bool) -> None:
    # copy_blocks inside one cache: block i goes to block i + 1, as one range
    # whose source and destination overlap, then a range that reads bytes the
    # first one wrote. Two threads sharing them would not give this result.
    block = 64 * KIB
    memory = _HostMemory((blocks + 2) * block)
    original = np.random.default_rng(blocks).integers(0, 256, memory.array().size, dtype=np.uint8)
    memory.array()[:] = original
    ranges = np.array([[0, block, blocks * block],
                       [block, (blocks + 1) * block, block]], dtype=np.uint64)
    expected = original.copy()
    for s, d, length in ranges.tolist():  # in order, each like memmove
        expected[d:d + length] = expected[s:s + length].copy()
    async with running_copier(2, busy) as (copier, _, _):
        await copier.copy(memory, memory, ranges)  # type: ignore[arg-type]
    assert np.array_equal(memory.array(), expected)


@pytest.mark.asyncio
@pytest.mark.parametrize("busy", [False, True], ids=["alone", "under-load"])
async def test_a_copy_after_close_fails_as_the_daemon_stopping(busy: bool) -> None:
    # Alone, 512 KiB is a helped copy; under load it is posted to the threads.
    src, dst = _HostMemory(2**20), _HostMemory(2**20)
    async with running_copier(2, busy) as (copier, _, _):
        copier.close()
        with pytest.raises(LLMException) as stopped:
            await copier.copy(dst, src, np.array([[0, 0, HELPED_COPY_BYTES * 2]],  # type: ignore[arg-type]
                                                 dtype=np.uint64))
    assert stopped.value.status_code == LLMStatusCode.LLM_FAILED
    assert "stopping" in str(stopped.value)
    assert src.pins == dst.pins == 0
