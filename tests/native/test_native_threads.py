"""The data plane's threads: a fixed set on each side, whatever the number of
links, and a silent peer holds none of them (link_threads.c, tcp_server.c)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from hixl_native import CompletionQueue, DataServer, SharedPool

hn = pytest.importorskip("hixl_native")
np = pytest.importorskip("numpy")

from tests.native._native_support import (  # noqa: E402
    CLUSTER,
    TOKEN,
    RawServer,
    wait_completions,
    wait_one,
)

KIB = 1 << 10
REGION = 7
LINKS = 200
STREAMS = 4


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def quads(rows: Any) -> Any:
    return np.array(rows, dtype=np.uint64).ravel()


@pytest.fixture
def local(server: DataServer, pools: tuple[SharedPool, SharedPool]) -> Iterator[SharedPool]:
    """The local pool; the remote one is REGION of ``server``, filled with a pattern."""
    remote, local = pools
    np.frombuffer(remote, np.uint8)[:] = np.arange(remote.size, dtype=np.uint64).astype(np.uint8)
    server.register_region(REGION, remote, 0, remote.size, CLUSTER, writable=True)
    yield local
    server.unregister_region(REGION)


def test_links_share_a_fixed_set_of_threads(pools: tuple[SharedPool, SharedPool],
                                            cq: CompletionQueue) -> None:
    remote, local = pools
    server = hn.DataServer("127.0.0.1", 0, max_connections=LINKS * STREAMS + 1, threads=4)
    assert server.threads == 4
    server.authorize(TOKEN, CLUSTER)
    server.register_region(REGION, remote, 0, remote.size, CLUSTER)
    warm = hn.DataLink("127.0.0.1", server.port, TOKEN, 1, cq, 2000)  # starts the workers
    links = []
    try:
        threads, fds = _threads(), _fds()
        for _ in range(LINKS):
            links.append(hn.DataLink("127.0.0.1", server.port, TOKEN, STREAMS, cq, 5000))
        assert all(link.streams_up == STREAMS for link in links)
        # Each link: its sockets on both ends (one process) and its stop
        # eventfd; not one thread more.
        assert _fds() - fds == LINKS * (2 * STREAMS + 1)
        assert _threads() == threads
        # Every link moves bytes on the shared workers.
        for i, link in enumerate(links):
            link.read(i, local, quads([(REGION, 4 * KIB * (i % 16), 0, 4 * KIB)]), 5000)
        done = wait_completions(cq, LINKS, 30)
        assert sorted(done) == [(i, hn.OK) for i in range(LINKS)]
        assert _threads() == threads
    finally:
        for link in links:
            link.close()
        warm.close()
        server.unregister_region(REGION)
        server.close()


def _eventfds() -> int:
    return sum(1 for fd in os.listdir("/proc/self/fd")
               if _link_target(f"/proc/self/fd/{fd}") == "anon_inode:[eventfd]")


def _link_target(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # the listing's own fd, closed by now
        return ""


def test_a_closed_link_still_referenced_holds_no_eventfd(
        server: DataServer, pools: tuple[SharedPool, SharedPool], cq: CompletionQueue) -> None:
    """close() gives back the link's stop eventfd, not only its sockets: a
    closed link that something still references (a prepared repeat, a
    traceback's frame) holds no descriptor."""
    remote, local = pools
    server.register_region(REGION, remote, 0, remote.size, CLUSTER)
    before = _eventfds()
    link = hn.DataLink("127.0.0.1", server.port, TOKEN, STREAMS, cq, 5000)
    try:
        assert _eventfds() == before + 1
        link.read(1, local, quads([(REGION, 0, 0, 4 * KIB)]), 5000)
        assert wait_completions(cq, 1, 10) == [(1, hn.OK)]
        link.close()
        assert _eventfds() == before
        with pytest.raises(hn.NativeError):  # and the closed link refuses work
            link.read(2, local, quads([(REGION, 0, 0, 4 * KIB)]), 5000)
    finally:
        link.close()
        server.unregister_region(REGION)


@pytest.mark.parametrize("silent", [4], ids=["4-silent-links"])
def test_a_silent_peer_holds_no_worker(
    silent: int, server: DataServer, pools: tuple[SharedPool, SharedPool], local: SharedPool,
    cq: CompletionQueue
) -> None:
    """Requests to a peer that never answers wait parked, without a thread:
    a healthy link's request, started after them with a shorter deadline,
    still completes (were the workers held, it would time out first)."""
    stuck_ms, healthy_ms = 8000, 3000
    stuck = 3 * hn.link_threads()
    raw = RawServer("silent")
    silent_links = [hn.DataLink("127.0.0.1", raw.port, TOKEN, STREAMS, cq, 2000)
                    for _ in range(silent)]
    healthy = hn.DataLink("127.0.0.1", server.port, TOKEN, 1, cq, 2000)
    try:
        for i in range(stuck):
            # several pieces per request (bytes over 4 streams): every
            # stream of every silent link gets work
            silent_links[i % silent].read(1000 + i, local,
                                          quads([(REGION, 0, 1 << 20, 1 << 20)]), stuck_ms)
        healthy.read(1, local, quads([(REGION, 0, 0, 64 * KIB)]), healthy_ms)
        assert wait_one(cq, healthy_ms / 1000 + 2) == (1, hn.OK)
        remote = pools[0]
        assert np.array_equal(np.frombuffer(local, np.uint8)[: 64 * KIB],
                              np.frombuffer(remote, np.uint8)[: 64 * KIB])
        for link in silent_links:
            link.close()  # wakes the parked pieces: each ends, cancelled
        statuses = {status for _, status in wait_completions(cq, stuck, 10)}
        assert statuses == {hn.E_CANCELLED}
    finally:
        for link in silent_links:
            link.close()
        healthy.close()
        raw.close()


def test_a_parked_piece_ends_at_its_deadline(local: SharedPool, cq: CompletionQueue) -> None:
    raw = RawServer("silent")
    link = hn.DataLink("127.0.0.1", raw.port, TOKEN, 2, cq, 2000)
    try:
        link.read(5, local, quads([(REGION, 0, 0, 8 * KIB)]), 300)
        assert wait_one(cq, 5) == (5, hn.E_TIMEOUT)
    finally:
        link.close()
        raw.close()


def test_thread_counts_are_checked() -> None:
    with pytest.raises(ValueError):
        hn.DataServer("127.0.0.1", 0, threads=0)
    with pytest.raises(ValueError):
        hn.set_link_threads(257)
