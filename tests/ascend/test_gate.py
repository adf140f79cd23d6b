"""ascend/gate.py: one communicator creation at a time, reservations that lapse,
bounded waits (issue 30, defect 6)."""

from __future__ import annotations

import asyncio
import time

import pytest

from hixl_client.status import LLMException, LLMStatusCode
from hixl_service.ascend.gate import CreationGate

pytestmark = pytest.mark.asyncio


async def test_one_holder_and_waiters_get_it_in_turn() -> None:
    gate = CreationGate(tie_break=5)
    assert gate.try_hold("link:a") and gate.holder == "link:a"
    assert not gate.try_hold("join:b")
    waiting = asyncio.ensure_future(gate.hold("join:b", time.monotonic() + 30))
    await asyncio.sleep(0)
    assert not waiting.done()
    gate.release("join:b")  # not the holder: nothing happens
    assert gate.holder == "link:a"
    gate.release("link:a")
    await waiting
    assert gate.holder == "join:b"


async def test_a_reservation_lapses_unless_claimed() -> None:
    gate = CreationGate()
    assert gate.try_hold("join:x", lapse_s=0.01)
    await gate.hold("link:y", time.monotonic() + 30)  # free once the reservation lapsed
    assert gate.holder == "link:y"
    gate.release("link:y")
    assert gate.try_hold("join:z", lapse_s=0.01)
    assert gate.claim("join:z") and not gate.claim("join:other")
    await asyncio.sleep(0.05)
    assert gate.holder == "join:z"  # claimed: kept until released


async def test_waiting_past_the_deadline_is_refused() -> None:
    gate = CreationGate()
    gate.try_hold("link:a")
    with pytest.raises(LLMException, match="another HCCL communicator") as caught:
        await gate.hold("link:b", time.monotonic() + 0.01)
    assert caught.value.status_code == LLMStatusCode.LLM_LINK_FAILED
    assert gate.holder == "link:a"


async def test_tie_break_ids_differ() -> None:
    assert len({CreationGate().tie_break for _ in range(64)}) == 64
