"""hixl_client._spin.ReplySpin: how long a lane call looks for its reply before
it sleeps, following how quickly replies came lately."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

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


@pytest.mark.asyncio(loop_scope="session")
async def test_a_reply_is_read_after_the_spin_and_its_time_recorded() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)
        loop = asyncio.get_running_loop()
        spin = ReplySpin(1_000_000.0)
        done = loop.create_future()
        done.set_result(b"early")
        assert await spin.reply(done, a.fileno()) == b"early"
        assert spin.budget_us() == 1_000_000.0  # answered before any wait: nothing learnt
        reply = loop.create_future()
        loop.add_reader(a.fileno(), lambda: reply.done() or reply.set_result(a.recv(1)))
        try:
            sender = threading.Timer(0.001, b.send, (b"r",))
            sender.start()
            assert await spin.reply(reply, a.fileno()) == b"r"
            sender.join()
        finally:
            loop.remove_reader(a.fileno())
        # the reply's time is what the next spin follows: twice it, below the bound
        assert 0.0 < spin.budget_us() < 1_000_000.0
