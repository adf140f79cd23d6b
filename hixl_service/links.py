"""Links between clusters and the transports that move their bytes.

A link is chosen at link time and never changes silently:

* ``local``: both clusters live in this daemon; a transfer is a native
  memcpy between their pools (``copier``, GIL released);
* ``tcp``: the remote cluster lives in another daemon; a transfer is posted
  to a native ``DataLink`` (several TCP streams) and its completion comes back
  through one ``CompletionQueue`` watched by the event loop (no polling);
* ``hccl`` (the Ascend backend): the remote cluster lives in another daemon;
  a transfer is a matched HCCL batch on both daemons (``ascend.hccl_link``).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import hixl_native
import numpy as np

from hixl_client.status import LLMException, LLMStatusCode

from .load import TransferLoad

if TYPE_CHECKING:
    from .ascend.hccl_link import HcclInbound, HcclLink
    from .peer_api import PeerApi, ResolvedCache
    from .planning import Ranges
    from .pools import Memory

logger = logging.getLogger(__name__)

TRANSPORT_LOCAL = "local"
TRANSPORT_TCP = "tcp"
TRANSPORT_HCCL = "hccl"

# A native status becomes the LLMStatusCode the caller sees.
_NATIVE_STATUS = {
    hixl_native.E_TIMEOUT: (LLMStatusCode.LLM_TIMEOUT, "the transfer timed out"),
    hixl_native.E_CLOSED: (LLMStatusCode.LLM_LINK_FAILED, "the peer daemon closed the link"),
    hixl_native.E_REFUSED: (LLMStatusCode.LLM_PARAM_INVALID,
                            "the peer refused a range outside the memory the cluster registered"),
    hixl_native.E_IO: (LLMStatusCode.LLM_LINK_FAILED, "a data-plane socket failed"),
    hixl_native.E_PROTO: (LLMStatusCode.LLM_LINK_FAILED, "the data-plane protocol broke"),
    hixl_native.E_CANCELLED: (LLMStatusCode.LLM_LINK_FAILED, "the link was closed"),
}


class RegionRefused(LLMException):
    """The peer's data server refused a range (a region gone, or outside it)."""


def native_status_error(status: int) -> LLMException:
    """Translate a failed native completion status into an LLMException."""
    code, text = _NATIVE_STATUS.get(status, (LLMStatusCode.LLM_FAILED, "the transfer failed"))
    kind = RegionRefused if status == hixl_native.E_REFUSED else LLMException
    return kind(f"{text} (native status {status})", status_code=code)


# A small transfer started while no other one is under way may be finished
# on the event loop's thread: it sends the request and waits this long (GIL
# released) for the reply, which spares the two thread handoffs of a native
# round trip; a reply that takes longer is left to the link's worker.
INLINE_WAIT_US = 200


# A transfer of more ranges than this reaches the data link in slices of
# this many, two at a time: each slice's native request (iovecs and wire
# ranges, 40 bytes a range, built from 32-byte quads) exists only while it
# moves. A 200k-range pull then holds about 2.4 MiB of them instead of 15,
# and two slices in flight keep the streams busy between them.
SLICE_RANGES = 16384
SLICES_IN_FLIGHT = 2


def _posted(dispatcher: CompletionDispatcher, request_id: int,
            local: Memory) -> asyncio.Future[int]:
    """The completion of a request just posted to the data link, ``local`` pinned
    until it arrives (a native job cannot be interrupted)."""
    done = dispatcher.expect_id(request_id)
    local.pin_until(done)
    return done


def _check(status: int) -> None:
    if status != hixl_native.OK:
        raise native_status_error(status)


async def landed(posted: asyncio.Future[int]) -> None:
    """Wait for a posted request (``OutboundLink.start``) to end; raise if it failed.

    The native side ends every request by its deadline, so this wait is bounded
    even if nothing else is; the shield leaves the future (and the pin) to the
    dispatcher if the caller is cancelled."""
    _check(await asyncio.shield(posted))


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


@dataclass
class OutboundLink:
    """A link this daemon opened from a local cluster to a (possibly local) remote one."""

    local_cluster_id: int
    remote_cluster_id: int
    remote_peer_address: str
    remote_daemon_id: str
    token: int
    transport: str
    peer: PeerApi | None = None  # None for local links
    data: hixl_native.DataLink | None = None
    hccl: HcclLink | None = None
    # Remote caches named by id or blocks key, as last resolved. Like
    # LLM-DataDist's copy of the peer's cache index, it saves the peer call on
    # later transfers; region ids are never reused, so a stale entry can only
    # be refused by the peer's data server, never misdirect bytes.
    resolved: dict[tuple[str, int], ResolvedCache] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        if self.hccl is not None:
            return self.hccl.alive
        return self.data.alive if self.data is not None else True

    @property
    def streams(self) -> int:
        return self.data.streams if self.data is not None else 0

    async def read(self, dispatcher: CompletionDispatcher, dst: Memory,
                   region_id: int, ranges: Ranges, timeout_ms: int) -> None:
        """Move (remote offset, pool offset, length) ranges into ``dst``; raise on failure."""
        if self.hccl is not None:
            await self._hccl(False, dst, ranges[:, [1, 2]], region_id, ranges[:, [0, 2]],
                             timeout_ms)
            return
        await self._transfer(dispatcher, False, dst, region_id, ranges, timeout_ms)

    async def write(self, dispatcher: CompletionDispatcher, src: Memory,
                    region_id: int, ranges: Ranges, timeout_ms: int) -> None:
        """Move (pool offset, remote offset, length) ranges out of ``src``; raise on failure."""
        if self.hccl is not None:
            await self._hccl(True, src, ranges[:, [0, 2]], region_id, ranges[:, [1, 2]],
                             timeout_ms)
            return
        await self._transfer(dispatcher, True, src, region_id, ranges, timeout_ms)

    def start(self, dispatcher: CompletionDispatcher, writing: bool, local: Memory,
              region_id: int, ranges: Ranges, timeout_ms: int, remote_shift: int = 0,
              local_shift: int = 0) -> int | asyncio.Future[int]:
        """Post ranges of one remote region (``_transfer``'s rows, at most
        ``SLICE_RANGES``) to the data link as one request, every remote and
        local offset shifted by ``remote_shift`` and ``local_shift`` (natively:
        no new array). Returns its native status when it ended inside the call
        (alone, a small request may: see INLINE_WAIT_US), else the future of
        its completion, ``local`` pinned until then (``landed`` waits for it).
        Raises, having posted nothing, when the link is down or the data link
        refuses the request."""
        submit = self._submit(writing)
        request_id = dispatcher.new_id()
        status = submit(request_id, local.native, region_id, ranges, max(1, timeout_ms),
                        INLINE_WAIT_US if dispatcher.idle else 0, remote_shift, local_shift)
        return status if status is not None else _posted(dispatcher, request_id, local)

    def _submit(self, writing: bool) -> Callable[..., int | None]:
        """The data link's submit of one direction's requests of one region, after
        checking that the link is up."""
        data = self.data
        assert data is not None
        if not data.alive:
            raise LLMException(
                f"the link to cluster {self.remote_cluster_id} is down; unlink and link again",
                status_code=LLMStatusCode.LLM_LINK_FAILED)
        return data.write_to if writing else data.read_from

    async def _transfer(self, dispatcher: CompletionDispatcher, writing: bool, local: Memory,
                        region_id: int, ranges: Ranges, timeout_ms: int) -> None:
        """Post ranges of one remote region to the data link and wait for the completion.

        ``ranges`` are the planner's (n, 3) uint64 rows: (remote offset, local
        offset, length) to read, (local offset, remote offset, length) to write.
        A longer list goes out in slices of ``SLICE_RANGES``, ``SLICES_IN_FLIGHT``
        at a time; the first failure stops further slices, and the call returns
        only once every slice it started has ended.
        """
        if len(ranges) <= SLICE_RANGES:
            started = self.start(dispatcher, writing, local, region_id, ranges, timeout_ms)
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
                request_id = dispatcher.new_id()
                remaining_ms = max(1, int((deadline - loop.time()) * 1000))
                # No inline wait: a slice's completion always comes through the queue.
                submit(request_id, local.native, region_id, ranges[start:start + SLICE_RANGES],
                       remaining_ms, 0)
                moving.append(_posted(dispatcher, request_id, local))
        except Exception as exc:  # a slice the data link would not take
            refused = exc
        while moving:  # every started slice ends by its deadline
            status = await asyncio.shield(moving.popleft())
            failed = status if failed == hixl_native.OK else failed
        if refused is not None:
            raise refused
        _check(failed)

    async def _hccl(self, sending: bool, local: Memory, local_pairs: Ranges, region_id: int,
                    remote_pairs: Ranges, timeout_ms: int) -> None:
        assert self.hccl is not None
        if not local.on_device:
            raise LLMException("the hccl transport moves device memory: use DEVICE caches "
                               "on both ends", status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
        await self.hccl.transfer(sending, local, np.ascontiguousarray(local_pairs).ravel(),
                                 region_id, np.ascontiguousarray(remote_pairs).ravel(),
                                 max(1, timeout_ms))

    def close(self) -> None:
        if self.data is not None:
            self.data.close()


@dataclass
class InboundLink:
    """A link another daemon (or this one) opened to one of our clusters."""

    token: int
    src_daemon_id: str
    src_cluster_id: int
    dst_cluster_id: int
    hccl: HcclInbound | None = None  # the hccl backend's side of the link
