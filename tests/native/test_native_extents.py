"""ExtentAllocator: the SharedPool allocator on its own, over offsets only."""

from __future__ import annotations

import itertools
import random
import threading
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from hixl_native import ExtentAllocator, SharedPool

hn = pytest.importorskip("hixl_native")

PAGE = 4096


def sixty_four_pages() -> ExtentAllocator:
    # Not a fixture: pytest holds fixture values until after the leak check
    # in conftest, and an ExtentAllocator is only released when collected.
    return hn.ExtentAllocator(64 * PAGE, 12)


def test_alloc_rounds_up_to_pages() -> None:
    alloc = sixty_four_pages()
    a = alloc.alloc(1)
    b = alloc.alloc(PAGE + 1)
    c = alloc.alloc(PAGE)
    assert [alloc.allocation_size(o) for o in (a, b, c)] == [PAGE, 2 * PAGE, PAGE]
    assert all(o % PAGE == 0 for o in (a, b, c)) and len({a, b, c}) == 3
    assert alloc.used_bytes == 4 * PAGE
    assert alloc.free_bytes == 60 * PAGE


def test_size_rounds_up_and_properties() -> None:
    x = hn.ExtentAllocator(3 * 1024 + 1, 10)
    assert x.size == 4 * 1024
    assert (x.page_size, x.page_shift) == (1024, 10)
    assert (x.used_bytes, x.free_bytes) == (0, x.size)
    assert "0 of 4096 bytes used" in repr(x)
    assert x.alloc(x.size) == 0


def test_large_page_needs_no_memory() -> None:
    # Offsets only: a 1 TiB range of 1 GiB pages costs nothing to create.
    x = hn.ExtentAllocator(1 << 40, 30)
    assert x.alloc(1) == 0
    assert x.alloc(1) == 1 << 30
    assert x.used_bytes == 2 << 30


@pytest.mark.parametrize("shift", [9, 31, -1, 64])
def test_page_shift_bounds(shift: int) -> None:
    with pytest.raises(ValueError):
        hn.ExtentAllocator(1 << 20, shift)


@pytest.mark.parametrize("shift", [10, 30])
def test_page_shift_limits_accepted(shift: int) -> None:
    assert hn.ExtentAllocator(1, shift).page_size == 1 << shift


@pytest.mark.parametrize("size", [0, -5, (1 << 62) + 1])
def test_size_bounds(size: int) -> None:
    with pytest.raises(ValueError):
        hn.ExtentAllocator(size, 12)


def test_constructor_argument_types() -> None:
    with pytest.raises(TypeError):
        hn.ExtentAllocator(1.5, 12)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        hn.ExtentAllocator(PAGE, "12")  # type: ignore[arg-type]


def test_exhaustion_raises_pool_exhausted() -> None:
    alloc = sixty_four_pages()
    alloc.alloc(60 * PAGE)
    with pytest.raises(hn.PoolExhausted) as info:
        alloc.alloc(5 * PAGE)
    assert isinstance(info.value, hn.NativeError)
    assert f"{4 * PAGE} of {64 * PAGE} bytes free" in str(info.value)
    with pytest.raises(hn.PoolExhausted):
        alloc.alloc(65 * PAGE)
    with pytest.raises(hn.PoolExhausted):
        alloc.alloc(2**64 - 1)  # must not wrap while rounding up
    assert alloc.alloc(4 * PAGE) == 60 * PAGE
    with pytest.raises(hn.PoolExhausted):
        alloc.alloc(1)
    assert alloc.free_bytes == 0


def test_exhaustion_by_fragmentation() -> None:
    alloc = sixty_four_pages()
    offsets = [alloc.alloc(PAGE) for _ in range(64)]
    for off in offsets[::2]:
        alloc.free(off)
    assert alloc.free_bytes == 32 * PAGE
    with pytest.raises(hn.PoolExhausted):
        alloc.alloc(2 * PAGE)


def test_free_coalesces_into_one_full_extent() -> None:
    alloc = sixty_four_pages()
    offsets = [alloc.alloc(PAGE * (1 + i % 3)) for i in range(32)]
    offsets.append(alloc.alloc(alloc.free_bytes))
    with pytest.raises(hn.PoolExhausted):
        alloc.alloc(1)
    random.Random(7).shuffle(offsets)
    for off in offsets:
        alloc.free(off)
    assert (alloc.used_bytes, alloc.free_bytes) == (0, alloc.size)
    assert alloc.alloc(64 * PAGE) == 0


def test_best_fit_keeps_large_extents() -> None:
    alloc = sixty_four_pages()
    a, _, c, _ = (alloc.alloc(n * PAGE) for n in (4, 1, 1, 1))
    alloc.free(a)  # a 4-page hole at 0 ...
    alloc.free(c)  # ... a 1-page hole at 5 and 57 free pages at the end
    assert alloc.alloc(PAGE) == c
    assert alloc.alloc(3 * PAGE) == a


@pytest.mark.parametrize(
    "bad",
    [
        1,  # not page-aligned
        PAGE + 1,  # inside the second block, unaligned
        2 * PAGE,  # inside the second block, aligned
        4 * PAGE,  # a free page
        64 * PAGE,  # the end of the range
        10**9,
        2**64 - 1,
    ],
)
def test_bad_free_raises(bad: int) -> None:
    alloc = sixty_four_pages()
    assert alloc.alloc(PAGE) == 0
    assert alloc.alloc(3 * PAGE) == PAGE
    with pytest.raises(ValueError):
        alloc.free(bad)
    with pytest.raises(ValueError):
        alloc.allocation_size(bad)
    assert alloc.used_bytes == 4 * PAGE


def test_double_free_raises() -> None:
    alloc = sixty_four_pages()
    off = alloc.alloc(PAGE)
    alloc.free(off)
    with pytest.raises(ValueError, match="not the start of an allocation"):
        alloc.free(off)
    assert alloc.free_bytes == alloc.size


def test_argument_errors() -> None:
    alloc = sixty_four_pages()
    with pytest.raises(ValueError):
        alloc.alloc(0)
    with pytest.raises(ValueError):
        alloc.alloc(-1)
    with pytest.raises(ValueError):
        alloc.alloc(2**64)
    with pytest.raises(TypeError):
        alloc.alloc(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        alloc.free(-1)
    with pytest.raises(ValueError):
        alloc.free(2**64)
    with pytest.raises(TypeError):
        alloc.free(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        alloc.allocation_size("0")  # type: ignore[arg-type]


def test_uninitialized_and_reinitialized() -> None:
    bare = hn.ExtentAllocator.__new__(hn.ExtentAllocator)
    with pytest.raises(ValueError):
        bare.alloc(1)
    with pytest.raises(ValueError):
        _ = bare.size
    x = hn.ExtentAllocator(PAGE, 12)
    with pytest.raises(RuntimeError):
        x.__init__(PAGE, 12)  # type: ignore[misc]


def test_counted_in_live_objects() -> None:
    before = hn.live_objects()["allocators"]
    x = hn.ExtentAllocator(PAGE, 12)
    assert hn.live_objects()["allocators"] == before + 1
    del x
    assert hn.live_objects()["allocators"] == before


def test_concurrent_alloc_free_keeps_invariants() -> None:
    pages = 512
    x = hn.ExtentAllocator(pages * PAGE, 12)
    owner = bytearray(pages)  # page -> id of the thread holding it, 0 if free
    lock = threading.Lock()
    errors: list[str] = []
    start = threading.Barrier(8)

    def pages_of(off: int, size: int) -> slice:
        return slice(off // PAGE, (off + size) // PAGE)

    def claim(off: int, size: int, tid: int) -> None:
        with lock:
            if any(owner[pages_of(off, size)]):
                errors.append(f"[{off}, {off + size}) overlaps a live block")
            owner[pages_of(off, size)] = bytes([tid]) * (size // PAGE)

    def release(off: int, size: int, tid: int) -> None:
        # Before free(): once freed, another thread may be handed these pages.
        with lock:
            if owner[pages_of(off, size)] != bytes([tid]) * (size // PAGE):
                errors.append(f"block at {off} changed owner")
            owner[pages_of(off, size)] = bytes(size // PAGE)

    def worker(tid: int) -> None:
        rng = random.Random(tid)
        mine: list[tuple[int, int]] = []
        start.wait()
        for _ in range(3000):
            if mine and (rng.random() < 0.45 or len(mine) > 30):
                off, size = mine.pop(rng.randrange(len(mine)))
                if x.allocation_size(off) != size:
                    errors.append(f"size of block at {off} changed")
                release(off, size, tid)
                x.free(off)
                continue
            nbytes = rng.randint(1, 8 * PAGE)
            try:
                off = x.alloc(nbytes)
            except hn.PoolExhausted:
                continue
            size = x.allocation_size(off)
            if off % PAGE or size != -(-nbytes // PAGE) * PAGE or off + size > x.size:
                errors.append(f"bad block ({off}, {size}) for {nbytes} bytes")
            claim(off, size, tid)
            mine.append((off, size))
        for off, size in mine:
            release(off, size, tid)
            x.free(off)

    threads = [threading.Thread(target=worker, args=(tid,)) for tid in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    assert not any(owner)
    assert (x.used_bytes, x.free_bytes) == (0, x.size)
    assert x.alloc(x.size) == 0


def test_invariants_hold_mid_stress() -> None:
    x = hn.ExtentAllocator(256 * PAGE, 12)
    stop = threading.Event()
    live: dict[int, int] = {}
    lock = threading.Lock()

    def churn(seed: int) -> None:
        rng = random.Random(seed)
        mine: list[int] = []
        while not stop.is_set():
            if mine and rng.random() < 0.5:
                off = mine.pop(rng.randrange(len(mine)))
                with lock:
                    del live[off]
                x.free(off)
            else:
                try:
                    off = x.alloc(rng.randint(1, 4 * PAGE))
                except hn.PoolExhausted:
                    continue
                with lock:
                    live[off] = x.allocation_size(off)
                mine.append(off)

    threads = [threading.Thread(target=churn, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    try:
        for _ in range(200):
            used, free = x.used_bytes, x.free_bytes
            # Two reads, not one snapshot: each is consistent, their sum may not be.
            assert used % PAGE == 0 and free % PAGE == 0
            assert 0 <= used <= x.size and 0 <= free <= x.size
    finally:
        stop.set()
        for t in threads:
            t.join()
    spans = sorted(live.items())
    for (a, asize), (b, _) in itertools.pairwise(spans):
        assert a + asize <= b
    assert x.used_bytes == sum(live.values())
    assert x.used_bytes + x.free_bytes == x.size


def _replay(obj: SharedPool | ExtentAllocator, seed: int) -> list[object]:
    """The outcomes of one random alloc/free sequence."""
    rng = random.Random(seed)
    live: list[int] = []
    out: list[object] = []
    for _ in range(400):
        if live and rng.random() < 0.4:
            off = live.pop(rng.randrange(len(live)))
            obj.free(off)
            out.append(("free", off, obj.used_bytes))
            continue
        try:
            off = obj.alloc(rng.randint(1, 5 * PAGE))
        except hn.PoolExhausted:
            out.append("exhausted")
            continue
        live.append(off)
        out.append((off, obj.allocation_size(off), obj.free_bytes))
    return out


def test_shared_pool_uses_the_same_allocator() -> None:
    pool = hn.SharedPool("same", 96 * PAGE + 1, 12, populate=False)
    try:
        x = hn.ExtentAllocator(96 * PAGE + 1, 12)
        assert (pool.size, pool.page_size) == (x.size, x.page_size)
        for seed in range(3):
            assert _replay(pool, seed) == _replay(x, seed)
    finally:
        pool.close()


def test_shared_pool_counts_one_allocator() -> None:
    before = hn.live_objects()
    pool = hn.SharedPool("count", 4 * PAGE, 12, populate=False)
    now = hn.live_objects()
    assert now["allocators"] == before["allocators"] + 1
    assert now["pools"] == before["pools"] + 1
    pool.close()
    assert hn.live_objects() == before
