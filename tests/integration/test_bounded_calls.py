"""Every client call ends by its own timeout plus a fixed margin, even when the
client's own daemon hangs (issue 21, point 5).

The daemon is frozen with SIGSTOP, so it accepts nothing and answers
nothing; each test resumes it in a ``finally``. Before the bounds, a pull
with ``sync_kv_timeout = 1000`` returned after 11.7 s on the transfer lane
and 11.0 s over gRPC, and ``allocate_cache`` after 30 s.

The assertions allow a loaded host's slack beyond the documented bound
(``LOAD_SLACK_S``): what they tell apart is a call that waits for its daemon
by the bound from one that waits by a much longer or no bound at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from hixl_client import (
    Cache,
    CacheDesc,
    CacheKeyByIdAndIndex,
    DataType,
    LayerSynchronizer,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
    TransferWithCacheKeyConfig,
)
from hixl_client._transport import CALL_MARGIN_S, CONTROL_TIMEOUT_OPTION, LANE_GRACE_S
from hixl_service.testing import DaemonProcess, start_daemon
from hixl_wire.lane import WATCHDOG_TICK_S
from tests.clusters import cluster_info

from .conftest import daemon_status, options

pytestmark = pytest.mark.asyncio

DESC = CacheDesc(2, [2, 64 * 1024], DataType.DT_UINT8)
SYNC_KV_TIMEOUT_MS = 1000
CONTROL_TIMEOUT_MS = 1000
# The most a call may run past its own timeout (docs/client.md, "Bounded calls").
MAX_MARGIN_S = 1.0
# What a loaded test host may add on top.
LOAD_SLACK_S = 3.0


async def test_the_documented_margins_fit_in_a_second() -> None:
    assert CALL_MARGIN_S + LANE_GRACE_S + WATCHDOG_TICK_S <= MAX_MARGIN_S


def _cluster_options(**extra: str) -> dict[str, str]:
    opts = options(sync_kv_timeout=SYNC_KV_TIMEOUT_MS)
    opts[CONTROL_TIMEOUT_OPTION] = str(CONTROL_TIMEOUT_MS)
    opts.update(extra)
    return opts


@contextlib.asynccontextmanager
async def _linked(next_cluster_id: Callable[[], int], transfer_lane: bool = True
                  ) -> AsyncIterator[tuple[DaemonProcess, LLMDataDist, LLMDataDist, Cache, Cache]]:
    """Two daemons of the test's own, a decoder linked to a prompt cluster, a source
    cache on the prompt's side and a destination on the decoder's."""
    async with start_daemon(pool__max_bytes="512MiB") as prefill, \
            start_daemon(pool__max_bytes="512MiB") as decode:
        prompt = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill.client_target)
        decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=decode.client_target,
                              transfer_lane=transfer_lane)
        await prompt.init(_cluster_options())
        await decoder.init(_cluster_options())
        status, results = await decoder.link_clusters(
            [cluster_info(prompt.cluster_id, prefill.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS, results
        src = await prompt.cache_manager.allocate_cache(DESC)
        dst = await decoder.cache_manager.allocate_cache(DESC)
        yield decode, prompt, decoder, src, dst
        await decoder.finalize()
        await prompt.finalize()


@contextlib.contextmanager
def _paused(daemon: DaemonProcess) -> Iterator[None]:
    daemon.pause()
    try:
        yield
    finally:
        daemon.resume()


async def _timed_failure(call: Awaitable[Any]) -> tuple[LLMException, float]:
    """The LLMException ``call`` ends with and how long it took; a call that
    waits past any bound fails the test instead of hanging it."""
    started = time.monotonic()
    with pytest.raises(LLMException) as info:
        await asyncio.wait_for(call, 60)
    return info.value, time.monotonic() - started


def _assert_within(elapsed_s: float, timeout_s: float) -> None:
    assert timeout_s <= elapsed_s < timeout_s + MAX_MARGIN_S + LOAD_SLACK_S, (
        f"a call with a {timeout_s} s timeout ended after {elapsed_s:.2f} s")


@pytest.mark.parametrize("transfer_lane", [True, False], ids=["lane", "grpc"])
async def test_a_pull_whose_daemon_hangs_ends_by_its_timeout(
        next_cluster_id: Callable[[], int], transfer_lane: bool) -> None:
    async with _linked(next_cluster_id, transfer_lane) as (decode, prompt, decoder, src, dst):
        connection = decoder._connection
        assert connection is not None and connection.has_lane == transfer_lane
        key = CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, 0)
        with _paused(decode):
            error, elapsed = await _timed_failure(decoder.cache_manager.pull_cache(key, dst))
        assert error.status_code == LLMStatusCode.LLM_TIMEOUT, error
        _assert_within(elapsed, SYNC_KV_TIMEOUT_MS / 1000)
        await decoder.cache_manager.pull_cache(key, dst)  # and the daemon serves on


async def test_a_repeated_pull_whose_daemon_hangs_ends_by_its_timeout(
        next_cluster_id: Callable[[], int]) -> None:
    async with _linked(next_cluster_id) as (decode, prompt, decoder, src, dst):
        key = CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, 0)
        await decoder.cache_manager.pull_cache(key, dst)  # the next one goes by handle
        assert decoder.cache_manager._repeat_handles
        with _paused(decode):
            error, elapsed = await _timed_failure(decoder.cache_manager.pull_cache(key, dst))
        assert error.status_code == LLMStatusCode.LLM_TIMEOUT, error
        _assert_within(elapsed, SYNC_KV_TIMEOUT_MS / 1000)


@pytest.mark.parametrize("transfer_lane", [True, False], ids=["lane", "grpc"])
async def test_control_calls_whose_daemon_hangs_end_by_the_control_timeout(
        next_cluster_id: Callable[[], int], transfer_lane: bool) -> None:
    """allocate, deallocate, copy and switch_role have no timeout of LLM-DataDist's:
    they end by hixl.ControlCallTimeout (copies take the lane when it is open)."""
    async with _linked(next_cluster_id, transfer_lane) as (decode, _prompt, decoder, _src,
                                                           dst):
        manager = decoder.cache_manager
        other = await manager.allocate_cache(DESC)
        calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("allocate_cache", lambda: manager.allocate_cache(DESC)),
            ("deallocate_cache", lambda: manager.deallocate_cache(other)),
            ("copy_cache", lambda: manager.copy_cache(dst, other)),
            ("switch_role", lambda: decoder.switch_role(LLMRole.PROMPT)),
        ]
        with _paused(decode):  # at once: each ends by its own bound, whatever the others do
            failures = await asyncio.gather(*(_timed_failure(call()) for _, call in calls))
        for (name, _), (error, elapsed) in zip(calls, failures, strict=True):
            assert error.status_code == LLMStatusCode.LLM_TIMEOUT, (name, error)
            _assert_within(elapsed, CONTROL_TIMEOUT_MS / 1000)


async def test_link_and_unlink_whose_daemon_hangs_end_by_their_timeout(
        next_cluster_id: Callable[[], int]) -> None:
    async with _linked(next_cluster_id) as (decode, prompt, decoder, _src, _dst):
        target = [cluster_info(prompt.cluster_id, "127.0.0.1:1")]
        with _paused(decode):
            failures = await asyncio.gather(
                _timed_failure(decoder.link_clusters(target, timeout=1500)),
                _timed_failure(decoder.unlink_clusters(target, timeout=1500)))
        for error, elapsed in failures:
            assert error.status_code == LLMStatusCode.LLM_TIMEOUT, error
            _assert_within(elapsed, 1.5)


async def test_init_whose_daemon_hangs_ends_by_the_control_timeout(
        next_cluster_id: Callable[[], int]) -> None:
    async with start_daemon(pool__max_bytes="256MiB") as daemon:
        llm = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=daemon.client_target)
        with _paused(daemon):
            error, elapsed = await _timed_failure(llm.init(_cluster_options()))
        assert error.status_code == LLMStatusCode.LLM_TIMEOUT, error
        _assert_within(elapsed, CONTROL_TIMEOUT_MS / 1000)
        assert not llm.is_initialized


async def test_finalize_whose_daemon_hangs_logs_and_returns(
        next_cluster_id: Callable[[], int], caplog: pytest.LogCaptureFixture) -> None:
    """finalize ends by the control timeout, logs, and ends the session, which makes
    the daemon free the cluster once it runs again."""
    async with start_daemon(pool__max_bytes="256MiB") as daemon:
        llm = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=daemon.client_target)
        await llm.init(_cluster_options())
        with _paused(daemon), caplog.at_level(logging.WARNING, logger="hixl_client"):
            started = time.monotonic()
            await asyncio.wait_for(llm.finalize(), 60)
            elapsed = time.monotonic() - started
        _assert_within(elapsed, CONTROL_TIMEOUT_MS / 1000)
        assert any("finalizing cluster" in r.getMessage() for r in caplog.records)
        for _ in range(200):  # bounded: the daemon frees it once it sees the session end
            if not (await daemon_status(daemon.client_target)).clusters:
                break
            await asyncio.sleep(0.05)
        assert not (await daemon_status(daemon.client_target)).clusters


async def test_finalize_after_the_daemon_died_does_not_mask_the_error(
        next_cluster_id: Callable[[], int]) -> None:
    async with start_daemon(pool__max_bytes="256MiB") as daemon:
        llm = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=daemon.client_target)
        await llm.init(_cluster_options())
        with pytest.raises(KeyError, match="the body's own error"):
            async with llm:
                await asyncio.to_thread(daemon.kill)
                raise KeyError("the body's own error")
        assert not llm.is_initialized


# The blocking facade, in a process of its own (one event loop per process for
# grpc.aio): it prints the status and duration of each call made while the
# test holds its daemon stopped.
FACADE = textwrap.dedent("""
    import json, sys, time
    from hixl_client.sync import (BlocksCacheKey, CacheDesc, CacheKeyByIdAndIndex, DataType,
                                  LLMClusterInfo, LLMConfig, LLMDataDist, LLMException, LLMRole,
                                  set_daemon)

    set_daemon(sys.argv[1])
    options = json.loads(sys.argv[4])
    dd = LLMDataDist(LLMRole.DECODER, int(sys.argv[3]))
    dd.init(options)
    host, port = sys.argv[2].rsplit(":", 1)
    info = LLMClusterInfo()
    info.remote_cluster_id = int(sys.argv[5])
    info.append_local_ip_info("127.0.0.1", 0)
    info.append_remote_ip_info(host, int(port))
    assert dd.link_clusters([info], timeout=5000)[0] == 0
    desc = CacheDesc(2, [2, 64 * 1024], DataType.DT_UINT8)
    cm = dd.cache_manager
    dst = cm.allocate_cache(desc)
    blocks = cm.allocate_blocks_cache(desc)
    no_such_blocks = BlocksCacheKey(int(sys.argv[5]), 7)

    def pull_blocks():  # on this thread's own lane (hixl_client._blocking_lane)
        cm.pull_blocks(no_such_blocks, blocks, [0], [1])

    try:
        pull_blocks()  # connects the thread's lane while the daemon still runs
    except LLMException:
        pass  # the prefill has no such blocks cache
    print("ready", flush=True)
    sys.stdin.readline()  # the daemon is stopped now
    results = {}
    for name, call in (
            ("pull_cache", lambda: cm.pull_cache(
                CacheKeyByIdAndIndex(int(sys.argv[5]), int(sys.argv[6]), 0), dst)),
            ("pull_blocks", pull_blocks),
            ("allocate_cache", lambda: cm.allocate_cache(desc))):
        started = time.monotonic()
        try:
            call()
            results[name] = ["returned", time.monotonic() - started]
        except LLMException as exc:
            results[name] = [exc.status_code.name, time.monotonic() - started]
    print(json.dumps(results), flush=True)
    sys.stdin.readline()  # the daemon runs again
    dd.finalize()
""")


async def test_blocking_facade_calls_whose_daemon_hangs_end_by_their_timeout(
        next_cluster_id: Callable[[], int]) -> None:
    async with start_daemon(pool__max_bytes="512MiB") as prefill, \
            start_daemon(pool__max_bytes="512MiB") as decode:
        prompt = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill.client_target)
        await prompt.init(_cluster_options())
        src = await prompt.cache_manager.allocate_cache(DESC)
        errors = decode.tmpdir / "facade.err"  # the client's stderr, for failures
        with errors.open("wb") as stderr:
            client = await asyncio.create_subprocess_exec(
                sys.executable, "-c", FACADE, decode.client_target, prefill.peer_address,
                str(next_cluster_id()), json.dumps(_cluster_options()), str(prompt.cluster_id),
                str(src.cache_id), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
        assert client.stdin is not None and client.stdout is not None
        try:
            line = await asyncio.wait_for(client.stdout.readline(), 60)
            assert line == b"ready\n", (line, errors.read_text())
            with _paused(decode):
                client.stdin.write(b"go\n")
                line = await asyncio.wait_for(client.stdout.readline(), 60)
            results = json.loads(line)
            client.stdin.write(b"done\n")
            assert await asyncio.wait_for(client.wait(), 60) == 0, errors.read_text()
        finally:
            if client.returncode is None:
                client.kill()
                await client.wait()
        assert results["pull_cache"][0] == "LLM_TIMEOUT", results
        _assert_within(results["pull_cache"][1], SYNC_KV_TIMEOUT_MS / 1000)
        assert results["pull_blocks"][0] == "LLM_TIMEOUT", results
        _assert_within(results["pull_blocks"][1], SYNC_KV_TIMEOUT_MS / 1000)
        assert results["allocate_cache"][0] == "LLM_TIMEOUT", results
        _assert_within(results["allocate_cache"][1], CONTROL_TIMEOUT_MS / 1000)
        await prompt.finalize()


class _AllReady(LayerSynchronizer):
    """An ``async def`` synchronizer: every layer is ready at once."""

    async def synchronize_layer(  # type: ignore[override]
            self, layer_index: int, timeout_in_millis: int | None) -> bool:
        return True


async def test_a_layerwise_task_whose_daemon_hangs_ends_by_its_layers_timeout(
        next_cluster_id: Callable[[], int]) -> None:
    async with start_daemon(pool__max_bytes="512MiB") as sender_side, \
            start_daemon(pool__max_bytes="512MiB") as receiver_side:
        sender = LLMDataDist(LLMRole.DECODER, next_cluster_id(),
                             daemon=sender_side.client_target)
        receiver = LLMDataDist(LLMRole.PROMPT, next_cluster_id(),
                               daemon=receiver_side.client_target)
        accessible = {"llm.EnableRemoteCacheAccessible": "1"}
        await receiver.init(_cluster_options(**accessible))
        await sender.init(_cluster_options(**accessible))
        status, results = await sender.link_clusters(
            [cluster_info(receiver.cluster_id, receiver_side.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS, results
        desc = CacheDesc(4, [1, 64 * 1024], DataType.DT_UINT8)  # 2 layers
        src = await sender.cache_manager.allocate_cache(desc)
        dst = await receiver.cache_manager.allocate_cache(desc)
        config = TransferWithCacheKeyConfig(
            CacheKeyByIdAndIndex(receiver.cluster_id, dst.cache_id, 0), range(2), range(2))
        with _paused(sender_side):
            started = time.monotonic()
            task = sender.cache_manager.transfer_cache_async(src, _AllReady(), [config])
            statuses = await asyncio.wait_for(task.get_results(), 60)
            elapsed = time.monotonic() - started
        assert statuses == [LLMStatusCode.LLM_TIMEOUT], statuses
        _assert_within(elapsed, SYNC_KV_TIMEOUT_MS / 1000)
        await sender.finalize()
        await receiver.finalize()
