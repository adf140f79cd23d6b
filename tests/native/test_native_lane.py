"""Native lanes (csrc/native_lane.h): repeats read from a real ring, run on a
real DataLink to a real DataServer, answered in the other ring; cells
published, revoked and refused as the daemon's Python relies on."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from hixl_native import CompletionQueue, DataLink, DataServer, SharedPool

hn = pytest.importorskip("hixl_native")
np = pytest.importorskip("numpy")

from tests.native._native_support import CLUSTER, TOKEN  # noqa: E402

# The frames of hixl_wire/rings.py, spelled out here: this test pins the C layout.
SUBMISSION = struct.Struct("<QQIIII")
COMPLETION = struct.Struct("<QiiQII")
PULL, PUSH = 1, 2
REGION = 9
OWNER = 5
SLOT = 4096  # bytes of one slot of one tensor, both sides
SLOTS = 8
TENSORS = 3  # each tensor is SLOTS * SLOT bytes, one after the other


@dataclass
class Lane:
    """A lane and the client's ends of its two rings."""

    lane: Any
    submit: Any  # the client's producer side
    complete: Any  # the client's consumer side
    log: Any

    def call(self, call_id: int, handle: int, src: int, dst: int, kind: int = PULL,
             timeout_s: float = 5.0) -> tuple[int, int, int, int, int, int]:
        assert self.submit.write(SUBMISSION.pack(call_id, handle, src, dst, 5000, kind))
        return COMPLETION.unpack(_next(self, timeout_s))


@pytest.fixture
def lane() -> Iterator[Lane]:
    submissions, client_submit = hn.Ring.create(1 << 16, producer=False)
    completions, client_complete = hn.Ring.create(1 << 16, producer=True)
    log = hn.NativeLaneLog(64)
    native = hn.NativeLane(submissions, completions, OWNER, log)
    client = Lane(native, hn.Ring.attach(*client_submit, producer=True),
                  hn.Ring.attach(*client_complete, producer=False), log)
    yield client
    native.stop()
    for ring in (client.submit, client.complete, submissions, completions):
        ring.close()


@pytest.fixture
def linked(server: DataServer, pools: tuple[SharedPool, SharedPool],
           cq: CompletionQueue) -> Iterator[tuple[DataLink, SharedPool, SharedPool]]:
    remote, local = pools
    np.frombuffer(remote, np.uint8)[:] = np.random.default_rng(3).integers(
        0, 256, remote.size, np.uint8)
    server.register_region(REGION, remote, 0, remote.size, CLUSTER, writable=True)
    link = hn.DataLink("127.0.0.1", server.port, TOKEN, 2, cq, 2000)
    yield link, remote, local
    link.close()
    server.unregister_region(REGION)


def slot_ranges() -> Any:
    """One range per tensor between slots 0 and 0 (remote, local, length):
    the same offsets on both sides."""
    return np.array([(t * SLOTS * SLOT, t * SLOTS * SLOT, SLOT) for t in range(TENSORS)],
                    dtype=np.uint64)


def cell(link: DataLink, local: SharedPool, handle: int, push: bool = False,
         owner: int = OWNER, checksum: bool = False) -> Any:
    return hn.RepeatCell(handle, owner, push, checksum, link, local, REGION, slot_ranges(),
                         SLOT, SLOTS, SLOT, SLOTS, TENSORS * SLOT, 5000)


def slot_of(pool: SharedPool, slot: int) -> Any:
    arr = np.frombuffer(pool, np.uint8)
    return np.concatenate([arr[t * SLOTS * SLOT + slot * SLOT:][:SLOT] for t in range(TENSORS)])


@pytest.mark.parametrize("checksum", [False, True])
def test_a_published_pull_moves_the_slots_named(lane: Lane, linked: Any, checksum: bool) -> None:
    link, remote, local = linked
    c = cell(link, local, 101, checksum=checksum)
    c.publish()
    try:
        call_id, outcome, status, nbytes, _, _ = lane.call(7, 101, src=5, dst=2)
        assert (call_id, outcome, status, nbytes) == (7, hn.NL_OK, 0, TENSORS * SLOT)
        assert np.array_equal(slot_of(local, 2), slot_of(remote, 5))
        assert not np.any(slot_of(local, 5))
        records, dropped = lane.log.take()
        assert dropped == 0
        assert [(r[0], r[1], r[2], r[4]) for r in records] == [
            (OWNER, 101, hn.NL_OK, TENSORS * SLOT)]
        assert c.inflight == 0
    finally:
        c.close()


def test_a_published_push_writes_the_far_slot(lane: Lane, linked: Any) -> None:
    link, remote, local = linked
    np.frombuffer(local, np.uint8)[:] = 0x5A
    c = cell(link, local, 102, push=True)
    c.publish()
    try:
        assert lane.call(1, 102, src=3, dst=6, kind=PUSH)[1] == hn.NL_OK
        assert np.all(slot_of(remote, 6) == 0x5A)
        assert not np.all(slot_of(remote, 5) == 0x5A)
    finally:
        c.close()


def test_what_no_cell_allows_falls_back_and_moves_nothing(lane: Lane, linked: Any) -> None:
    link, _, local = linked
    mine, foreign = cell(link, local, 103), cell(link, local, 104, owner=OWNER + 1)
    mine.publish()
    foreign.publish()
    try:
        cases = [(999, 0, 0, PULL),  # no such handle
                 (104, 0, 0, PULL),  # another owner's
                 (103, 0, 0, PUSH),  # the other direction
                 (103, SLOTS, 0, PULL),  # a slot out of range
                 (103, 0, SLOTS, PULL),
                 (103, 0, 0, 77)]  # no such kind
        for i, (handle, src, dst, kind) in enumerate(cases):
            assert lane.call(i, handle, src, dst, kind)[1] == hn.NL_FALLBACK, cases[i]
        assert not np.any(np.frombuffer(local, np.uint8))
        assert lane.log.take() == ([], 0)
    finally:
        mine.close()
        foreign.close()


def test_a_revoked_cell_is_no_longer_run(lane: Lane, linked: Any) -> None:
    link, _, local = linked
    c = cell(link, local, 105)
    c.publish()
    assert lane.call(1, 105, 0, 0)[1] == hn.NL_OK
    c.revoke()
    assert lane.call(2, 105, 0, 0)[1] == hn.NL_FALLBACK
    c.publish()  # published again, as after a full call found it still current
    assert lane.call(3, 105, 0, 0)[1] == hn.NL_OK
    c.publish()  # idempotent
    other = cell(link, local, 105)
    with pytest.raises(ValueError, match="publish"):
        other.publish()  # one cell per handle
    other.close()
    c.close()


def test_a_region_the_far_side_dropped_falls_back(lane: Lane, linked: Any,
                                                  server: DataServer) -> None:
    link, remote, local = linked
    c = cell(link, local, 106)
    c.publish()
    try:
        server.unregister_region(REGION)
        assert lane.call(1, 106, 0, 0)[1] == hn.NL_FALLBACK
    finally:
        server.register_region(REGION, remote, 0, remote.size, CLUSTER, writable=True)
        c.close()


def test_a_closed_link_falls_back(lane: Lane, linked: Any) -> None:
    link, _, local = linked
    c = cell(link, local, 107)
    c.publish()
    link.close()
    try:
        assert lane.call(1, 107, 0, 0)[1] == hn.NL_FALLBACK
    finally:
        c.close()


def test_close_waits_for_a_transfer_in_flight(lane: Lane, linked: Any) -> None:
    """A revocation waits for transfers already running: many repeats from a
    thread while the cell is closed; every one ends OK or falls back."""
    link, _, local = linked
    c = cell(link, local, 108)
    c.publish()
    outcomes: list[int] = []

    def repeat() -> None:
        for i in range(200):
            outcomes.append(lane.call(i, 108, i % SLOTS, i % SLOTS)[1])

    thread = threading.Thread(target=repeat)
    thread.start()
    while not outcomes:
        time.sleep(0.001)
    c.close()
    assert c.inflight == 0
    thread.join(10)
    assert set(outcomes) <= {hn.NL_OK, hn.NL_FALLBACK}
    assert outcomes[-1] == hn.NL_FALLBACK


def test_a_foreign_frame_ends_the_lane(lane: Lane) -> None:
    assert lane.submit.write(b"not a submission")
    deadline = time.monotonic() + 5
    while not lane.lane.ended:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    lane.lane.stop()
    lane.lane.stop()  # idempotent


def test_stop_ends_an_idle_lane(lane: Lane) -> None:
    """Asleep in poll, it wakes on its stop descriptor (a lane that did not
    would hang this test until pytest's timeout)."""
    lane.lane.stop()
    assert lane.lane.ended


def test_a_full_log_counts_what_it_lost(lane: Lane, linked: Any) -> None:
    link, _, local = linked
    c = cell(link, local, 109)
    c.publish()
    try:
        for i in range(70):  # the log holds 64
            assert lane.call(i, 109, 0, 0)[1] == hn.NL_OK
        records, dropped = lane.log.take()
        assert (len(records), dropped) == (64, 6)
        assert lane.log.take() == ([], 0)
    finally:
        c.close()


def test_many_submissions_at_once_each_land_and_are_answered_by_call_id(
        lane: Lane, linked: Any) -> None:
    """64 submissions written before any is answered: each gets exactly one
    completion, by its call id, and the last pull into each slot wins."""
    link, remote, local = linked
    c = cell(link, local, 110)
    c.publish()
    try:
        count = 64
        for i in range(count):
            assert lane.submit.write(SUBMISSION.pack(1000 + i, 110, i % SLOTS,
                                                     (i * 3) % SLOTS, 5000, PULL))
        answers = [COMPLETION.unpack(_next(lane)) for _ in range(count)]
        done = {answer[0]: answer for answer in answers}
        assert sorted(done) == list(range(1000, 1000 + count))
        assert {answer[1] for answer in done.values()} == {hn.NL_OK}
        for slot in range(SLOTS):  # the last pull into each slot came from...
            last = max(i for i in range(count) if (i * 3) % SLOTS == slot)
            assert np.array_equal(slot_of(local, slot), slot_of(remote, last % SLOTS))
        assert lane.lane.under_way == 0
    finally:
        c.close()


@pytest.fixture
def silent(cq: CompletionQueue, pools: tuple[SharedPool, SharedPool]) -> Iterator[Any]:
    """A cell whose far side takes requests and never answers (its transfers
    end by their 1 s deadline)."""
    from tests.native._native_support import RawServer

    server = RawServer("silent")
    link = hn.DataLink("127.0.0.1", server.port, TOKEN, 1, cq, 2000)
    stuck = hn.RepeatCell(120, OWNER, False, False, link, pools[1], REGION, slot_ranges(),
                          SLOT, SLOTS, SLOT, SLOTS, TENSORS * SLOT, 1000)
    stuck.publish()
    yield stuck
    stuck.close()
    link.close()
    server.close()


def test_a_silent_far_side_holds_up_only_its_own(lane: Lane, linked: Any,
                                                 silent: Any) -> None:
    link, _, local = linked
    quick = cell(link, local, 111)
    quick.publish()
    try:
        assert lane.submit.write(SUBMISSION.pack(1, 120, 0, 0, 5000, PULL))
        # Answered first: the silent one's answer comes only at its deadline.
        assert lane.call(2, 111, 1, 1)[:2] == (2, hn.NL_OK)
        assert lane.lane.under_way == 1
        first = COMPLETION.unpack(_next(lane))
        call_id, outcome, status = first[:3]
        assert (call_id, outcome, status) == (1, hn.NL_FAILED, hn.E_TIMEOUT)
        assert lane.lane.under_way == 0
    finally:
        quick.close()


def _next(lane: Lane, timeout_s: float = 5.0) -> bytes:
    deadline = time.monotonic() + timeout_s
    while (frame := lane.complete.read()) is None:
        assert time.monotonic() < deadline, "no completion"
        lane.complete.wait(0.2)
    return bytes(frame)


def test_a_cancelled_call_is_answered_at_once(lane: Lane, silent: Any) -> None:
    """Its transfer runs to its deadline (the memory stays in use until then),
    but its caller hears at once, and nothing more about it later."""
    assert lane.submit.write(SUBMISSION.pack(5, 120, 0, 0, 5000, PULL))
    deadline = time.monotonic() + 5
    while lane.lane.under_way != 1:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert lane.submit.write(SUBMISSION.pack(5, 0, 0, 0, 0, hn.NL_CANCEL))
    assert COMPLETION.unpack(_next(lane))[:2] == (5, hn.NL_CANCELLED)
    assert lane.lane.under_way == 0
    assert silent.inflight == 1
    while silent.inflight:  # its deadline ends it
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert lane.complete.read() is None
    records, _ = lane.log.take()
    assert [(r[1], r[2], r[3]) for r in records] == [(120, hn.NL_FAILED, hn.E_TIMEOUT)]
    assert lane.submit.write(SUBMISSION.pack(6, 0, 0, 0, 0, hn.NL_CANCEL))  # nothing to cancel
    assert lane.call(7, 999, 0, 0)[:2] == (7, hn.NL_FALLBACK)  # and the lane goes on
