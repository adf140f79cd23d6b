"""CopyPool: copies on native threads, one completion each, checked before queuing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.native._native_support import wait_completions

if TYPE_CHECKING:
    from hixl_native import CompletionQueue, CopyPool, SharedPool

hn = pytest.importorskip("hixl_native")
np = pytest.importorskip("numpy")

MIB = 1 << 20


@pytest.fixture
def pool(cq: CompletionQueue, request: pytest.FixtureRequest) -> Iterator[CopyPool]:
    """A pool posting to ``cq``, of one thread unless parametrized indirectly."""
    copy_pool = hn.CopyPool(getattr(request, "param", 1), cq)
    yield copy_pool
    copy_pool.close()


@pytest.mark.parametrize("pool", [2], indirect=True)
def test_each_copy_lands_and_posts_one_completion(
        copy_pair: tuple[SharedPool, SharedPool], cq: CompletionQueue, pool: CopyPool) -> None:
    dst, src = copy_pair
    rng = np.random.default_rng(4)
    jobs = {}
    for request_id in range(1, 33):  # more copies than threads: some queue
        length = int(rng.integers(1, 128 * 1024))
        d = (request_id - 1) * 128 * 1024
        s = int(rng.integers(0, src.size - length))
        jobs[request_id] = (d, s, length)
        pool.submit(request_id, dst, src, np.array([[d, s, length]], dtype=np.uint64))
    done = wait_completions(cq, len(jobs))
    assert sorted(done) == [(request_id, hn.OK) for request_id in jobs]
    for d, s, length in jobs.values():
        assert bytes(dst.view(d, length)) == bytes(src.view(s, length))


def test_bad_ranges_are_refused_before_anything_is_queued(
        copy_pair: tuple[SharedPool, SharedPool], cq: CompletionQueue, pool: CopyPool) -> None:
    dst, src = copy_pair
    with pytest.raises(ValueError, match="range 1"):
        pool.submit(1, dst, src, np.array([[0, 0, 10], [dst.size - 4, 0, 10]], dtype=np.uint64))
    with pytest.raises(TypeError):
        pool.submit(2, dst, src, np.array([0, 0, 10], dtype=np.int64))
    assert cq.drain() == []
    pool.submit(3, dst, src, np.array([0, 0, 10], dtype=np.uint64))
    assert wait_completions(cq, 1) == [(3, hn.OK)]


def test_memory_stays_pinned_until_the_copy_ends(
        copy_pair: tuple[SharedPool, SharedPool], cq: CompletionQueue, pool: CopyPool) -> None:
    dst, src = copy_pair
    before = dst.exports, src.exports
    # Enough copies queued (tens of milliseconds of copying) that the last one
    # is still waiting when the next line reads the pins, however loaded the host.
    queued = 32
    for request_id in range(1, queued):
        pool.submit(request_id, dst, src, np.array([0, 0, 4 * MIB], dtype=np.uint64))
    pool.submit(queued, dst, src, np.array([0, 0, 4096], dtype=np.uint64))
    # Pinned from submit on: neither mapping can be unmapped meanwhile.
    assert dst.exports > before[0] and src.exports > before[1]
    assert sorted(wait_completions(cq, queued)) == [(i, hn.OK) for i in range(1, queued + 1)]
    assert (dst.exports, src.exports) == before
    assert bytes(dst.view(0, 4096)) == bytes(src.view(0, 4096))


def test_close_cancels_queued_copies_and_refuses_new_ones(
        copy_pair: tuple[SharedPool, SharedPool], cq: CompletionQueue, pool: CopyPool) -> None:
    dst, src = copy_pair
    whole = np.array([0, 0, 4 * MIB], dtype=np.uint64)
    copies = 128  # about 0.1 s of copying on one thread; submitting them takes far less
    for request_id in range(1, copies + 1):
        pool.submit(request_id, dst, src, whole)
    pool.close()  # waits for the running copy only
    statuses = dict(wait_completions(cq, copies))
    assert set(statuses) == set(range(1, copies + 1))
    assert set(statuses.values()) <= {hn.OK, hn.E_CANCELLED}
    assert statuses[copies] == hn.E_CANCELLED
    with pytest.raises(hn.NativeError):
        pool.submit(copies + 1, dst, src, whole)
    pool.close()  # idempotent; the fixture closes it once more


def _random_triples(rng: np.random.Generator, size: int, count: int) -> np.ndarray:
    """``count`` (dst, src, length) triples with disjoint destinations inside ``size`` bytes;
    lengths vary (zero included), so the cut falls inside some range."""
    lengths = rng.integers(0, size // (2 * count), count)
    lengths[0] += 1
    slot = size // count
    dst = np.arange(count) * slot
    src = rng.integers(0, size - lengths)
    return np.stack([dst, src, lengths], axis=1).astype(np.uint64)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("pool", [1, 2], indirect=True)
def test_a_helped_copy_copies_every_range_exactly(
        copy_pair: tuple[SharedPool, SharedPool], cq: CompletionQueue, pool: CopyPool,
        seed: int) -> None:
    dst, src = copy_pair
    rng = np.random.default_rng(seed)
    triples = _random_triples(rng, dst.size, int(rng.integers(1, 24)))
    np.frombuffer(dst, np.uint8)[:] = 0
    pool.copy_helped(dst, src, triples)
    expected = np.zeros(dst.size, np.uint8)
    source = np.frombuffer(src, np.uint8)
    for d, s, length in triples.tolist():
        expected[d:d + length] = source[s:s + length]
    assert np.array_equal(np.frombuffer(dst, np.uint8), expected)
    assert cq.drain() == []  # the caller waited: nothing to deliver


def test_a_helped_copy_takes_shifts(
        copy_pair: tuple[SharedPool, SharedPool], cq: CompletionQueue, pool: CopyPool) -> None:
    dst, src = copy_pair
    size = 1 << 20
    pool.copy_helped(dst, src, np.array([0, 0, size], dtype=np.uint64), 3 * size, size)
    assert bytes(dst.view(3 * size, size)) == bytes(src.view(size, size))
    with pytest.raises(ValueError, match="range 0"):
        pool.copy_helped(dst, src, np.array([0, 0, size], dtype=np.uint64), dst.size, 0)
    assert cq.drain() == []


def test_a_helped_copy_with_every_worker_busy_is_finished_by_its_caller(
        copy_pair: tuple[SharedPool, SharedPool], cq: CompletionQueue, pool: CopyPool) -> None:
    dst, src = copy_pair
    half = dst.size // 2
    # The only worker is kept busy by copies queued ahead of the helped share:
    # some 50 ms of them, against well under 1 ms for the helped copy alone.
    busy = 256
    for request_id in range(1, busy + 1):
        pool.submit(request_id, dst, src, np.array([half, half, half], dtype=np.uint64))
    pool.copy_helped(dst, src, np.array([0, 0, half], dtype=np.uint64))
    assert bytes(dst.view(0, half)) == bytes(src.view(0, half))
    # It did not wait behind them: most were still to run when it returned.
    done_by_then = cq.drain()
    assert len(done_by_then) < busy // 2
    # The share the caller took back is no longer queued; the others all complete.
    rest = wait_completions(cq, busy - len(done_by_then))
    assert sorted(done_by_then + rest) == [(i, hn.OK) for i in range(1, busy + 1)]
    assert cq.drain() == []


def test_a_helped_copy_refuses_bad_ranges_and_a_closed_pool(
        copy_pair: tuple[SharedPool, SharedPool], cq: CompletionQueue, pool: CopyPool) -> None:
    dst, src = copy_pair
    np.frombuffer(dst, np.uint8)[:] = 0
    with pytest.raises(ValueError, match="range 1"):
        pool.copy_helped(dst, src, np.array([[0, 0, 1 << 20], [dst.size, 0, 1]], dtype=np.uint64))
    assert not np.frombuffer(dst, np.uint8).any()  # nothing copied
    pool.close()
    with pytest.raises(hn.NativeError):
        pool.copy_helped(dst, src, np.array([0, 0, 4096], dtype=np.uint64))


def test_close_waits_for_a_helped_copy_under_way(
        copy_pair: tuple[SharedPool, SharedPool], cq: CompletionQueue, pool: CopyPool) -> None:
    dst, src = copy_pair
    half = dst.size // 2
    for request_id in range(1, 65):  # the worker is busy: the helped share stays queued
        pool.submit(request_id, dst, src, np.array([half, half, half], dtype=np.uint64))
    outcome: list[BaseException | None] = []

    def helped() -> None:
        try:
            pool.copy_helped(dst, src, np.array([0, 0, half], dtype=np.uint64))
            outcome.append(None)
        except BaseException as exc:  # reported to the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=helped)
    thread.start()
    pool.close()  # queued copies cancelled; a helped share goes back to its caller
    thread.join(timeout=30)
    assert not thread.is_alive()
    # Closed first, the call is refused; closed while it ran, it finished every byte.
    if outcome[0] is None:
        assert bytes(dst.view(0, half)) == bytes(src.view(0, half))
    else:
        assert isinstance(outcome[0], hn.NativeError)
    statuses = dict(wait_completions(cq, 64))
    assert set(statuses.values()) <= {hn.OK, hn.E_CANCELLED}
