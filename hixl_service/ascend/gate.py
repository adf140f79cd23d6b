"""One communicator creation at a time per daemon, and the tie-break that keeps
two daemons linking to each other at once from deadlocking (issue 30, defect 6).

HCCL's creation calls (``HcclCommInitRootInfo[Config]``,
``HcclCommInitClusterInfoMemConfig``) may only run one at a time in a process,
and each blocks until the other rank of the communicator has made its own
(bounded by ``HCCL_CONNECT_TIMEOUT``). Were daemon A to enter its creation of
the A->B link while B entered its creation of the B->A link, each would wait
for the other, whose creation cannot start before its own ends. So a link's
creation is reserved on both daemons before either enters HCCL:

* the linking daemon holds its own gate, then asks the far daemon to hold its
  gate for the link (``Peer.HcclReserve``); the far daemon grants it only if
  its gate is free, and answers at once either way;
* refused, the daemon with the lower tie-break id keeps its gate and asks
  again; the other gives its gate up and waits a little, so the lower one's
  request is granted. Both are bounded by the link's deadline.

A granted reservation lapses unless the ``HcclConnect`` it is for arrives in
time. Everything here runs on the event loop.
"""

from __future__ import annotations

import asyncio
import secrets
import time

from hixl_wire.status import LLMException, LLMStatusCode


class CreationGate:
    """Who may create a communicator in this daemon now (one holder at a time)."""

    def __init__(self, tie_break: int | None = None) -> None:
        # compared with the far daemon's: the lower one creates first
        self.tie_break = tie_break if tie_break is not None else secrets.randbits(63) + 1
        self._holder: str | None = None
        self._lapse: asyncio.TimerHandle | None = None
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def holder(self) -> str | None:
        """Who holds the gate (``link:<name>`` or ``join:<name>``), None: free."""
        return self._holder

    def try_hold(self, owner: str, lapse_s: float | None = None) -> bool:
        """Hold the gate if it is free; with ``lapse_s``, only that long unless claimed."""
        if self._holder is not None:
            return False
        self._holder = owner
        if lapse_s is not None:
            self._lapse = asyncio.get_running_loop().call_later(lapse_s, self.release, owner)
        return True

    def claim(self, owner: str) -> bool:
        """Keep ``owner``'s reservation (it no longer lapses); False: it holds none."""
        if self._holder != owner:
            return False
        if self._lapse is not None:
            self._lapse.cancel()
            self._lapse = None
        return True

    async def hold(self, owner: str, deadline: float) -> None:
        """Wait for the gate until ``deadline`` (``time.monotonic()``), then hold it.

        Raises:
            LLMException: LLM_LINK_FAILED when the deadline passes first.
        """
        while not self.try_hold(owner):
            left = deadline - time.monotonic()
            if left <= 0:
                raise LLMException(
                    f"this daemon was creating another HCCL communicator ({self._holder}) "
                    f"until the link's deadline", status_code=LLMStatusCode.LLM_LINK_FAILED)
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait((waiter,), timeout=left)
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def release(self, owner: str) -> None:
        """Free the gate if ``owner`` holds it (idempotent)."""
        if self._holder != owner:
            return
        self._holder = None
        if self._lapse is not None:
            self._lapse.cancel()
            self._lapse = None
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
