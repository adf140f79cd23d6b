"""link_retry_count and link_total_time: linking to a prefill instance that is still starting."""

from __future__ import annotations

import asyncio

import pytest

from hixl_client import LLMConfig, LLMDataDist, LLMRole, LLMStatusCode
from hixl_service.testing import DaemonProcess
from tests.clusters import cluster_info

from .conftest import options

pytestmark = pytest.mark.asyncio

RETRYING = "retrying"
LOG_WAIT_S = 20.0


def _link_options(retries: int | None = None, total_s: int | None = None) -> dict[str, str]:
    config = LLMConfig()
    if retries is not None:
        config.link_retry_count = retries
    if total_s is not None:
        config.link_total_time = total_s
    return {**dict(config.generate_options()), **options(pool_bytes=2**20)}


def _retries_logged(daemon: DaemonProcess, since: int) -> int:
    return daemon.log_path.read_bytes()[since:].decode(errors="replace").count(RETRYING)


async def _await_retry(daemon: DaemonProcess, since: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LOG_WAIT_S
    while not _retries_logged(daemon, since):
        assert loop.time() < deadline, daemon.log_tail()
        await asyncio.sleep(0.05)


async def test_retries_link_once_the_prompt_cluster_is_up(
        prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
        next_cluster_id) -> None:  # type: ignore[no-untyped-def]
    prompt_id = next_cluster_id()
    decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=decode_daemon.client_target)
    await decoder.init(_link_options(retries=100, total_s=60))
    prompt = LLMDataDist(LLMRole.PROMPT, prompt_id, daemon=prefill_daemon.client_target)
    since = decode_daemon.log_path.stat().st_size
    try:
        linking = asyncio.create_task(decoder.link_clusters(
            [cluster_info(prompt_id, prefill_daemon.peer_address)], timeout=60000))
        await _await_retry(decode_daemon, since)  # the prompt cluster is not there yet
        await prompt.init(options(pool_bytes=2**20))
        status, results = await linking
        assert status == LLMStatusCode.LLM_SUCCESS, results
    finally:
        await decoder.finalize()
        if prompt.is_initialized:
            await prompt.finalize()


async def test_one_attempt_by_default(prefill_daemon: DaemonProcess,
                                      decode_daemon: DaemonProcess,
                                      next_cluster_id) -> None:  # type: ignore[no-untyped-def]
    decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=decode_daemon.client_target)
    await decoder.init(_link_options())
    since = decode_daemon.log_path.stat().st_size
    try:
        status, results = await decoder.link_clusters(
            [cluster_info(next_cluster_id(), prefill_daemon.peer_address)], timeout=10000)
        assert status != LLMStatusCode.LLM_SUCCESS
        assert results == [LLMStatusCode.LLM_LINK_FAILED]
        assert _retries_logged(decode_daemon, since) == 0
    finally:
        await decoder.finalize()


async def test_link_total_time_ends_the_retries(prefill_daemon: DaemonProcess,
                                                decode_daemon: DaemonProcess,
                                                next_cluster_id) -> None:  # type: ignore[no-untyped-def]
    decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=decode_daemon.client_target)
    await decoder.init(_link_options(retries=100, total_s=1))
    since = decode_daemon.log_path.stat().st_size
    try:
        # the call would allow a minute; link_total_time ends it after a second
        _status, results = await decoder.link_clusters(
            [cluster_info(next_cluster_id(), prefill_daemon.peer_address)], timeout=60000)
        assert results == [LLMStatusCode.LLM_LINK_FAILED]
        assert 1 <= _retries_logged(decode_daemon, since) < 100
    finally:
        await decoder.finalize()
