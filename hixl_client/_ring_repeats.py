"""Repeated transfers through the session's rings (``hixl_wire.rings``).

A repeat written to the submission ring is run by a native thread of the
daemon; its completion comes back on the other ring. A small repeat is
answered sooner than a sleeping event loop would be woken, so the client
looks for completions by spinning (``_spin.ReplySpin``'s budget, the GIL
released) before it sleeps in the loop on the completion ring's pipe:

* A caller that makes one call at a time spins in the call itself: its
  answer is there when it awaits it, and the call never suspends.
* Calls that overlap do not spin each on its own, which would hold the loop
  while the others wait to be submitted. Each call awaits its answer, and one
  *look* per turn of the loop (a callback queued behind the callers that are
  ready) spins once for all of them, after they have all been submitted.
  Every look that settled some calls queues the next one, behind the callers
  it woke, so while calls flow the loop never sleeps; a look that found
  nothing within the budget sleeps on the pipe.

Which of the two a call takes follows how many calls the last look found in
flight; one call in ``PROBE_EVERY`` that would spin in itself goes by the
look instead, so that callers which have begun to overlap are noticed.

The rings are a shortcut, never the only way: whenever they cannot take or
run a call (full, closed, the daemon's ``OUTCOME_FALLBACK``) :meth:`repeat`
says None and the caller sends the same repeat over the transfer lane, which
gives the full call's result or error. Everything runs on the loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import time
from typing import NamedTuple

import hixl_native

from hixl_wire.lane import (
    DEADLINE_GRACE_S,
    KIND_HELLO,
    REPLY_OK,
    WATCHDOG_TICK_S,
    error_from_reply,
    frame_of,
    unanswered,
)
from hixl_wire.link_status import link_failure
from hixl_wire.rings import (
    COMPLETION,
    KIND_CANCEL,
    KIND_PULL,
    KIND_PUSH,
    MAX_IN_FLIGHT,
    OUTCOME_CANCELLED,
    OUTCOME_FAILED,
    OUTCOME_FALLBACK,
    OUTCOME_OK,
    RINGS_TAG,
    SUBMISSION,
    RingPair,
    attach_pair,
    greet,
)

from ._spin import ReplySpin
from .status import LLMException, LLMStatusCode

logger = logging.getLogger(__name__)

_CALL_IDS = 2**64
# One call in this many that could spin in itself awaits the look instead:
# callers of a loop that each spin in their call never overlap, and this is
# how they are found to be several.
PROBE_EVERY = 32
_TIMEOUT_MS_MAX = 2**32 - 1
# What a ring failure can raise: a corrupt ring (NativeError), a closed one (ValueError).
_RING_ERRORS = (hixl_native.NativeError, ValueError, OSError)

# (outcome, native status, bytes, data_us) of a completion; None: fall back.
_Answer = tuple[int, int, int, int] | None


class Completion(NamedTuple):
    """A repeat that ran on the rings: what moved and how long that took."""

    bytes: int
    data_us: int

    @property
    def control_us(self) -> int:
        """No Python ran between the two ends (read by ``timing.record``)."""
        return 0


class _Waiting(NamedTuple):
    future: asyncio.Future[_Answer]  # cancelled when its caller was: its answer is ignored
    give_up_at: float  # loop time past which the daemon is deemed gone


class RingRepeats:
    """One session's rings, as seen from the client (open with :meth:`connect`).

    Args:
        sock: the connection the rings came on (watched for the daemon's end).
        pair: the client's end of the rings.
        what: names the daemon in error messages.
        grace_s: how long past a call's bound its completion may come.
        spin: how long a call alone waits for its completion by spinning.
    """

    def __init__(self, sock: socket.socket, pair: RingPair, what: str,
                 grace_s: float = DEADLINE_GRACE_S, spin: ReplySpin | None = None) -> None:
        self._sock = sock
        self._pair = pair
        self._what = what  # "hixl daemon at ...", for messages
        self._grace_s = grace_s  # how long past its bound a completion may come
        self._loop = asyncio.get_running_loop()
        self._spin = spin if spin is not None else ReplySpin()
        # Every submission not yet answered, those of cancelled callers too: each
        # holds a place in the completion ring until its completion comes.
        self._pending: dict[int, _Waiting] = {}
        self._next_id = 0
        self._armed = False  # asleep on the completion ring's pipe
        self._armed_at = 0.0  # when it went to sleep there (perf_counter)
        self._look_due = False  # a look is queued on the loop
        self._overlapping = True  # the last look found several calls in flight
        self._inline_calls = 0  # calls that spun in themselves since the last look
        self._watchdog: asyncio.TimerHandle | None = None
        self._closed = False
        self._loop.add_reader(pair.incoming.wait_fd, self._completions_ready)
        self._loop.add_reader(sock.fileno(), self._socket_readable)

    @classmethod
    async def connect(cls, path: str, session_id: str, what: str, timeout_s: float,
                      grace_s: float = DEADLINE_GRACE_S) -> RingRepeats:
        """Ask the daemon for the session's rings, on a new connection to its
        transfer lane's unix socket ``path``.

        Args:
            path: the transfer lane's socket.
            session_id: the session the rings serve.
            what: names the daemon in error messages.
            timeout_s: bounds the connection and the HELLO.
            grace_s: how long past a call's bound its completion may come.

        Raises:
            LLMException: the daemon refused (its error), or answered without
                rings (a daemon without them, which took the HELLO for a
                lane's: ``LLM_FEATURE_NOT_ENABLED``).
            OSError, asyncio.TimeoutError, hixl_native.NativeError: no connection,
                no answer in time, unusable rings.
        """
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await asyncio.wait_for(loop.sock_connect(sock, path), timeout_s)
            hello = frame_of(0, KIND_HELLO, timeout_s, RINGS_TAG, session_id.encode())
            kind, body, fds = await asyncio.wait_for(greet(sock, hello), timeout_s)
            if kind != REPLY_OK or not fds:
                for fd in fds:
                    os.close(fd)
                if kind != REPLY_OK:
                    raise error_from_reply(body, what)
                raise LLMException(f"{what} offers no rings",
                                   status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
            pair = attach_pair(fds)
        except BaseException:
            sock.close()
            raise
        try:
            return cls(sock, pair, what, grace_s)
        except BaseException:
            pair.close()
            sock.close()
            raise

    @property
    def is_open(self) -> bool:
        return not self._closed

    async def repeat(self, push: bool, handle: int, src_batch: int, dst_batch: int,
                     timeout_s: float) -> Completion | None:
        """Run a repeat (RepeatPush or RepeatPull of ``handle``) on the rings.

        Args:
            push: a RepeatPush, else a RepeatPull.
            handle: the daemon's ``repeat_handle`` of the shape.
            src_batch: the source batch slot.
            dst_batch: the destination batch slot.
            timeout_s: the daemon's bound, as a lane frame carries it; the
                completion is awaited ``grace_s`` longer.

        Returns:
            What moved; None: nothing did, send the repeat over the lane.

        Raises:
            LLMException: the transfer failed (the daemon's own error for its
                native status), or no completion came in time (LLM_TIMEOUT).
        """
        pending = self._pending
        if self._closed or len(pending) >= MAX_IN_FLIGHT:
            return None
        call_id = self._next_id
        submission = SUBMISSION.pack(call_id, handle, src_batch, dst_batch,
                                     min(int(timeout_s * 1000), _TIMEOUT_MS_MAX),
                                     KIND_PUSH if push else KIND_PULL)
        try:
            if not self._pair.outgoing.write(submission):
                return None
        except _RING_ERRORS as exc:
            self._lost(f"the submission ring failed: {exc}")
            return None
        self._next_id = (call_id + 1) % _CALL_IDS
        loop = self._loop
        future: asyncio.Future[_Answer] = loop.create_future()
        # Alone, and not asleep on the ring (which a spin's wait would undo).
        alone = not pending and not self._armed and not self._look_due
        pending[call_id] = _Waiting(future, loop.time() + timeout_s + self._grace_s)
        if self._watchdog is None:
            self._watchdog = loop.call_later(WATCHDOG_TICK_S, self._watch)
        try:
            if alone and not self._overlapping and self._inline_calls < PROBE_EVERY:
                self._inline_calls += 1
                answer = await self._spun(future)
            else:
                self._look_soon()
                answer = await future
        except asyncio.CancelledError:
            self._cancel(call_id)
            raise
        return self._outcome(answer)

    def _cancel(self, call_id: int) -> None:
        """Tell the daemon a caller gave up ``call_id``: it answers the call at
        once (OUTCOME_CANCELLED), so the call leaves the daemon's transfers under
        way as a cancelled lane call does; the place in the ring is freed then."""
        if self._closed or call_id not in self._pending:
            return
        with contextlib.suppress(*_RING_ERRORS):  # not sent: its own completion frees it
            self._pair.outgoing.write(SUBMISSION.pack(call_id, 0, 0, 0, 0, KIND_CANCEL))

    async def _spun(self, future: asyncio.Future[_Answer]) -> _Answer:
        """The answer of the one call in flight, spun for in the call itself."""
        started = time.perf_counter()
        budget = self._spin.budget_us()
        if budget > 0:
            self._look_for(budget)
        if not future.done():
            self._sleep(started)
            if self._armed:
                return await future  # _completions_ready counts the wait
        self._spin.took((time.perf_counter() - started) * 1e6)
        return await future  # done, unless the rings closed (then None)

    def _look_soon(self) -> None:
        if not self._look_due:
            self._look_due = True
            self._loop.call_soon(self._look)

    def _look(self) -> None:
        """One look for all the calls in flight (see the module): spin for
        completions, then either queue the next look or sleep on the pipe."""
        self._look_due = False
        pending = self._pending
        self._overlapping = len(pending) > 1
        self._inline_calls = 0
        if self._closed or self._armed or not pending:
            return
        started = time.perf_counter()
        budget = self._spin.budget_us()
        settled = self._look_for(budget) if budget > 0 else 0
        if not settled:
            self._sleep(started)
            return
        self._spin.took((time.perf_counter() - started) * 1e6)
        if pending:
            self._look_soon()

    def _outcome(self, answer: _Answer) -> Completion | None:
        if answer is None:
            return None
        outcome, status, nbytes, data_us = answer
        if outcome == OUTCOME_OK:
            return Completion(nbytes, data_us)
        if outcome == OUTCOME_FAILED:
            code, text = link_failure(status)
            raise LLMException(text, status_code=code)
        return None  # OUTCOME_FALLBACK (others are refused in _drain)

    def _look_for(self, budget_us: float) -> int:
        """Spin up to ``budget_us`` for a completion, the GIL released, and
        settle what came: how many calls that settled."""
        try:
            if self._pair.incoming.wait(0.0, spin_us=budget_us):
                return self._drain()
        except _RING_ERRORS as exc:
            self._lost(f"the completion ring failed: {exc}")
        return 0

    def _sleep(self, since: float) -> None:
        """Sleep on the completion ring's pipe while submissions are unanswered
        (``since``: when the wait for them began, for the spin's budget)."""
        while not self._armed and self._pending and not self._closed:
            try:
                self._armed = self._pair.incoming.arm()
            except _RING_ERRORS as exc:
                self._lost(f"the completion ring failed: {exc}")
                return
            if not self._armed:  # completions came meanwhile
                self._drain()
        if self._armed:
            self._armed_at = since

    def _completions_ready(self) -> None:
        if self._closed:
            return
        if self._armed:
            self._armed = False
            self._spin.took((time.perf_counter() - self._armed_at) * 1e6)
        # Also when not armed: a spin's wait may leave a wake-up in the pipe.
        self._pair.incoming.disarm()
        self._drain()
        if self._pending:
            self._look_soon()  # behind the callers just woken, which may submit more

    def _drain(self) -> int:
        """Settle the calls whose completions are in the ring: how many."""
        incoming, pending = self._pair.incoming, self._pending
        settled = 0
        try:
            while (frame := incoming.read()) is not None:
                call_id, outcome, status, nbytes, data_us, _ = COMPLETION.unpack(frame)
                if outcome not in (OUTCOME_OK, OUTCOME_FALLBACK, OUTCOME_FAILED,
                                   OUTCOME_CANCELLED):
                    raise ValueError(f"unknown outcome {outcome}")
                waiting = pending.pop(call_id, None)
                settled += 1
                if waiting is not None and not waiting.future.done():
                    waiting.future.set_result((outcome, status, nbytes, data_us))
        except (*_RING_ERRORS, struct.error) as exc:
            self._lost(f"a malformed completion: {exc}")
        return settled

    def _watch(self) -> None:
        """Give up on calls past their bound; runs every WATCHDOG_TICK_S while
        calls are in flight (one timer, not one per call, as a lane's)."""
        now = self._loop.time()
        pending = self._pending
        for call_id in [c for c, waiting in pending.items() if waiting.give_up_at <= now]:
            future = pending.pop(call_id).future
            if not future.done():
                future.set_exception(unanswered(self._what))
        self._watchdog = self._loop.call_later(WATCHDOG_TICK_S, self._watch) \
            if pending else None

    def _socket_readable(self) -> None:
        try:
            data = self._sock.recv(1)
        except BlockingIOError:
            return
        except OSError as exc:
            self._lost(f"its socket failed: {exc}")
            return
        # After HELLO the socket carries nothing: its end is the daemon's going away.
        self._lost("the daemon closed them" if not data else "bytes came on their socket")

    def _lost(self, reason: str) -> None:
        logger.info("%s: repeats go over the transfer lane, the rings are closed: %s",
                    self._what, reason)
        self.close()

    def close(self) -> None:
        """Close the rings and their socket (idempotent): calls in flight, and
        every later one, are sent over the lane by their callers."""
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._pair.incoming.wait_fd)
        self._loop.remove_reader(self._sock.fileno())
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        pending, self._pending = self._pending, {}
        for waiting in pending.values():
            if not waiting.future.done():
                waiting.future.set_result(None)
        self._pair.close()
        self._sock.close()
