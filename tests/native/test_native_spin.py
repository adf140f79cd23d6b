"""hixl_native.spin_readable: a bounded look for bytes on a real socket."""

from __future__ import annotations

import socket
import threading

import pytest

native = pytest.importorskip("hixl_native")


def test_a_quiet_socket_is_not_readable_once_the_budget_is_spent() -> None:
    a, b = socket.socketpair()
    with a, b:
        assert not native.spin_readable(a.fileno(), 200.0)
        assert not native.spin_readable(a.fileno(), 0.0)


def test_bytes_or_an_end_make_it_readable() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.send(b"x")
        assert native.spin_readable(a.fileno(), 1_000_000.0)
        assert a.recv(1) == b"x"  # the look took nothing
        b.close()
        assert native.spin_readable(a.fileno(), 1_000_000.0)  # the end: recv says so
        assert a.recv(1) == b""


def test_a_spin_sees_bytes_another_thread_sends() -> None:
    a, b = socket.socketpair()
    with a, b:
        sender = threading.Timer(0.001, b.send, (b"y",))
        sender.start()
        # Long enough to see the byte even on a busy host; a spin that lost its
        # CPU ends early, so retry within the bound instead of timing anything.
        seen = any(native.spin_readable(a.fileno(), 100_000.0) for _ in range(1000))
        sender.join()
        assert seen and a.recv(1) == b"y"


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError):
        native.spin_readable(0, -1.0)
