"""The daemon's side of the native submission path (issue 32).

A client repeating a transfer shape writes each repeat into a ring it shares
with the daemon, and a native thread per ring connection runs it with no
Python on the way (``csrc/native_lane.h``). What that thread may run is
decided here, in Python, where every rule lives:

* **Cells.** After a repeat's shape was prepared (``prepared._prepare``,
  right after a transfer of it succeeded, so every part was current), its
  plan is *published* as a ``hixl_native.RepeatCell`` when the link's
  transport can hand it over (one TCP request from pool memory, small
  enough for the lane's thread to send itself). Publishing again replaces
  the shape's old cell.
* **Revocation.** A cell is revoked wherever ``PreparedTransfer.current``
  would say no: its local cache dropped by the registry (``CacheEntry.drop``
  runs the hook registered here; the cache's fence then also waits for the
  cell's transfers in flight, as for any other transfer), the daemon's
  settings reloaded (the checksum default may change) and the drain. A link
  that closes or dies needs no hook: the lane sees it natively and falls
  back; a far cache that went away is refused by the far data server, and the
  lane falls back with nothing moved. Every fallback takes the ordinary lane,
  where Python's full answer runs.
* **After the fact.** The lanes log each transfer they ran; the event loop
  reads the log when its descriptor is readable, at most every
  ``LOG_PERIOD_S``, and counts each as the lane's handlers count theirs
  (the transfer statistics, the link's health, the warning of a failure).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import hixl_native

from hixl_wire.rings import RingPair, new_pair

from .cluster import Cluster
from .native_errors import link_error
from .registry import CacheEntry
from .repeats import PreparedTransfer, Repeat
from .stats import DaemonStats
from .transfer_log import failed, succeeded
from .transfers import Outcome
from .transports.tcp import native_plan

logger = logging.getLogger(__name__)

# The longest transfer a lane's thread runs: what the data link sends whole
# from the submitting thread (tcp_link.c's INLINE_MAX_BYTES). Longer ones take
# the ordinary lane, whose transfers move on the link's workers.
MAX_NATIVE_BYTES = 512 * 1024
# The event loop reads the lanes' log no more often than this: a burst of
# transfers costs it one wake-up.
LOG_PERIOD_S = 0.005
# How often a revoked cell is looked at until its transfers in flight ended.
_POLL_S = 0.001


def owner_of(session_id: str) -> int:
    """The lanes' and cells' owner number of a session (its random id's first 64 bits)."""
    return int(session_id[:16], 16)


@dataclass
class _Published:
    """A cell and what the log's records of it count against."""

    cell: hixl_native.RepeatCell
    cluster: Cluster
    repeat: Repeat
    local: CacheEntry  # the memory it moves bytes of


class NativeLanes:
    """Every native lane, cell and the log of one daemon."""

    def __init__(self, stats: DaemonStats) -> None:
        self._stats = stats
        self.log = hixl_native.NativeLaneLog()
        self._published: dict[int, _Published] = {}  # by repeat handle
        self._lanes: set[hixl_native.NativeLane] = set()
        self._refusing = False  # draining: nothing new runs natively
        self._reader_at: asyncio.AbstractEventLoop | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self.native_transfers = 0  # what the lanes ran (/metrics: lane="native")

    # -- lanes -------------------------------------------------------------

    def open(self, session_id: str) -> tuple[hixl_native.NativeLane, RingPair, list[int]]:
        """A lane for a ring connection of session ``session_id``: the lane, the
        daemon's end of its rings, and the client's descriptors to send."""
        self._watch_log()
        pair, far = new_pair()
        try:
            lane = hixl_native.NativeLane(pair.incoming, pair.outgoing,
                                          owner_of(session_id), self.log)
        except BaseException:
            pair.close()
            for fd in far:
                os.close(fd)
            raise
        self._lanes.add(lane)
        return lane, pair, far

    def close(self, lane: hixl_native.NativeLane, pair: RingPair) -> None:
        """End a lane (its connection closed): its thread first, then its rings.
        The thread ends once the transfers it has out ended (each by its
        deadline), so it is waited for off the event loop."""
        self._lanes.discard(lane)
        task = asyncio.get_running_loop().create_task(self._stop(lane, pair))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _stop(lane: hixl_native.NativeLane, pair: RingPair) -> None:
        await asyncio.to_thread(lane.stop)
        pair.close()

    @property
    def under_way(self) -> int:
        """Transfers the lanes have out now (their callers did not cancel them)."""
        return sum(lane.under_way for lane in self._lanes)

    # -- cells -------------------------------------------------------------

    def runs(self, handle: int) -> bool:
        """Whether the lanes run repeats of ``handle`` now (a cell is published)."""
        return handle in self._published

    def offer(self, cluster: Cluster, repeat: Repeat,
              checksum_of: Callable[[int], bool]) -> bool:
        """After a transfer of ``repeat``'s shape succeeded: publish its prepared
        transfer, unless a cell of it is out already or it cannot run natively
        (``checksum_of`` resolves the shape's Checksum); whether the lanes run
        its repeats now."""
        prepared = repeat.found
        if prepared is None or prepared.native_fit is False or self._refusing:
            return False
        if repeat.handle in self._published:
            return True
        if prepared.native_fit is None:  # asked once per prepared transfer
            prepared.native_fit = (prepared.bytes <= MAX_NATIVE_BYTES
                                   and native_plan(prepared.handle) is not None)
            if not prepared.native_fit:
                return False
        if prepared.local.gone or not prepared.current(
                cluster.registry, cluster.links, repeat.shape, checksum_of(repeat.shape.checksum)):
            return False
        self.publish(cluster, repeat, prepared)
        return self.runs(repeat.handle)

    def publish(self, cluster: Cluster, repeat: Repeat, prepared: PreparedTransfer) -> None:
        """Let the lanes run repeats of ``repeat`` from ``prepared`` (just found
        current), if its transport can hand them over."""
        if self._refusing or prepared.bytes > MAX_NATIVE_BYTES:
            self.revoke(repeat.handle)
            return
        plan = native_plan(prepared.handle)
        if plan is None:
            self.revoke(repeat.handle)
            return
        source, destination = prepared.source, prepared.destination
        cell = hixl_native.RepeatCell(
            repeat.handle, owner_of(cluster.session_id), plan.writing, plan.checksum,
            plan.link, plan.local, plan.region_id, plan.ranges, source.stride,
            source.batch_size, destination.stride, destination.batch_size, prepared.bytes,
            cluster.settings.sync_timeout_ms)
        self.revoke(repeat.handle)
        cell.publish()
        local = prepared.local
        self._published[repeat.handle] = _Published(cell, cluster, repeat, local)
        if self._local_gone not in local.when_gone:
            local.when_gone.append(self._local_gone)

    def revoke(self, handle: int) -> None:
        """No lane runs the shape's cell again; it is freed once its transfers ended."""
        published = self._published.pop(handle, None)
        if published is not None:
            self._retire(published.cell, published.local)

    def revoke_all(self) -> None:
        """Revoke every cell (the settings changed, or the daemon drains)."""
        for handle in list(self._published):
            self.revoke(handle)

    def refuse(self) -> None:
        """The drain began: revoke everything, publish nothing from now on."""
        self._refusing = True
        self.revoke_all()

    def _local_gone(self, entry: CacheEntry) -> None:
        """The registry dropped ``entry``: revoke the cells that move its bytes."""
        for handle, published in list(self._published.items()):
            if published.local is entry:
                del self._published[handle]
                self._retire(published.cell, entry)

    def _retire(self, cell: hixl_native.RepeatCell, local: CacheEntry) -> None:
        """Revoke ``cell`` and free it once its transfers in flight ended; until
        then they count as users of ``local`` (its fence waits for them)."""
        cell.revoke()
        if not cell.inflight:
            cell.close()
            return
        task = asyncio.get_running_loop().create_task(self._close_when_idle(cell, local))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close_when_idle(cell: hixl_native.RepeatCell, local: CacheEntry) -> None:
        with local.in_use():
            # A native thread lowers the count: there is no event to wait on.
            while cell.inflight:  # noqa: ASYNC110 (each transfer ends by its deadline)
                await asyncio.sleep(_POLL_S)
        cell.close()

    async def close_all(self) -> None:
        """The daemon stops: every lane ended, every cell freed."""
        self.refuse()
        for lane in list(self._lanes):
            await asyncio.to_thread(lane.stop)
        self._lanes.clear()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        if self._reader_at is not None:
            self._reader_at.remove_reader(self.log.fd)
            self._reader_at = None
        self.catch_up()

    # -- the log -----------------------------------------------------------

    def _watch_log(self) -> None:
        if self._reader_at is None:
            self._reader_at = asyncio.get_running_loop()
            self._reader_at.add_reader(self.log.fd, self._log_readable)

    def _log_readable(self) -> None:
        """Read the log now, then not again for LOG_PERIOD_S (records wait meanwhile)."""
        loop = self._reader_at
        if loop is None:
            return
        loop.remove_reader(self.log.fd)
        self.catch_up()
        loop.call_later(LOG_PERIOD_S, self._rewatch, loop)

    def _rewatch(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._reader_at is loop:
            loop.add_reader(self.log.fd, self._log_readable)

    def catch_up(self) -> None:
        """Count what the lanes logged since the last look (the event loop only)."""
        records, dropped = self.log.take()
        if dropped:
            logger.warning("native lanes: %d transfers went uncounted (their log was full)",
                           dropped)
        for _owner, handle, outcome, status, nbytes, data_ns in records:
            self.native_transfers += 1
            published = self._published.get(handle)
            if published is None or published.cluster.closed:
                continue  # revoked since: its cluster may be gone
            cluster, shape = published.cluster, published.repeat.shape
            op = "push_cache" if shape.push else "pull_cache"
            if outcome == hixl_native.NL_OK:
                cluster.repeats.repeated += 1
                cluster.repeats.native += 1
                succeeded(cluster, shape.remote_cluster_id,
                          Outcome(nbytes, "tcp", data_ns / 1e9))
                self._stats.transferred(op, "tcp", nbytes, 0.0, data_ns / 1e9)
            else:
                failed(cluster, shape.remote_cluster_id,
                       "RepeatPush" if shape.push else "RepeatPull", link_error(status))


__all__ = ["LOG_PERIOD_S", "MAX_NATIVE_BYTES", "NativeLanes", "owner_of"]
