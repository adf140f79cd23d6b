"""SharedPool and Mapping: allocation, sharing through the fd, export pins."""

from __future__ import annotations

import itertools
import os
import random
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from hixl_native import SharedPool

hn = pytest.importorskip("hixl_native")

PAGE = 4096


@pytest.fixture
def pool() -> Iterator[SharedPool]:
    p = hn.SharedPool("test", 64 * PAGE, 12)
    yield p
    p.close()


def test_alloc_rounds_up_to_pages(pool: SharedPool) -> None:
    a = pool.alloc(1)
    b = pool.alloc(PAGE + 1)
    assert pool.allocation_size(a) == PAGE
    assert pool.allocation_size(b) == 2 * PAGE
    assert a % PAGE == 0 and b % PAGE == 0 and a != b
    assert pool.used_bytes == 3 * PAGE
    assert pool.free_bytes == 61 * PAGE


def test_size_rounds_up_and_properties() -> None:
    with hn.SharedPool("odd", 3 * 1024 + 1, 10, populate=False) as p:
        assert p.size == 4 * 1024
        assert (p.page_size, p.page_shift) == (1024, 10)
        assert p.fd >= 0 and p.address != 0
    assert p.closed and p.fd == -1 and p.address == 0


@pytest.mark.parametrize("populate", [True, False])
def test_new_pool_reads_zero(populate: bool) -> None:
    """A populated pool has had every page written once (see pool.c); that
    write must leave the memory as a fresh memfd's: all zero."""
    with hn.SharedPool("zero", 8 * PAGE + 1, 12, populate=populate) as p:
        assert bytes(p.view(0, p.size)) == bytes(p.size)


@pytest.mark.parametrize("shift", [9, 31, -1])
def test_page_shift_bounds(shift: int) -> None:
    with pytest.raises(ValueError):
        hn.SharedPool("bad", 1 << 20, shift)


@pytest.mark.parametrize("size", [0, -5])
def test_size_must_be_positive(size: int) -> None:
    with pytest.raises(ValueError):
        hn.SharedPool("bad", size, 12)


def test_exhaustion_raises_pool_exhausted(pool: SharedPool) -> None:
    pool.alloc(60 * PAGE)
    with pytest.raises(hn.PoolExhausted) as info:
        pool.alloc(5 * PAGE)
    assert isinstance(info.value, hn.NativeError)
    with pytest.raises(hn.PoolExhausted):
        pool.alloc(65 * PAGE)
    assert pool.alloc(4 * PAGE) >= 0


def test_free_coalesces_into_one_full_extent(pool: SharedPool) -> None:
    offsets = [pool.alloc(PAGE * (1 + i % 3)) for i in range(32)]
    offsets.append(pool.alloc(pool.free_bytes))
    with pytest.raises(hn.PoolExhausted):
        pool.alloc(1)
    random.Random(7).shuffle(offsets)
    for off in offsets:
        pool.free(off)
    assert pool.used_bytes == 0
    assert pool.alloc(64 * PAGE) == 0


@pytest.mark.parametrize("bad", [PAGE, 1, 10**9])
def test_bad_free_raises(pool: SharedPool, bad: int) -> None:
    pool.alloc(PAGE)
    with pytest.raises(ValueError):
        pool.free(bad)
    with pytest.raises(ValueError):
        pool.allocation_size(bad)


def test_double_free_raises(pool: SharedPool) -> None:
    off = pool.alloc(PAGE)
    pool.free(off)
    with pytest.raises(ValueError):
        pool.free(off)


def test_alloc_argument_errors(pool: SharedPool) -> None:
    with pytest.raises(ValueError):
        pool.alloc(0)
    with pytest.raises(TypeError):
        pool.alloc(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        pool.free(-1)


def test_concurrent_alloc_free_keeps_invariants() -> None:
    pool = hn.SharedPool("threads", 1024 * PAGE, 12, populate=False)
    live: dict[int, int] = {}
    lock = threading.Lock()
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        mine: list[int] = []
        for _ in range(1500):
            if mine and (rng.random() < 0.45 or len(mine) > 40):
                off = mine.pop(rng.randrange(len(mine)))
                size = pool.allocation_size(off)
                if bytes(pool.view(off, size)) != bytes([seed]) * size:
                    errors.append(f"block at {off} was overwritten")
                with lock:
                    del live[off]
                pool.free(off)
                continue
            try:
                off = pool.alloc(rng.randint(1, 6 * PAGE))
            except hn.PoolExhausted:
                continue
            size = pool.allocation_size(off)
            with lock:
                if off in live:
                    errors.append(f"offset {off} handed out twice")
                live[off] = size
            pool.view(off, size)[:] = bytes([seed]) * size
            mine.append(off)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    spans = sorted(live.items())
    for (a, asize), (b, _) in itertools.pairwise(spans):
        assert a + asize <= b
    assert pool.used_bytes == sum(live.values())
    assert pool.used_bytes + pool.free_bytes == pool.size
    for off in live:
        pool.free(off)
    assert pool.alloc(pool.size) == 0
    pool.close()


def test_second_mapping_of_fd_shares_bytes(pool: SharedPool) -> None:
    with hn.Mapping(pool.fd, pool.size) as other:
        assert other.address != pool.address
        pool.view(PAGE, 5)[:] = b"hello"
        assert bytes(other.view(PAGE, 5)) == b"hello"
        other.view(0, 3)[:] = b"abc"
        assert bytes(pool.view(0, 3)) == b"abc"


def test_mapping_does_not_own_fd_and_checks_file_size() -> None:
    fd = os.memfd_create("hixl-test", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 2 * PAGE)
        with pytest.raises(ValueError):
            hn.Mapping(fd, 3 * PAGE)
        m = hn.Mapping(fd, 2 * PAGE)
        m.close()
        os.fstat(fd)  # still open: the caller owns it
    finally:
        os.close(fd)


def test_view_bounds(pool: SharedPool) -> None:
    assert len(pool.view(0, pool.size)) == pool.size
    assert len(pool.view(pool.size, 0)) == 0
    with pytest.raises(ValueError):
        pool.view(pool.size - 1, 2)
    with pytest.raises(ValueError):
        pool.view(-1, 1)


def test_views_block_close_and_close_is_idempotent() -> None:
    pool = hn.SharedPool("views", 4 * PAGE, 12)
    first, second = pool.view(0, 10), pool.view(PAGE, 10)
    assert pool.exports == 2
    with pytest.raises(BufferError):
        pool.close()
    first.release()
    assert pool.exports == 1
    with pytest.raises(BufferError):
        pool.close()
    del second
    assert pool.exports == 0
    pool.close()
    pool.close()
    with pytest.raises(ValueError):
        pool.view(0, 1)
    with pytest.raises(ValueError):
        pool.alloc(1)


def test_buffer_protocol_whole_mapping(pool: SharedPool) -> None:
    with memoryview(pool) as whole:
        assert whole.nbytes == pool.size and not whole.readonly
        assert pool.exports == 1
    assert pool.exports == 0
