"""The HCCL transport: one two-rank communicator per link, one-sided where CANN allows.

The linking daemon is rank 0. With ``ascend.comm_init = "rank_table"`` (the
default, as HIXL does) it asks the other daemon for its rank
(``Peer.HcclRankInfo``: host, physical device, device NIC), builds the
two-rank table and sends it with ``Peer.HcclConnect``; with ``"root_info"``
it sends ``HcclGetRootInfo``'s root info instead. Both daemons then build
the communicator concurrently (`Channel.build`, the one place a link's
communicator is made), each with a stream of its own for the link; the
shim creates communicators one at a time per process.

**One-sided** (HIXL's direct path), when both daemons' CANN has the API:
right after the communicator is built, each side binds its cluster's
registered device memory to it (``Channel.prepare_one_sided``: the one place
that binds) and both prepare it at once (``Peer.HcclPrepare``). A pull is
then ``HcclBatchGet`` and a push ``HcclBatchPut`` of (local, remote, count)
descriptors, queued by the linking side alone and waited for on the link's
stream with the transfer's deadline; the other daemon is asked once per
region where it lies (``Peer.HcclRegion``), never per transfer. A transfer
touching memory registered after the link was prepared prepares a new
communicator first; memory that still is not bound moves two-sided.

**Two-sided** (the fallback: a CANN without the one-sided API on either
side): a pull or push is one batch on each side: the linking daemon asks the
other (``Peer.HcclPost``) to check the ranges against its region and queue its
side (sends for a pull, receives for a push), then queues the matching
receives or sends in the same order and waits for them. Each range is an
``HcclBatchSendRecv`` call of its own (one item per peer and direction, as
CANN requires). Each side runs one batch of a link at a time, in order, so the
two sides always pair up.

A batch that fails or runs past its deadline tears the channel down on the
side that saw it, in the order CANN allows (`Channel.destroy`): abort the
stream's work (``aclrtStreamAbort``), unbind its memory, destroy the
communicator, then the stream, which is never destroyed while its work has
not ended (``aclrtDestroyStream`` would wait for it). The link stays, and its
next transfer builds a new communicator. Each communicator's HCCL buffers
(twice ``ascend.hccl_buffer_mb``) count against its device's budget. Every
wait is bounded: building and preparing by the link timeout, batches by the
transfer's deadline (on the linked side plus a short grace, so that a batch
the other side never completes times out on the linking side first and is
reported as a timeout).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from hixl_native import _ascend
from hixl_native._ascend import AscendError

from hixl_wire.status import LLMException, LLMStatusCode

from ..ascend.comms import CommSettings, CommSpec, rank_table
from ..native_errors import RegionRefused
from .base import ONE_SIDED, Place, Prepared, TransportInfo
from .hccl_channel import (
    INITIATOR_RANK,
    NO_COMMUNICATOR,
    RESERVE_BACKOFF_S,
    RESERVE_RETRY_S,
    REVOKE_WAIT_S,
    WATCH_GRACE_S,
    WATCH_WAIT_MS,
    Channel,
    FarRegion,
    Side,
    block_on,
    close_when_built,
    fail,
    pause,
    region_pairs,
    remaining_ms,
)
from .hccl_inbound import HcclInbound, hccl_side
from .hccl_peer import LINK_CALLS, HcclPeer

__all__ = ["HcclInbound", "HcclLink", "HcclTransport", "hccl_side", "region_pairs"]

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from ..ascend.onesided import OneSidedMemory
    from ..memory.base import Memory
    from ..peer_api import PeerApi
    from ..planning import Ranges

logger = logging.getLogger(__name__)


class HcclLink(Side):
    """The linking daemon's side of one link (rank 0)."""

    def __init__(self, device: _ascend.Device, peer: PeerApi, token: int,
                 settings: CommSettings, memory: OneSidedMemory | None = None,
                 cluster_id: int = 0) -> None:
        super().__init__(device, settings, memory, cluster_id)
        self._peer = HcclPeer(peer)
        self._token = token
        # Far regions of the current communicator (asked once each).
        self._regions: dict[int, FarRegion] = {}
        # (local memory, far region) pairs still unbound after a fresh prepare:
        # they move two-sided rather than prepare yet another communicator.
        self._unbound: set[tuple[int, int]] = set()
        self._one_sided_failed = False
        self._builds = 0
        # the watch on the current one-sided communicator (Peer.HcclTeardown)
        self._watcher: asyncio.Task[None] | None = None
        self._watched: Channel | None = None
        self._watch_destroying = False

    async def _spec(self, deadline: float) -> CommSpec:
        """What both ranks build the next communicator from."""
        self._builds += 1
        # unique in both processes: HCCL refuses a name in use
        name = f"hixl-{self._token:016x}-{self._builds}"
        buffer_mb = self._settings.buffer_mb
        if self._settings.mode == "rank_table":
            far = await self._peer.hccl_rank_info(self._token,
                                                  max(0.001, deadline - time.monotonic()))
            mine = await asyncio.to_thread(self._settings.describe, self._device.id)
            try:
                far.check()
            except ValueError as exc:
                raise LLMException(f"the peer's HCCL rank is unusable: {exc}",
                                   status_code=LLMStatusCode.LLM_LINK_FAILED) from None
            try:
                table = rank_table(mine, far)
            except ValueError as exc:  # refused before HCCL would wait for it in vain
                raise LLMException(str(exc), status_code=LLMStatusCode.LLM_LINK_FAILED) from None
            return CommSpec(rank_table=table, buffer_mb=buffer_mb, name=name)
        try:
            root_info = await asyncio.to_thread(self._device.hccl_root_info)
        except AscendError as exc:
            raise fail(exc, "creating the HCCL root info") from exc
        return CommSpec(root_info=root_info, buffer_mb=buffer_mb, name=name)

    async def connect(self, timeout_s: float) -> None:
        """Build the communicator with the other daemon, within ``timeout_s``."""
        async with self._lock:
            await self._connect(time.monotonic() + timeout_s)

    async def _connect(self, deadline: float) -> None:
        await self._drop()
        try:
            spec = await self._spec(deadline)
        except (LLMException, AscendError) as exc:
            error = fail(exc, "describing this side's HCCL rank")
            raise LLMException(f"cannot open the HCCL link: {error}",
                               status_code=LLMStatusCode.LLM_LINK_FAILED) from exc
        owner = f"link:{spec.name}"
        await self._reserve(spec.name, owner, deadline)
        local: asyncio.Future[Channel] = asyncio.ensure_future(asyncio.to_thread(
            Channel.build, self._device, spec, INITIATOR_RANK, self._settings,
            remaining_ms(deadline)))
        # held until the build ends, also when it is given up on below
        local.add_done_callback(lambda _: self._settings.gate.release(owner))
        remote = asyncio.ensure_future(self._peer.hccl_connect(
            self._token, spec, max(0.001, deadline - time.monotonic())))
        done, _ = await asyncio.wait((local, remote),
                                     timeout=max(0.0, deadline - time.monotonic()))
        failure: BaseException | None = None
        if remote in done and remote.exception() is not None:
            failure = remote.exception()
        elif local in done and local.exception() is not None:
            failure = local.exception()
        elif local not in done or remote not in done:
            failure = LLMException("building the HCCL communicator timed out",
                                   status_code=LLMStatusCode.LLM_LINK_FAILED)
        if failure is None:
            self._channel = local.result()
            self._regions.clear()
            # HCCL's one-sided bookkeeping (op_base.cc's one-sided communicator
            # table) covers rank-table communicators only, as HIXL uses them.
            if (self.one_sided_here and remote.result() and not self._one_sided_failed
                    and spec.rank_table):
                await self._prepare(deadline)
            self._start_watch()
            return
        remote.cancel()
        if local in done:
            if local.exception() is None:
                await asyncio.to_thread(local.result().destroy)
        else:
            close_when_built(local)
        error = fail(failure, "building the HCCL communicator")
        raise LLMException(f"cannot open the HCCL link: {error}",
                           status_code=LLMStatusCode.LLM_LINK_FAILED) from failure

    async def _drop(self) -> None:
        channel = self._channel
        await self._stop_watch()
        await super()._drop()
        if channel is not None and channel.binding is not None:
            await self._tell_destroyed(channel)

    def _start_watch(self) -> None:
        """Watch the far half of a one-sided communicator (its daemon asks this side
        to destroy its half before it frees memory bound to it)."""
        channel = self._channel
        if channel is None or channel.binding is None or channel.closed:
            return
        if self._watched is channel and self._watcher is not None:
            return
        self._watched = channel
        self._watch_destroying = False
        self._watcher = asyncio.ensure_future(self._watch(channel))

    async def _stop_watch(self) -> None:
        watcher, self._watcher, self._watched = self._watcher, None, None
        if watcher is None or watcher.done():
            return
        if not self._watch_destroying:  # a destroy under way ends by itself (bounded)
            watcher.cancel()
        await asyncio.wait((watcher,))

    async def _watch(self, channel: Channel) -> None:
        while not channel.closed and not self.closed:
            try:
                destroy = await self._peer.hccl_teardown(
                    self._token, channel.name, False, WATCH_WAIT_MS,
                    WATCH_WAIT_MS / 1000.0 + WATCH_GRACE_S)
            except LLMException as exc:
                # It can no longer ask: destroy this half now (see REVOKE_WAIT_S).
                logger.warning("lost the far daemon's watch on HCCL communicator %s (%s); "
                               "destroying this side of it", channel.name, exc)
                destroy = True
            if destroy:
                self._watch_destroying = True
                await asyncio.to_thread(channel.destroy)
                await self._tell_destroyed(channel)
                return

    async def _tell_destroyed(self, channel: Channel) -> None:
        """Tell the far daemon that this half of a one-sided communicator is gone
        (best effort: it stops waiting after REVOKE_WAIT_S anyway)."""
        try:
            await self._peer.hccl_teardown(self._token, channel.name, True, 0, WATCH_GRACE_S)
        except LLMException as exc:
            logger.info("telling the far daemon that HCCL communicator %s is destroyed: %s",
                        channel.name, exc)

    async def _destroy_far(self, name: str) -> None:
        """Have the far daemon destroy its half of one-sided communicator ``name``, whose
        mapping of memory bound here lives until then (Peer.HcclDestroy; the memory
        is about to be freed); wait at most REVOKE_WAIT_S for its word."""
        try:
            await self._peer.hccl_destroy(self._token, name, REVOKE_WAIT_S)
        except LLMException as exc:
            if exc.status_code == LLMStatusCode.LLM_NOT_YET_LINK:  # its half went with the link
                logger.info("the far daemon no longer holds the link of HCCL communicator %s",
                            name)
                return
            logger.warning("the far daemon did not confirm within %.0f s that it destroyed its "
                           "half of HCCL communicator %s (%s); going on (a daemon that is gone "
                           "took its half with it)", REVOKE_WAIT_S, name, exc)

    async def _reserve(self, name: str, owner: str, deadline: float) -> None:
        """Hold this daemon's creation gate and the far daemon's for communicator
        ``name`` (ascend/gate.py: the lower tie-break id creates first)."""
        gate = self._settings.gate
        while True:
            await gate.hold(owner, deadline)
            try:
                while True:
                    granted, theirs = await self._peer.hccl_reserve(
                        self._token, name, remaining_ms(deadline), gate.tie_break,
                        max(0.001, deadline - time.monotonic()))
                    if granted:
                        return
                    if gate.tie_break >= theirs:
                        break  # the far daemon creates first: give ours up
                    await pause(RESERVE_RETRY_S, deadline)
            except BaseException:
                gate.release(owner)
                raise
            gate.release(owner)
            await pause(RESERVE_BACKOFF_S, deadline)

    async def _prepare(self, deadline: float) -> None:
        """Bind and prepare both sides for one-sided transfers; on failure, go two-sided."""
        channel = self._channel
        assert channel is not None and self._memory is not None
        timeout_ms = remaining_ms(deadline)
        # Freeing memory bound to it has the far half destroyed first.
        channel.release_peer = functools.partial(
            block_on, asyncio.get_running_loop(),
            functools.partial(self._destroy_far, channel.name), REVOKE_WAIT_S + WATCH_GRACE_S,
            f"asking the far daemon to destroy its half of HCCL communicator {channel.name}")
        # Both are bounded (HCCL's prepare by timeout_ms, the call by the deadline),
        # and the local one must end before the channel may be destroyed.
        local, remote = await asyncio.gather(
            asyncio.to_thread(channel.prepare_one_sided, self._memory, self._cluster_id,
                              timeout_ms),
            self._peer.hccl_prepare(self._token, timeout_ms,
                                    max(0.001, deadline - time.monotonic())),
            return_exceptions=True)
        failure = local if isinstance(local, BaseException) else remote
        if not isinstance(failure, BaseException):
            return
        logger.warning("preparing the HCCL link for one-sided transfers failed; it moves "
                       "two-sided from now on: %s", fail(failure, "HcclCommPrepare"))
        self._one_sided_failed = True
        await self._drop()
        await self._connect(deadline)

    async def transfer(self, sending: bool, local: Memory, ranges: Ranges, region_id: int,
                       timeout_ms: int) -> None:
        """Move one batch: ``sending`` from ``local`` into the region, else the reverse.

        ``ranges`` are the transport's: (far, local, length) for a pull,
        (local, far, length) for a push. Runs to its end even if the awaiting
        coroutine is cancelled, so that the two sides stay paired; bounded by
        ``timeout_ms``.
        """
        job = asyncio.ensure_future(self._transfer(sending, local, ranges, region_id, timeout_ms))
        local.pin_until(job)
        await asyncio.shield(job)

    async def _transfer(self, sending: bool, local: Memory, ranges: Ranges, region_id: int,
                        timeout_ms: int) -> None:
        deadline = time.monotonic() + timeout_ms / 1000.0
        async with self._lock:
            if self.closed:
                raise LLMException("the link was closed", status_code=LLMStatusCode.LLM_LINK_FAILED)
            if self._live() is None:
                await self._connect(deadline)
            if await self._one_sided(sending, local, ranges, region_id, deadline):
                return
            local_cols, remote_cols = ([0, 2], [1, 2]) if sending else ([1, 2], [0, 2])
            local_pairs = np.ascontiguousarray(ranges[:, local_cols]).ravel()
            remote_pairs = np.ascontiguousarray(ranges[:, remote_cols]).ravel()
            await self._two_sided(sending, local, local_pairs, region_id, remote_pairs, deadline)

    async def _one_sided(self, put: bool, local: Memory, ranges: Ranges, region_id: int,
                         deadline: float) -> bool:
        """Move the batch one-sided if the link and both memories allow; False: they do not."""
        assert local.device is not None
        unbound_key = (id(local.device), region_id)
        far: FarRegion | None = None
        for attempt in range(2):
            channel = self._live()
            if channel is None or channel.binding is None or unbound_key in self._unbound:
                return False
            far = await self._far_region(region_id, deadline)
            if channel.binding.covers(local.device) and far.bound:
                break
            if attempt:
                self._unbound.add(unbound_key)
                return False
            # Memory registered after the link was prepared: prepare a new communicator.
            await self._connect(deadline)
        channel = self._channel
        assert channel is not None and far is not None
        if put and not far.writable:
            raise RegionRefused(f"region {region_id} of the far cluster is not writable by "
                                f"linked peers", status_code=LLMStatusCode.LLM_PARAM_INVALID)
        try:
            await asyncio.to_thread(channel.run_one_sided, put, local,
                                    np.ascontiguousarray(ranges, dtype=np.uint64), far,
                                    remaining_ms(deadline))
        except ValueError as exc:  # checked before anything was queued
            raise RegionRefused(f"region {region_id}: {exc}",
                                status_code=LLMStatusCode.LLM_PARAM_INVALID) from None
        except BaseException as exc:
            await self._drop()
            if isinstance(exc, AscendError):
                raise fail(exc, "the one-sided HCCL transfer") from exc
            raise
        return True

    async def _far_region(self, region_id: int, deadline: float) -> FarRegion:
        found = self._regions.get(region_id)
        if found is None:
            try:
                found = await self._peer.hccl_region(self._token, region_id,
                                                     max(0.001, deadline - time.monotonic()))
            except LLMException as exc:
                if exc.status_code == LLMStatusCode.LLM_PARAM_INVALID:
                    raise RegionRefused(str(exc), status_code=exc.status_code) from None
                raise
            self._regions[region_id] = found
        return found

    async def _two_sided(self, sending: bool, local: Memory, local_pairs: np.ndarray[Any, Any],
                         region_id: int, remote_pairs: np.ndarray[Any, Any],
                         deadline: float) -> None:
        ranges = remote_pairs.astype("<u8", copy=False).tobytes()
        for attempt in range(2):
            if self._live() is None:
                await self._connect(deadline)
            try:
                await self._peer.hccl_post(self._token, not sending, region_id, ranges,
                                           remaining_ms(deadline),
                                           max(0.001, deadline - time.monotonic()))
                break
            except LLMException as exc:
                if exc.status_code == LLMStatusCode.LLM_PARAM_INVALID:
                    # Nothing was queued. A refused region may be a stale resolve,
                    # which the caller retries once, as for the TCP data server.
                    raise RegionRefused(str(exc), status_code=exc.status_code) from None
                # The other side lost its communicator, or may have queued its
                # half without our knowing: either way, build both anew.
                await self._drop()
                if NO_COMMUNICATOR in str(exc) and attempt == 0:
                    continue
                raise
        channel = self._channel
        assert channel is not None
        try:
            await asyncio.to_thread(channel.run, sending, local, local_pairs,
                                    remaining_ms(deadline))
        except BaseException as exc:
            await self._drop()  # whatever failed, the two sides may no longer pair up
            if isinstance(exc, AscendError):
                raise fail(exc, "the HCCL batch") from exc
            raise


class HcclTransport:
    """The Transport of an HCCL link: device memory to device memory."""

    name = "hccl"
    # Device memory only; one-sided where CANN offers it (``data_path`` says).
    capabilities = frozenset({ONE_SIDED})
    # The Peer calls its links need of the far daemon (``factory.check_peer_calls``).
    peer_calls = LINK_CALLS

    def __init__(self, side: HcclLink) -> None:
        self._side = side

    @classmethod
    async def open(cls, device: _ascend.Device, peer: PeerApi, token: int, timeout_s: float,
                   settings: CommSettings, memory: OneSidedMemory | None = None,
                   cluster_id: int = 0) -> HcclTransport:
        """Build (and, one-sided, prepare) the link's communicator with the far daemon,
        within ``timeout_s``; ``memory`` holds the device memory of ``cluster_id``."""
        side = HcclLink(device, peer, token, settings, memory, cluster_id)
        try:
            await side.connect(timeout_s)
        except BaseException:
            await side.close()
            raise
        return cls(side)

    @property
    def alive(self) -> bool:
        return self._side.alive

    @property
    def data_path(self) -> str:
        return self._side.data_path

    def info(self) -> TransportInfo:
        return TransportInfo(self.name, 0, self.alive, self.data_path,
                             capabilities=self.capabilities)

    async def read(self, local: Memory, far: Place, ranges: Ranges, timeout_ms: int,
                   checksum: bool = False) -> None:
        await self._batch(False, local, ranges, far.region_id, timeout_ms)

    async def write(self, local: Memory, far: Place, ranges: Ranges, timeout_ms: int,
                    checksum: bool = False) -> None:
        await self._batch(True, local, ranges, far.region_id, timeout_ms)

    def prepare(self, writing: bool, local: Memory, far: Place, ranges: Ranges,
                nbytes: int, checksum: bool = False) -> Prepared:
        return _PreparedBatch(self, writing, local, far, ranges)

    async def _batch(self, sending: bool, local: Memory, ranges: Ranges, region_id: int,
                     timeout_ms: int) -> None:
        if not local.on_device:
            raise LLMException("the hccl transport moves device memory: use DEVICE caches "
                               "on both ends", status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
        await self._side.transfer(sending, local, ranges, region_id, max(1, timeout_ms))

    async def close(self) -> None:
        await self._side.close()


class _PreparedBatch:
    """An HCCL batch between other slots: the shifted ranges, sent as one batch."""

    __slots__ = ("_far", "_local", "_ranges", "_transport", "_writing")

    def __init__(self, transport: HcclTransport, writing: bool, local: Memory, far: Place,
                 ranges: Ranges) -> None:
        self._transport = transport
        self._writing = writing
        self._local = local
        self._far = far
        self._ranges = ranges

    def start(self, src_shift: int, dst_shift: int,
              timeout_ms: int) -> Awaitable[None] | None:
        shifted = self._ranges + np.array((src_shift, dst_shift, 0), dtype=np.uint64)
        move = self._transport.write if self._writing else self._transport.read
        return move(self._local, self._far, shifted, timeout_ms)
