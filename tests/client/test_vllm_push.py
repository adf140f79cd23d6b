"""Push mode's prefill side (``hixl_client.vllm._push.Pusher``) on an event
loop, without vLLM: which layers it pushes when, what it reports, and when it
counts a decode worker done. Its pushes here only record what they were asked;
tests/vllm pushes real KV between real vLLM servers."""

from __future__ import annotations

import asyncio

import pytest

from hixl_client import LLMException, LLMStatusCode
from hixl_client.vllm._kv_map import KvShape
from hixl_client.vllm._params import Saved, Want
from hixl_client.vllm._push import Pusher
from hixl_client.vllm._sources import Pull, Worker

pytestmark = pytest.mark.asyncio

LAYERS = 2
SHAPE = KvShape(32, 2, 32, 2)
ME = Worker("L32", "fam", SHAPE, 32, 0, 1)


def want(transfer: str = "t1", family: str = "fam", layout: str = "L32",
         tellers: int = 1) -> Want:
    return Want(transfer, 77, "127.0.0.1:1", 0, 1, layout, family, tuple(SHAPE.to_list()), 32,
                (5, 6), 0, 50, tellers)


def saved(whole: bool, transfer: str = "t1") -> Saved:
    return Saved("req-1", transfer, (3, 4), 50, whole)


class Calls:
    """What the pusher asked of the worker, in order."""

    def __init__(self, fail: bool = False) -> None:
        self.pushes: list[tuple[Pull, range | None]] = []
        self.reports: list[str] = []
        self.dones: list[tuple[str, int]] = []
        self.fail = fail

    async def push(self, wanted: Want, pull: Pull, layers: range | None) -> None:
        await asyncio.sleep(0)
        self.pushes.append((pull, layers))
        if self.fail:
            raise LLMException("the far side is gone", status_code=LLMStatusCode.LLM_LINK_FAILED)

    async def report(self, wanted: Want, error: str) -> None:
        self.reports.append(error)

    def done(self, request_id: str, tellers: int) -> None:
        self.dones.append((request_id, tellers))


def pusher(calls: Calls, num_layers: int | None = LAYERS) -> Pusher:
    return Pusher(ME, num_layers, 5.0, calls.push, calls.report, calls.done)


async def settle(p: Pusher) -> None:
    await p.end_step(1.0)
    await asyncio.sleep(0.01)


async def test_a_finished_request_goes_whole_when_its_want_comes() -> None:
    calls = Calls()
    p = pusher(calls)
    p.begin_step([saved(whole=True)])
    p.want(want())
    await settle(p)
    [(pull, layers)] = calls.pushes
    assert layers == range(0, LAYERS) and pull.src == [3, 4] and pull.dst == [5, 6]
    assert calls.reports == [""] and calls.dones == [("req-1", 1)]


async def test_layers_go_one_by_one_as_they_are_saved_once_wanted() -> None:
    calls = Calls()
    p = pusher(calls)
    p.want(want())  # before the request is known here: kept
    p.begin_step([saved(whole=False)])
    assert calls.pushes == []
    p.layer_saved(0)
    await asyncio.sleep(0.01)
    assert [layers for _, layers in calls.pushes] == [range(0, 1)] and not calls.reports
    p.layer_saved(1)
    await settle(p)
    assert [layers for _, layers in calls.pushes] == [range(0, 1), range(1, 2)]
    assert calls.reports == [""] and calls.dones == [("req-1", 1)]
    # The request finishes: every layer went already, nothing more is pushed.
    p.begin_step([saved(whole=True)])
    await settle(p)
    assert len(calls.pushes) == 2 and calls.dones == [("req-1", 1)]


async def test_a_want_during_the_prefill_gets_the_saved_layers_at_once() -> None:
    calls = Calls()
    p = pusher(calls)
    p.begin_step([saved(whole=False)])
    p.layer_saved(0)
    p.want(want(tellers=2))
    await asyncio.sleep(0.01)
    p.layer_saved(1)
    await settle(p)
    assert [layers for _, layers in calls.pushes] == [range(0, 1), range(1, 2)]
    assert calls.dones == [("req-1", 2)]


async def test_without_layers_of_their_own_a_request_goes_whole_at_its_end() -> None:
    calls = Calls()
    p = pusher(calls, num_layers=None)
    p.begin_step([saved(whole=False)])
    p.want(want())
    p.layer_saved(0)
    await settle(p)
    assert calls.pushes == []
    p.begin_step([saved(whole=True)])
    await settle(p)
    assert [layers for _, layers in calls.pushes] == [None] and calls.reports == [""]


async def test_a_failed_push_is_reported_and_nothing_more_goes() -> None:
    calls = Calls(fail=True)
    p = pusher(calls)
    p.begin_step([saved(whole=False)])
    p.want(want())
    p.layer_saved(0)
    await asyncio.sleep(0.01)
    p.layer_saved(1)
    await settle(p)
    assert len(calls.pushes) == 1
    assert len(calls.reports) == 1 and "the far side is gone" in calls.reports[0]
    assert calls.dones == [("req-1", 1)]


async def test_a_want_of_another_layout_family_is_refused_with_why() -> None:
    calls = Calls()
    p = pusher(calls)
    p.begin_step([saved(whole=True)])
    # Blocks of another size move as runs, within one layout family only.
    p.want(Want("t1", 77, "127.0.0.1:1", 0, 1, "L64", "other", tuple(SHAPE.to_list()), 64,
                (5,), 0, 50, 1))
    await settle(p)
    assert calls.pushes == [] and "cannot move as runs" in calls.reports[0]
    assert calls.dones == [("req-1", 1)]


async def test_a_forgotten_request_is_pushed_no_more() -> None:
    calls = Calls()
    p = pusher(calls)
    p.begin_step([saved(whole=False)])
    p.forget("req-1")
    p.want(want())  # kept as early: no such request any more
    p.layer_saved(0)
    await settle(p)
    assert calls.pushes == [] and calls.reports == []
