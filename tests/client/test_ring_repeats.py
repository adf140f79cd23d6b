"""hixl_client._ring_repeats.RingRepeats: repeats through the session's rings.

The daemon's end is played by the test itself, with the daemon's half of a
real pair (``hixl_wire.rings.new_pair``) and a real unix socket: the
daemon's native consumer cannot run in a unit test of the client, so the
test reads the submissions and writes the completions, from the event loop
or from a thread as the daemon's C thread would (the integration tests run
a real daemon). Covered: each outcome, the bound on a silent daemon, calls
out of order, the limits that send a call to the lane, a daemon that goes
away, a cancelled caller, and the HELLO that asks for the rings.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import hixl_native
import pytest
from hixl_native import Ring

from hixl_client._ring_repeats import PROBE_EVERY, Completion, RingRepeats
from hixl_client._spin import ReplySpin
from hixl_client.status import LLMException, LLMStatusCode
from hixl_service.native_errors import link_error
from hixl_wire.lane import (
    HEADER,
    KIND_HELLO,
    REPLY_ERROR,
    REPLY_OK,
    call_error,
    unanswered,
)
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
    RING_CAPACITY,
    RINGS_TAG,
    SUBMISSION,
    RingPair,
    attach_pair,
    new_pair,
    send_with_fds,
)

WHAT = "hixl daemon at unix:/test"
SESSION = "0123456789abcdef"
# (call id, handle, src batch, dst batch, timeout ms, kind)
Submission = tuple[int, int, int, int, int, int]
# A submission -> (outcome, native status, bytes, data_us)
Answer = Callable[[Submission], tuple[int, int, int, int]]


class DaemonEnd:
    """The daemon's end of a session's rings and their socket."""

    def __init__(self, submission_capacity: int = RING_CAPACITY) -> None:
        if submission_capacity == RING_CAPACITY:
            self.pair, self.client_fds = new_pair()
        else:  # a smaller submission ring than any daemon makes, to fill it
            submissions, theirs = Ring.create(submission_capacity, producer=False)
            completions, more = Ring.create(RING_CAPACITY, producer=True)
            self.pair, self.client_fds = RingPair(submissions, completions), [*theirs, *more]
        self.sock, self.client_sock = socket.socketpair()
        self.client_sock.setblocking(False)

    def client(self, grace_s: float, spin: ReplySpin | None) -> RingRepeats:
        return RingRepeats(self.client_sock, attach_pair(self.client_fds), WHAT, grace_s, spin)

    async def submissions(self, count: int) -> list[Submission]:
        """The next ``count`` submissions, as the client wrote them."""
        taken: list[Submission] = []
        deadline = time.monotonic() + 2.0
        while len(taken) < count:
            frame = self.pair.incoming.read()
            if frame is None:
                assert time.monotonic() < deadline, f"{len(taken)} of {count} submissions came"
                await asyncio.sleep(0.001)
                continue
            taken.append(SUBMISSION.unpack(frame))
        return taken

    def complete(self, call_id: int, outcome: int = OUTCOME_OK, status: int = 0,
                 nbytes: int = 0, data_us: int = 0) -> None:
        assert self.pair.outgoing.write(COMPLETION.pack(call_id, outcome, status, nbytes,
                                                        data_us, 0))

    @contextlib.contextmanager
    def answering(self, answer: Answer) -> Iterator[list[Submission]]:
        """A thread that answers every submission as ``answer`` says (the
        daemon's C thread does the same without Python)."""
        seen: list[Submission] = []
        stop = threading.Event()

        def run() -> None:
            while not stop.is_set():
                if not self.pair.incoming.wait(0.02, spin_us=50.0):
                    continue
                while (frame := self.pair.incoming.read()) is not None:
                    submission = SUBMISSION.unpack(frame)
                    seen.append(submission)
                    self.complete(submission[0], *answer(submission))

        thread = threading.Thread(target=run, name="daemon-end")
        thread.start()
        try:
            yield seen
        finally:
            stop.set()
            thread.join()

    def close(self) -> None:
        self.pair.close()
        self.sock.close()
        for fd in self.client_fds:
            with contextlib.suppress(OSError):
                os.close(fd)


@contextlib.asynccontextmanager
async def rings(submission_capacity: int = RING_CAPACITY, grace_s: float = 0.05,
                spin: ReplySpin | None = None) -> AsyncIterator[tuple[RingRepeats, DaemonEnd]]:
    daemon = DaemonEnd(submission_capacity)
    client = daemon.client(grace_s, spin)
    try:
        yield client, daemon
    finally:
        client.close()
        daemon.close()


def _moved(submission: Submission) -> tuple[int, int, int, int]:
    return OUTCOME_OK, 0, submission[1] * 1000, 5


@pytest.mark.asyncio
@pytest.mark.parametrize("spin_us", [1e6, 0.0], ids=["spinning", "asleep-in-the-loop"])
async def test_a_repeat_that_ran_gives_what_moved(spin_us: float) -> None:
    # A bound of a second: each call spins until its completion (a thread
    # answering from Python is too slow for the default); none: each sleeps.
    async with rings(spin=ReplySpin(spin_us)) as (client, daemon):
        with daemon.answering(_moved) as seen:
            for call in range(5):
                done = await client.repeat(call % 2 == 0, 7, 1, 2, 1.5)
                assert done == Completion(7000, 5) and done.control_us == 0
        assert seen == [(call, 7, 1, 2, 1500, KIND_PUSH if call % 2 == 0 else KIND_PULL)
                        for call in range(5)]


@pytest.mark.asyncio
async def test_a_repeat_the_daemon_cannot_run_goes_to_the_lane() -> None:
    async with rings() as (client, daemon):
        with daemon.answering(lambda _: (OUTCOME_FALLBACK, 0, 0, 0)):
            assert await client.repeat(False, 7, 0, 0, 1.0) is None
        assert client.is_open  # the next one may run


@pytest.mark.asyncio
@pytest.mark.parametrize("status", [hixl_native.E_TIMEOUT, hixl_native.E_CHECKSUM,
                                    hixl_native.E_CLOSED, hixl_native.E_IO, -9999])
async def test_a_failed_repeat_raises_what_the_daemon_raises_for_its_status(status: int) -> None:
    async with rings() as (client, daemon):
        with daemon.answering(lambda _: (OUTCOME_FAILED, status, 0, 0)), \
                pytest.raises(LLMException) as info:
            await client.repeat(True, 7, 0, 0, 1.0)
    expected = link_error(status)
    assert (info.value.status_code, str(info.value)) == (expected.status_code, str(expected))


@pytest.mark.asyncio
async def test_a_daemon_that_never_answers_times_the_call_out() -> None:
    async with rings(grace_s=0.05) as (client, daemon):
        started = time.monotonic()
        with pytest.raises(LLMException) as info:
            await client.repeat(False, 7, 0, 0, 0.05)
        took = time.monotonic() - started
        # Not before its bound and grace (the loop clock has milliseconds); after
        # them, within a watchdog tick on a quiet host (bounded here loosely, as a
        # loaded host may run the loop late).
        assert 0.09 <= took < 5.0
        expected = unanswered(WHAT)
        assert (info.value.status_code, str(info.value)) == (LLMStatusCode.LLM_TIMEOUT,
                                                             str(expected))
        # Its late completion is ignored; the next call gets its own.
        (first, *_), = await daemon.submissions(1)
        daemon.complete(first, nbytes=1)
        with daemon.answering(_moved):
            assert await client.repeat(False, 3, 0, 0, 1.0) == Completion(3000, 5)


@pytest.mark.asyncio
async def test_calls_in_flight_get_their_own_completions_in_any_order() -> None:
    async with rings() as (client, daemon):
        calls = [asyncio.ensure_future(client.repeat(False, handle, 0, 0, 1.0))
                 for handle in range(1, 11)]
        submissions = await daemon.submissions(10)
        for call_id, handle, *_ in reversed(submissions):
            daemon.complete(call_id, nbytes=handle * 10, data_us=handle)
            await asyncio.sleep(0)  # some now, some together
        assert await asyncio.wait_for(asyncio.gather(*calls), 1.0) == [
            Completion(handle * 10, handle) for handle in range(1, 11)]


async def _worker(client: RingRepeats, handle: int, calls: int) -> None:
    for _ in range(calls):
        assert await client.repeat(False, handle, 0, 0, 1.5) == Completion(handle * 1000, 5)


@pytest.mark.asyncio
async def test_callers_that_overlap_are_all_submitted_before_the_client_spins() -> None:
    # Spinning up to a second: a caller that spun in its own call would hold
    # the loop, and the others could not submit until it was done.
    async with rings(spin=ReplySpin(1e6)) as (client, daemon):
        with daemon.answering(_moved) as seen:
            await asyncio.gather(*(_worker(client, handle, 3) for handle in range(1, 5)))
        handles = [submission[1] for submission in seen]
        assert handles[:4] == [1, 2, 3, 4] and sorted(handles) == sorted([1, 2, 3, 4] * 3)


@pytest.mark.asyncio
async def test_a_caller_that_spins_in_its_calls_lets_others_in_every_probe_every_calls() -> None:
    # The first caller runs alone, so it spins in its calls, which never yield
    # the loop. The second caller is started from the daemon's thread after the
    # first's third call: it can run only when one of the first's calls goes
    # by the look instead, PROBE_EVERY calls later at the most.
    loop = asyncio.get_running_loop()
    second: list[asyncio.Future[None]] = []
    async with rings(spin=ReplySpin(1e6)) as (client, daemon):
        def answer(submission: Submission) -> tuple[int, int, int, int]:
            if len(seen) == 3:
                loop.call_soon_threadsafe(
                    lambda: second.append(asyncio.ensure_future(_worker(client, 2, 1))))
            return _moved(submission)

        with daemon.answering(answer) as seen:
            await _worker(client, 1, 3 * PROBE_EVERY)
            await asyncio.wait_for(second[0], 1.0)
        handles = [submission[1] for submission in seen]
        assert handles.count(2) == 1 and 3 <= handles.index(2) <= 3 + PROBE_EVERY + 1


@pytest.mark.asyncio
async def test_past_max_in_flight_a_call_goes_to_the_lane_at_once() -> None:
    async with rings() as (client, daemon):
        calls = [asyncio.ensure_future(client.repeat(False, 1, 0, 0, 5.0))
                 for _ in range(MAX_IN_FLIGHT)]
        submissions = await daemon.submissions(MAX_IN_FLIGHT)
        assert await client.repeat(False, 1, 0, 0, 5.0) is None
        for call_id, *_ in submissions:
            daemon.complete(call_id, nbytes=1)
        assert set(await asyncio.wait_for(asyncio.gather(*calls), 2.0)) == {Completion(1, 0)}


@pytest.mark.asyncio
async def test_a_full_submission_ring_sends_the_call_to_the_lane() -> None:
    # 4 KiB hold 102 submissions of 40 bytes: fewer than MAX_IN_FLIGHT.
    async with rings(submission_capacity=4096) as (client, daemon):
        calls = [asyncio.ensure_future(client.repeat(False, 1, 0, 0, 5.0)) for _ in range(102)]
        await asyncio.sleep(0.01)
        assert await client.repeat(False, 1, 0, 0, 5.0) is None
        for call_id, *_ in await daemon.submissions(102):
            daemon.complete(call_id)
        assert len(await asyncio.wait_for(asyncio.gather(*calls), 2.0)) == 102


@pytest.mark.asyncio
async def test_a_daemon_that_goes_away_sends_calls_in_flight_and_later_ones_to_the_lane() -> None:
    async with rings() as (client, daemon):
        calls = [asyncio.ensure_future(client.repeat(False, 1, 0, 0, 5.0)) for _ in range(3)]
        await daemon.submissions(3)
        daemon.sock.close()
        assert await asyncio.wait_for(asyncio.gather(*calls), 1.0) == [None] * 3
        assert not client.is_open
        assert await client.repeat(False, 1, 0, 0, 5.0) is None


@pytest.mark.asyncio
async def test_a_malformed_completion_closes_the_rings() -> None:
    async with rings() as (client, daemon):
        call = asyncio.ensure_future(client.repeat(False, 1, 0, 0, 5.0))
        (call_id, *_), = await daemon.submissions(1)
        daemon.complete(call_id, outcome=7)
        assert await asyncio.wait_for(call, 1.0) is None
        assert not client.is_open


@pytest.mark.asyncio
async def test_a_cancelled_call_is_cancelled_at_the_daemon_and_late_answers_ignored() -> None:
    async with rings() as (client, daemon):
        call = asyncio.ensure_future(client.repeat(False, 1, 0, 0, 5.0))
        (cancelled, *_), = await daemon.submissions(1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        (cancel,) = await daemon.submissions(1)  # the daemon is told
        assert (cancel[0], cancel[-1]) == (cancelled, KIND_CANCEL)
        later = asyncio.ensure_future(client.repeat(False, 2, 0, 0, 5.0))
        (call_id, *_), = await daemon.submissions(1)
        daemon.complete(cancelled, outcome=OUTCOME_CANCELLED)  # its answer frees its place
        daemon.complete(cancelled, nbytes=1)  # a stray one: ignored
        daemon.complete(call_id, nbytes=2)
        assert await asyncio.wait_for(later, 1.0) == Completion(2, 0)
        assert not client._pending


# ---- connect: the HELLO that asks for the rings ------------------------------------------------


@contextlib.asynccontextmanager
async def listening(tmp_path: Path) -> AsyncIterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "lane.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with listener:
        listener.bind(path)
        listener.listen()
        listener.setblocking(False)
        yield path, listener


async def _hello(listener: socket.socket) -> tuple[socket.socket, bytes]:
    """Accept the client's connection and read its HELLO frame."""
    loop = asyncio.get_running_loop()
    conn, _ = await loop.sock_accept(listener)
    frame = await loop.sock_recv(conn, 1024)
    return conn, frame


def _frame(kind: int, body: bytes = b"") -> bytes:
    return HEADER.pack(len(body), 0, kind, 0, 0) + body


@pytest.mark.asyncio
async def test_connect_asks_for_the_rings_of_the_session(tmp_path: Path) -> None:
    async with listening(tmp_path) as (path, listener):
        connecting = asyncio.ensure_future(RingRepeats.connect(path, SESSION, WHAT, 1.0))
        conn, hello = await _hello(listener)
        with conn:
            _, _, kind, _, tag = HEADER.unpack_from(hello)
            assert (kind, tag, hello[HEADER.size:]) == (KIND_HELLO, RINGS_TAG, SESSION.encode())
            pair, fds = new_pair()
            send_with_fds(conn, _frame(REPLY_OK), fds)
            for fd in fds:
                os.close(fd)
            client = await asyncio.wait_for(connecting, 1.0)
            try:
                call = asyncio.ensure_future(client.repeat(True, 5, 0, 1, 1.0))
                while (frame := pair.incoming.read()) is None:
                    await asyncio.sleep(0.001)
                assert SUBMISSION.unpack(frame)[1:] == (5, 0, 1, 1000, KIND_PUSH)
                pair.outgoing.write(COMPLETION.pack(0, OUTCOME_OK, 0, 64, 2, 0))
                assert await asyncio.wait_for(call, 1.0) == Completion(64, 2)
            finally:
                client.close()
                pair.close()
            assert conn.recv(1) == b""  # the daemon sees the client go


@pytest.mark.asyncio
async def test_connect_raises_the_daemons_refusal(tmp_path: Path) -> None:
    async with listening(tmp_path) as (path, listener):
        connecting = asyncio.ensure_future(RingRepeats.connect(path, SESSION, WHAT, 1.0))
        conn, _ = await _hello(listener)
        with conn:
            refusal = call_error(grpc.StatusCode.UNAUTHENTICATED, int(LLMStatusCode.LLM_FAILED), "no such session")
            conn.sendall(_frame(REPLY_ERROR, refusal.SerializeToString()))
            with pytest.raises(LLMException, match="^no such session$") as info:
                await asyncio.wait_for(connecting, 1.0)
            assert info.value.status_code == LLMStatusCode.LLM_FAILED
            assert conn.recv(1) == b""


@pytest.mark.asyncio
async def test_a_daemon_without_rings_answers_without_descriptors(tmp_path: Path) -> None:
    async with listening(tmp_path) as (path, listener):
        connecting = asyncio.ensure_future(RingRepeats.connect(path, SESSION, WHAT, 1.0))
        conn, _ = await _hello(listener)
        with conn:
            conn.sendall(_frame(REPLY_OK))  # an older daemon: an ordinary lane's HELLO
            with pytest.raises(LLMException, match="offers no rings") as info:
                await asyncio.wait_for(connecting, 1.0)
            assert info.value.status_code == LLMStatusCode.LLM_FEATURE_NOT_ENABLED
            assert conn.recv(1) == b""  # and its connection is closed
