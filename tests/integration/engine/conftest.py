"""In-process engines: real daemons (port-0 gRPC, lane and data servers) run in
the test's own event loop, so a test reaches the engine itself, puts a
FaultTransport around every link it opens, and drives transfers without a
client process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest_asyncio

from hixl_client.types import LLMRole, Placement
from hixl_service.cluster import OPT_HOST_MEM_POOL, OPT_MEM_POOL, OPT_SYNC_TIMEOUT, Cluster
from hixl_service.config import DaemonConfig, LoggingConfig, PoolConfig, ServerConfig
from hixl_service.engine import Engine, NewCache
from hixl_service.peer_api import IdRef
from hixl_service.registry import CacheEntry
from hixl_service.server import Daemon
from hixl_service.transfers import PullSpec
from hixl_service.transports.base import Transport
from hixl_service.transports.fault import FaultTransport

TENSOR_BYTES = 4096
BATCH = 4


@dataclass
class InProcessDaemon:
    """One daemon running in this process; every transport its links open is a
    FaultTransport around the real one (``faults``, in link order)."""

    daemon: Daemon
    task: asyncio.Task[None]
    faults: list[FaultTransport] = field(default_factory=list)

    @property
    def engine(self) -> Engine:
        return self.daemon.engine

    @property
    def peer_address(self) -> str:
        return self.daemon.peer_address

    async def cluster(self, cluster_id: int, sync_timeout_ms: int = 1000) -> Cluster:
        session = self.engine.sessions.attach(0, f"engine-test-{cluster_id}")
        pool = '{"memory_size": 4194304}'
        options = {OPT_MEM_POOL: pool, OPT_HOST_MEM_POOL: pool,
                   OPT_SYNC_TIMEOUT: str(sync_timeout_ms)}
        return await self.engine.init_cluster(session, cluster_id, LLMRole.MIX, options)


def start_options(tmp: Path) -> DaemonConfig:
    return DaemonConfig(
        server=ServerConfig(client_socket=tmp / "client.sock", peer_host="127.0.0.1", peer_port=0,
                            peer_lane_port=0),
        pool=PoolConfig(max_bytes=64 << 20, populate=False),
        logging=LoggingConfig(level="WARNING"))


async def start_daemon(tmp: Path) -> InProcessDaemon:
    tmp.mkdir(parents=True, exist_ok=True)
    daemon = Daemon(start_options(tmp))
    task = asyncio.ensure_future(daemon.run(handle_signals=False))
    ready = asyncio.ensure_future(daemon.ready.wait())
    await asyncio.wait({task, ready}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if not daemon.ready.is_set():
        ready.cancel()
        task.cancel()
        raise RuntimeError("the in-process daemon did not start")
    running = InProcessDaemon(daemon, task)

    def wrap(transport: Transport) -> Transport:
        fault = FaultTransport(transport)
        running.faults.append(fault)
        return fault

    daemon.engine.kit.wrap = wrap
    return running


async def stop_daemon(running: InProcessDaemon) -> None:
    running.daemon.stop()
    await asyncio.wait_for(running.task, 30)


@pytest_asyncio.fixture
async def daemons(tmp_path: Path) -> AsyncIterator[tuple[InProcessDaemon, InProcessDaemon]]:
    """A prefill and a decode daemon, both in this process."""
    prefill = await start_daemon(tmp_path / "prefill")
    decode = await start_daemon(tmp_path / "decode")
    try:
        yield prefill, decode
    finally:
        await stop_daemon(decode)
        await stop_daemon(prefill)


def cache(engine: Engine, cluster: Cluster, placement: Placement = Placement.DEVICE) -> CacheEntry:
    """A 2-tensor cache of BATCH slots."""
    return engine.caches.allocate(cluster, NewCache(2, TENSOR_BYTES * BATCH, BATCH, placement), [])


def view(entry: CacheEntry, tensor: int, slot: int) -> np.ndarray:
    """One slot of one tensor of a cache, as bytes in the daemon's memory."""
    stride = entry.tensor_size // entry.batch_size
    start = entry.tensor_offsets[tensor] + slot * stride
    memory = memoryview(entry.memory.native)[start:start + stride]
    return np.frombuffer(memory, dtype=np.uint8)


def fill(entry: CacheEntry, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for tensor in range(entry.num_tensors):
        for slot in range(entry.batch_size):
            view(entry, tensor, slot)[:] = rng.integers(0, 256, TENSOR_BYTES, dtype=np.uint8)


def pull_spec(src_cluster: int, src: CacheEntry, dst: CacheEntry, src_slot: int,
              dst_slot: int) -> PullSpec:
    return PullSpec(src=IdRef(src_cluster, src.cache_id, src_slot), dst_cache_id=dst.cache_id,
                    batch_index=dst_slot, size=-1, src_tensor_indices=[0, 1],
                    dst_tensor_indices=[0, 1], tensor_num_per_layer=2)


