"""The linked daemon's side of an HCCL link (rank 1): it joins the communicators the
linking daemon builds, queues its half of two-sided batches, and answers the
linking daemon's reservation and teardown calls. See ``hccl``.
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

from ..ascend.comms import CommSettings, CommSpec, RankInfo
from ..native_errors import to_llm_exception
from .base import InboundSide
from .hccl_channel import (
    ACCEPTOR_RANK,
    INBOUND_GRACE_S,
    JOIN_GATE_WAIT_S,
    NO_COMMUNICATOR,
    REVOKE_WAIT_S,
    WATCH_GRACE_S,
    Channel,
    Side,
    block_on,
    close_when_built,
    fail,
    remaining_ms,
    settle,
)

if TYPE_CHECKING:
    from ..ascend.onesided import OneSidedMemory
    from ..memory.base import Memory

logger = logging.getLogger(__name__)


class HcclInbound(Side):
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
            raise fail(exc, "describing this side's HCCL rank") from exc

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
            build = asyncio.ensure_future(asyncio.to_thread(Channel.build, self._device, spec,
                                                            ACCEPTOR_RANK, self._settings))
            build.add_done_callback(lambda _: gate.release(owner))  # when the build ends
            try:
                channel = await asyncio.shield(build)
            except asyncio.CancelledError:
                close_when_built(build)
                raise
            except AscendError as exc:
                raise fail(exc, "joining the HCCL communicator") from exc
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

    async def destroy_half(self, name: str) -> None:
        """The linking daemon is about to free memory bound to communicator ``name``:
        destroy this half now (its mapping of that memory lives until
        HcclCommDestroy, hcomm hccl_one_sided_service.cc: DeInit ->
        DisableMemAccess). Nothing to do when the current communicator is
        another one: that one was destroyed before this one was joined."""
        channel = self._channel
        if channel is None or channel.name != name:
            return
        await asyncio.to_thread(channel.destroy)
        # the linking side's watch on it ends now (it destroys its half too)
        ask = self._named(self._asks, name)
        if not ask.done():
            ask.set_result(None)

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
            channel.release_peer = functools.partial(
                block_on, asyncio.get_running_loop(),
                functools.partial(self._revoke, channel.name), REVOKE_WAIT_S + WATCH_GRACE_S,
                f"asking the linking daemon to destroy its half of HCCL communicator "
                f"{channel.name}")
            try:
                await asyncio.to_thread(channel.prepare_one_sided, self._memory,
                                        self._cluster_id, timeout_ms)
            except AscendError as exc:
                await self._drop()
                raise fail(exc, "preparing the HCCL link") from exc

    async def close(self) -> None:
        """As `Side.close`; a one-sided communicator's linking half goes first (its
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
                settle(posted, LLMException(NO_COMMUNICATOR,
                                             status_code=LLMStatusCode.LLM_LINK_FAILED))
                return
            try:
                await asyncio.to_thread(channel.post, sending, memory, pairs)
            except AscendError as exc:
                error = fail(exc, "queueing an HCCL batch")
                logger.warning("%s; the communicator will be rebuilt", error)
                settle(posted, error)
                await self._drop()
                return
            settle(posted)
            try:
                await asyncio.to_thread(channel.stream.synchronize, remaining_ms(deadline))
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
