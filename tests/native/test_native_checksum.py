"""The data plane's optional CRC-32C trailer (tcp_wire.h): the CRC itself,
checked transfers over real sockets, and bytes damaged in flight by a relay."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

hn = pytest.importorskip("hixl_native")
np = pytest.importorskip("numpy")
core = pytest.importorskip("hixl_native._core")

from tests.native._native_support import (  # noqa: E402
    CLUSTER,
    HANDSHAKE_C2S,
    HANDSHAKE_S2C,
    OP_READ,
    OP_WRITE,
    RANGE,
    REPLY,
    REQUEST,
    TOKEN,
    FlipRelay,
    RawClient,
    recv_exact,
    wait_one,
)

KIB = 1 << 10
REGION = 5
FLAG_CRC32C = 1
BOUNCE = 64 * KIB  # small, so that engine-memory transfers take several chunks


def test_known_vectors() -> None:
    """The values of the CRC-32C check string and of RFC 3720's (iSCSI) examples,
    by the CPU's instruction and by the table, whole and continued."""
    vectors = {
        b"": 0,
        b"123456789": 0xE3069283,
        bytes(32): 0x8A9136AA,
        b"\xff" * 32: 0x62A8AB43,
        bytes(range(32)): 0x46DD794E,
        bytes(range(31, -1, -1)): 0x113FDB5C,
    }
    for data, want in vectors.items():
        assert hn.crc32c(data) == want, data
        assert core.crc32c_table(data) == want, data
        assert hn.crc32c(data[7:], hn.crc32c(data[:7])) == want


def test_hardware_and_table_agree_at_every_alignment() -> None:
    data = os.urandom(70_000)
    for start in range(9):
        # Around the three-lane stripes (3 x 4096 bytes) too.
        for length in (0, 1, 7, 8, 9, 63, 4096, 12_287, 12_288, 12_289, 24_581, 65_537):
            piece = memoryview(data)[start:start + length]
            assert hn.crc32c(piece) == core.crc32c_table(piece)


@pytest.fixture
def far(server: Any) -> Iterator[Any]:
    """A 1 MiB remote pool of random bytes, registered writable as REGION."""
    pool = hn.SharedPool("far", 1 << 20, 12)
    np.frombuffer(pool, np.uint8)[:] = np.random.default_rng(3).integers(0, 256, pool.size,
                                                                         np.uint8)
    server.register_region(REGION, pool, 0, pool.size, CLUSTER, writable=True)
    yield pool
    server.unregister_region(REGION)
    pool.close()


@pytest.fixture
def near() -> Iterator[Any]:
    pool = hn.SharedPool("near", 1 << 20, 12)
    yield pool
    pool.close()


def triples(rows: list[tuple[int, int, int]]) -> Any:
    return np.array(rows, dtype=np.uint64).reshape(-1, 3)


def finish(status: int | None, cq: Any, request_id: int) -> int:
    """The status of a request that ended inline (``status``) or was posted."""
    if status is not None:
        return status
    rid, posted = wait_one(cq)
    assert rid == request_id
    return posted


# (remote, local, length); no two overlap on either side: the receiver takes its
# CRC of the bytes as they land, and overlapping destinations would overwrite them.
ROWS = [(i * 12_288, i * 4096, 4096) for i in range(40)] + [(600 * KIB, 600 * KIB, 300 * KIB)]


@pytest.mark.parametrize("wait_us", [0, 2000])
@pytest.mark.parametrize("streams", [1, 3])
def test_checked_transfers_are_byte_exact(server: Any, cq: Any, far: Any, near: Any,
                                          streams: int, wait_us: int) -> None:
    """READ and WRITE with the trailer, of many ranges cut over streams, inline
    or posted: OK and the very bytes."""
    a, b = np.frombuffer(far, np.uint8), np.frombuffer(near, np.uint8)
    with hn.DataLink("127.0.0.1", server.port, TOKEN, streams, cq, 2000) as link:
        for k, rows in enumerate((ROWS, ROWS[:1], [(5, 3, 1)])):
            b[:] = 0
            status = link.read_from(10 + k, near, REGION, triples(rows), 5000, wait_us,
                                    checksum=True)
            assert finish(status, cq, 10 + k) == hn.OK
            for r, loc, n in rows:
                assert (b[loc:loc + n] == a[r:r + n]).all()
        b[:] = np.random.default_rng(9).integers(0, 256, b.size, np.uint8)
        back = [(loc, r, n) for r, loc, n in ROWS]
        status = link.write_to(20, near, REGION, triples(back), 5000, wait_us, checksum=True)
        assert finish(status, cq, 20) == hn.OK
        for loc, r, n in back:
            assert (a[r:r + n] == b[loc:loc + n]).all()


def corrupting_link(server: Any, cq: Any, direction: str, offset: int) -> tuple[FlipRelay, Any]:
    relay = FlipRelay(server.port, direction, offset)
    return relay, hn.DataLink("127.0.0.1", relay.port, TOKEN, 1, cq, 2000)


def test_a_read_damaged_in_flight_fails_with_e_checksum(server: Any, cq: Any, far: Any,
                                                        near: Any) -> None:
    """One payload byte flipped between the target and the initiator: a checked
    READ ends with E_CHECKSUM; the stream stays in step for the next request."""
    rows = [(4096, 0, 64 * KIB)]
    relay, link = corrupting_link(server, cq, "s2c", HANDSHAKE_S2C + REPLY.size + 1000)
    try:
        status = link.read_from(1, near, REGION, triples(rows), 5000, checksum=True)
        assert finish(status, cq, 1) == hn.E_CHECKSUM
        assert relay.flipped.is_set()
        status = link.read_from(2, near, REGION, triples(rows), 5000, checksum=True)
        assert finish(status, cq, 2) == hn.OK
        assert link.streams_up == 1  # the same connection carried on
    finally:
        link.close()
        relay.close()


def test_the_relay_really_damages_an_unchecked_read(server: Any, cq: Any, far: Any,
                                                    near: Any) -> None:
    """Without the trailer the same damage lands silently: what the CRC is for."""
    rows = [(4096, 0, 64 * KIB)]
    relay, link = corrupting_link(server, cq, "s2c", HANDSHAKE_S2C + REPLY.size + 1000)
    try:
        assert finish(link.read_from(1, near, REGION, triples(rows), 5000), cq, 1) == hn.OK
        got, want = np.frombuffer(near, np.uint8), np.frombuffer(far, np.uint8)
        assert got[1000] == want[4096 + 1000] ^ 1
        assert (got[:1000] == want[4096:5096]).all()
    finally:
        link.close()
        relay.close()


def test_a_write_damaged_in_flight_is_answered_e_checksum(server: Any, cq: Any, far: Any,
                                                          near: Any) -> None:
    rows = [(0, 8192, 64 * KIB)]
    np.frombuffer(near, np.uint8)[:] = 7
    relay, link = corrupting_link(server, cq, "c2s",
                                  HANDSHAKE_C2S + REQUEST.size + RANGE.size + 500)
    before = server.checksum_mismatches
    try:
        status = link.write_to(1, near, REGION, triples(rows), 5000, checksum=True)
        assert finish(status, cq, 1) == hn.E_CHECKSUM
        assert server.checksum_mismatches == before + 1  # counted where it was found
        status = link.write_to(2, near, REGION, triples(rows), 5000, checksum=True)
        assert finish(status, cq, 2) == hn.OK
        assert (np.frombuffer(far, np.uint8)[8192:8192 + 64 * KIB] == 7).all()
        assert server.checksum_mismatches == before + 1
    finally:
        link.close()
        relay.close()


@pytest.fixture
def pidfd() -> Iterator[int]:
    fd = os.pidfd_open(os.getpid())
    yield fd
    os.close(fd)


def span(array: Any, pidfd: int, bounce: tuple[Any, Any]) -> Any:
    return hn.ProcessSpan(pidfd, os.getpid(), array.ctypes.data, array.nbytes, *bounce)


@pytest.mark.parametrize("direction", ["s2c", "c2s"])
def test_engine_memory_through_bounce_buffers(server: Any, cq: Any, pidfd: int,
                                              direction: str) -> None:
    """Client-process memory at both ends (the target's transfer_bounced, the
    initiator's staged pieces), chunked through 64 KiB bounce buffers: checked
    transfers are exact, and damage in flight fails them with E_CHECKSUM."""
    bounce = (hn.BouncePool(2, BOUNCE), hn.BouncePool(2, BOUNCE))
    rng = np.random.default_rng(5)
    far_mem = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    near_mem = np.zeros(1 << 20, dtype=np.uint8)
    server.register_process_region(7, span(far_mem, pidfd, bounce), 0, far_mem.nbytes, CLUSTER,
                                   writable=True)
    local = span(near_mem, pidfd, bounce)
    rows = [(i * 12_288 % (1 << 20), i * 4096, 4096) for i in range(60)]
    back = [(loc, r, n) for r, loc, n in rows]
    damage = (HANDSHAKE_S2C + REPLY.size + 70_000 if direction == "s2c"
              else HANDSHAKE_C2S + REQUEST.size + 16 * RANGE.size + 70_000)
    relay = FlipRelay(server.port, direction, damage)
    try:
        with hn.DataLink("127.0.0.1", relay.port, TOKEN, 1, cq, 2000) as link:
            if direction == "s2c":
                assert link.read_from(1, local, 7, triples(rows), 5000, checksum=True) is None
                assert wait_one(cq)[1] == hn.E_CHECKSUM
                assert link.read_from(2, local, 7, triples(rows), 5000, checksum=True) is None
                assert wait_one(cq) == (2, hn.OK)
                for r, loc, n in rows:
                    assert (near_mem[loc:loc + n] == far_mem[r:r + n]).all()
            else:
                near_mem[:] = rng.integers(0, 256, near_mem.size, dtype=np.uint8)
                assert link.write_to(1, local, 7, triples(back), 5000, checksum=True) is None
                assert wait_one(cq)[1] == hn.E_CHECKSUM
                assert link.write_to(2, local, 7, triples(back), 5000, checksum=True) is None
                assert wait_one(cq) == (2, hn.OK)
                for loc, r, n in back:
                    assert (far_mem[r:r + n] == near_mem[loc:loc + n]).all()
        assert relay.flipped.is_set()
    finally:
        relay.close()
        server.unregister_region(7)
        local.revoke()


def test_target_echoes_the_flag_and_sends_the_trailer(server: Any, far: Any) -> None:
    """By hand: an OK REPLY to a checked READ echoes the flag, and the payload is
    followed by its CRC; a refused one echoes nothing and nothing follows."""
    raw = RawClient(server.port, TOKEN)
    try:
        assert raw.welcome() == 0
        raw.request(OP_READ, 1, [(REGION, 100, 5000)], flags=FLAG_CRC32C)
        assert raw.reply_flags() == (1, hn.OK, FLAG_CRC32C)
        payload = recv_exact(raw.sock, 5000)
        assert payload == bytes(far)[100:5100]
        assert int.from_bytes(recv_exact(raw.sock, 4), "little") == hn.crc32c(payload)
        raw.request(OP_READ, 2, [(99, 0, 10)], flags=FLAG_CRC32C)
        assert raw.reply_flags() == (2, hn.E_REFUSED, 0)
        # A WRITE whose trailer does not match: answered E_CHECKSUM, in step after.
        raw.request(OP_WRITE, 3, [(REGION, 0, 8)], flags=FLAG_CRC32C)
        raw.sock.sendall(b"abcdefgh" + (hn.crc32c(b"abcdefgh") ^ 1).to_bytes(4, "little"))
        assert raw.reply_flags() == (3, hn.E_CHECKSUM, FLAG_CRC32C)
        raw.request(OP_WRITE, 4, [(REGION, 0, 8)], flags=FLAG_CRC32C)
        raw.sock.sendall(b"abcdefgh" + hn.crc32c(b"abcdefgh").to_bytes(4, "little"))
        assert raw.reply_flags() == (4, hn.OK, FLAG_CRC32C)
        assert bytes(far)[:8] == b"abcdefgh"
    finally:
        raw.close()


def test_unknown_flags_are_a_protocol_error(server: Any, far: Any) -> None:
    raw = RawClient(server.port, TOKEN)
    try:
        assert raw.welcome() == 0
        raw.request(OP_READ, 1, [(REGION, 0, 10)], flags=0x02)
        assert raw.reply()[1] == hn.E_PROTO
        raw.sock.settimeout(5)
        try:
            assert raw.sock.recv(1) == b""
        except (TimeoutError, ConnectionResetError):
            pass
    finally:
        raw.close()


def test_the_mismatch_count_is_read_after_the_server_closed() -> None:
    """A /metrics scrape may come while the daemon stops, its data server closed."""
    srv = hn.DataServer("127.0.0.1", 0)
    srv.close()
    assert srv.checksum_mismatches == 0
