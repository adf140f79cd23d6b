"""A lane call starts in its frame's callback and gets a task only if it waits (``eager``)."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from hixl_service.eager import start_eagerly

tag: contextvars.ContextVar[str] = contextvars.ContextVar("tag", default="-")


@pytest.mark.asyncio
async def test_a_coroutine_that_never_waits_ends_without_a_task() -> None:
    ran: list[str] = []

    async def call() -> None:
        tag.set("call")
        ran.append(tag.get())

    assert start_eagerly(asyncio.get_running_loop(), call()) is None
    assert ran == ["call"]
    assert tag.get() == "-"  # the call's context is its own, as a task's would be


@pytest.mark.asyncio
async def test_a_coroutine_that_waits_continues_in_a_task_with_its_context() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[int] = loop.create_future()
    steps: list[object] = []

    async def call() -> None:
        tag.set("call")
        steps.append("before")
        steps.append(await gate)
        await asyncio.sleep(0)  # a bare yield, as well as a future
        steps.append(tag.get())

    task = start_eagerly(loop, call())
    assert task is not None
    assert steps == ["before"]  # ran up to its wait before start_eagerly returned
    gate.set_result(7)
    await task
    assert steps == ["before", 7, "call"]


@pytest.mark.asyncio
async def test_a_failed_wait_raises_inside_the_call() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()
    caught: list[BaseException] = []

    async def call() -> None:
        try:
            await gate
        except OSError as exc:
            caught.append(exc)

    task = start_eagerly(loop, call())
    assert task is not None
    gate.set_exception(OSError("link lost"))
    await task
    assert [str(exc) for exc in caught] == ["link lost"]


@pytest.mark.asyncio
async def test_cancelling_the_task_cancels_the_call_where_it_waits() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()
    cleaned: list[str] = []

    async def call() -> None:
        try:
            await gate
        finally:
            cleaned.append("finally")

    task = start_eagerly(loop, call())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gate.cancelled()
    assert cleaned == ["finally"]
