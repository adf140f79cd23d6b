"""The drain's bookkeeping (``drain``); the whole stop runs in
tests/integration/test_lifecycle.py against real daemons."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from hixl_client.status import LLMException, LLMStatusCode
from hixl_service.drain import Drain
from hixl_service.load import TransferLoad
from hixl_service.sessions import Sessions


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
    assert drain.busy and "1 transfer calls and 1 layer-wise tasks" == drain.in_flight()
    assert not await drain.wait_idle(0.05)  # the grace passes with work in flight
    waiting = asyncio.ensure_future(drain.wait_idle(30))
    load.end()
    await asyncio.sleep(0.05)
    assert not waiting.done()  # the task still runs
    drain.layerwise_tasks -= 1
    assert await asyncio.wait_for(waiting, 30)
