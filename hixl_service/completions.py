"""Native completions, delivered to the event loop without polling.

Native work (data-link requests, posted copies) ends on native threads,
which push (request id, status) pairs to one ``hixl_native.CompletionQueue``;
its eventfd wakes the loop, which resolves the future each request's
awaiter holds.
"""

from __future__ import annotations

import asyncio
import itertools

import hixl_native

from .load import TransferLoad


class CompletionDispatcher:
    """Resolves futures from native completions, woken by the queue's eventfd."""

    def __init__(self, loop: asyncio.AbstractEventLoop, load: TransferLoad | None = None) -> None:
        self.queue = hixl_native.CompletionQueue()
        self._loop = loop
        self._load = load if load is not None else TransferLoad()
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[int]] = {}
        loop.add_reader(self.queue.fd, self._on_ready)

    def expect(self) -> tuple[int, asyncio.Future[int]]:
        """Reserve a request id and the future its completion will resolve."""
        request_id = next(self._ids)
        return request_id, self.expect_id(request_id)

    def new_id(self) -> int:
        """A request id whose completion nobody awaits yet (see ``expect_id``)."""
        return next(self._ids)

    def expect_id(self, request_id: int) -> asyncio.Future[int]:
        """The future the completion of ``request_id`` will resolve; call it before the
        loop runs again, as completions are read only by the loop."""
        future: asyncio.Future[int] = self._loop.create_future()
        self._waiting[request_id] = future
        return future

    @property
    def idle(self) -> bool:
        """Nothing else to do: no native request of this daemon awaits its
        completion, and no other transfer call is under way (see load.py)."""
        return not self._waiting and self._load.alone

    def forget(self, request_id: int) -> None:
        self._waiting.pop(request_id, None)

    def _on_ready(self) -> None:
        for request_id, status in self.queue.drain():
            future = self._waiting.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(status)

    def close(self) -> None:
        self._loop.remove_reader(self.queue.fd)
        for future in self._waiting.values():
            if not future.done():
                future.set_result(hixl_native.E_CANCELLED)
        self._waiting.clear()
        self.queue.close()
