"""Data-plane failure paths: deadlines, dead peers, cancellation, draining
regions and malformed peers. Every wait here is bounded."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from hixl_native import CompletionQueue, DataServer, SharedPool

hn = pytest.importorskip("hixl_native")
np = pytest.importorskip("numpy")

from tests.native._native_support import (  # noqa: E402
    CLUSTER,
    MAGIC,
    OP_READ,
    REQUEST,
    TOKEN,
    VERSION,
    RawClient,
    RawServer,
    assert_no_more,
    recv_exact,
    wait_completions,
    wait_one,
    wait_until,
)

KIB, MIB = 1 << 10, 1 << 20


def quads(rows: Any) -> Any:
    return np.array(rows, dtype=np.uint64).ravel()


@pytest.fixture
def raw_server(request: pytest.FixtureRequest) -> Iterator[RawServer]:
    srv = RawServer(request.param)
    yield srv
    srv.close()


@pytest.mark.parametrize("raw_server", ["silent"], indirect=True)
def test_deadline_without_answer(
    raw_server: RawServer, cq: CompletionQueue, pools: tuple[SharedPool, SharedPool]
) -> None:
    _, local = pools
    # one stream, so the second request must reuse (and reconnect) the
    # stream that timed out
    with hn.DataLink("127.0.0.1", raw_server.port, TOKEN, 1, cq, 2000) as link:
        start = time.monotonic()
        link.read(1, local, quads([(1, 0, 0, 256 * KIB)]), 200)
        assert wait_one(cq, 5) == (1, hn.E_TIMEOUT)
        elapsed = time.monotonic() - start
        assert 0.18 < elapsed < 2.0, elapsed
        # a timeout is not a dead peer: the stream resets and reconnects, in the
        # background or for the next request, whichever comes first
        assert link.alive
        link.write(2, local, quads([(1, 0, 0, 4 * KIB)]), 100)
        assert wait_one(cq, 5) == (2, hn.E_TIMEOUT)
        assert raw_server.accepted >= 2  # the first connection, then the new one


@pytest.mark.parametrize("raw_server", ["no_accept"], indirect=True)
def test_connect_deadline_when_nobody_answers_hello(
    raw_server: RawServer, cq: CompletionQueue
) -> None:
    start = time.monotonic()
    with pytest.raises(hn.NativeError) as info:
        hn.DataLink("127.0.0.1", raw_server.port, TOKEN, 1, cq, 200)
    assert info.value.code == hn.E_TIMEOUT
    assert time.monotonic() - start < 2.0


def test_timeout_mid_transfer_resets_stream(server: DataServer, cq: CompletionQueue) -> None:
    size = 64 * MIB
    remote, local = hn.SharedPool("big-r", size, 12), hn.SharedPool("big-l", size, 12)
    try:
        np.frombuffer(remote, np.uint8)[:] = np.random.default_rng(5).integers(
            0, 256, size, np.uint8
        )
        server.register_region(1, remote, 0, size, CLUSTER)
        with hn.DataLink("127.0.0.1", server.port, TOKEN, 2, cq, 2000) as link:
            # ~512 MiB cannot cross loopback TCP in 20 ms
            link.read(1, local, quads([(1, 0, 0, size)] * 8), 20)
            assert wait_one(cq) == (1, hn.E_TIMEOUT)
            assert link.alive
            link.read(2, local, quads([(1, 0, 0, 8 * MIB)]), 5000)
            assert wait_one(cq) == (2, hn.OK)
            assert np.array_equal(
                np.frombuffer(local, np.uint8)[: 8 * MIB],
                np.frombuffer(remote, np.uint8)[: 8 * MIB],
            )
        server.unregister_region(1)  # returns: the server let go of the region
    finally:
        local.close()
        remote.close()


@pytest.mark.parametrize("raw_server", ["close_after_request"], indirect=True)
def test_peer_dies_mid_request(
    raw_server: RawServer, cq: CompletionQueue, pools: tuple[SharedPool, SharedPool]
) -> None:
    _, local = pools
    with hn.DataLink("127.0.0.1", raw_server.port, TOKEN, 1, cq, 2000) as link:
        start = time.monotonic()
        link.read(1, local, quads([(1, 0, 0, 64 * KIB)]), 10_000)
        link.read(2, local, quads([(1, 0, 0, 64 * KIB)]), 10_000)
        got = sorted(wait_completions(cq, 2, 5))
        assert got == [(1, hn.E_CLOSED), (2, hn.E_CLOSED)]
        assert time.monotonic() - start < 2.0
        # A later request fails too: at once while the stream is down, or on the
        # stream reopened in the background, which this server closes again.
        link.write(3, local, quads([(1, 0, 0, 4 * KIB)]), 10_000)
        assert wait_one(cq, 2) == (3, hn.E_CLOSED)


def test_server_close_kills_link(
    server: DataServer, pools: tuple[SharedPool, SharedPool], cq: CompletionQueue
) -> None:
    remote, local = pools
    server.register_region(1, remote, 0, remote.size, CLUSTER)
    link = hn.DataLink("127.0.0.1", server.port, TOKEN, 4, cq, 2000)
    try:
        link.read(1, local, quads([(1, 0, 0, MIB)]), 5000)
        assert wait_one(cq) == (1, hn.OK)
        server.close()
        # idle streams notice the EOF on their own
        assert wait_until(lambda: not link.alive)
        link.read(2, local, quads([(1, 0, 0, MIB)]), 5000)
        assert wait_one(cq, 2) == (2, hn.E_CLOSED)
    finally:
        link.close()


@pytest.mark.parametrize("raw_server", ["silent"], indirect=True)
@pytest.mark.parametrize("streams", [1, 3])
def test_close_cancels_queued_and_in_flight(
    raw_server: RawServer, cq: CompletionQueue, pools: tuple[SharedPool, SharedPool], streams: int
) -> None:
    _, local = pools
    link = hn.DataLink("127.0.0.1", raw_server.port, TOKEN, streams, cq, 2000)
    for i in range(6):
        link.read(i, local, quads([(1, 0, i * 256 * KIB, 256 * KIB)]), 30_000)
    assert raw_server.requests_seen.wait(5)
    assert local.exports > 0  # in-flight requests pin the destination
    start = time.monotonic()
    link.close()
    assert time.monotonic() - start < 2.0
    got = wait_completions(cq, 6, 2)
    assert sorted(got) == [(i, hn.E_CANCELLED) for i in range(6)]
    assert_no_more(cq)
    assert local.exports == 0
    assert not link.alive


def test_unregister_waits_for_in_flight_read(
    server: DataServer, cq: CompletionQueue, pools: tuple[SharedPool, SharedPool]
) -> None:
    remote, local = pools
    np.frombuffer(remote, np.uint8)[:] = np.random.default_rng(6).integers(
        0, 256, remote.size, np.uint8
    )
    server.register_region(1, remote, 0, remote.size, CLUSTER)
    raw = RawClient(server.port, TOKEN)
    try:
        assert raw.welcome() == hn.OK
        # 8 MiB does not fit in the socket buffers: the server stays busy
        # sending, holding the region, until this client reads.
        raw.request(OP_READ, 42, [(1, 0, remote.size)])
        assert raw.reply() == (42, hn.OK)
        waiter = threading.Thread(target=server.unregister_region, args=(1,))
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive(), "unregister returned while a read used the region"
        # new requests are refused while the region drains
        with hn.DataLink("127.0.0.1", server.port, TOKEN, 1, cq, 2000) as link:
            link.read(7, local, quads([(1, 0, 0, 4 * KIB)]), 2000)
            assert wait_one(cq) == (7, hn.E_REFUSED)
        payload = recv_exact(raw.sock, remote.size)
        waiter.join(5)
        assert not waiter.is_alive()
        assert payload == bytes(remote.view(0, remote.size))
        assert remote.exports == 0
    finally:
        raw.close()


def test_bad_hello_is_answered_with_proto(server: DataServer) -> None:
    wrong_version = RawClient(server.port, TOKEN, version=VERSION + 1)
    try:
        assert wrong_version.welcome() == hn.E_PROTO
        assert wrong_version.at_eof()
    finally:
        wrong_version.close()
    wrong_magic = RawClient(server.port, TOKEN, magic=0xDEADBEEF)
    try:
        assert wrong_magic.welcome() == hn.E_PROTO
        assert wrong_magic.at_eof()
    finally:
        wrong_magic.close()


def test_unknown_token_closes_raw_connection(server: DataServer) -> None:
    raw = RawClient(server.port, TOKEN + 5)
    try:
        assert raw.welcome() == hn.E_REFUSED
        assert raw.at_eof()
    finally:
        raw.close()


@pytest.mark.parametrize("case", ["no_ranges", "total_mismatch", "bad_op"])
def test_malformed_request_gets_proto_and_close(
    server: DataServer, pools: tuple[SharedPool, SharedPool], case: str
) -> None:
    remote, _ = pools
    server.register_region(1, remote, 0, remote.size, CLUSTER)
    raw = RawClient(server.port, TOKEN)
    try:
        assert raw.welcome() == hn.OK
        if case == "no_ranges":
            raw.request(OP_READ, 3, [], nranges=0)
        elif case == "total_mismatch":
            raw.request(OP_READ, 3, [(1, 0, 100)], total=99)
        else:
            raw.sock.sendall(REQUEST.pack(MAGIC, VERSION, 3, 9, 0, 0, 1, 3, 100, 1000, 0))
        assert raw.reply() == (3, hn.E_PROTO)
        assert raw.at_eof()
    finally:
        raw.close()
    server.unregister_region(1)
