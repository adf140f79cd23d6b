"""Many links between two daemons on loopback: the soak's and the link-scale tool's set-up.

A link joins one decode cluster to one prompt cluster (the decoder's
``link_clusters``). ``L`` links need ``P x D >= L`` clusters' sessions, so
the mesh takes about ``sqrt(L)`` of each: decoder ``d`` links to prompt
clusters in order until ``L`` links exist. Every cluster is a session of
this process with its daemon (an ``LLMDataDist``), each with one small
pool, so the whole mesh runs in three processes: the tool and two daemons.

The prompt daemon listens on a fixed peer port, so that after a restart
(:meth:`Mesh.restart_prompt`) the decoders' link monitor finds it where it
was and links again by itself; its clusters are then initialised again and
their caches registered anew, as a serving stack's clients would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hixl_bench import collect
from hixl_bench.procstat import ProcFigures, StatusChannels, less_executor, proc_figures
from hixl_client import (
    Cache,
    CacheDesc,
    DataType,
    LLMClusterInfo,
    LLMConfig,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
)
from hixl_service.testing import DaemonProcess, unused_port
from hixl_wire._proto.hixl.v1 import admin_pb2

PROMPT_ID_BASE = 0x50_0000
DECODER_ID_BASE = 0xD0_0000
_PAGE_SHIFT = 12
_MIB = 1 << 20
# Settles a link monitor within seconds of a restart instead of the defaults'
# tens of seconds: heartbeats every 0.2 s, down after 1.5 s silent, leases of 3 s.
FAST_LINKS: dict[str, Any] = {
    "links__heartbeat_interval_s": 0.2,
    "links__heartbeat_timeout_s": 0.5,
    "links__down_after_s": 1.5,
    "links__lease_s": 3.0,
    "links__tcp_user_timeout_s": 2.0,
    "transfer__connect_timeout_s": 1.0,
}
_FINALIZE_S = 15.0
_INIT_RETRY_S = 10.0
_INIT_RETRY_PAUSE_S = 0.1


@dataclass(frozen=True)
class MeshShape:
    """How many prompt and decode clusters carry ``links`` links, and each slot's size."""

    links: int
    prompts: int
    decoders: int
    block: int = 4096  # bytes of one slot of one tensor
    decoder_slots: int = 1  # a transfer's own landing slots on each decoder (the soak's workers)

    @classmethod
    def for_links(cls, links: int, block: int = 4096, decoder_slots: int = 1) -> MeshShape:
        if links < 1:
            raise ValueError(f"links must be >= 1, got {links}")
        prompts = math.ceil(math.sqrt(links))
        return cls(links, prompts, math.ceil(links / prompts), block, decoder_slots)

    def pairs(self) -> list[tuple[int, int]]:
        """(decoder index, prompt index) of every link."""
        return [(d, p) for d in range(self.decoders) for p in range(self.prompts)][:self.links]

    def prompt_desc(self) -> CacheDesc:
        """Slot 0: what decoders pull; slot 1 + d: where decoder d pushes."""
        return CacheDesc(2, [1 + self.decoders, self.block], DataType.DT_UINT8)

    def decoder_desc(self) -> CacheDesc:
        """Slots 0 .. decoder_slots - 1: where pulls land; the last: what pushes send."""
        return CacheDesc(2, [self.decoder_slots + 1, self.block], DataType.DT_UINT8)

    def pool_bytes(self, desc: CacheDesc, floor: int) -> int:
        per_tensor = -(-desc.size // (1 << _PAGE_SHIFT)) << _PAGE_SHIFT
        return max(floor, 2 * per_tensor + (1 << _PAGE_SHIFT))


def pattern(prompt: int, block: int) -> np.ndarray:
    """The bytes prompt cluster ``prompt`` serves in slot 0 (the same after a restart)."""
    return np.random.default_rng(PROMPT_ID_BASE + prompt).integers(0, 256, block, dtype=np.uint8)


def cluster_options(pool_bytes: int, sync_kv_timeout_ms: int) -> dict[str, str]:
    config = LLMConfig()
    config.device_id = 0
    config.enable_cache_manager = True
    config.mem_pool_cfg = json.dumps({"memory_size": pool_bytes, "page_shift": _PAGE_SHIFT})
    config.sync_kv_timeout = sync_kv_timeout_ms
    config.enable_remote_cache_accessible = True  # decoders push as well as pull
    return dict(config.generate_options())


def daemon_settings(shape: MeshShape, streams: int, pool_bytes: int, clusters: int,
                    fast_links: bool) -> dict[str, Any]:
    """A daemon of the mesh: the pools of ``clusters`` clusters, and limits that let
    ``shape.links`` links from one peer in at once (the defaults stop at 512)."""
    links = shape.links + 64
    settings: dict[str, Any] = {
        "pool__max_bytes": clusters * pool_bytes + 64 * _MIB,
        # Pools faulted in at init: a daemon's VmRSS then does not grow as a
        # run first touches its slots.
        "pool__populate": True,
        "transfer__streams_per_link": streams,
        "limits__max_inbound_links": links,
        "limits__max_links_per_peer": links,
        "limits__max_data_connections": min(1 << 20, streams * links),
        "limits__hello_rate": 10_000.0,
        "limits__hello_burst": links,
        "server__grace_period_s": 1.0,
        "logging__level": "WARNING",
    }
    return {**settings, **(FAST_LINKS if fast_links else {})}


@dataclass
class Mesh:
    """Two daemons, their clusters and the links between them."""

    shape: MeshShape
    prompt_daemon: DaemonProcess
    decode_daemon: DaemonProcess
    pool_bytes: int
    sync_kv_timeout_ms: int
    daemon_env: dict[str, str]  # loads ``collect``'s hook
    prompts: list[LLMDataDist] = field(default_factory=list)
    decoders: list[LLMDataDist] = field(default_factory=list)
    sources: list[Cache] = field(default_factory=list)  # per prompt, slot 0 filled
    landing: list[Cache] = field(default_factory=list)  # per decoder
    restarts: int = 0
    init_retries: int = 0  # prompt clusters' inits refused right after a restart
    channels: StatusChannels = field(default_factory=StatusChannels)  # Admin readings

    def prompt_id(self, prompt: int) -> int:
        return PROMPT_ID_BASE + prompt

    def decoder_id(self, decoder: int) -> int:
        return DECODER_ID_BASE + decoder

    def linked_prompts(self, decoder: int) -> list[int]:
        return [p for d, p in self.shape.pairs() if d == decoder]

    async def start_prompts(self) -> None:
        """Initialise every prompt cluster and register (allocate and fill) its cache."""
        options = cluster_options(self.pool_bytes, self.sync_kv_timeout_ms)
        desc = self.shape.prompt_desc()

        async def one(prompt: int) -> tuple[LLMDataDist, Cache]:
            client = LLMDataDist(LLMRole.PROMPT, self.prompt_id(prompt),
                                 daemon=self.prompt_daemon.client_target)
            await self._init_retrying(client, options)
            cache = await client.cache_manager.allocate_cache(desc)
            for tensor in range(2):
                cache.numpy(tensor)[0] = pattern(prompt, self.shape.block)
            return client, cache

        made = await asyncio.gather(*(one(p) for p in range(self.shape.prompts)))
        self.prompts = [client for client, _ in made]
        self.sources = [cache for _, cache in made]

    async def _init_retrying(self, client: LLMDataDist, options: dict[str, str]) -> None:
        """``init``, tried again for up to ``_INIT_RETRY_S`` while the daemon refuses
        (a restart not yet listening), counted in ``init_retries``.

        Before sessions had connections of their own, the first ``init``
        after a restart could also fail at once although the new daemon
        listened: gRPC shared one
        connection, and its reconnect backoff, between a process's channels
        to one target, and the old clients' failed calls kept it in backoff.
        Each session has a connection of its own now
        (``hixl_client._transport.CHANNEL_OPTIONS``;
        tests/integration/test_daemon_restart.py).
        """
        deadline = asyncio.get_running_loop().time() + _INIT_RETRY_S
        while True:
            try:
                await client.init(options)
                return
            except LLMException:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                self.init_retries += 1
                await asyncio.sleep(_INIT_RETRY_PAUSE_S)

    async def start_decoders(self) -> None:
        options = cluster_options(self.pool_bytes, self.sync_kv_timeout_ms)
        desc = self.shape.decoder_desc()

        async def one(decoder: int) -> tuple[LLMDataDist, Cache]:
            client = LLMDataDist(LLMRole.DECODER, self.decoder_id(decoder),
                                 daemon=self.decode_daemon.client_target)
            await client.init(options)
            return client, await client.cache_manager.allocate_cache(desc)

        made = await asyncio.gather(*(one(d) for d in range(self.shape.decoders)))
        self.decoders = [client for client, _ in made]
        self.landing = [cache for _, cache in made]

    async def link(self, timeout_ms: int = 60_000, decoders: list[int] | None = None) -> None:
        """Each decoder links to its prompt clusters (one call each, decoders at once).

        Raises:
            RuntimeError: a link failed (the per-cluster statuses say which).
        """
        peer = self.prompt_daemon.peer_address

        async def one(decoder: int) -> None:
            infos = [LLMClusterInfo.for_peer(self.prompt_id(p), peer)
                     for p in self.linked_prompts(decoder)]
            if not infos:
                return
            status, results = await self.decoders[decoder].link_clusters(infos, timeout_ms)
            if status != LLMStatusCode.LLM_SUCCESS:
                failed = sorted({r.name for r in results if r != LLMStatusCode.LLM_SUCCESS})
                raise RuntimeError(f"decoder {decoder}: link_clusters answered {status.name} "
                                   f"({failed})")

        await asyncio.gather(*(one(d) for d in decoders or range(self.shape.decoders)))

    async def links_up(self) -> int:
        """Outbound links the decode daemon shows up to the prompt daemon now."""
        status = await self.status(self.decode_daemon)
        far = self.prompt_daemon.daemon_id
        return sum(1 for link in status.links if link.direction == "outbound"
                   and link.health.state == "up" and link.remote_daemon_id == far)

    async def wait_links_up(self, bound_s: float, poll_s: float = 0.1) -> float | None:
        """Seconds until all links are up again (None: not within ``bound_s``)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while loop.time() - started < bound_s:
            if await self.links_up() >= self.shape.links:
                return loop.time() - started
            await asyncio.sleep(poll_s)
        return None

    async def restart_prompt(self, signum: signal.Signals) -> None:
        """Stop the prompt daemon with ``signum`` (SIGKILL or SIGTERM), start it again
        on the same ports, and initialise and register its clusters there again."""
        stop: Callable[[], object] = (self.prompt_daemon.kill if signum == signal.SIGKILL
                                      else self.prompt_daemon.stop)
        await asyncio.to_thread(stop)
        await finalize_quietly(self.prompts)  # their sessions ended with the daemon
        self.prompts, self.sources = [], []
        await asyncio.to_thread(self.prompt_daemon.start)
        self.restarts += 1
        await self.start_prompts()

    async def collect(self) -> bool:
        """A full garbage collection in both daemons and here (see ``collect``)."""
        collect.collect_here()
        answers = await asyncio.gather(collect.collect(self.daemon_env, self.prompt_daemon.pid),
                                       collect.collect(self.daemon_env, self.decode_daemon.pid))
        return all(answers)

    async def status(self, daemon: DaemonProcess) -> admin_pb2.DaemonStatus:
        """``Admin/GetStatus`` of ``daemon``, over the mesh's kept channel to it."""
        return await self.channels.status(daemon.client_target)

    def daemon_figures(self, daemon: DaemonProcess) -> ProcFigures:
        """``daemon``'s figures, less its default-executor threads as of its last
        collection (``collect``): they are counted the way ``own_figures`` counts
        this process's."""
        return less_executor(proc_figures(daemon.pid),
                             collect.executor_threads(self.daemon_env, daemon.pid))

    async def close(self) -> None:
        await finalize_quietly([*self.decoders, *self.prompts])
        await self.channels.aclose()
        self.decoders, self.prompts, self.sources, self.landing = [], [], [], []


async def finalize_quietly(clients: list[LLMDataDist]) -> None:
    """Finalize clients, some of whose daemon may be gone; bounded, never raises."""
    async def one(client: LLMDataDist) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.finalize(), _FINALIZE_S)

    await asyncio.gather(*(one(c) for c in clients))


@contextlib.asynccontextmanager
async def mesh(shape: MeshShape, *, streams: int = 4, pool_floor: int = _MIB,
               sync_kv_timeout_ms: int = 2000, fast_links: bool = True,
               link: bool = True) -> AsyncIterator[Mesh]:
    """Start both daemons and every cluster, link them (unless ``link`` is false),
    and tear everything down on exit."""
    pool = max(shape.pool_bytes(shape.prompt_desc(), pool_floor),
               shape.pool_bytes(shape.decoder_desc(), pool_floor))
    prompt_settings = daemon_settings(shape, streams, pool, shape.prompts, fast_links)
    decode_settings = daemon_settings(shape, streams, pool, shape.decoders, fast_links)
    with collect.hook_dir() as env:
        prompt = DaemonProcess(env=env, server__peer_port=unused_port(), **prompt_settings)
        decode = DaemonProcess(env=env, **decode_settings)
        made: Mesh | None = None
        try:
            await asyncio.gather(asyncio.to_thread(prompt.start),
                                 asyncio.to_thread(decode.start))
            made = Mesh(shape, prompt, decode, pool, sync_kv_timeout_ms, env)
            await made.start_prompts()
            await made.start_decoders()
            if link:
                await made.link()
            yield made
        finally:
            if made is not None:
                await made.close()
            await asyncio.gather(asyncio.to_thread(decode.close),
                                 asyncio.to_thread(prompt.close))
