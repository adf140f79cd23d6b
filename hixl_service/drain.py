"""The graceful stop: refuse new work, let the work in flight end, then stop.

SIGTERM, SIGINT and ``Admin/Drain`` start it (``server``). From then on the
daemon refuses new sessions, cluster inits, links (its clusters' and peers'
Hello) and transfers, each with ``LLM_FAILED`` and gRPC UNAVAILABLE and a
message that says the daemon is stopping; the calls that end work already
under way still run (a started layer-wise task's layers, unlinks,
deallocations, finalize). The daemon waits up to ``server.grace_period_s``
for the transfer calls under way (``load.TransferLoad``: pulls, pushes,
copies and LayerReady calls, on the lane and over gRPC) and the layer-wise
tasks still open to end, and only then ends the sessions, which closes their
links with the peers told.

A handler of new work says so with :func:`refuses_while_draining`, the one
place the servicers' refusal is written.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn, Protocol, TypeVar

import grpc

from hixl_wire.status import LLMStatusCode

from .load import TransferLoad
from .rpc_errors import CallRefused

logger = logging.getLogger(__name__)

# How often the drain looks whether the work in flight has ended.
_POLL_S = 0.02

Request = TypeVar("Request")
Call = TypeVar("Call")
Reply = TypeVar("Reply")


class Drain:
    """Whether the daemon still takes new work, and the layer-wise tasks it waits for."""

    def __init__(self, load: TransferLoad, native: Callable[[], int] = lambda: 0) -> None:
        """``native``: the transfers native lanes have out (native_lanes.py)."""
        self._load = load
        self._native = native
        self.draining = False
        self.layerwise_tasks = 0  # TransferCache streams that started a task and still run

    def begin(self) -> bool:
        """Stop taking new work; False if the drain had begun already."""
        if self.draining:
            return False
        self.draining = True
        return True

    def refuse_new(self, what: str) -> None:
        """Refuse new work of kind ``what`` ("transfers", "links", ...) while draining."""
        if self.draining:
            raise refusal(what)

    @property
    def busy(self) -> bool:
        return self._load.running > 0 or self.layerwise_tasks > 0 or self._native() > 0

    def in_flight(self) -> str:
        return (f"{self._load.running} transfer calls, {self._native()} native transfers and "
                f"{self.layerwise_tasks} layer-wise tasks")

    async def wait_idle(self, grace_s: float) -> bool:
        """Wait until no transfer call and no layer-wise task runs, at most ``grace_s``;
        whether they all ended."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self.busy:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(_POLL_S)
        return True


def refusal(what: str) -> CallRefused:
    """The refusal of new work during the drain: UNAVAILABLE, as for a daemon that is down."""
    return CallRefused(f"the hixl daemon is stopping (draining): it takes no new {what}; "
                       f"use another daemon, or this one once it was restarted",
                       LLMStatusCode.LLM_FAILED, grpc.StatusCode.UNAVAILABLE)


class Draining(Protocol):
    """A servicer whose handlers refuse new work while the daemon drains."""

    @property
    def drain(self) -> Drain: ...


ServicerT = TypeVar("ServicerT", bound=Draining)
Handler = Callable[[ServicerT, Request, Call], Awaitable[Reply]]


def refuses_while_draining(what: str) -> Callable[[Handler[ServicerT, Request, Call, Reply]],
                                                  Handler[ServicerT, Request, Call, Reply]]:
    """Make a servicer's handler of new work of kind ``what`` ("transfers", "links",
    ...) answer :func:`refusal` while the daemon drains, before it runs at all.

    The handler stays what it was for ``calls.unary`` and the lanes (a function of
    the servicer, the request and the call, returning an awaitable): the wrapper
    is a plain function that hands back the handler's own coroutine, so a call
    that goes on costs one plain call, as ``Drain.refuse_new`` did, and no extra
    coroutine. A refused call raises when awaited, as the handler would have.
    """
    def decorate(handler: Handler[ServicerT, Request, Call, Reply]
                 ) -> Handler[ServicerT, Request, Call, Reply]:
        @functools.wraps(handler)
        def refusing(servicer: ServicerT, request: Request, call: Call) -> Awaitable[Reply]:
            if servicer.drain.draining:
                return _refused(what)
            return handler(servicer, request, call)

        return refusing

    return decorate


async def _refused(what: str) -> NoReturn:
    raise refusal(what)
