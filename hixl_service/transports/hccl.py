"""The HCCL transport: one two-rank communicator per link, one-sided where CANN allows.

The linking daemon is rank 0. With ``ascend.comm_init = "rank_table"`` (the
default, as HIXL does) it asks the other daemon for its rank
(``Peer.HcclRankInfo``: host, physical device, device NIC), builds the
two-rank table and sends it with ``Peer.HcclConnect``; with ``"root_info"``
it sends ``HcclGetRootInfo``'s root info instead. Both daemons then build
the communicator concurrently (`_Channel.build`, the one place a link's
communicator is made), each with a stream of its own for the link; the
shim creates communicators one at a time per process.

**One-sided** (HIXL's direct path), when both daemons' CANN has the API:
right after the communicator is built, each side binds its cluster's
registered device memory to it (``_Channel.prepare_one_sided``: the one place
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
side that saw it, in the order CANN allows (`_Channel.destroy`): abort the
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
import concurrent.futures
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from hixl_native import _ascend
from hixl_native._ascend import AscendError

from hixl_client.status import LLMException, LLMStatusCode

from ..ascend.comms import CommSettings, CommSpec, RankInfo, rank_table
from ..native_errors import RegionRefused, to_llm_exception
from .base import InboundSide, Place, Prepared, TransportInfo

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from ..ascend.onesided import Binding, OneSidedMemory
    from ..memory.base import Memory
    from ..peer_api import FarRegion, PeerApi
    from ..planning import Ranges

logger = logging.getLogger(__name__)

INITIATOR_RANK = 0
ACCEPTOR_RANK = 1
# Tells the linking daemon that this side has no communicator (it failed
# earlier): build a new one and post again.
NO_COMMUNICATOR = "the link has no HCCL communicator on this side"
# The linked side waits for its half of a batch this much longer than the
# linking side (at most half the transfer's timeout): only the linking side
# can tell the user, so its own timeout must fire first. Were both to give up
# at the same instant, the one destroying its communicator first would turn
# the other's timeout into a remote error, by chance.
INBOUND_GRACE_S = 0.25
ONE_SIDED = "one-sided"
TWO_SIDED = "two-sided"
# How long a torn-down channel's aborted work may take to end before its
# stream is abandoned instead of destroyed (the transfer's deadline has
# passed by then).
TEARDOWN_WAIT_MS = 2000
ACL_API_NOT_SUPPORT = 200001  # an optional entry point this CANN lacks
# After aclrtStreamAbort of work in flight, HIXL waits this long before it
# unbinds and destroys (hixl comm_channel.cc): the abort cannot stop tasks
# that aicpu is already unfolding.
ABORT_SETTLE_S = 0.1
# The warm-up batch every new communicator runs on both sides (`_Channel.build`):
# HCCL builds a communicator's peer links inside its first send/receive host
# call, which blocks until the peer makes its own (hcomm
# hccl_communicator_host.cc, ExecOp -> AllocAlgResource; transport_manager.cc,
# WaitLinksEstablishCompleted). Paired here, at link set-up, no transfer's
# host call waits on the other daemon's later one.
WARMUP_BYTES = 4096
# Asking the far daemon to reserve its communicator creation (ascend/gate.py):
# the lower tie-break id asks again after RESERVE_RETRY_S keeping its own gate;
# the higher one gives its gate up for RESERVE_BACKOFF_S first.
RESERVE_RETRY_S = 0.02
RESERVE_BACKOFF_S = 0.1
# A linked side that was not asked to reserve waits this long for its gate.
JOIN_GATE_WAIT_S = 30.0
# One-sided links: the linking side's watch (Peer.HcclTeardown) on its
# communicator. Each watch call is answered after WATCH_WAIT_MS at the latest;
# one that fails (no answer within WATCH_WAIT_MS + WATCH_GRACE_S) makes the
# linking side destroy its half at once, since the other daemon could no
# longer ask it to. So a linked daemon freeing bound memory waits at most
# REVOKE_WAIT_S (longer than both together) for the linking side's word:
# past it, that side has destroyed its half or is gone.
WATCH_WAIT_MS = 2000
WATCH_GRACE_S = 1.0
REVOKE_WAIT_S = 5.0
# How long the linked side's warm-up may take (the linking side's is bounded
# by its link timeout).
WARMUP_TIMEOUT_MS = 30_000


class _Channel:
    """A communicator and the stream its batches run on (one side of a link)."""

    def __init__(self, comm: _ascend.HcclComm, stream: _ascend.Stream, device_bytes: int,
                 settings: CommSettings) -> None:
        self.comm = comm
        self.stream = stream
        self._device_bytes = device_bytes
        self._settings = settings
        self._device_id = comm.device.id
        # One-sided: the memory bound before the communicator was prepared.
        self.binding: Binding | None = None
        self._memory: OneSidedMemory | None = None
        # destroy runs from the link's side and from a release of bound memory
        self._teardown = threading.Lock()
        self.name = ""  # the communicator's name (both sides build it from one CommSpec)
        # The linked side: before memory bound here is freed, the linking side must
        # destroy its half (blocking, bounded; HcclInbound sets it).
        self.release_peer: Callable[[], None] | None = None

    @property
    def closed(self) -> bool:
        """Whether the communicator was destroyed (the link then builds a new one)."""
        return self.comm.closed

    @classmethod
    def build(cls, device: _ascend.Device, spec: CommSpec, rank: int,
              settings: CommSettings, timeout_ms: int = WARMUP_TIMEOUT_MS) -> _Channel:
        """Join the communicator and set up its links (blocks until both ranks did,
        or HCCL gives up).

        The one place a link's communicator is made: its HCCL buffers are
        counted against the device's budget first, then the communicator is
        created from the rank table or the root info, then the link's stream,
        then both ranks run a paired warm-up batch (`WARMUP_BYTES`).
        """
        settings.reserve(device.id, spec.device_bytes)
        try:
            if spec.rank_table:
                comm = _ascend.comm_from_rank_table(device, spec.rank_table, rank,
                                                    buffer_mb=spec.buffer_mb, name=spec.name)
            else:
                comm = _ascend.HcclComm(device, spec.root_info, 2, rank,
                                        buffer_mb=spec.buffer_mb, name=spec.name)
        except BaseException:
            settings.release(device.id, spec.device_bytes)
            raise
        try:
            channel = cls(comm, device.create_stream(), spec.device_bytes, settings)
        except BaseException:
            comm.destroy()
            settings.release(device.id, spec.device_bytes)
            raise
        channel.name = spec.name
        try:
            channel.warm_up(timeout_ms)
        except BaseException:
            channel.destroy()
            raise
        return channel

    def warm_up(self, timeout_ms: int) -> None:
        """Send and receive `WARMUP_BYTES` in one batch, as the peer does at once: the
        first send/receive of a communicator is what builds its links."""
        peer = ACCEPTOR_RANK if self.comm.rank == INITIATOR_RANK else INITIATOR_RANK
        item = _ascend.SendRecvItem
        with self.comm.device.malloc(2 * WARMUP_BYTES) as scratch:
            self.comm.batch_send_recv([item.send(scratch, 0, WARMUP_BYTES, peer),
                                       item.recv(scratch, WARMUP_BYTES, WARMUP_BYTES, peer)],
                                      self.stream)
            self.stream.synchronize(timeout_ms)

    def prepare_one_sided(self, memory: OneSidedMemory, cluster_id: int,
                          timeout_ms: int) -> None:
        """Bind the cluster's registered memory, then prepare (blocking; both ranks at once).

        The one place a communicator gets memory bound: every way of building
        one calls it right after the build, on both sides of the link.
        """
        self.binding = memory.bind(self.comm, cluster_id)
        self.binding.teardown = self._release_bound
        self._memory = memory
        _ascend.hccl_prepare(self.comm, max(1, -(-timeout_ms // 1000)))

    def _release_bound(self) -> None:
        """Memory bound to this communicator is about to be freed (blocking): the
        peer's half goes first (its mapping of the memory lives until its
        HcclCommDestroy, hcomm hccl_one_sided_service.cc: DeInit ->
        DisableMemAccess), then this one."""
        ask = self.release_peer
        if ask is not None and not self.comm.closed:
            ask()
        self.destroy()

    def run_one_sided(self, put: bool, local: Memory, ranges: np.ndarray[Any, Any],
                      far: FarRegion, timeout_ms: int) -> None:
        """Queue one-sided descriptors (HcclBatchPut / HcclBatchGet) and wait for them."""
        assert local.device is not None
        peer = ACCEPTOR_RANK if self.comm.rank == INITIATOR_RANK else INITIATOR_RANK
        queue = _ascend.hccl_batch_put if put else _ascend.hccl_batch_get
        queue(self.comm, local.device, ranges, far.address, far.size, peer, self.stream)
        self.stream.synchronize(timeout_ms)

    def run(self, sending: bool, memory: Memory, pairs: np.ndarray[Any, Any],
            timeout_ms: int) -> None:
        """Queue one batch and wait for it (blocking)."""
        self.post(sending, memory, pairs)
        self.stream.synchronize(timeout_ms)

    def post(self, sending: bool, memory: Memory, pairs: np.ndarray[Any, Any]) -> None:
        assert memory.device is not None
        peer = ACCEPTOR_RANK if self.comm.rank == INITIATOR_RANK else INITIATOR_RANK
        queue = self.comm.send_ranges if sending else self.comm.recv_ranges
        queue(memory.device, pairs, peer, self.stream)

    def destroy(self) -> None:
        """Tear down (blocking; idempotent): abort the stream's unfinished work
        ("aclrtStreamAbort", CANN API reference aclcppdevg_03_1777; HIXL does the
        same), unbind its memory (HCCL refuses to deregister memory still bound),
        destroy the communicator, then the stream. `Stream.destroy` never
        destroys a stream whose work did not end within its bound: it abandons it
        ("aclrtDestroyStream", aclcppdevg_03_0070, waits for unfinished tasks)."""
        with self._teardown:
            self._destroy()

    def _destroy(self) -> None:
        if self.comm.closed:
            return
        if self.stream.pending:
            try:
                self.stream.abort()
                time.sleep(ABORT_SETTLE_S)  # see ABORT_SETTLE_S (a worker thread)
            except AscendError as exc:
                if exc.code != ACL_API_NOT_SUPPORT:  # absent: the bounded wait below decides
                    logger.info("aborting an HCCL channel's stream: %s", to_llm_exception(exc))
        if self.binding is not None and self._memory is not None:
            self._memory.unbind(self.binding)
        try:
            self.comm.destroy()
        except AscendError as exc:
            logger.info("destroying an HCCL communicator: %s", to_llm_exception(exc))
        finally:
            self._settings.release(self._device_id, self._device_bytes)
        try:
            self.stream.destroy(TEARDOWN_WAIT_MS)
        except AscendError as exc:
            logger.warning("an HCCL channel's stream did not end its work and is abandoned "
                           "(its memory stays pinned): %s", to_llm_exception(exc))


def _close_when_built(job: asyncio.Future[_Channel]) -> None:
    """Destroy a channel whose builder was given up on, once the build ends."""
    def done(finished: asyncio.Future[_Channel]) -> None:
        if not finished.cancelled() and finished.exception() is None:
            asyncio.get_running_loop().run_in_executor(None, finished.result().destroy)
    job.add_done_callback(done)


def _settle(posted: asyncio.Future[None], error: LLMException | None = None) -> None:
    """Tell the poster how queueing went (it may have stopped waiting)."""
    if posted.done():
        return
    if error is None:
        posted.set_result(None)
    else:
        posted.set_exception(error)


async def _pause(seconds: float, deadline: float) -> None:
    if time.monotonic() + seconds >= deadline:
        raise LLMException("the far daemon kept creating other HCCL communicators until the "
                           "link's deadline", status_code=LLMStatusCode.LLM_LINK_FAILED)
    await asyncio.sleep(seconds)


def _remaining_ms(deadline: float) -> int:
    return max(1, int((deadline - time.monotonic()) * 1000))


def _fail(exc: BaseException, what: str) -> LLMException:
    if isinstance(exc, LLMException):
        return exc
    if isinstance(exc, AscendError):
        return to_llm_exception(exc, what)
    return LLMException(f"{what}: {exc}", status_code=LLMStatusCode.LLM_LINK_FAILED)


def region_pairs(ranges: bytes, region_id: int, region_offset: int,
                 region_size: int) -> np.ndarray[Any, Any]:
    """Check a peer's (offset in region, length) pairs; return them as memory offsets.

    Raises:
        LLMException: no pairs, a partial pair, or one outside the region
            (``LLM_PARAM_INVALID``).
    """
    if len(ranges) == 0 or len(ranges) % 16:
        raise LLMException("ranges must be non-empty (offset, length) uint64 pairs",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID)
    pairs = np.frombuffer(ranges, dtype="<u8").reshape(-1, 2).astype(np.uint64)
    ends = pairs[:, 0] + pairs[:, 1]
    if bool((ends > region_size).any()) or bool((ends < pairs[:, 0]).any()):
        raise LLMException(f"a range runs past the {region_size} bytes of region {region_id}",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID)
    pairs[:, 0] += np.uint64(region_offset)
    return pairs.ravel()


class _Side:
    """One daemon's side of a link: its channel, and the lock that lets one batch
    (or one rebuild) at a time use it."""

    def __init__(self, device: _ascend.Device, settings: CommSettings,
                 memory: OneSidedMemory | None, cluster_id: int) -> None:
        self._device = device
        self._memory = memory
        self._cluster_id = cluster_id
        self._settings = settings
        self._channel: _Channel | None = None
        self._lock = asyncio.Lock()
        self.closed = False
        self._last_path = TWO_SIDED  # of the last communicator, while there is none

    @property
    def one_sided_here(self) -> bool:
        """Whether this daemon's CANN has the one-sided API."""
        return self._memory is not None and self._memory.enabled

    @property
    def data_path(self) -> str:
        """``one-sided`` when the communicator is prepared for it, else ``two-sided``
        (while the link has none: what its last one was)."""
        channel = self._channel
        if channel is None:
            return self._last_path
        return ONE_SIDED if channel.binding is not None else TWO_SIDED

    @property
    def alive(self) -> bool:
        """Whether a communicator is up (else the linking side builds one on its next
        transfer)."""
        return self._live() is not None

    def _live(self) -> _Channel | None:
        """The channel, unless there is none or it was torn down (a release of memory
        bound to it does that from outside the link)."""
        channel = self._channel
        return channel if channel is not None and not channel.closed else None

    async def _drop(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            self._last_path = ONE_SIDED if channel.binding is not None else TWO_SIDED
            await asyncio.to_thread(channel.destroy)

    async def close(self) -> None:
        """Destroy the communicator once the running batch (if any) ended."""
        self.closed = True
        async with self._lock:
            await self._drop()


class HcclLink(_Side):
    """The linking daemon's side of one link (rank 0)."""

    def __init__(self, device: _ascend.Device, peer: PeerApi, token: int,
                 settings: CommSettings, memory: OneSidedMemory | None = None,
                 cluster_id: int = 0) -> None:
        super().__init__(device, settings, memory, cluster_id)
        self._peer = peer
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
        self._watched: _Channel | None = None
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
            raise _fail(exc, "creating the HCCL root info") from exc
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
            error = _fail(exc, "describing this side's HCCL rank")
            raise LLMException(f"cannot open the HCCL link: {error}",
                               status_code=LLMStatusCode.LLM_LINK_FAILED) from exc
        owner = f"link:{spec.name}"
        await self._reserve(spec.name, owner, deadline)
        local: asyncio.Future[_Channel] = asyncio.ensure_future(asyncio.to_thread(
            _Channel.build, self._device, spec, INITIATOR_RANK, self._settings,
            _remaining_ms(deadline)))
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
            _close_when_built(local)
        error = _fail(failure, "building the HCCL communicator")
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

    async def _watch(self, channel: _Channel) -> None:
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

    async def _tell_destroyed(self, channel: _Channel) -> None:
        """Tell the far daemon that this half of a one-sided communicator is gone
        (best effort: it stops waiting after REVOKE_WAIT_S anyway)."""
        try:
            await self._peer.hccl_teardown(self._token, channel.name, True, 0, WATCH_GRACE_S)
        except LLMException as exc:
            logger.info("telling the far daemon that HCCL communicator %s is destroyed: %s",
                        channel.name, exc)

    async def _reserve(self, name: str, owner: str, deadline: float) -> None:
        """Hold this daemon's creation gate and the far daemon's for communicator
        ``name`` (ascend/gate.py: the lower tie-break id creates first)."""
        gate = self._settings.gate
        while True:
            await gate.hold(owner, deadline)
            try:
                while True:
                    granted, theirs = await self._peer.hccl_reserve(
                        self._token, name, _remaining_ms(deadline), gate.tie_break,
                        max(0.001, deadline - time.monotonic()))
                    if granted:
                        return
                    if gate.tie_break >= theirs:
                        break  # the far daemon creates first: give ours up
                    await _pause(RESERVE_RETRY_S, deadline)
            except BaseException:
                gate.release(owner)
                raise
            gate.release(owner)
            await _pause(RESERVE_BACKOFF_S, deadline)

    async def _prepare(self, deadline: float) -> None:
        """Bind and prepare both sides for one-sided transfers; on failure, go two-sided."""
        channel = self._channel
        assert channel is not None and self._memory is not None
        timeout_ms = _remaining_ms(deadline)
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
                       "two-sided from now on: %s", _fail(failure, "HcclCommPrepare"))
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
                                    _remaining_ms(deadline))
        except ValueError as exc:  # checked before anything was queued
            raise RegionRefused(f"region {region_id}: {exc}",
                                status_code=LLMStatusCode.LLM_PARAM_INVALID) from None
        except BaseException as exc:
            await self._drop()
            if isinstance(exc, AscendError):
                raise _fail(exc, "the one-sided HCCL transfer") from exc
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
                                           _remaining_ms(deadline),
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
                                    _remaining_ms(deadline))
        except BaseException as exc:
            await self._drop()  # whatever failed, the two sides may no longer pair up
            if isinstance(exc, AscendError):
                raise _fail(exc, "the HCCL batch") from exc
            raise


class HcclInbound(_Side):
    """The linked daemon's side of one link (rank 1)."""

    name = "hccl"

    def __init__(self, device: _ascend.Device, settings: CommSettings,
                 memory: OneSidedMemory | None = None, cluster_id: int = 0) -> None:
        super().__init__(device, settings, memory, cluster_id)
        self._batches: set[asyncio.Task[None]] = set()
        # By communicator name: the linking side was asked to destroy its half /
        # said that it did (Peer.HcclTeardown).
        self._asks: dict[str, asyncio.Future[None]] = {}
        self._gone: dict[str, asyncio.Future[None]] = {}

    async def rank_info(self) -> RankInfo:
        """This side's rank, for the linking daemon's rank table."""
        try:
            return await asyncio.to_thread(self._settings.describe, self._device.id)
        except AscendError as exc:
            raise _fail(exc, "describing this side's HCCL rank") from exc

    async def connect(self, spec: CommSpec) -> bool:
        """Join a new communicator (replacing an old one once its batch ended).

        Returns whether this side can prepare it for one-sided transfers.
        """
        try:
            spec.check(_ascend.HCCL_ROOT_INFO_BYTES)
        except ValueError as exc:
            raise LLMException(str(exc), status_code=LLMStatusCode.LLM_PARAM_INVALID) from None
        async with self._lock:
            await self._drop()
            gate, owner = self._settings.gate, f"join:{spec.name}"
            if not gate.claim(owner):  # not reserved (HcclReserve): wait for the gate
                await gate.hold(owner, time.monotonic() + JOIN_GATE_WAIT_S)
            build = asyncio.ensure_future(asyncio.to_thread(_Channel.build, self._device, spec,
                                                            ACCEPTOR_RANK, self._settings))
            build.add_done_callback(lambda _: gate.release(owner))  # when the build ends
            try:
                channel = await asyncio.shield(build)
            except asyncio.CancelledError:
                _close_when_built(build)
                raise
            except AscendError as exc:
                raise _fail(exc, "joining the HCCL communicator") from exc
            if self.closed:
                await asyncio.to_thread(channel.destroy)
                raise LLMException("the link was closed", status_code=LLMStatusCode.LLM_LINK_FAILED)
            self._channel = channel
            # The linking side dropped its old communicator before this build.
            self._settle_names()
        return self.one_sided_here

    def _settle_names(self) -> None:
        for table in (self._asks, self._gone):
            for future in table.values():
                if not future.done():
                    future.set_result(None)
            table.clear()

    def _named(self, table: dict[str, asyncio.Future[None]], name: str) -> asyncio.Future[None]:
        future = table.get(name)
        if future is None:
            future = table[name] = asyncio.get_running_loop().create_future()
        return future

    async def watch(self, name: str, wait_ms: int) -> bool:
        """The linking side's watch on communicator ``name``: True once it must destroy
        its half (asked, or this side has no such communicator); False after
        ``wait_ms``."""
        channel = self._channel
        if self.closed or channel is None or channel.closed or channel.name != name:
            return True
        ask = self._named(self._asks, name)
        await asyncio.wait((ask,), timeout=max(1, wait_ms) / 1000.0)
        return ask.done()

    def destroyed(self, name: str) -> None:
        """The linking side destroyed its half of communicator ``name``."""
        gone = self._named(self._gone, name)
        if not gone.done():
            gone.set_result(None)

    async def _revoke(self, name: str) -> None:
        """Ask the linking side to destroy its half of communicator ``name`` and wait
        for its word, at most REVOKE_WAIT_S."""
        ask = self._named(self._asks, name)
        if not ask.done():
            ask.set_result(None)
        gone = self._named(self._gone, name)
        await asyncio.wait((gone,), timeout=REVOKE_WAIT_S)
        if not gone.done():
            logger.warning("the linking daemon did not confirm within %.0f s that it destroyed "
                           "its half of HCCL communicator %s; going on (it destroys its half "
                           "itself once it can no longer watch)", REVOKE_WAIT_S, name)

    def _revoke_from(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        """`_revoke` from a worker thread (a release of bound memory; blocking, bounded)."""
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop or loop.is_closed():
            logger.warning("cannot ask the linking daemon to destroy its half of HCCL "
                           "communicator %s from here; going on", name)
            return
        job = asyncio.run_coroutine_threadsafe(self._revoke(name), loop)
        try:
            job.result(REVOKE_WAIT_S + WATCH_GRACE_S)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError,
                RuntimeError) as exc:
            job.cancel()
            logger.warning("asking the linking daemon to destroy its half of HCCL "
                           "communicator %s: %r", name, exc)

    def reserve(self, name: str, hold_ms: int) -> tuple[bool, int]:
        """Hold this daemon's creation gate for communicator ``name`` if it is free
        (for ``hold_ms`` unless its HcclConnect comes); returns whether it was
        granted and this daemon's tie-break id. Never waits."""
        gate = self._settings.gate
        lapse_s = min(max(hold_ms, 1), int(JOIN_GATE_WAIT_S * 1000)) / 1000.0
        return gate.try_hold(f"join:{name}", lapse_s), gate.tie_break

    async def prepare(self, timeout_ms: int) -> None:
        """Bind this cluster's memory to the communicator and prepare it, as the
        linking side does at the same time (blocks until both are ready)."""
        async with self._lock:
            channel = self._live()
            if channel is None or self.closed:
                raise LLMException(NO_COMMUNICATOR, status_code=LLMStatusCode.LLM_LINK_FAILED)
            if self._memory is None or not self._memory.enabled:
                raise LLMException("this daemon's CANN lacks the one-sided HCCL API",
                                   status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
            channel.release_peer = functools.partial(self._revoke_from,
                                                     asyncio.get_running_loop(), channel.name)
            try:
                await asyncio.to_thread(channel.prepare_one_sided, self._memory,
                                        self._cluster_id, timeout_ms)
            except AscendError as exc:
                await self._drop()
                raise _fail(exc, "preparing the HCCL link") from exc

    async def close(self) -> None:
        """As `_Side.close`; a one-sided communicator's linking half goes first (its
        mapping of this side's memory lives until it is destroyed)."""
        channel = self._live()
        if channel is not None and channel.binding is not None:
            await self._revoke(channel.name)
        await super().close()

    def bound(self, memory: Memory) -> bool:
        """Whether ``memory`` was bound when the current communicator was prepared."""
        channel = self._live()
        return (channel is not None and channel.binding is not None
                and memory.device is not None and channel.binding.covers(memory.device))

    async def post(self, sending: bool, memory: Memory, pairs: np.ndarray[Any, Any],
                   timeout_ms: int) -> None:
        """Queue this side of a batch; return once queued (it completes in the background)."""
        posted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        batch = asyncio.ensure_future(self._run(sending, memory, pairs, timeout_ms, posted))
        self._batches.add(batch)
        batch.add_done_callback(self._batches.discard)
        memory.pin_until(batch)
        await posted

    async def _run(self, sending: bool, memory: Memory, pairs: np.ndarray[Any, Any],
                   timeout_ms: int, posted: asyncio.Future[None]) -> None:
        timeout_s = timeout_ms / 1000.0
        deadline = time.monotonic() + timeout_s + min(INBOUND_GRACE_S, timeout_s / 2)
        async with self._lock:
            channel = self._live()
            if channel is None or self.closed:
                _settle(posted, LLMException(NO_COMMUNICATOR,
                                             status_code=LLMStatusCode.LLM_LINK_FAILED))
                return
            try:
                await asyncio.to_thread(channel.post, sending, memory, pairs)
            except AscendError as exc:
                error = _fail(exc, "queueing an HCCL batch")
                logger.warning("%s; the communicator will be rebuilt", error)
                _settle(posted, error)
                await self._drop()
                return
            _settle(posted)
            try:
                await asyncio.to_thread(channel.stream.synchronize, _remaining_ms(deadline))
            except AscendError as exc:
                logger.warning("an HCCL batch failed; the communicator will be rebuilt: %s",
                               to_llm_exception(exc))
                await self._drop()


def hccl_side(side: InboundSide | None) -> HcclInbound:
    """The HCCL half of an inbound link, for the Peer calls that drive it."""
    if not isinstance(side, HcclInbound):
        raise LLMException("the link is gone or not an HCCL link; link again",
                           status_code=LLMStatusCode.LLM_NOT_YET_LINK)
    return side


class HcclTransport:
    """The Transport of an HCCL link: device memory to device memory."""

    name = "hccl"

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
        return TransportInfo(self.name, 0, self.alive, self.data_path)

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
