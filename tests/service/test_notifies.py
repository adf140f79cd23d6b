"""The bounds of notifications: the daemon's inbox refuses rather than grows, and
the client's inbox holds its session's stream while full."""

from __future__ import annotations

import asyncio

import pytest

from hixl_client.notify import NotifyDesc, NotifyInbox
from hixl_client.status import LLMException, LLMStatusCode
from hixl_service.notifies import Inbox, Notification

pytestmark = pytest.mark.asyncio


async def test_a_full_inbox_refuses_at_once_and_keeps_order() -> None:
    inbox = Inbox(limit=3)
    for i in range(3):
        inbox.put(Notification(7, "n", bytes([i])))
    with pytest.raises(LLMException) as full:
        inbox.put(Notification(7, "n", b"x"))
    assert full.value.status_code == LLMStatusCode.LLM_OUT_OF_MEMORY
    assert [n.message for n in await inbox.take()] == [b"\x00", b"\x01", b"\x02"]
    inbox.put(Notification(7, "n", b"again"))  # room once read
    assert len(inbox) == 1


async def test_take_waits_for_one_and_a_closed_inbox_ends_its_reader() -> None:
    inbox = Inbox()
    reader = asyncio.ensure_future(inbox.take())
    await asyncio.sleep(0.01)
    assert not reader.done()
    inbox.put(Notification(1, "a", b""))
    assert [n.name for n in await reader] == ["a"]
    reader = asyncio.ensure_future(inbox.take())
    await asyncio.sleep(0.01)
    inbox.close()
    assert await reader == []
    with pytest.raises(LLMException) as closed:
        inbox.put(Notification(1, "late", b""))
    assert closed.value.status_code == LLMStatusCode.LLM_NOT_YET_LINK


async def test_a_full_client_inbox_holds_its_writer_until_read() -> None:
    inbox = NotifyInbox(limit=2)
    await inbox.put(NotifyDesc("a"))
    await inbox.put(NotifyDesc("b"))
    writer = asyncio.ensure_future(inbox.put(NotifyDesc("c")))
    await asyncio.sleep(0.01)
    assert not writer.done()  # the session's stream is not read meanwhile
    assert [n.name for n in inbox.take()] == ["a", "b"]
    await asyncio.wait_for(writer, 1)
    await asyncio.wait_for(inbox.wait(), 1)
    assert [n.name for n in inbox.take()] == ["c"]
