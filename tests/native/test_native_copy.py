"""copy_ranges: exact bytes, validation before any copy, GIL released."""

from __future__ import annotations

import array
import threading
import time
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from hixl_native import SharedPool

hn = pytest.importorskip("hixl_native")
np = pytest.importorskip("numpy")

MIB = 1 << 20


def test_copy_matches_numpy(copy_pair: tuple[SharedPool, SharedPool]) -> None:
    dst, src = copy_pair
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 20_000, 64, dtype=np.uint64)
    src_off = rng.integers(0, src.size - 20_000, 64, dtype=np.uint64)
    dst_off = np.arange(64, dtype=np.uint64) * 20_000  # disjoint destinations
    triples = np.stack([dst_off, src_off, lengths], axis=1).ravel()
    expected = np.frombuffer(dst, np.uint8).copy()
    s = np.frombuffer(src, np.uint8)
    for d, o, n in triples.reshape(-1, 3).tolist():
        expected[d : d + n] = s[o : o + n]
    hn.copy_ranges(dst, src, triples)
    assert np.array_equal(np.frombuffer(dst, np.uint8), expected)


@pytest.mark.parametrize("kind", ["array", "bytes", "numpy"])
def test_accepts_uint64_buffers(copy_pair: tuple[SharedPool, SharedPool], kind: str) -> None:
    dst, src = copy_pair
    values = [100, 200, 50, 0, 4096, 10]
    ranges = {
        "array": array.array("Q", values),
        "bytes": array.array("Q", values).tobytes(),
        "numpy": np.array(values, dtype=np.uint64),
    }[kind]
    hn.copy_ranges(dst, src, ranges)
    assert bytes(dst.view(100, 50)) == bytes(src.view(200, 50))
    assert bytes(dst.view(0, 10)) == bytes(src.view(4096, 10))


def test_large_requests_stream_and_stay_exact() -> None:
    """A request of 512 KiB or more takes the streaming-store path for its larger ranges:
    unaligned starts, odd lengths, small ranges and overlaps must all stay exact."""
    src, dst = hn.SharedPool("src", 16 * MIB, 12), hn.SharedPool("dst", 16 * MIB, 12)
    try:
        s = np.frombuffer(src, np.uint8)
        s[:] = np.random.default_rng(3).integers(0, 256, src.size, np.uint8)
        rng = np.random.default_rng(4)
        lengths = rng.integers(1, 300_000, 40, dtype=np.uint64)
        lengths[:5] = [1, 15, 63, 4095, 4097]  # below and around the streaming cut-off
        src_off = rng.integers(0, src.size - 300_000, 40, dtype=np.uint64)
        dst_off = np.arange(40, dtype=np.uint64) * 300_001 + 3  # unaligned, disjoint
        triples = np.stack([dst_off, src_off, lengths], axis=1)
        assert int(lengths.sum()) >= 4 * MIB
        expected = np.frombuffer(dst, np.uint8).copy()
        for d, o, n in triples.tolist():
            expected[d : d + n] = s[o : o + n]
        del s  # a live view would keep the pool from closing
        hn.copy_ranges(dst, src, triples.ravel())
        assert np.array_equal(np.frombuffer(dst, np.uint8), expected)
        # inside one mapping, an overlapping range still has memmove's result
        before = bytes(src.view(0, 5 * MIB))
        hn.copy_ranges(src, src, np.array([4096, 0, 5 * MIB], dtype=np.uint64))
        assert bytes(src.view(4096, 5 * MIB)) == before
    finally:
        dst.close()
        src.close()


def test_same_mapping_overlapping(copy_pair: tuple[SharedPool, SharedPool]) -> None:
    _, src = copy_pair
    before = bytes(src.view(0, 1000))
    hn.copy_ranges(src, src, array.array("Q", [10, 0, 1000]))
    assert bytes(src.view(10, 1000)) == before


def test_bad_triple_is_named_and_nothing_copied(copy_pair: tuple[SharedPool, SharedPool]) -> None:
    dst, src = copy_pair
    before = bytes(dst.view(0, 100))
    bad = array.array("Q", [0, 0, 100, dst.size - 10, 0, 11])
    with pytest.raises(ValueError, match="range 1"):
        hn.copy_ranges(dst, src, bad)
    assert bytes(dst.view(0, 100)) == before
    with pytest.raises(ValueError, match="range 0"):
        hn.copy_ranges(dst, src, array.array("Q", [0, 2**64 - 1, 2]))


def test_shifted_ranges_copy_between_other_places(
        copy_pair: tuple[SharedPool, SharedPool]) -> None:
    """Shifts move every triple's offsets before the check, as the caller would
    have with a new list; a shifted triple outside a mapping, or an offset that
    would wrap around, is refused with nothing copied."""
    dst, src = copy_pair
    ranges = np.array([[0, 0, 100], [300, 1000, 50]], dtype=np.uint64)
    hn.copy_ranges(dst, src, ranges, 0, 4096, 8192)
    assert bytes(dst.view(4096, 100)) == bytes(src.view(8192, 100))
    assert bytes(dst.view(4396, 50)) == bytes(src.view(9192, 50))
    before = bytes(dst.view(0, 100))
    with pytest.raises(ValueError, match="range 1"):
        hn.copy_ranges(dst, src, ranges, 0, dst.size - 320, 0)
    with pytest.raises(ValueError, match="overflows"):
        hn.copy_ranges(dst, src, ranges, 0, 0, 2**64 - 500)
    assert bytes(dst.view(0, 100)) == before


def test_rejects_wrong_buffers(copy_pair: tuple[SharedPool, SharedPool]) -> None:
    dst, src = copy_pair
    with pytest.raises(TypeError):
        hn.copy_ranges(dst, src, np.zeros(3, dtype=np.float64))
    with pytest.raises(TypeError):
        hn.copy_ranges(dst, src, np.zeros(3, dtype=np.int64))
    with pytest.raises(TypeError):
        hn.copy_ranges(dst, src, [0, 0, 1])
    with pytest.raises(ValueError, match="3-tuples"):
        hn.copy_ranges(dst, src, array.array("Q", [0, 0]))


def test_closed_mapping_is_rejected(copy_pair: tuple[SharedPool, SharedPool]) -> None:
    _, src = copy_pair
    other = hn.SharedPool("tmp", MIB, 12)
    other.close()
    with pytest.raises(ValueError, match="closed"):
        hn.copy_ranges(other, src, array.array("Q", [0, 0, 1]))


def test_gil_is_released_during_copy() -> None:
    size = 64 * MIB
    src, dst = hn.SharedPool("gsrc", size, 12), hn.SharedPool("gdst", size, 12)
    ranges = array.array("Q", [0, 0, size] * 12)  # ~768 MiB of copying
    ticks: list[float] = []
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        start = time.perf_counter()
        hn.copy_ranges(dst, src, ranges)
        end = time.perf_counter()
    finally:
        stop.set()
        thread.join()
        dst.close()
        src.close()
    # With the GIL held for the whole call the other thread could only run
    # right before or after it, never in the middle half of the call.
    lo, hi = start + (end - start) / 4, end - (end - start) / 4
    assert any(lo < t < hi for t in ticks), f"no progress during a {end - start:.3f}s copy"
