"""Notifications between linked clusters: send_notify, get_notifies, wait_notifies,
across two daemons (the Peer call and the peer lane) and inside one daemon."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hixl_client import LLMDataDist, LLMException, LLMRole, LLMStatusCode, NotifyDesc
from hixl_service.testing import DaemonProcess
from hixl_wire.compat import timeout

from .conftest import Pair, cluster_info, make_pair, options

pytestmark = pytest.mark.asyncio


async def test_notifications_arrive_in_order_named_by_sender(pair: Pair) -> None:
    sent = [NotifyDesc("done", f"request-{i}".encode()) for i in range(50)]
    for one in sent:
        await pair.decoder.send_notify(pair.prompt.cluster_id, one)
    received: list[NotifyDesc] = []
    async with timeout(10):
        while len(received) < len(sent):
            received += await pair.prompt.wait_notifies(5000)
    assert [(n.name, n.notify_msg) for n in received] == [(n.name, n.notify_msg) for n in sent]
    assert {n.remote_cluster_id for n in received} == {pair.decoder.cluster_id}
    assert pair.prompt.get_notifies() == []
    assert await pair.prompt.wait_notifies(50) == []


async def test_str_messages_and_the_peer_address(pair: Pair) -> None:
    assert pair.prompt.peer_address == pair.prompt_daemon.peer_address
    await pair.decoder.send_notify(pair.prompt.cluster_id, NotifyDesc(notify_msg="héllo"))
    [got] = await pair.prompt.wait_notifies(5000)
    assert got == NotifyDesc("", "héllo".encode(), pair.decoder.cluster_id)


async def test_a_notification_needs_a_link_the_sender_made(pair: Pair) -> None:
    # The link goes from decoder to prompt: the prompt cluster has no link to send on.
    with pytest.raises(LLMException) as refused:
        await pair.prompt.send_notify(pair.decoder.cluster_id, NotifyDesc("x", b"y"))
    assert refused.value.status_code == LLMStatusCode.LLM_NOT_YET_LINK
    info = cluster_info(pair.prompt.cluster_id, pair.prompt_daemon.peer_address)
    await pair.decoder.unlink_clusters([info])
    with pytest.raises(LLMException) as unlinked:
        await pair.decoder.send_notify(pair.prompt.cluster_id, NotifyDesc("x", b"y"))
    assert unlinked.value.status_code == LLMStatusCode.LLM_NOT_YET_LINK


async def test_bounds_are_checked_before_any_call(pair: Pair) -> None:
    with pytest.raises(LLMException) as too_long:
        NotifyDesc("n", b"x" * (64 * 1024 + 1))
    assert too_long.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    with pytest.raises(TypeError):
        NotifyDesc("n", 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await pair.decoder.send_notify(pair.prompt.cluster_id, b"raw")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await pair.decoder.send_notify(-1, NotifyDesc())
    largest = NotifyDesc("n" * 1024, b"x" * (64 * 1024))
    await pair.decoder.send_notify(pair.prompt.cluster_id, largest)
    assert [n.notify_msg for n in await pair.prompt.wait_notifies(5000)] == [largest.notify_msg]


async def test_a_finalized_receiver_refuses_notifications(
        prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
        next_cluster_id: Callable[[], int]) -> None:
    made = await make_pair(prefill_daemon, decode_daemon, next_cluster_id)
    try:
        await made.prompt.finalize()
        with pytest.raises(LLMException) as gone:
            await made.decoder.send_notify(made.prompt.cluster_id, NotifyDesc("x", b"y"))
        assert gone.value.status_code == LLMStatusCode.LLM_NOT_YET_LINK
    finally:
        await made.decoder.finalize()


async def test_inside_one_daemon(prefill_daemon: DaemonProcess,
                                 next_cluster_id: Callable[[], int]) -> None:
    prompt = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill_daemon.client_target)
    decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(),
                          daemon=prefill_daemon.client_target)
    async with prompt, decoder:
        await prompt.init(options())
        await decoder.init(options())
        status, _ = await decoder.link_clusters(
            [cluster_info(prompt.cluster_id, prefill_daemon.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS
        assert decoder.link_transports[prompt.cluster_id] == "local"
        await decoder.send_notify(prompt.cluster_id, NotifyDesc("done", b"r1"))
        [got] = await prompt.wait_notifies(5000)
        assert (got.name, got.notify_msg, got.remote_cluster_id) == ("done", b"r1",
                                                                     decoder.cluster_id)
