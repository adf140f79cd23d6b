"""Real daemon pairs for integration tests.

Two daemons are started once per test session (a "prefill" and a "decode"
host) and shared; each test uses fresh cluster ids and must finalize its
clusters, which the leak check after every test verifies through the Admin
service. Tests that stop, pause or kill a daemon start their own.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc.aio
import numpy as np
import pytest
import pytest_asyncio

from hixl_client import Cache, LLMDataDist, LLMRole, LLMStatusCode
from hixl_service.testing import DaemonProcess
from hixl_wire._proto.hixl.v1 import admin_pb2, admin_pb2_grpc
from tests.clusters import cluster_info, cluster_options

POOL_BYTES = 256 * 2**20
DAEMON_BUDGET = "1GiB"


async def daemon_status(target: str) -> admin_pb2.DaemonStatus:
    """Ask a daemon's Admin service for its status."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        return await stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=10)


def options(pool_bytes: int = POOL_BYTES, sync_kv_timeout: int | None = None,
            host_pool_bytes: int | None = None,
            remote_accessible: bool | None = None) -> dict[str, str]:
    return cluster_options(pool_bytes, host_pool_bytes=host_pool_bytes or 0,
                           sync_kv_timeout=sync_kv_timeout, remote_accessible=remote_accessible)


@dataclass
class Pair:
    """A prompt cluster on one daemon and a decoder cluster linked to it."""

    prompt: LLMDataDist
    decoder: LLMDataDist
    prompt_daemon: DaemonProcess
    decoder_daemon: DaemonProcess


def daemon_process(**overrides: Any) -> DaemonProcess:
    settings: dict[str, Any] = {"pool__max_bytes": DAEMON_BUDGET}
    settings.update(overrides)
    return DaemonProcess(**settings)


@pytest.fixture(scope="session")
def prefill_daemon() -> Iterator[DaemonProcess]:
    with daemon_process() as daemon:
        yield daemon


@pytest.fixture(scope="session")
def decode_daemon() -> Iterator[DaemonProcess]:
    with daemon_process() as daemon:
        yield daemon


async def make_pair(prompt_daemon: DaemonProcess, decoder_daemon: DaemonProcess,
                    next_cluster_id: Callable[[], int], **option_args: Any) -> Pair:
    prompt = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prompt_daemon.client_target)
    decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(),
                          daemon=decoder_daemon.client_target)
    await prompt.init(options(**option_args))
    await decoder.init(options(**option_args))
    status, results = await decoder.link_clusters(
        [cluster_info(prompt.cluster_id, prompt_daemon.peer_address)], timeout=5000)
    assert status == LLMStatusCode.LLM_SUCCESS, results
    return Pair(prompt, decoder, prompt_daemon, decoder_daemon)


@pytest_asyncio.fixture
async def accessible(prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
                     next_cluster_id: Callable[[], int]) -> AsyncIterator[Pair]:
    """A linked pair in remote-cache-accessible mode, the prompt cluster on the
    decode daemon (test_fencing.py has its own, the other way round)."""
    made = await make_pair(decode_daemon, prefill_daemon, next_cluster_id,
                           remote_accessible=True)
    yield made
    await made.decoder.finalize()
    await made.prompt.finalize()


@pytest_asyncio.fixture
async def pair(prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
               next_cluster_id: Callable[[], int]) -> AsyncIterator[Pair]:
    """A linked prompt/decoder pair across the two shared daemons."""
    made = await make_pair(prefill_daemon, decode_daemon, next_cluster_id)
    yield made
    await made.decoder.finalize()
    await made.prompt.finalize()
    for daemon in (prefill_daemon, decode_daemon):
        status = await daemon_status(daemon.client_target)
        leftovers = {made.prompt.cluster_id, made.decoder.cluster_id} & {
            c.cluster_id for c in status.clusters}
        assert not leftovers, f"clusters left behind on {daemon}: {leftovers}"


def fill_random(cache: Cache, seed: int) -> list[np.ndarray]:
    """Fill every tensor of ``cache`` with seeded random bytes through its zero-copy
    views; a copy of each tensor's bytes."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(cache.cache_desc.num_tensors):
        view = np.frombuffer(cache.tensor_view(i), dtype=np.uint8)
        view[:] = rng.integers(0, 256, view.size, dtype=np.uint8)
        out.append(view.copy())
    return out


def logged(daemon: DaemonProcess, text: str, timeout_s: float = 5.0) -> bool:
    """Whether ``text`` shows in the daemon's log within ``timeout_s`` (blocking:
    call it in a thread from async code)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in daemon.log_path.read_text(errors="replace"):
            return True
        time.sleep(0.05)
    return False
