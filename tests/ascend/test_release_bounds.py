"""The linking daemon freeing memory bound to a one-sided communicator (issue 30,
defect 2), without a device: the far half is asked to go first (Peer.HcclDestroy),
and a far daemon that is gone or never answers does not hang the release: it
waits a bounded time, then destroys this half and goes on."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from hixl_wire.status import LLMException, LLMStatusCode

hccl = pytest.importorskip("hixl_service.transports.hccl")

pytestmark = pytest.mark.asyncio


class _Recorder:
    """Stands in for the shim's communicator and stream; records what is called."""

    def __init__(self, calls: list[str], what: str) -> None:
        self.calls = calls
        self.what = what
        self.pending = False
        self.closed = False
        self.device = type("Dev", (), {"id": 0})()

    def destroy(self, *args: Any) -> None:
        self.calls.append(f"destroy {self.what}")
        self.closed = True


class _Peer:
    """The far daemon: answers HcclPrepare, and HcclDestroy as ``answer`` says."""

    def __init__(self, calls: list[str], answer: Callable[[float], Awaitable[None]]) -> None:
        self.calls = calls
        self.answer = answer

    async def transport_call(self, method: str, request: Any, timeout_s: float) -> None:
        if method == "HcclDestroy":
            self.calls.append(f"far destroys {request.comm_name}")
            await self.answer(timeout_s)


async def _confirms(timeout_s: float) -> None:
    return None


async def _gone(timeout_s: float) -> None:
    raise LLMException("peer daemon unavailable", status_code=LLMStatusCode.LLM_LINK_FAILED)


async def _silent(timeout_s: float) -> None:
    await asyncio.Event().wait()  # ignores its deadline: the release's own bound ends it


async def _prepared_link(calls: list[str], answer: Callable[[float], Awaitable[None]]) -> Any:
    """A linking side whose one-sided communicator was just prepared."""
    settings = type("S", (), {"release": lambda self, device, nbytes: None})()
    channel = hccl.Channel(_Recorder(calls, "comm"), _Recorder(calls, "stream"), 1, settings)
    channel.name = "hixl-test-1"
    channel.prepare_one_sided = lambda memory, cluster_id, timeout_ms: None
    link = hccl.HcclLink(object(), _Peer(calls, answer), 7, settings, object(), 1)
    link._channel = channel
    await link._prepare(time.monotonic() + 30)
    return channel


@pytest.mark.parametrize("answer", [_confirms, _gone])
async def test_the_far_half_goes_first(answer: Callable[[float], Awaitable[None]]) -> None:
    calls: list[str] = []
    channel = await _prepared_link(calls, answer)
    await asyncio.to_thread(channel._release_bound)  # a release of bound memory (a worker)
    assert calls == ["far destroys hixl-test-1", "destroy comm", "destroy stream"]
    assert channel.closed


async def test_a_silent_far_daemon_does_not_hang_the_release(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(hccl, "REVOKE_WAIT_S", 0.01)
    monkeypatch.setattr(hccl, "WATCH_GRACE_S", 0.01)
    calls: list[str] = []
    channel = await _prepared_link(calls, _silent)
    with caplog.at_level(logging.WARNING):
        await asyncio.to_thread(channel._release_bound)
    assert calls == ["far destroys hixl-test-1", "destroy comm", "destroy stream"]
    assert "asking the far daemon to destroy its half of HCCL communicator hixl-test-1" \
        in caplog.text


async def test_a_release_on_the_loop_itself_does_not_wait(
        caplog: pytest.LogCaptureFixture) -> None:
    """The loop cannot wait for its own work: the release says so and goes on."""
    calls: list[str] = []
    channel = await _prepared_link(calls, _silent)
    with caplog.at_level(logging.WARNING):
        channel._release_bound()
    assert calls == ["destroy comm", "destroy stream"]
    assert "cannot wait from here" in caplog.text
