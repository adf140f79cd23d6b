"""The TCP transport: the native data plane between two daemons.

A link's ``hixl_native.DataLink`` holds several TCP streams to the far
daemon's data server; a transfer is posted to it as one native request per
slice of ranges and its completion comes back through the daemon's one
``CompletionQueue`` (``completions``), watched by the event loop.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import hixl_native
import numpy as np

from hixl_wire.status import LLMException, LLMStatusCode

from ..native_errors import link_error
from .base import REACHES_HOST_MEMORY, TCP_STREAMS, Place, Prepared, TransportInfo

if TYPE_CHECKING:
    from ..completions import CompletionDispatcher
    from ..memory.base import Memory
    from ..planning import Ranges

# A small transfer started while no other one is under way may be finished
# on the event loop's thread: it sends the request and waits this long (GIL
# released) for the reply, which spares the two thread handoffs of a native
# round trip; a reply that takes longer is left to the link's worker.
INLINE_WAIT_US = 200

# A transfer of more ranges than this reaches the data link in slices of
# this many, two at a time: each slice's native request (iovecs and wire
# ranges, 40 bytes a range, built from 32-byte quads) exists only while it
# moves, so a very long block list never holds all of them at once, and two
# slices in flight keep the streams busy between them.
SLICE_RANGES = 16384
SLICES_IN_FLIGHT = 2


def _gone(exc: hixl_native.NativeError) -> Exception:
    """A submit refused because the local engine memory was revoked meanwhile."""
    return link_error(exc.code) if exc.code == hixl_native.E_GONE else exc


def _check(status: int) -> None:
    if status != hixl_native.OK:
        raise link_error(status)


async def _failed(status: int) -> None:
    _check(status)


async def landed(posted: asyncio.Future[int]) -> None:
    """Wait for a posted request to end; raise if it failed.

    The native side ends every request by its deadline, so this wait is bounded
    even if nothing else is; the shield leaves the future (and the pin) to the
    dispatcher if the caller is cancelled."""
    _check(await asyncio.shield(posted))


class TcpTransport:
    """One link's native data link."""

    name = "tcp"
    capabilities = frozenset({REACHES_HOST_MEMORY, TCP_STREAMS})
    peer_calls: tuple[str, ...] = ()  # of the far daemon, beyond protocol 1's: none

    def __init__(self, data: hixl_native.DataLink, dispatcher: CompletionDispatcher,
                 remote_cluster_id: int) -> None:
        self._data = data
        self._dispatcher = dispatcher
        self._remote_cluster_id = remote_cluster_id

    @classmethod
    async def open(cls, host: str, port: int, token: int, streams: int,
                   dispatcher: CompletionDispatcher, connect_timeout_s: float,
                   remote_cluster_id: int, key: bytes) -> TcpTransport:
        """Connect ``streams`` data-plane streams to the far daemon's data server,
        each proving the link's ``key`` (agreed at Hello) to it."""
        if len(key) != hixl_native.KEY_SIZE:
            raise LLMException(f"the peer at {host}:{port} gave no data-plane key for the link "
                               f"(an older hixl?)", status_code=LLMStatusCode.LLM_LINK_FAILED)
        try:
            data = await asyncio.to_thread(hixl_native.DataLink, host, port, token, streams,
                                           dispatcher.queue, int(connect_timeout_s * 1000), key)
        except hixl_native.NativeError as exc:
            raise LLMException(f"cannot open the data plane to {host}:{port}: {exc}",
                               status_code=LLMStatusCode.LLM_LINK_FAILED) from exc
        return cls(data, dispatcher, remote_cluster_id)

    @property
    def alive(self) -> bool:
        return bool(self._data.alive)

    def info(self) -> TransportInfo:
        return TransportInfo(self.name, self._data.streams, self.alive,
                             streams_up=self._data.streams_up, capabilities=self.capabilities)

    # Plain functions handing back _transfer's coroutine: one coroutine fewer a request.
    def read(self, local: Memory, far: Place, ranges: Ranges, timeout_ms: int,
             checksum: bool = False) -> Coroutine[Any, Any, None]:
        return self._transfer(False, local, far.region_id, ranges, timeout_ms, checksum)

    def write(self, local: Memory, far: Place, ranges: Ranges, timeout_ms: int,
              checksum: bool = False) -> Coroutine[Any, Any, None]:
        return self._transfer(True, local, far.region_id, ranges, timeout_ms, checksum)

    def prepare(self, writing: bool, local: Memory, far: Place, ranges: Ranges,
                nbytes: int, checksum: bool = False) -> Prepared:
        if len(ranges) <= SLICE_RANGES:
            return _OneRequest(self, writing, local, far.region_id, ranges, checksum)
        return _Sliced(self, writing, local, far.region_id, ranges, checksum)

    def start(self, writing: bool, local: Memory, region_id: int, ranges: Ranges,
              timeout_ms: int, remote_shift: int = 0, local_shift: int = 0,
              checksum: bool = False) -> int | asyncio.Future[int]:
        """Post ranges of one remote region (at most ``SLICE_RANGES``) to the data
        link as one request, every remote and local offset shifted by
        ``remote_shift`` and ``local_shift`` (natively: no new array). Returns
        its native status when it ended inside the call (alone, a small request
        may: see INLINE_WAIT_US), else the future of its completion, ``local``
        pinned until then (``landed`` waits for it). ``checksum``: the request
        carries a CRC-32C of its bytes (``tcp_wire.h``). Raises, having posted
        nothing, when the link is down or the data link refuses the request."""
        submit = self._submit(writing)
        dispatcher = self._dispatcher
        request_id = dispatcher.new_id()
        try:
            status = submit(request_id, local.data_handle, region_id, ranges,
                            max(1, timeout_ms), INLINE_WAIT_US if dispatcher.idle else 0,
                            remote_shift, local_shift, checksum=checksum)
        except hixl_native.NativeError as exc:
            raise _gone(exc) from None
        return status if status is not None else self._posted(request_id, local)

    def _posted(self, request_id: int, local: Memory) -> asyncio.Future[int]:
        """The completion of a request just posted, ``local`` pinned until it arrives
        (a native job cannot be interrupted)."""
        done = self._dispatcher.expect_id(request_id)
        local.pin_until(done)
        return done

    def _submit(self, writing: bool) -> Callable[..., int | None]:
        """The data link's submit of one direction's requests, after checking that
        the link is up."""
        data = self._data
        if not data.alive:
            raise LLMException(
                f"the data streams to cluster {self._remote_cluster_id} are lost; they are "
                f"reopened in the background while its daemon answers (query_link_states "
                f"shows the link's state)", status_code=LLMStatusCode.LLM_LINK_FAILED)
        return data.write_to if writing else data.read_from

    async def _transfer(self, writing: bool, local: Memory, region_id: int, ranges: Ranges,
                        timeout_ms: int, checksum: bool = False) -> None:
        """Post ranges of one remote region to the data link and wait for the completion.

        ``ranges`` are the planner's (n, 3) uint64 rows: (remote offset, local
        offset, length) to read, (local offset, remote offset, length) to write.
        A longer list goes out in slices of ``SLICE_RANGES``, ``SLICES_IN_FLIGHT``
        at a time; the first failure stops further slices, and the call returns
        only once every slice it started has ended.
        """
        if len(ranges) <= SLICE_RANGES:
            started = self.start(writing, local, region_id, ranges, timeout_ms,
                                 checksum=checksum)
            if isinstance(started, int):
                _check(started)
            else:
                await landed(started)
            return
        submit = self._submit(writing)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        moving: collections.deque[asyncio.Future[int]] = collections.deque()
        failed, refused = hixl_native.OK, None
        try:
            for start in range(0, len(ranges), SLICE_RANGES):
                if len(moving) == SLICES_IN_FLIGHT:
                    failed = await asyncio.shield(moving.popleft())
                    if failed != hixl_native.OK:
                        break
                request_id = self._dispatcher.new_id()
                remaining_ms = max(1, int((deadline - loop.time()) * 1000))
                # No inline wait: a slice's completion always comes through the queue.
                try:
                    submit(request_id, local.data_handle, region_id,
                           ranges[start:start + SLICE_RANGES], remaining_ms, 0,
                           checksum=checksum)
                except hixl_native.NativeError as exc:
                    raise _gone(exc) from None
                moving.append(self._posted(request_id, local))
        except Exception as exc:  # a slice the data link would not take
            refused = exc
        while moving:  # every started slice ends by its deadline
            status = await asyncio.shield(moving.popleft())
            failed = status if failed == hixl_native.OK else failed
        if refused is not None:
            raise refused
        _check(failed)

    async def close(self) -> None:
        await asyncio.to_thread(self._data.close)


@dataclass(frozen=True, slots=True)
class NativePlan:
    """A prepared TCP request as a native lane's cell takes it (``RepeatCell``)."""

    link: hixl_native.DataLink
    local: hixl_native.Mapping
    region_id: int
    ranges: Ranges
    writing: bool
    checksum: bool


class _Planned:
    """Ranges of one remote region, kept for starts between other slots."""

    __slots__ = ("_checksum", "_local", "_ranges", "_region_id", "_transport", "_writing")

    def __init__(self, transport: TcpTransport, writing: bool, local: Memory, region_id: int,
                 ranges: Ranges, checksum: bool) -> None:
        self._transport = transport
        self._writing = writing
        self._local = local
        self._region_id = region_id
        self._ranges = ranges
        self._checksum = checksum


class _OneRequest(_Planned):
    """Ranges that fit one native request: a repeat passes the two shifts to
    the data link, which adds them to its private copy as it checks them."""

    __slots__ = ()

    def native(self) -> NativePlan | None:
        """What a native lane needs to run the repeats itself (native_lanes.py):
        only requests from pool memory, which the lane's thread sends itself;
        engine memory is staged by the link's workers."""
        local = self._local.data_handle
        if not isinstance(local, hixl_native.Mapping):
            return None
        return NativePlan(self._transport._data, local, self._region_id, self._ranges,
                          self._writing, self._checksum)

    def start(self, src_shift: int, dst_shift: int,
              timeout_ms: int) -> Awaitable[None] | None:
        remote_shift, local_shift = (dst_shift, src_shift) if self._writing else \
            (src_shift, dst_shift)
        posted = self._transport.start(self._writing, self._local, self._region_id,
                                       self._ranges, timeout_ms, remote_shift, local_shift,
                                       self._checksum)
        if not isinstance(posted, int):
            return landed(posted)
        if posted == hixl_native.E_REFUSED:
            _check(posted)  # RegionRefused: refused before a byte moved
        if posted == hixl_native.OK:
            return None
        # It ran and failed (bytes may have moved): reported, never started again
        # as if nothing had happened (raising here would run the full call).
        return _failed(posted)


class _Sliced(_Planned):
    """Ranges too many for one request: each start shifts a copy of them."""

    __slots__ = ()

    def start(self, src_shift: int, dst_shift: int,
              timeout_ms: int) -> Awaitable[None] | None:
        shifted = self._ranges + np.array((src_shift, dst_shift, 0), dtype=np.uint64)
        return self._transport._transfer(self._writing, self._local, self._region_id, shifted,
                                         timeout_ms, self._checksum)


def native_plan(prepared: Prepared) -> NativePlan | None:
    """What a native lane needs to run repeats of ``prepared`` itself; None unless
    it is one TCP request from pool memory (native_lanes.py)."""
    return prepared.native() if isinstance(prepared, _OneRequest) else None
