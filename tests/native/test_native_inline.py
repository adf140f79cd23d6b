"""Requests sent, and maybe finished, by the submitting thread: ``read_from`` /
``write_to`` with an inline wait, direct sends, and ``run_ranges``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

import pytest

if TYPE_CHECKING:
    from hixl_native import CompletionQueue, DataLink, DataServer, SharedPool

    Setup: TypeAlias = tuple[DataServer, SharedPool, SharedPool, CompletionQueue]

hn = pytest.importorskip("hixl_native")
np = pytest.importorskip("numpy")

from hixl_native._core import run_ranges  # noqa: E402

from tests.native._native_support import (  # noqa: E402
    CLUSTER,
    TOKEN,
    RawServer,
    assert_no_more,
    wait_completions,
    wait_one,
)

KIB, MIB = 1 << 10, 1 << 20
REGION, RO_REGION = 1, 2
WAIT_US = 100_000  # long enough that a local reply always arrives within it


def triples(rows: Any) -> Any:
    return np.array(rows, dtype=np.uint64).reshape(-1, 3)


def fill_random(mapping: Any, seed: int) -> Any:
    arr = np.frombuffer(mapping, np.uint8)
    arr[:] = np.random.default_rng(seed).integers(0, 256, arr.size, np.uint8)
    return arr


@pytest.fixture
def setup(
    server: DataServer, pools: tuple[SharedPool, SharedPool], cq: CompletionQueue
) -> Iterator[Setup]:
    remote, local = pools
    server.register_region(REGION, remote, 0, remote.size, CLUSTER, writable=True)
    server.register_region(RO_REGION, remote, 0, MIB, CLUSTER)
    yield server, remote, local, cq
    for rid in (REGION, RO_REGION):
        server.unregister_region(rid)


def open_link(server: DataServer, cq: CompletionQueue, streams: int) -> DataLink:
    link: DataLink = hn.DataLink("127.0.0.1", server.port, TOKEN, streams, cq, 2000)
    return link


def finish(link_result: int | None, cq: CompletionQueue, request_id: int) -> int:
    """The status, whether the request ended inside the call or was posted."""
    if link_result is not None:
        assert_no_more(cq, 0.05)  # ended here: nothing is posted
        return link_result
    got_id, status = wait_one(cq)
    assert got_id == request_id
    return status


@pytest.mark.parametrize("wait_us", [0, WAIT_US])
@pytest.mark.parametrize("streams", [1, 4])
@pytest.mark.parametrize("op", ["read", "write"])
@pytest.mark.parametrize("size", [1, 4 * KIB, 64 * KIB, 300 * KIB, 3 * MIB + 5])
def test_region_requests_are_byte_exact(setup: Setup, wait_us: int, streams: int, op: str,
                                        size: int) -> None:
    server, remote, local, cq = setup
    remote_arr, local_arr = fill_random(remote, 1), fill_random(local, 2)
    with open_link(server, cq, streams) as link:
        for i in range(3):  # the later ones find the streams idle again
            remote_off, local_off = 7 + i * 4 * MIB // 3, 11 + i * 997
            if op == "read":
                rows = triples([(remote_off, local_off, size)])
                result = link.read_from(i, local, REGION, rows, 5000, wait_us)
            else:
                rows = triples([(local_off, remote_off, size)])
                result = link.write_to(i, local, REGION, rows, 5000, wait_us)
            if wait_us == 0:
                assert result is None
            assert finish(result, cq, i) == hn.OK
            assert np.array_equal(remote_arr[remote_off:remote_off + size],
                                  local_arr[local_off:local_off + size])


@pytest.mark.parametrize("op", ["read", "write"])
def test_region_requests_take_shifts(setup: Setup, op: str) -> None:
    """Shifts move every range's remote and local offset, as a new list would;
    a shifted local range outside the mapping, or an offset that would wrap
    around, is refused before anything is sent."""
    server, remote, local, cq = setup
    fill_random(remote, 5)
    fill_random(local, 6)
    rows = triples([(0, 0, 8 * KIB), (64 * KIB, 16 * KIB, 4 * KIB)])
    with open_link(server, cq, 2) as link:
        if op == "read":
            result = link.read_from(1, local, REGION, rows, 5000, WAIT_US, MIB, 2 * MIB)
            assert finish(result, cq, 1) == hn.OK
            assert bytes(local.view(2 * MIB, 8 * KIB)) == bytes(remote.view(MIB, 8 * KIB))
            assert bytes(local.view(2 * MIB + 16 * KIB, 4 * KIB)) == \
                bytes(remote.view(MIB + 64 * KIB, 4 * KIB))
        else:  # write_to's rows are (local, remote, length)
            result = link.write_to(1, local, REGION, rows, 5000, WAIT_US, 3 * MIB, MIB)
            assert finish(result, cq, 1) == hn.OK
            assert bytes(remote.view(3 * MIB, 8 * KIB)) == bytes(local.view(MIB, 8 * KIB))
            assert bytes(remote.view(3 * MIB + 16 * KIB, 4 * KIB)) == \
                bytes(local.view(MIB + 64 * KIB, 4 * KIB))
        submit = link.read_from if op == "read" else link.write_to
        with pytest.raises(ValueError, match="outside"):
            submit(2, local, REGION, rows, 5000, 0, 0, local.size - 10 * KIB)
        with pytest.raises(ValueError, match="overflows"):
            submit(3, local, REGION, rows, 5000, 0, 2**64 - KIB, 0)
        assert_no_more(cq, 0.05)


def test_small_request_ends_inside_the_call(setup: Setup) -> None:
    server, _, local, cq = setup
    with open_link(server, cq, 2) as link:
        # A loopback reply takes microseconds; allow for a busy host anyway.
        results = [link.read_from(i, local, REGION, triples([(0, 0, 4 * KIB)]), 5000, WAIT_US)
                   for i in range(20)]
        assert any(result == hn.OK for result in results), results
        pending = [i for i, result in enumerate(results) if result is None]
        assert sorted(wait_completions(cq, len(pending))) == [(i, hn.OK) for i in pending]
        assert_no_more(cq, 0.05)
    assert local.exports == 0


def test_requests_one_at_a_time_keep_to_one_stream(setup: Setup) -> None:
    """A request alone goes out on the stream the last one used, not round robin;
    requests of several pieces still spread over every stream."""
    server, _, local, cq = setup
    with open_link(server, cq, 4) as link:
        for i in range(40):
            result = link.read_from(i, local, REGION, triples([(0, 0, 64 * KIB)]), 5000,
                                    WAIT_US)
            assert finish(result, cq, i) == hn.OK
        pieces = link.stream_pieces()
        assert sum(pieces) == 40 and max(pieces) == 40, pieces
        # 4 MiB is cut into one piece per stream (256 KiB at least each).
        result = link.read_from(40, local, REGION, triples([(0, 0, 4 * MIB)]), 5000, 0)
        assert finish(result, cq, 40) == hn.OK
        after = link.stream_pieces()
        assert [b - a for a, b in zip(pieces, after, strict=True)] == [1, 1, 1, 1], after
    assert link.stream_pieces() == after  # still readable once closed


def test_inline_refusal_keeps_the_stream(setup: Setup) -> None:
    server, _, local, cq = setup
    with open_link(server, cq, 1) as link:
        result = link.write_to(1, local, RO_REGION, triples([(0, 0, 4 * KIB)]), 5000, WAIT_US)
        assert finish(result, cq, 1) == hn.E_REFUSED
        result = link.read_from(2, local, 99, triples([(0, 0, 4 * KIB)]), 5000, WAIT_US)
        assert finish(result, cq, 2) == hn.E_REFUSED
        result = link.read_from(3, local, REGION, triples([(0, 0, 4 * KIB)]), 5000, WAIT_US)
        assert finish(result, cq, 3) == hn.OK
        assert link.alive


def test_empty_request_ends_at_once(setup: Setup) -> None:
    server, _, local, cq = setup
    with open_link(server, cq, 1) as link:
        assert link.read_from(1, local, REGION, triples([(0, 0, 0)]), 5000, WAIT_US) == hn.OK
        assert link.read_from(2, local, REGION, triples([(0, 0, 0)]), 5000) is None
        assert wait_one(cq) == (2, hn.OK)
        assert_no_more(cq, 0.05)


@pytest.mark.parametrize("raw_server", ["silent"], indirect=True)
@pytest.mark.parametrize("op", ["read", "write"])
def test_unanswered_inline_request_keeps_its_deadline(
    raw_server: RawServer, cq: CompletionQueue, pools: tuple[SharedPool, SharedPool], op: str
) -> None:
    _, local = pools
    with hn.DataLink("127.0.0.1", raw_server.port, TOKEN, 1, cq, 2000) as link:
        submit = link.read_from if op == "read" else link.write_to
        start = time.monotonic()
        # The call waits 20 ms for a reply, then leaves it to the worker.
        assert submit(1, local, 1, triples([(0, 0, 4 * KIB)]), 300, 20_000) is None
        assert time.monotonic() - start < 0.25
        assert wait_one(cq, 5) == (1, hn.E_TIMEOUT)
        assert 0.28 < time.monotonic() - start < 1.0
        # A deadline shorter than the wait ends inside the call.
        start = time.monotonic()
        result = submit(2, local, 1, triples([(0, 0, 4 * KIB)]), 30, 60_000)
        assert finish(result, cq, 2) == hn.E_TIMEOUT
        assert time.monotonic() - start < 0.5
        assert link.alive


@pytest.fixture
def raw_server(request: pytest.FixtureRequest) -> Iterator[RawServer]:
    srv = RawServer(request.param)
    yield srv
    srv.close()


def test_concurrent_submitters(setup: Setup) -> None:
    """Threads racing for idle streams, inline and not, every request exact."""
    server, remote, local, cq = setup
    remote_arr, local_arr = fill_random(remote, 5), fill_random(local, 6)
    errors: list[BaseException] = []
    ended_here: list[tuple[int, int]] = []
    lock = threading.Lock()

    def worker(t: int) -> None:
        try:
            for i in range(40):
                request_id = t * 1000 + i
                off = (t * 40 + i) * 8 * KIB
                size = (4 * KIB, 200 * KIB, 600 * KIB)[i % 3]
                result = link.read_from(request_id, local, REGION,
                                        triples([(off, off + MIB, size)]), 10_000,
                                        WAIT_US if i % 2 else 0)
                if result is not None:
                    with lock:
                        ended_here.append((request_id, result))
        except BaseException as exc:  # reported below
            errors.append(exc)

    with open_link(server, cq, 3) as link:
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not errors
        posted = wait_completions(cq, 160 - len(ended_here), 30)
        assert_no_more(cq, 0.05)
    statuses = dict(posted + ended_here)
    assert len(statuses) == 160 and set(statuses.values()) == {hn.OK}
    # later requests overwrite earlier ones where they overlap: check the last of each place
    for t in range(4):
        off = (t * 40 + 39) * 8 * KIB
        size = 4 * KIB
        assert np.array_equal(local_arr[off + MIB:off + MIB + size], remote_arr[off:off + size])


@pytest.mark.parametrize("streams", [1, 3])
def test_close_during_direct_traffic_cancels_cleanly(setup: Setup, streams: int) -> None:
    server, _, local, cq = setup
    link = open_link(server, cq, streams)
    pending = 0
    for i in range(30):
        result = link.read_from(i, local, REGION, triples([(0, i * KIB, 700 * KIB)]), 10_000,
                                WAIT_US if i % 2 else 0)
        pending += result is None
    link.close()
    got = wait_completions(cq, pending, 10)
    assert {status for _, status in got} <= {hn.OK, hn.E_CANCELLED}
    assert_no_more(cq, 0.05)
    assert local.exports == 0
    with pytest.raises(hn.NativeError):
        link.read_from(99, local, REGION, triples([(0, 0, 1)]), 1000, WAIT_US)


def test_region_arguments_are_checked(setup: Setup) -> None:
    server, _, local, cq = setup
    with open_link(server, cq, 1) as link:
        with pytest.raises(ValueError, match="outside the local mapping"):
            link.read_from(1, local, REGION, triples([(0, local.size - 5, 6)]), 1000)
        with pytest.raises(ValueError, match="outside the local mapping"):
            link.write_to(1, local, REGION, triples([(local.size - 5, 0, 6)]), 1000)
        with pytest.raises(ValueError):
            link.read_from(1, local, REGION, triples([(0, 0, 1)]), 1000, 10**9)
        with pytest.raises(ValueError):
            link.read_from(1, local, -1, triples([(0, 0, 1)]), 1000)
        with pytest.raises(ValueError):
            link.read_from(1, local, REGION, np.zeros(4, np.uint64), 1000)
        assert_no_more(cq, 0.05)


def test_run_ranges_merges_and_drops() -> None:
    def ranges(*args: Any) -> list[list[int]]:
        return np.frombuffer(run_ranges(*args), dtype=np.uint64).reshape(-1, 3).tolist()

    # adjacent tensors on both sides merge into one range
    assert ranges([0, 100, 200], 0, 5, (1000, 1100, 1200), 0, 0, 3, 100) == [[5, 1000, 300]]
    # only one side adjacent: nothing merges
    assert ranges([0, 100, 200, 1000], 1, 5, (0, 10, 20, 30), 0, 7, 3, 100) == [
        [105, 7, 100], [205, 17, 100], [1005, 27, 100]]
    assert ranges([0, 64], 0, 0, [0, 64], 0, 0, 2, 0) == []
    assert ranges([0], 0, 0, [0], 0, 0, 0, 8) == []
    with pytest.raises(ValueError):
        run_ranges([0], 0, 0, [0], 0, 0, 2, 1)  # past the offsets
    with pytest.raises(ValueError):
        run_ranges([0, 1], 0, -1, [0, 1], 0, 0, 1, 1)
    with pytest.raises(TypeError):
        run_ranges(["x"], 0, 0, [0], 0, 0, 1, 1)
