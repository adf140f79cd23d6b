"""One side of an HCCL link: its communicator and stream (`Channel`, the one place
a link's communicator is built and torn down), the lock that lets one batch at a
time use it (`Side`), and what both sides of a link share. See ``hccl`` for how
links use them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from hixl_native import _ascend
from hixl_native._ascend import AscendError

from hixl_wire.status import LLMException, LLMStatusCode

from ..ascend.comms import CommSettings, CommSpec
from ..native_errors import to_llm_exception

if TYPE_CHECKING:
    from ..ascend.onesided import Binding, OneSidedMemory
    from ..memory.base import Memory

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FarRegion:
    """A device region of the far daemon, as a one-sided HCCL transfer needs it."""

    address: int  # its first byte, in the far daemon's process
    size: int
    writable: bool
    bound: bool  # its memory was bound to the link's communicator when it was prepared

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
# The warm-up batch every new communicator runs on both sides (`Channel.build`):
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
# past it, that side has destroyed its half or is gone. The other way round,
# a linking daemon freeing bound memory asks the linked one to destroy its
# half (Peer.HcclDestroy) and waits at most REVOKE_WAIT_S for the answer too;
# past it (a linked daemon gone, or too slow to answer), it goes on: a gone
# daemon's half went with it, a silent one's lives until that daemon next
# joins a communicator for the link or drops it.
WATCH_WAIT_MS = 2000
WATCH_GRACE_S = 1.0
REVOKE_WAIT_S = 5.0
# How long the linked side's warm-up may take (the linking side's is bounded
# by its link timeout).
WARMUP_TIMEOUT_MS = 30_000


class Channel:
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
              settings: CommSettings, timeout_ms: int = WARMUP_TIMEOUT_MS) -> Channel:
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


def block_on(loop: asyncio.AbstractEventLoop,
             make: Callable[[], Coroutine[Any, Any, None]], timeout_s: float, what: str) -> None:
    """Run ``make()`` on ``loop`` from a worker thread, waiting at most ``timeout_s``
    (a release of bound memory asking the far daemon to destroy its half:
    blocking, bounded). A failure is logged; the release goes on."""
    try:
        on_loop = asyncio.get_running_loop() is loop
    except RuntimeError:
        on_loop = False
    if on_loop or loop.is_closed():
        logger.warning("cannot wait from here for %s; going on", what)
        return
    work = make()
    try:
        job = asyncio.run_coroutine_threadsafe(work, loop)
    except RuntimeError as exc:  # the loop closed meanwhile
        work.close()
        logger.warning("%s: %r", what, exc)
        return
    try:
        job.result(timeout_s)
    except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError,
            RuntimeError) as exc:
        job.cancel()
        logger.warning("%s: %r", what, exc)


def close_when_built(job: asyncio.Future[Channel]) -> None:
    """Destroy a channel whose builder was given up on, once the build ends."""
    def done(finished: asyncio.Future[Channel]) -> None:
        if not finished.cancelled() and finished.exception() is None:
            asyncio.get_running_loop().run_in_executor(None, finished.result().destroy)
    job.add_done_callback(done)


def settle(posted: asyncio.Future[None], error: LLMException | None = None) -> None:
    """Tell the poster how queueing went (it may have stopped waiting)."""
    if posted.done():
        return
    if error is None:
        posted.set_result(None)
    else:
        posted.set_exception(error)


async def pause(seconds: float, deadline: float) -> None:
    if time.monotonic() + seconds >= deadline:
        raise LLMException("the far daemon kept creating other HCCL communicators until the "
                           "link's deadline", status_code=LLMStatusCode.LLM_LINK_FAILED)
    await asyncio.sleep(seconds)


def remaining_ms(deadline: float) -> int:
    return max(1, int((deadline - time.monotonic()) * 1000))


def fail(exc: BaseException, what: str) -> LLMException:
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


class Side:
    """One daemon's side of a link: its channel, and the lock that lets one batch
    (or one rebuild) at a time use it."""

    def __init__(self, device: _ascend.Device, settings: CommSettings,
                 memory: OneSidedMemory | None, cluster_id: int) -> None:
        self._device = device
        self._memory = memory
        self._cluster_id = cluster_id
        self._settings = settings
        self._channel: Channel | None = None
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

    def _live(self) -> Channel | None:
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
