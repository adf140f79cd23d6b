"""FaultTransport: a test double that wraps a real transport and breaks it on purpose.

It stands where a link's transport stands (``TransportKit.wrap`` puts it
there) and passes every call to the real transport it wraps, except the
requests a rule picks:

* ``delay``: the request waits ``delay_s`` first, then moves;
* ``drop``: the request is never answered, so it ends at its deadline with
  ``LLM_TIMEOUT``, as a request lost on the wire does;
* ``fail``: the request fails with ``status`` and moves nothing;
* ``refuse``: the far end refuses the ranges (``RegionRefused``), nothing moved;
* ``corrupt``: the request moves, with one byte flipped on its way (in the
  landed bytes of a read, in the source while a write sends it).

``sever()`` cuts the whole transport, as a dead stream or peer does:
``alive`` turns False, no stream is connected, and every later request
fails with ``LLM_LINK_FAILED``; ``heal()`` undoes it, as streams reopened
in the background do.
Rules apply to repeats too (``prepare``), since a prepared transfer moves
over the same transport.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from hixl_wire.status import LLMException, LLMStatusCode

from ..native_errors import RegionRefused
from .base import Place, Prepared, Transport, TransportInfo

if TYPE_CHECKING:
    from ..memory.base import Memory
    from ..planning import Ranges

FaultKind = Literal["delay", "drop", "fail", "refuse", "corrupt"]
Direction = Literal["read", "write", "any"]
_Move = Callable[[], Awaitable[None]]


@dataclass
class FaultRule:
    """Which requests to break, and how.

    ``nth`` counts the requests in the rule's direction from 1 after the rule
    was added (None: every one); ``times`` is how many it breaks at most.
    """

    kind: FaultKind
    direction: Direction = "any"
    nth: int | None = None
    times: int | None = 1
    delay_s: float = 0.0
    status: LLMStatusCode = LLMStatusCode.LLM_LINK_FAILED
    seen: int = 0
    applied: int = 0

    def picks(self, writing: bool) -> bool:
        if self.direction != "any" and (self.direction == "write") != writing:
            return False
        self.seen += 1
        if self.nth is not None and self.seen != self.nth:
            return False
        if self.times is not None and self.applied >= self.times:
            return False
        self.applied += 1
        return True


class FaultTransport:
    """A real transport with faults injected into the requests rules pick."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.rules: list[FaultRule] = []
        self.requests = 0  # requests that reached this transport
        self._severed = False

    def add(self, rule: FaultRule) -> FaultRule:
        self.rules.append(rule)
        return rule

    def clear(self) -> None:
        self.rules.clear()

    def sever(self) -> None:
        self._severed = True

    def heal(self) -> None:
        self._severed = False

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def alive(self) -> bool:
        return not self._severed and self.inner.alive

    def info(self) -> TransportInfo:
        inner = self.inner.info()
        return TransportInfo(inner.name, inner.streams, self.alive, inner.data_path,
                             0 if self._severed else inner.streams_up, inner.capabilities)

    def _rule_for(self, writing: bool) -> FaultRule | None:
        self.requests += 1
        if self._severed:
            raise LLMException("the link was severed (FaultTransport)",
                               status_code=LLMStatusCode.LLM_LINK_FAILED)
        return next((rule for rule in self.rules if rule.picks(writing)), None)

    async def read(self, local: Memory, far: Place, ranges: Ranges, timeout_ms: int,
                   checksum: bool = False) -> None:
        rule = self._rule_for(False)
        await self._run(rule, False, local, ranges, timeout_ms,
                        lambda: self.inner.read(local, far, ranges, timeout_ms, checksum))

    async def write(self, local: Memory, far: Place, ranges: Ranges, timeout_ms: int,
                    checksum: bool = False) -> None:
        rule = self._rule_for(True)
        await self._run(rule, True, local, ranges, timeout_ms,
                        lambda: self.inner.write(local, far, ranges, timeout_ms, checksum))

    def prepare(self, writing: bool, local: Memory, far: Place, ranges: Ranges,
                nbytes: int, checksum: bool = False) -> Prepared:
        return _FaultyPrepared(self, writing, local, ranges,
                               self.inner.prepare(writing, local, far, ranges, nbytes, checksum))

    async def _run(self, rule: FaultRule | None, writing: bool, local: Memory, ranges: Ranges,
                   timeout_ms: int, move: _Move) -> None:
        if rule is None:
            await move()
            return
        if rule.kind == "delay":
            await asyncio.sleep(rule.delay_s)
            await move()
        elif rule.kind == "drop":
            await asyncio.sleep(timeout_ms / 1000)
            raise LLMException("the transfer timed out (dropped by FaultTransport)",
                               status_code=LLMStatusCode.LLM_TIMEOUT)
        elif rule.kind == "fail":
            raise LLMException("the transfer failed (FaultTransport)", status_code=rule.status)
        elif rule.kind == "refuse":
            raise RegionRefused("the far end refused the ranges (FaultTransport)",
                                status_code=LLMStatusCode.LLM_PARAM_INVALID)
        elif writing:  # corrupt what is sent, then put the source back
            offset = int(ranges[0][0])
            _flip(local, offset)
            try:
                await move()
            finally:
                _flip(local, offset)
        else:  # corrupt what landed
            await move()
            _flip(local, int(ranges[0][1]))

    async def close(self) -> None:
        await self.inner.close()


def _flip(memory: Memory, offset: int) -> None:
    view = memoryview(memory.native)
    view[offset] ^= 0xFF


class _FaultyPrepared:
    """A prepared transfer of a FaultTransport: each start meets the same rules."""

    def __init__(self, transport: FaultTransport, writing: bool, local: Memory, ranges: Ranges,
                 inner: Prepared) -> None:
        self._transport = transport
        self._writing = writing
        self._local = local
        self._ranges = ranges
        self._inner = inner

    def start(self, src_shift: int, dst_shift: int,
              timeout_ms: int) -> Awaitable[None] | None:
        rule = self._transport._rule_for(self._writing)
        if rule is None:
            return self._inner.start(src_shift, dst_shift, timeout_ms)
        shifted = self._ranges.copy()
        shifted[:, 0] += src_shift
        shifted[:, 1] += dst_shift

        async def move() -> None:
            moving = self._inner.start(src_shift, dst_shift, timeout_ms)
            if moving is not None:
                await moving

        return self._transport._run(rule, self._writing, self._local, shifted, timeout_ms,
                                    move)
