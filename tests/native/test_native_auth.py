"""The data server's connection proof, write permission and connection limit.

Raw initiators play attackers: a connection that does not prove the link's
key (a forged MAC, or a MAC seen on another connection) is refused before
any request is read; a link authorized read-only has every WRITE refused
before a byte lands; connections beyond the server's limit are told E_BUSY.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from hixl_native import CompletionQueue, DataServer, SharedPool

hn = pytest.importorskip("hixl_native")
np = pytest.importorskip("numpy")

from tests.native._native_support import (  # noqa: E402
    CLUSTER,
    MAGIC,
    OP_READ,
    OP_WRITE,
    RANGE,
    REQUEST,
    VERSION,
    WELCOME,
    RawClient,
    recv_exact,
    wait_one,
)

KEY = bytes(range(32))
OTHER_KEY = bytes(reversed(range(32)))
LINK = 0x0BAD_F00D_0000_0001
READ_ONLY_LINK = 0x0BAD_F00D_0000_0002
REGION = 7


@pytest.fixture
def keyed(pools: tuple[SharedPool, SharedPool]) -> Iterator[tuple[DataServer, SharedPool]]:
    """A server with one writable region, a read-write link and a read-only one."""
    remote, _ = pools
    srv = hn.DataServer("127.0.0.1", 0)
    srv.authorize(LINK, CLUSTER, KEY)
    srv.authorize(READ_ONLY_LINK, CLUSTER, KEY, may_write=False)
    srv.register_region(REGION, remote, 0, 1 << 20, CLUSTER, writable=True)
    np.frombuffer(remote, np.uint8)[: 1 << 20] = 0x5A
    yield srv, remote
    srv.unregister_region(REGION)
    srv.close()


def test_the_right_key_is_welcomed(keyed: tuple[DataServer, SharedPool]) -> None:
    server, _ = keyed
    raw = RawClient(server.port, LINK, key=KEY)
    try:
        assert raw.welcome() == hn.OK
        raw.request(OP_READ, 1, [(REGION, 0, 16)])
        assert raw.reply() == (1, hn.OK)
        assert recv_exact(raw.sock, 16) == b"\x5a" * 16
    finally:
        raw.close()


@pytest.mark.parametrize("who", ["wrong_key", "no_key", "zero_mac"])
def test_a_connection_without_the_key_is_refused_before_any_request(
    keyed: tuple[DataServer, SharedPool], who: str
) -> None:
    server, _ = keyed
    key = {"wrong_key": OTHER_KEY, "no_key": bytes(32), "zero_mac": KEY}[who]
    raw = RawClient(server.port, LINK, key=key)
    try:
        status = raw.welcome(bytes(32) if who == "zero_mac" else None)
        assert status == hn.E_REFUSED
        assert raw.at_eof()
    finally:
        raw.close()


def test_a_proof_replayed_on_another_connection_is_refused(
    keyed: tuple[DataServer, SharedPool],
) -> None:
    server, _ = keyed
    first = RawClient(server.port, LINK, key=KEY)
    replay = RawClient(server.port, LINK, key=OTHER_KEY)
    try:
        assert first.welcome() == hn.OK
        # The attacker saw first's PROOF on the wire and sends it again.
        assert replay.welcome(first.proof) == hn.E_REFUSED
        assert replay.nonce != first.nonce
        assert replay.at_eof()
    finally:
        first.close()
        replay.close()


def test_a_request_sent_instead_of_a_proof_is_never_served(
    keyed: tuple[DataServer, SharedPool],
) -> None:
    server, remote = keyed
    raw = RawClient(server.port, LINK, key=KEY)
    try:
        assert raw.challenge() == hn.OK
        # A WRITE where the PROOF belongs: its first 40 bytes are taken as
        # the proof (not one); nothing of it lands.
        raw.sock.sendall(REQUEST.pack(MAGIC, VERSION, 3, OP_WRITE, 0, 0, 1, 9, 16, 1000, 0)
                         + RANGE.pack(REGION, 0, 16) + b"\xee" * 16)
        assert WELCOME.unpack(recv_exact(raw.sock, WELCOME.size))[3] == hn.E_PROTO
        assert raw.at_eof()
        assert bytes(np.frombuffer(remote, np.uint8)[:16]) == b"\x5a" * 16
    finally:
        raw.close()


def test_a_data_link_with_the_wrong_key_fails_to_open(
    keyed: tuple[DataServer, SharedPool], cq: CompletionQueue
) -> None:
    server, _ = keyed
    with pytest.raises(hn.NativeError) as failed:
        hn.DataLink("127.0.0.1", server.port, LINK, 2, cq, 2000, OTHER_KEY)
    assert failed.value.code == hn.E_REFUSED


def test_a_read_only_link_cannot_write_a_byte(
    keyed: tuple[DataServer, SharedPool], pools: tuple[SharedPool, SharedPool],
    cq: CompletionQueue,
) -> None:
    server, remote = keyed
    _, local = pools
    np.frombuffer(local, np.uint8)[:4096] = 0xEE
    with hn.DataLink("127.0.0.1", server.port, READ_ONLY_LINK, 1, cq, 2000, KEY) as link:
        link.write(5, local, np.array([REGION, 0, 0, 4096], dtype=np.uint64), 2000)
        assert wait_one(cq) == (5, hn.E_REFUSED)
        assert bytes(np.frombuffer(remote, np.uint8)[:4096]) == b"\x5a" * 4096
        link.read(6, local, np.array([REGION, 0, 0, 4096], dtype=np.uint64), 2000)
        assert wait_one(cq) == (6, hn.OK)
        assert bytes(np.frombuffer(local, np.uint8)[:4096]) == b"\x5a" * 4096


def test_connections_beyond_the_limit_are_told_busy(cq: CompletionQueue) -> None:
    srv = hn.DataServer("127.0.0.1", 0, max_connections=1)
    srv.authorize(LINK, CLUSTER, KEY)
    first = RawClient(srv.port, LINK, key=KEY)
    second = RawClient(srv.port, LINK, key=KEY)
    try:
        assert first.welcome() == hn.OK
        assert second.welcome() == hn.E_BUSY
        assert second.at_eof()
        with pytest.raises(hn.NativeError) as failed:
            hn.DataLink("127.0.0.1", srv.port, LINK, 1, cq, 2000, KEY)
        assert failed.value.code == hn.E_BUSY
        assert "limit of concurrent data connections" in str(failed.value)
    finally:
        first.close()
        second.close()
        srv.close()


def test_keys_of_the_wrong_size_are_refused(cq: CompletionQueue) -> None:
    srv = hn.DataServer("127.0.0.1", 0)
    try:
        with pytest.raises(ValueError, match="32 bytes"):
            srv.authorize(LINK, CLUSTER, b"short")
        with pytest.raises(ValueError, match="32 bytes"):
            hn.DataLink("127.0.0.1", srv.port, LINK, 1, cq, 2000, b"short")
    finally:
        srv.close()
