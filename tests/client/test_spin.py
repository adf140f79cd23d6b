"""hixl_client._spin.ReplySpin: how long a lane call looks for its reply before
it sleeps, following how quickly replies came lately."""

from __future__ import annotations

import socket

from hixl_client._spin import REPLY_SPIN_US, ReplySpin


def test_the_first_call_spins_the_whole_bound() -> None:
    assert ReplySpin().budget_us() == REPLY_SPIN_US


def test_quick_replies_spin_twice_their_time() -> None:
    spin = ReplySpin(100.0)
    for _ in range(20):
        spin.took(20.0)
    assert spin.budget_us() == 40.0
    for _ in range(20):
        spin.took(80.0)
    assert spin.budget_us() == 100.0  # twice 80, capped at the bound


def test_slow_replies_stop_the_spin_and_quick_ones_bring_it_back() -> None:
    spin = ReplySpin(100.0)
    for _ in range(20):
        spin.took(500.0)
    assert spin.budget_us() == 0.0  # replies take longer: sleep at once
    for _ in range(20):
        spin.took(10.0)
    assert 0.0 < spin.budget_us() <= 100.0


def test_spin_returns_when_the_socket_has_bytes_and_at_its_budget() -> None:
    a, b = socket.socketpair()
    with a, b:
        spin = ReplySpin(1_000_000.0)  # a second at most: never reached below
        b.send(b"r")
        spin.spin(a.fileno())
        assert a.recv(1) == b"r"
        quiet = ReplySpin(50.0)
        quiet.spin(a.fileno())  # nothing to read: back after its budget
        assert quiet.budget_us() == 50.0
