"""Waiting the first microseconds for a transfer-lane reply by looking, not sleeping.

A small transfer's reply comes back in tens of microseconds. A caller that
sleeps for it (the event loop in ``epoll``, a thread in ``recv``) is woken by
the kernel when it comes, and on a virtual machine that wake-up costs about
as much again. So a lane call spins first: it looks at the lane's socket, the
GIL released, for up to twice the time replies took lately
(``hixl_native.spin_readable``), and sleeps only after that. Once replies
take longer than the bound, spinning would only burn a core: the caller
sleeps at once, and looks again when replies get quick again. Between two
looks the thread yields its core to any other that wants it (``csrc/spin.h``).
"""

from __future__ import annotations

import asyncio
import time
from typing import TypeVar

import hixl_native

T = TypeVar("T")

# The longest spin: about the reply time of a small transfer between two hosts.
REPLY_SPIN_US = 100.0


class ReplySpin:
    """One lane connection's spin before it waits for a reply (see the module)."""

    def __init__(self, bound_us: float = REPLY_SPIN_US) -> None:
        self._bound_us = bound_us
        self._recent_us = 0.0  # a running mean of reply times; 0: none yet

    def budget_us(self) -> float:
        """How long the next wait spins (0: not at all)."""
        recent = self._recent_us
        if recent >= self._bound_us:
            return 0.0
        return self._bound_us if recent == 0 else min(self._bound_us, 2 * recent)

    def spin(self, fd: int) -> None:
        """Spin on the socket ``fd`` until it is readable or the budget is spent."""
        budget = self.budget_us()
        if budget > 0:
            hixl_native.spin_readable(fd, budget)

    async def reply(self, future: asyncio.Future[T], fd: int) -> T:
        """The future's result (a lane reply), spinning on the socket ``fd``
        first: the event loop then finds the reply at its next look instead
        of sleeping in ``epoll`` and being woken for it."""
        if future.done():
            return future.result()
        started = time.perf_counter()
        budget = self.budget_us()
        if budget > 0:
            hixl_native.spin_readable(fd, budget)
        try:
            return await future
        finally:
            self.took((time.perf_counter() - started) * 1e6)

    def took(self, reply_us: float) -> None:
        """A reply came ``reply_us`` after its call was sent."""
        self._recent_us = reply_us if self._recent_us == 0 else \
            0.75 * self._recent_us + 0.25 * reply_us


__all__ = ["REPLY_SPIN_US", "ReplySpin"]
