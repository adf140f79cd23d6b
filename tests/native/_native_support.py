"""Helpers for the native tests: waiting on completions and raw wire peers.

The raw peers speak the data-plane protocol documented in
``native/hixl_native/csrc/tcp_wire.h`` from plain Python sockets, to create
faults that a real DataServer never shows (a target that stops answering,
one that dies mid-request) and to hold a request open at a known point.
"""

from __future__ import annotations

import hashlib
import hmac
import select
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

MAGIC = 0x4C584948
VERSION = 2
HELLO = struct.Struct("<IHHQQ")
CHALLENGE = struct.Struct("<IHHiI32s")
PROOF = struct.Struct("<IHH32s")
WELCOME = struct.Struct("<IHHiI")
REQUEST = struct.Struct("<IHHBBHIQQII")
RANGE = struct.Struct("<QQQ")
REPLY = struct.Struct("<IHHiIQ")
OP_READ, OP_WRITE = 1, 2

TOKEN = 0x1234_5678_9ABC_DEF0
CLUSTER = 1
OTHER_CLUSTER = 2
NO_KEY = bytes(32)  # what DataServer.authorize and DataLink use when given no key


def data_mac(key: bytes, token: int, nonce: bytes) -> bytes:
    """A connection's answer to the target's CHALLENGE (tcp_wire.h)."""
    return hmac.new(key, b"hixl-data-v2" + struct.pack("<Q", token) + nonce,
                    hashlib.sha256).digest()


def wait_completions(cq: Any, count: int, timeout: float = 10.0) -> list[tuple[int, int]]:
    """Wait on the queue's eventfd until ``count`` completions arrived."""
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"only {got} of {count} completions after {timeout}s"
        readable, _, _ = select.select([cq.fd], [], [], left)
        if readable:
            got.extend(cq.drain())
    return got


def wait_one(cq: Any, timeout: float = 10.0) -> tuple[int, int]:
    """Wait for exactly one completion and return it."""
    (done,) = wait_completions(cq, 1, timeout)
    return done


def assert_no_more(cq: Any, window: float = 0.1) -> None:
    """Assert that nothing else is posted within a short window."""
    readable, _, _ = select.select([cq.fd], [], [], window)
    extra = cq.drain() if readable else []
    assert not readable and not extra, f"unexpected completions {extra}"


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Wait for a condition that has no fd to wait on (bounded)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Receive exactly ``n`` bytes or raise EOFError."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError(f"EOF after {got} of {n} bytes")
        got += k
    return bytes(buf)


class RawClient:
    """A blocking initiator that speaks the wire protocol by hand.

    ``welcome()`` answers the target's challenge with ``key`` (or with the
    ``proof`` given, to play a forger or a replayer) and returns the status
    of the handshake: the CHALLENGE's when it is not OK, else the WELCOME's.
    """

    def __init__(self, port: int, token: int, version: int = VERSION, magic: int = MAGIC,
                 key: bytes = NO_KEY, host: str = "127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=5)
        self.token = token
        self.key = key
        self.nonce = b""
        self.proof = b""
        self.sock.sendall(HELLO.pack(magic, version, 1, token, 0))

    def challenge(self) -> int:
        """Read the CHALLENGE; returns its status (its nonce is kept)."""
        magic, _version, kind, status, _, nonce = CHALLENGE.unpack(
            recv_exact(self.sock, CHALLENGE.size))
        assert (magic, kind) == (MAGIC, 5)
        self.nonce = nonce
        return int(status)

    def welcome(self, proof: bytes | None = None) -> int:
        """Finish the handshake; returns its status."""
        status = self.challenge()
        if status != 0:
            return status
        self.proof = data_mac(self.key, self.token, self.nonce) if proof is None else proof
        self.sock.sendall(PROOF.pack(MAGIC, VERSION, 6, self.proof))
        magic, _version, kind, status, _ = WELCOME.unpack(recv_exact(self.sock, WELCOME.size))
        assert (magic, kind) == (MAGIC, 2)
        return int(status)

    def request(
        self,
        op: int,
        tag: int,
        ranges: list[tuple[int, int, int]],
        timeout_ms: int = 10_000,
        nranges: int | None = None,
        total: int | None = None,
        flags: int = 0,
    ) -> None:
        """Send a REQUEST header and its range list (not a WRITE payload)."""
        real_total = sum(r[2] for r in ranges)
        self.sock.sendall(
            REQUEST.pack(
                MAGIC,
                VERSION,
                3,
                op,
                flags,
                0,
                len(ranges) if nranges is None else nranges,
                tag,
                real_total if total is None else total,
                timeout_ms,
                0,
            )
        )
        self.sock.sendall(b"".join(RANGE.pack(*r) for r in ranges))

    def reply(self) -> tuple[int, int]:
        """Return (tag, status) of the next REPLY."""
        tag, status, _flags = self.reply_flags()
        return tag, status

    def reply_flags(self) -> tuple[int, int, int]:
        """Return (tag, status, flags) of the next REPLY."""
        magic, _v, kind, status, reserved, tag = REPLY.unpack(recv_exact(self.sock, REPLY.size))
        assert (magic, kind) == (MAGIC, 4)
        return int(tag), int(status), reserved & 0xFF

    def at_eof(self) -> bool:
        """True when the target closed the connection."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


class RawServer:
    """A fake target run by one thread.

    Modes:
        "silent": completes the handshake, then reads and ignores everything.
        "close_after_request": completes the handshake, closes the
            connection once a whole request header arrived.
        "no_accept": listens but never accepts, so nobody ever answers HELLO.
    """

    def __init__(self, mode: str):
        self.mode = mode
        self.requests_seen = threading.Event()
        self.accepted = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread: threading.Thread | None = None
        if mode != "no_accept":
            self._thread = threading.Thread(target=self._run, name=f"raw-{mode}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        conns: dict[socket.socket, bytearray] = {}
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            try:
                while True:
                    for key, _ in sel.select():
                        if key.fileobj is self._wake_r:
                            return
                        if key.fileobj is self._listener:
                            conn, _ = self._listener.accept()
                            self.accepted += 1
                            conns[conn] = bytearray()
                            sel.register(conn, selectors.EVENT_READ)
                        else:
                            self._serve(sel, conns, key.fileobj)  # type: ignore[arg-type]
            finally:
                for conn in conns:
                    conn.close()

    def _serve(
        self,
        sel: selectors.BaseSelector,
        conns: dict[socket.socket, bytearray],
        conn: socket.socket,
    ) -> None:
        try:
            data = conn.recv(1 << 20)
        except ConnectionError:
            data = b""
        buf = conns[conn]
        before = len(buf)
        buf += data
        # The handshake as a real target runs it, without checking the proof.
        if before < HELLO.size <= len(buf):
            conn.sendall(CHALLENGE.pack(MAGIC, VERSION, 5, 0, 0, bytes(32)))
        shaken = HELLO.size + PROOF.size
        if before < shaken <= len(buf):
            conn.sendall(WELCOME.pack(MAGIC, VERSION, 2, 0, 0))
        request_done = len(buf) >= shaken + REQUEST.size
        if request_done:
            self.requests_seen.set()
        if not data or (self.mode == "close_after_request" and request_done):
            sel.unregister(conn)
            del conns[conn]
            conn.close()
        elif len(buf) > shaken + REQUEST.size:
            del buf[shaken + REQUEST.size :]  # "silent": keep only what counts

    def close(self) -> None:
        self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join(5)
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()


# Bytes each side sends to complete a connection's handshake (tcp_wire.h).
HANDSHAKE_C2S = HELLO.size + PROOF.size
HANDSHAKE_S2C = CHALLENGE.size + WELCOME.size


class FlipRelay:
    """A TCP relay in front of a server that damages one byte in flight.

    Armed with ``offset`` (at start or by :meth:`arm`), it XORs with 0x01 the
    byte that many bytes later in direction ``direction`` ("c2s": initiator
    to target, "s2c": back), counted over all its connections, once;
    everything else passes unchanged (``offset`` None: a plain relay). One
    thread pumps both directions of every connection, so the initiator sees
    a real socket whose bytes were changed after they left the sender's
    memory. Counting over connections is exact while one request at a time
    moves through it.
    """

    def __init__(self, target_port: int, direction: str = "s2c", offset: int | None = None,
                 target_host: str = "127.0.0.1", listen: tuple[str, int] = ("127.0.0.1", 0)
                 ) -> None:
        assert direction in ("c2s", "s2c")
        self.direction = direction
        self.flipped = threading.Event()
        self._lock = threading.Lock()
        self._left = offset  # bytes of `direction` to pass before the one to flip
        self._listener = socket.create_server(listen)
        self.port: int = self._listener.getsockname()[1]
        # target_port 0: the relay's own port, on target_host (a server that
        # listens on another address and advertises the relay's).
        self._target = (target_host, target_port or self.port)
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._run, name="flip-relay", daemon=True)
        self._thread.start()

    def arm(self, offset: int, direction: str | None = None) -> None:
        """Flip the byte ``offset`` bytes from now in ``direction`` (default: as before)."""
        assert direction in (None, "c2s", "s2c")
        with self._lock:
            self.flipped.clear()
            self.direction = direction or self.direction
            self._left = offset

    def _run(self) -> None:
        # peer socket -> (its partner, the direction it sends)
        pipes: dict[socket.socket, tuple[socket.socket, str]] = {}
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            try:
                while True:
                    for key, _ in sel.select(timeout=30):
                        sock = key.fileobj
                        if sock is self._wake_r:
                            return
                        if sock is self._listener:
                            self._accept(sel, pipes)
                        else:
                            self._pump(sel, pipes, sock)  # type: ignore[arg-type]
            finally:
                for sock in pipes:
                    sock.close()

    def _accept(self, sel: selectors.BaseSelector,
                pipes: dict[socket.socket, tuple[socket.socket, str]]) -> None:
        client, _ = self._listener.accept()
        client.settimeout(10)
        try:
            upstream = socket.create_connection(self._target, 5)
        except OSError:
            client.close()
            return
        upstream.settimeout(10)
        pipes[client] = (upstream, "c2s")
        pipes[upstream] = (client, "s2c")
        sel.register(client, selectors.EVENT_READ)
        sel.register(upstream, selectors.EVENT_READ)

    def _pump(self, sel: selectors.BaseSelector,
              pipes: dict[socket.socket, tuple[socket.socket, str]], sock: socket.socket) -> None:
        if sock not in pipes:
            return
        partner, direction = pipes[sock]
        try:
            data = bytearray(sock.recv(1 << 20))
        except OSError:
            data = bytearray()
        if not data:
            for end in (sock, partner):
                if end in pipes:
                    sel.unregister(end)
                    del pipes[end]
                    end.close()
            return
        with self._lock:
            if direction == self.direction and self._left is not None:
                if self._left < len(data):
                    data[self._left] ^= 0x01
                    self._left = None
                    self.flipped.set()
                else:
                    self._left -= len(data)
        try:
            partner.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self._wake_w.send(b"x")
        self._thread.join(5)
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
