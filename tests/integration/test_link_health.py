"""Links that tell the truth and heal (issue 21): states, leases, recovery.

Real daemons, real signals. Every test configures short heartbeat, down and
lease bounds, so that what takes seconds in production happens here within
a few; every wait is bounded, generously (the machine is shared).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from hixl_client import (
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    DataType,
    LinkState,
    LinkStatus,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
)
from hixl_service.testing import DaemonProcess, start_daemon, unused_port
from hixl_wire._proto.hixl.v1 import admin_pb2
from tests.clusters import cluster_info

from .conftest import Pair, daemon_status, make_pair, options

# About the daemons' links and processes: once, on uvloop (scripts/test.sh).
pytestmark = [pytest.mark.asyncio, pytest.mark.one_loop]

WAIT_S = 40.0
# Short bounds: heartbeats every 0.2 s, down after 1.5 s silent, leases of 3 s.
FAST: dict[str, Any] = {
    "pool__max_bytes": "512MiB",
    "links__heartbeat_interval_s": 0.2,
    "links__heartbeat_timeout_s": 0.5,
    "links__down_after_s": 1.5,
    "links__lease_s": 3.0,
    "links__tcp_user_timeout_s": 2.0,
    "transfer__connect_timeout_s": 1.0,
}
DESC = CacheDesc(2, [1, 4096], DataType.DT_UINT8)


async def wait_until(check: Callable[[], Awaitable[Any]], what: str) -> Any:
    """Poll ``check`` until it returns something true; its last answer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        answer = await check()
        if answer:
            return answer
        assert loop.time() < deadline, f"not within {WAIT_S} s: {what}"
        await asyncio.sleep(0.1)


def admin_link(status: admin_pb2.DaemonStatus, direction: str, local: int,
               remote: int) -> admin_pb2.LinkStatus | None:
    return next((link for link in status.links
                 if link.direction == direction and link.local_cluster_id == local
                 and link.remote_cluster_id == remote), None)


async def outbound_state(client: LLMDataDist, remote: int) -> LinkStatus | None:
    return next((link for link in await client.query_link_states()
                 if link.direction == "outbound" and link.remote_cluster_id == remote), None)


def in_state(state: LinkState) -> Callable[[LinkStatus | None], bool]:
    return lambda link: link is not None and link.state is state


async def keyed_source(pair: Pair, req_id: int) -> tuple[CacheKey, np.ndarray, int]:
    """A filled source cache bound to a key: the key, its bytes and the cache id."""
    key = CacheKey(pair.prompt.cluster_id, req_id=req_id)
    src = await pair.prompt.cache_manager.allocate_cache(DESC, [key])
    data = np.random.default_rng(req_id).integers(0, 256, 4096, dtype=np.uint8)
    for index in range(2):
        np.frombuffer(src.tensor_view(index), dtype=np.uint8)[:] = data
    return key, data, src.cache_id


async def finalize_quietly(*clients: LLMDataDist) -> None:
    """Finalize clients, some of whose daemons were killed on purpose."""
    for client in clients:
        with contextlib.suppress(Exception):
            await client.finalize()


async def test_a_killed_linker_is_reaped_within_the_lease(
        next_cluster_id: Callable[[], int]) -> None:
    async with start_daemon(**FAST) as prefill, start_daemon(**FAST) as decode:
        pair = await make_pair(prefill, decode, next_cluster_id)
        prompt_id, decoder_id = pair.prompt.cluster_id, pair.decoder.cluster_id
        # Both sides see the link up, the same id in Admin and for the clients.
        inbound = admin_link(await daemon_status(prefill.client_target), "inbound",
                             prompt_id, decoder_id)
        assert inbound is not None and inbound.health.state == "up" and inbound.alive
        assert inbound.health.link_id == f"{decoder_id}->{prompt_id}"
        assert 0 < inbound.health.lease_left_s <= 3.0
        outbound = await outbound_state(pair.decoder, prompt_id)
        assert outbound is not None and outbound.state is LinkState.UP
        assert outbound.streams_up == outbound.streams == 4
        [seen_by_owner] = await pair.prompt.query_link_states()
        assert (seen_by_owner.direction, seen_by_owner.remote_cluster_id,
                seen_by_owner.state) == ("inbound", decoder_id, LinkState.UP)
        with pytest.raises(LLMException) as refused:
            await pair.prompt.switch_role(LLMRole.DECODER)
        assert refused.value.status_code == LLMStatusCode.LLM_EXIST_LINK

        await asyncio.to_thread(decode.kill)

        async def reaped() -> bool:
            status = await daemon_status(prefill.client_target)
            return admin_link(status, "inbound", prompt_id, decoder_id) is None
        await wait_until(reaped, "the owner dropped the killed linker's link")
        assert await pair.prompt.query_link_states() == []
        await pair.prompt.switch_role(LLMRole.DECODER)  # no longer blocked
        assert f"link {decoder_id}->{prompt_id}: lease ended" in prefill.log_tail(20000)
        await finalize_quietly(pair.decoder)
        await pair.prompt.finalize()


async def test_a_stopped_peer_is_down_and_the_link_recovers_after_sigcont(
        next_cluster_id: Callable[[], int]) -> None:
    settings = {**FAST, "links__lease_s": 30.0}  # the pause stays well inside the lease
    async with start_daemon(**settings) as prefill, start_daemon(**settings) as decode:
        pair = await make_pair(prefill, decode, next_cluster_id, sync_kv_timeout=500)
        prompt_id, decoder_id = pair.prompt.cluster_id, pair.decoder.cluster_id
        _, data, cache_id = await keyed_source(pair, 1)
        source = CacheKeyByIdAndIndex(prompt_id, cache_id, 0)  # a key would be used up
        dst = await pair.decoder.cache_manager.allocate_cache(DESC)
        await pair.decoder.cache_manager.pull_cache(source, dst)
        await asyncio.to_thread(prefill.pause)
        try:
            down = await wait_until(
                lambda: _matching(outbound_state(pair.decoder, prompt_id),
                                  in_state(LinkState.DOWN)),
                "the decoder sees the stopped peer's link down")
            assert "heartbeat" in down.last_error
            status = await daemon_status(decode.client_target)
            seen = admin_link(status, "outbound", decoder_id, prompt_id)
            assert seen is not None and seen.health.state == "down"
            with pytest.raises(LLMException) as failed:
                await pair.decoder.cache_manager.pull_cache(source, dst)
            assert failed.value.status_code in (LLMStatusCode.LLM_TIMEOUT,
                                                LLMStatusCode.LLM_LINK_FAILED)
        finally:
            prefill.resume()
        await wait_until(lambda: _matching(outbound_state(pair.decoder, prompt_id),
                                           in_state(LinkState.UP)),
                         "the link is up again after SIGCONT")
        # No unlink, no link_clusters: the same link serves again.
        await pair.decoder.cache_manager.pull_cache(source, dst)
        np.testing.assert_array_equal(np.frombuffer(dst.tensor_view(0), np.uint8), data)
        after = await outbound_state(pair.decoder, prompt_id)
        assert after is not None and after.remote_daemon_id == prefill.daemon_id
        assert after.failed_transfers >= 1 and after.transfers >= 3
        await pair.decoder.finalize()
        await pair.prompt.finalize()


async def _matching(answer: Awaitable[LinkStatus | None],
                    wanted: Callable[[LinkStatus | None], bool]) -> LinkStatus | None:
    link = await answer
    return link if wanted(link) else None


async def test_a_restarted_peer_is_linked_again_and_its_old_caches_are_gone(
        next_cluster_id: Callable[[], int]) -> None:
    port = unused_port()
    async with start_daemon(**FAST) as decode:
        first = await asyncio.to_thread(
            lambda: DaemonProcess(server__peer_port=port, **FAST).start())
        try:
            pair = await make_pair(first, decode, next_cluster_id)
            prompt_id = pair.prompt.cluster_id
            key, _, cache_id = await keyed_source(pair, 1)
            dst = await pair.decoder.cache_manager.allocate_cache(DESC)
            by_id = CacheKeyByIdAndIndex(prompt_id, cache_id, 0)
            await pair.decoder.cache_manager.pull_cache(by_id, dst)  # the link remembers it
            await pair.decoder.cache_manager.pull_cache(key, dst)
        finally:
            await asyncio.to_thread(first.close)
        await finalize_quietly(pair.prompt)
        async with start_daemon(server__peer_port=port, **FAST) as second:
            prompt = LLMDataDist(LLMRole.PROMPT, prompt_id, daemon=second.client_target)
            await prompt.init(options())
            relinked = await wait_until(
                lambda: _matching(outbound_state(pair.decoder, prompt_id),
                                  lambda link: link is not None
                                  and link.state is LinkState.UP
                                  and link.remote_daemon_id == second.daemon_id),
                "the decoder linked to the restarted daemon by itself")
            assert relinked.remote_daemon_id != first.daemon_id
            # What was resolved from the old daemon is never used against the new one.
            with pytest.raises(LLMException) as gone:
                await pair.decoder.cache_manager.pull_cache(by_id, dst)
            assert gone.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
            with pytest.raises(LLMException) as gone:
                await pair.decoder.cache_manager.pull_cache(key, dst)
            assert gone.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
            # New caches of the restarted daemon are pulled over the new link.
            fresh = Pair(prompt, pair.decoder, second, decode)
            key2, data2, _ = await keyed_source(fresh, 2)
            await pair.decoder.cache_manager.pull_cache(key2, dst)
            np.testing.assert_array_equal(np.frombuffer(dst.tensor_view(1), np.uint8), data2)
            await pair.decoder.finalize()
            await prompt.finalize()


async def test_a_draining_owner_tells_its_linkers(next_cluster_id: Callable[[], int]) -> None:
    """A SIGTERM'd owner answers the linkers' heartbeats ``LEASE_STOPPING`` before it
    exits: their links go down saying why, rather than once heartbeats fail."""
    async with start_daemon(**FAST) as decode:
        owner = await asyncio.to_thread(lambda: DaemonProcess(**FAST).start())
        try:
            pair = await make_pair(owner, decode, next_cluster_id)
            prompt_id = pair.prompt.cluster_id
            await wait_until(lambda: _matching(outbound_state(pair.decoder, prompt_id),
                                               in_state(LinkState.UP)), "the link is up")
            assert await asyncio.to_thread(owner.stop, WAIT_S) == 0
            assert "did not heartbeat" not in owner.log_tail(20000)
        finally:
            await asyncio.to_thread(owner.close)
        down = await wait_until(
            lambda: _matching(outbound_state(pair.decoder, prompt_id),
                              lambda link: link is not None and link.state is LinkState.DOWN),
            "the linker's link is down")
        assert f"daemon {owner.daemon_id}" in down.last_error, down
        assert "is stopping (drained)" in down.last_error, down
        await finalize_quietly(pair.prompt)
        await pair.decoder.finalize()


async def test_link_clusters_replaces_a_link_whose_peer_died(
        next_cluster_id: Callable[[], int]) -> None:
    async with start_daemon(**FAST) as decode:
        async with start_daemon(**FAST) as dead:
            pair = await make_pair(dead, decode, next_cluster_id)
            prompt_id = pair.prompt.cluster_id
            await asyncio.to_thread(dead.kill)
            await wait_until(lambda: _matching(outbound_state(pair.decoder, prompt_id),
                                               in_state(LinkState.DOWN)),
                             "the dead peer's link is down")
        await finalize_quietly(pair.prompt)
        async with start_daemon(**FAST) as replacement:
            prompt = LLMDataDist(LLMRole.PROMPT, prompt_id, daemon=replacement.client_target)
            await prompt.init(options())
            status, results = await pair.decoder.link_clusters(
                [cluster_info(prompt_id, replacement.peer_address)], timeout=5000)
            assert (status, results) == (LLMStatusCode.LLM_SUCCESS, [LLMStatusCode.LLM_SUCCESS])
            link = await outbound_state(pair.decoder, prompt_id)
            assert link is not None and link.state is LinkState.UP
            assert link.remote_daemon_id == replacement.daemon_id
            await pair.decoder.finalize()
            await prompt.finalize()


async def test_the_owner_drops_an_inbound_link_itself(
        next_cluster_id: Callable[[], int]) -> None:
    async with start_daemon(**FAST) as prefill, start_daemon(**FAST) as decode:
        pair = await make_pair(prefill, decode, next_cluster_id)
        prompt_id, decoder_id = pair.prompt.cluster_id, pair.decoder.cluster_id
        key, _, _ = await keyed_source(pair, 1)
        dst = await pair.decoder.cache_manager.allocate_cache(DESC)
        status, _ = await pair.prompt.unlink_clusters(
            [cluster_info(decoder_id, decode.peer_address)], force=True)
        assert status == LLMStatusCode.LLM_SUCCESS
        assert admin_link(await daemon_status(prefill.client_target), "inbound", prompt_id,
                          decoder_id) is None
        await pair.prompt.switch_role(LLMRole.DECODER)
        down = await wait_until(lambda: _matching(outbound_state(pair.decoder, prompt_id),
                                                  in_state(LinkState.DOWN)),
                                "the linker learns that the owner dropped the link")
        assert "dropped the link itself" in down.last_error
        with pytest.raises(LLMException):
            await pair.decoder.cache_manager.pull_cache(key, dst)
        status, _ = await pair.decoder.link_clusters(
            [cluster_info(prompt_id, prefill.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS  # the down link is replaced
        await pair.decoder.cache_manager.pull_cache(key, dst)
        await pair.decoder.finalize()
        await pair.prompt.finalize()


async def test_an_unlink_the_owner_missed_is_retried(
        next_cluster_id: Callable[[], int]) -> None:
    settings = {**FAST, "links__lease_s": 60.0}  # the lease cannot be what drops it
    async with start_daemon(**settings) as prefill, start_daemon(**settings) as decode:
        pair = await make_pair(prefill, decode, next_cluster_id)
        prompt_id, decoder_id = pair.prompt.cluster_id, pair.decoder.cluster_id
        await asyncio.to_thread(prefill.pause)
        try:
            status, _ = await pair.decoder.unlink_clusters(
                [cluster_info(prompt_id, prefill.peer_address)])
        finally:
            prefill.resume()
        assert status == LLMStatusCode.LLM_NOTIFY_PROMPT_UNLINK_FAILED

        async def dropped() -> bool:
            status = await daemon_status(prefill.client_target)
            return admin_link(status, "inbound", prompt_id, decoder_id) is None
        await wait_until(dropped, "the retried Unlink reached the owner")
        # Told, not reaped: the lease (60 s) has not ended.
        log = prefill.log_tail(20000)
        assert f"link {decoder_id}->{prompt_id}: " in log
        assert "-> closed (unlinked by the linking cluster)" in log
        await pair.decoder.finalize()
        await pair.prompt.finalize()


async def test_a_failed_transfer_is_logged_once_at_warning(
        next_cluster_id: Callable[[], int]) -> None:
    async with start_daemon(**FAST) as prefill, start_daemon(**FAST) as decode:
        pair = await make_pair(prefill, decode, next_cluster_id, sync_kv_timeout=500)
        prompt_id, decoder_id = pair.prompt.cluster_id, pair.decoder.cluster_id
        key, _, _ = await keyed_source(pair, 1)
        dst = await pair.decoder.cache_manager.allocate_cache(DESC)
        await asyncio.to_thread(prefill.pause)
        try:
            with pytest.raises(LLMException) as failed:
                await pair.decoder.cache_manager.pull_cache(key, dst)
        finally:
            prefill.resume()
        code = failed.value.status_code.name
        lines = [line for line in decode.log_tail(50000).splitlines()
                 if "PullCache failed" in line]
        assert len(lines) == 1, lines
        assert "WARNING" in lines[0] and f"link {decoder_id}->{prompt_id}" in lines[0]
        assert code in lines[0] and "request " in lines[0]
        link = await outbound_state(pair.decoder, prompt_id)
        assert link is not None and link.failed_transfers == 1
        await pair.decoder.finalize()
        await pair.prompt.finalize()


async def test_a_stopped_linker_is_reaped_and_links_again_after_sigcont(
        next_cluster_id: Callable[[], int]) -> None:
    async with start_daemon(**FAST) as prefill, start_daemon(**FAST) as decode:
        pair = await make_pair(prefill, decode, next_cluster_id)
        prompt_id, decoder_id = pair.prompt.cluster_id, pair.decoder.cluster_id
        _, data, cache_id = await keyed_source(pair, 1)
        source = CacheKeyByIdAndIndex(prompt_id, cache_id, 0)
        dst = await pair.decoder.cache_manager.allocate_cache(DESC)

        async def owner_holds_it() -> bool:
            status = await daemon_status(prefill.client_target)
            return admin_link(status, "inbound", prompt_id, decoder_id) is not None

        await asyncio.to_thread(decode.pause)
        try:
            async def reaped() -> bool:
                return not await owner_holds_it()
            await wait_until(reaped, "the owner reaped the stopped linker's link")
            assert await pair.prompt.query_link_states() == []
        finally:
            decode.resume()
        # The linker learns that its lease ended and links again by itself.
        await wait_until(owner_holds_it, "the linker linked again after SIGCONT")
        up = await wait_until(lambda: _matching(outbound_state(pair.decoder, prompt_id),
                                                in_state(LinkState.UP)),
                              "the linker's link is up again")
        assert up.remote_daemon_id == prefill.daemon_id
        await pair.decoder.cache_manager.pull_cache(source, dst)
        np.testing.assert_array_equal(np.frombuffer(dst.tensor_view(0), np.uint8), data)
        await pair.decoder.finalize()
        await pair.prompt.finalize()
