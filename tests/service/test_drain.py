"""The drain's bookkeeping (``drain``); the whole stop runs in
tests/integration/test_lifecycle.py against real daemons."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import grpc
import pytest

from hixl_service.calls import CallInfo, lane_handler
from hixl_service.drain import Drain, refuses_while_draining
from hixl_service.engine import Engine
from hixl_service.load import TransferLoad
from hixl_service.servicer_client import ClientServicer
from hixl_service.sessions import Sessions
from hixl_service.stats import DaemonStats
from hixl_wire.status import LLMException, LLMStatusCode

# The Client handlers that start new work; every other one ends or reads work
# under way, and runs on through a drain (drain.py).
NEW_WORK = {"Init": "clusters", "LinkClusters": "links",
            **{name: "transfers" for name in (
                "PullCache", "PullBlocks", "PushCache", "PushBlocks", "RepeatPull",
                "RepeatPush", "CopyCache", "CopyBlocks", "SwapBlocks")}}


def test_new_work_is_refused_only_once_the_drain_began() -> None:
    drain = Drain(TransferLoad())
    drain.refuse_new("transfers")  # not draining: nothing happens
    assert drain.begin() is True
    assert drain.begin() is False  # the second stop finds it begun
    with pytest.raises(LLMException) as info:
        drain.refuse_new("transfers")
    assert info.value.status_code == LLMStatusCode.LLM_FAILED
    assert getattr(info.value, "grpc_code", None) == grpc.StatusCode.UNAVAILABLE
    assert "stopping (draining): it takes no new transfers" in str(info.value)


def test_a_closing_daemon_refuses_sessions_the_same_way() -> None:
    sessions = Sessions()
    sessions.closing = True
    with pytest.raises(LLMException, match="it takes no new sessions"):
        sessions.attach(1, "client")


@pytest.mark.asyncio
async def test_wait_idle_waits_for_transfers_and_layerwise_tasks() -> None:
    load = TransferLoad()
    drain = Drain(load)
    assert await drain.wait_idle(0.0)  # nothing in flight
    load.begin()
    drain.layerwise_tasks += 1
    assert drain.busy and drain.in_flight() == ("1 transfer calls, 0 native transfers and 1 "
                                                "layer-wise tasks")
    assert not await drain.wait_idle(0.05)  # the grace passes with work in flight
    waiting = asyncio.ensure_future(drain.wait_idle(30))
    load.end()
    await asyncio.sleep(0.05)
    assert not waiting.done()  # the task still runs
    drain.layerwise_tasks -= 1
    assert await asyncio.wait_for(waiting, 30)


class _Servicer:
    def __init__(self) -> None:
        self.drain = Drain(TransferLoad())
        self.ran: list[str] = []

    @refuses_while_draining("transfers")
    async def Pull(self, request: str, call: CallInfo) -> str:
        self.ran.append(request)
        return f"pulled {request}"


def _assert_refused(error: LLMException, what: str) -> None:
    assert error.status_code == LLMStatusCode.LLM_FAILED
    assert getattr(error, "grpc_code", None) == grpc.StatusCode.UNAVAILABLE
    assert f"it takes no new {what}" in str(error)


@pytest.mark.asyncio
async def test_a_handler_refuses_new_work_only_while_draining() -> None:
    servicer = _Servicer()
    assert await servicer.Pull("a", CallInfo()) == "pulled a"
    assert servicer.Pull.__name__ == "Pull"  # calls.unary names the method by it
    servicer.drain.begin()
    refused = servicer.Pull("b", CallInfo())  # an awaitable, as a handler returns
    with pytest.raises(LLMException) as info:
        await refused
    _assert_refused(info.value, "transfers")
    assert servicer.ran == ["a"]  # the refused call never ran


@pytest.mark.asyncio
@pytest.mark.parametrize(("method", "what"), sorted(NEW_WORK.items()))
async def test_the_client_service_refuses_new_work_before_touching_the_engine(
        method: str, what: str) -> None:
    # An engine with nothing but its drain and counters: a handler that got
    # past the refusal would fail on the first part it reached.
    drain = Drain(TransferLoad())
    engine = cast(Engine, SimpleNamespace(drain=drain, deps=SimpleNamespace(
        stats=DaemonStats())))
    servicer = ClientServicer(engine, "test", "")
    drain.begin()
    handler = lane_handler(servicer, method)
    request: Any = None
    with pytest.raises(LLMException) as info:
        await handler(request, CallInfo("a-session"))
    _assert_refused(info.value, what)
