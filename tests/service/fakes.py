"""Test doubles for unit tests of the daemon's service modules: the wire and the far
daemon, in memory.

The service modules under test (``transfers``, ``prepared``, ``outbound``,
``inbound``, ``far_caches``) run as they are, on real memory (memfd pools of
``memory.host``), real registries, regions and caches, and real asyncio. Only
what lies across the network is replaced:

* ``FakeDataServer`` stands in for ``hixl_native.DataServer``, the far daemon's
  data plane: it keeps the regions and link tokens the real one keeps and
  checks a request against them as ``region_table.c`` and ``tcp_server.c`` do;
* ``MemoryTransport`` stands in for ``transports.tcp.TcpTransport``: it moves a
  link's ranges between this process's memories through a ``FakeDataServer``,
  with the native link's failures (through ``native_errors.link_error``);
* ``FakePeer`` stands in for ``peer_client.PeerClient`` and the far daemon's
  ``PeerServicer``: each call is answered by the far daemon's real
  ``InboundLinks``, its refs and replies passed through their wire messages,
  and a failure arrives as ``error_from_rpc`` makes it (an ``LLMException``
  with the far side's status code);
* ``InMemoryDaemon`` is one daemon's real parts (pools, regions, caches, its
  inbound and outbound links, a copier for local links) around a
  ``FakeDataServer``; ``Network`` holds daemons by peer address.

``use_memory_wire`` makes the link factory open a ``MemoryTransport`` where it
would open TCP streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import hixl_native
import numpy as np
import pytest

from hixl_service import outbound as outbound_module
from hixl_service.caches import NewCache
from hixl_service.cluster import Cluster, ClusterSettings
from hixl_service.completions import CompletionDispatcher
from hixl_service.copier import Copier
from hixl_service.engine import Engine, EngineDeps
from hixl_service.inbound import InboundLinks, LeaseSettings
from hixl_service.load import TransferLoad
from hixl_service.memory.base import Memory, PoolSpec
from hixl_service.memory.host import HostBackend
from hixl_service.native_errors import link_error
from hixl_service.peer_api import (
    PROTOCOL_VERSION,
    CacheRefSpec,
    HeartbeatAnswer,
    PeerHello,
    ResolvedCache,
)
from hixl_service.peer_client import (
    PEER_CALLS,
    key_from_proto,
    key_to_proto,
    ref_from_proto,
    ref_to_proto,
)
from hixl_service.planning import Ranges
from hixl_service.pools import PoolManager
from hixl_service.registry import CacheEntry, KeySpec
from hixl_service.rpc_errors import handler_error
from hixl_service.transports import factory
from hixl_service.transports.base import (
    REACHES_HOST_MEMORY,
    Place,
    Prepared,
    Transport,
    TransportInfo,
)
from hixl_service.trust import Trust, insecure_trust
from hixl_wire._proto.hixl.v1 import peer_pb2
from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.types import LLMRole, Placement

POOL_BYTES = 1 << 20
PAGE_SHIFT = 12
TENSOR_BYTES = 1024  # per tensor: BATCH slots of 256 bytes
BATCH = 4


# -- the far daemon's data plane ----------------------------------------------------


@dataclass
class _Region:
    mapping: hixl_native.Mapping
    offset: int
    length: int
    cluster_id: int
    writable: bool
    dying: bool = False
    in_use: int = 0


@dataclass
class _Grant:
    cluster_id: int
    may_write: bool


class FakeDataServer:
    """Test double of ``hixl_native.DataServer`` (a daemon's data plane).

    It keeps what the real one keeps (regions of host mappings, link tokens
    with their cluster and write permission) and checks each request the way
    the native server does before a byte moves: every range in a known, live
    region of the token's cluster, inside it, and writable for a write by a
    link that may write; else the whole request is refused (``E_REFUSED``).
    ``unregister_region`` refuses new requests at once and returns once those
    holding the region have ended, as the native table's does (it is called
    off the loop, through ``Regions.remove``).
    """

    port = 7000  # nothing listens: a MemoryTransport reaches the server in memory

    def __init__(self) -> None:
        self._regions: dict[int, _Region] = {}
        self._grants: dict[int, _Grant] = {}
        self._lock = threading.Condition()

    def authorize(self, token: int, cluster_id: int, key: bytes = b"",
                  may_write: bool = True) -> None:
        self._grants[token] = _Grant(cluster_id, may_write)

    def revoke(self, token: int) -> None:
        self._grants.pop(token, None)

    def authorized(self, token: int) -> bool:
        return token in self._grants

    def register_region(self, region_id: int, mapping: hixl_native.Mapping, offset: int,
                        length: int, cluster_id: int, writable: bool = False) -> None:
        with self._lock:
            self._regions[region_id] = _Region(mapping, offset, length, cluster_id, writable)

    def unregister_region(self, region_id: int) -> None:
        with self._lock:
            region = self._regions.get(region_id)
            if region is None:
                return
            region.dying = True
            while region.in_use:
                self._lock.wait()
            del self._regions[region_id]

    def has_region(self, region_id: int) -> bool:
        with self._lock:
            region = self._regions.get(region_id)
            return region is not None and not region.dying

    def close(self) -> None:
        self._grants.clear()

    def acquire(self, token: int, writing: bool, region_id: int,
                spans: Sequence[tuple[int, int]]) -> _Region:
        """Hold ``region_id`` for a request of (offset, length) ``spans`` by the link
        ``token``; raises as the native link reports the server's refusal."""
        grant = self._grants.get(token)
        if grant is None:  # the server shut the link's streams (revoked)
            raise link_error(hixl_native.E_CLOSED)
        with self._lock:
            region = self._regions.get(region_id)
            if (region is None or region.dying or region.cluster_id != grant.cluster_id
                    or (writing and not (region.writable and grant.may_write))
                    or any(offset + length > region.length for offset, length in spans)):
                raise link_error(hixl_native.E_REFUSED)
            region.in_use += 1
            return region

    def release(self, region: _Region) -> None:
        with self._lock:
            region.in_use -= 1
            self._lock.notify_all()


# -- the wire ----------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request a MemoryTransport carried."""

    writing: bool
    region_id: int
    ranges: Ranges
    timeout_ms: int
    checksum: bool


def _copy(writing: bool, region: _Region, local: Memory, ranges: Ranges) -> None:
    """Move (remote, local, length) ranges: into ``local``, or out of it when writing."""
    with memoryview(region.mapping) as far, memoryview(local.native) as near:
        for remote, mine, length in np.asarray(ranges, dtype=np.uint64).tolist():
            there = region.offset + remote
            if writing:
                far[there:there + length] = near[mine:mine + length]
            else:
                near[mine:mine + length] = far[there:there + length]


class MemoryTransport:
    """Test double of ``transports.tcp.TcpTransport``: one link's data plane, in memory.

    A request goes to the far daemon's ``FakeDataServer`` under the link's token
    and moves its bytes with memoryview copies once the server accepted it.
    Failures are the native link's, translated as the real transport does:
    a refused range ``RegionRefused`` (nothing moved), a link whose token was
    revoked ``LLM_LINK_FAILED``, a request not answered by its deadline
    ``LLM_TIMEOUT``. ``hold()`` keeps requests in flight (not yet at the far
    server) until ``release()``: they then end by their deadline at the
    latest, as every native request does; ``in_flight`` is set while one waits.
    """

    name = "memory"
    capabilities = frozenset({REACHES_HOST_MEMORY})
    peer_calls: tuple[str, ...] = ()

    def __init__(self, server: FakeDataServer, token: int) -> None:
        self.server = server
        self.token = token
        self.requests: list[Request] = []
        self.closed = False
        self.in_flight = asyncio.Event()
        self._gate: asyncio.Event | None = None

    @property
    def alive(self) -> bool:
        return not self.closed and self.server.authorized(self.token)

    def info(self) -> TransportInfo:
        return TransportInfo(self.name, 1, self.alive, capabilities=self.capabilities)

    def hold(self) -> None:
        self._gate = asyncio.Event()

    def release(self) -> None:
        if self._gate is not None:
            self._gate.set()
            self._gate = None

    def _check_up(self) -> None:
        if not self.alive:
            raise LLMException("the data streams to the far cluster are lost (MemoryTransport)",
                               status_code=LLMStatusCode.LLM_LINK_FAILED)

    def _move(self, writing: bool, local: Memory, region_id: int, ranges: Ranges) -> None:
        # The wire's column order: (remote, local, length) for both directions.
        wire = ranges[:, [1, 0, 2]] if writing else ranges
        region = self.server.acquire(self.token, writing, region_id,
                                     [(int(r), int(n)) for r, _, n in wire.tolist()])
        try:
            _copy(writing, region, local, wire)
        finally:
            self.server.release(region)

    async def _transfer(self, writing: bool, local: Memory, far: Place, ranges: Ranges,
                        timeout_ms: int, checksum: bool) -> None:
        self._check_up()
        self.requests.append(Request(writing, far.region_id, ranges.copy(), timeout_ms,
                                     checksum))
        gate = self._gate
        if gate is not None:
            self.in_flight.set()
            try:
                await asyncio.wait_for(gate.wait(), timeout_ms / 1000)
            except asyncio.TimeoutError:
                raise link_error(hixl_native.E_TIMEOUT) from None
            finally:
                self.in_flight.clear()
        self._move(writing, local, far.region_id, ranges)

    async def read(self, local: Memory, far: Place, ranges: Ranges, timeout_ms: int,
                   checksum: bool = False) -> None:
        await self._transfer(False, local, far, ranges, timeout_ms, checksum)

    async def write(self, local: Memory, far: Place, ranges: Ranges, timeout_ms: int,
                    checksum: bool = False) -> None:
        await self._transfer(True, local, far, ranges, timeout_ms, checksum)

    def prepare(self, writing: bool, local: Memory, far: Place, ranges: Ranges,
                nbytes: int, checksum: bool = False) -> Prepared:
        return _PreparedRequest(self, writing, local, far, ranges.copy(), checksum)

    async def close(self) -> None:
        self.closed = True


class _PreparedRequest:
    """A MemoryTransport's prepared ranges: like the TCP transport's one-request
    handle, a start that is not held ends inside the call (a refusal raised
    there, nothing moved), and a held one returns an awaitable of its end."""

    def __init__(self, transport: MemoryTransport, writing: bool, local: Memory, far: Place,
                 ranges: Ranges, checksum: bool) -> None:
        self._transport = transport
        self._writing = writing
        self._local = local
        self._far = far
        self._ranges = ranges
        self._checksum = checksum

    def start(self, src_shift: int, dst_shift: int,
              timeout_ms: int) -> Any:
        transport = self._transport
        shifted = self._ranges + np.array((src_shift, dst_shift, 0), dtype=np.uint64)
        if transport._gate is not None:
            return transport._transfer(self._writing, self._local, self._far, shifted,
                                       timeout_ms, self._checksum)
        transport._check_up()
        transport.requests.append(Request(self._writing, self._far.region_id, shifted,
                                          timeout_ms, self._checksum))
        transport._move(self._writing, self._local, self._far.region_id, shifted)
        return None


async def _open_transport(kit: factory.TransportKit, ends: factory.LinkEnds, hello: PeerHello,
                          peer: Any, same_daemon: bool, timeout_s: float) -> Transport:
    """``factory.open_transport`` with a ``MemoryTransport`` where it opens TCP streams."""
    if same_daemon or not isinstance(peer, FakePeer):
        return await factory.open_transport(kit, ends, hello, peer, same_daemon, timeout_s)
    factory.check_peer_calls(kit, hello.daemon_id, hello.peer_calls)
    transport: Transport = MemoryTransport(peer.daemon.data_server, hello.token)
    return kit.wrap(transport) if kit.wrap is not None else transport


def use_memory_wire(monkeypatch: pytest.MonkeyPatch) -> None:
    """Links to another in-memory daemon get a MemoryTransport (``outbound`` opens
    its links' transports through the factory's ``open_transport``)."""
    monkeypatch.setattr(outbound_module, "open_transport", _open_transport)


# -- the far daemon's Peer service ---------------------------------------------------


class FakePeer:
    """Test double of ``peer_client.PeerClient`` with the far daemon's ``PeerServicer``
    behind it, for one far daemon (``daemon``), in memory.

    Each call is answered as the servicer answers it, by the far daemon's real
    ``InboundLinks``, with refs and keys passed through their proto messages;
    a failure reaches the caller as ``error_from_rpc`` gives it (a new
    ``LLMException`` with the far side's status code, what ``handler_error``
    made of the exception there). ``calls`` records (method, token or daemon
    id) in order. Faults: ``down`` (nobody answers: every call fails at once
    with ``LLM_LINK_FAILED``, as gRPC's UNAVAILABLE does), ``silent`` (methods
    whose calls get no answer: they end at their ``timeout_s`` with
    ``LLM_TIMEOUT``) and ``fail_next`` (the next calls of a method fail with a
    status).
    """

    def __init__(self, daemon: InMemoryDaemon, address: str) -> None:
        self.daemon = daemon
        self.address = address
        self.calls: list[tuple[str, Any]] = []
        self.down = False
        self.silent: set[str] = set()
        self._failing: dict[str, list[LLMStatusCode]] = {}
        self._called = asyncio.Condition()

    def fail_next(self, method: str, status: LLMStatusCode, times: int = 1) -> None:
        self._failing.setdefault(method, []).extend([status] * times)

    def count(self, method: str) -> int:
        return sum(1 for name, _ in self.calls if name == method)

    async def wait_for_call(self, method: str, count: int) -> None:
        """Return once ``method`` was called ``count`` times."""
        async with self._called:
            await self._called.wait_for(lambda: self.count(method) >= count)

    async def _reach(self, method: str, subject: Any, timeout_s: float) -> None:
        self.calls.append((method, subject))
        async with self._called:
            self._called.notify_all()
        if self.down:
            raise LLMException(f"peer daemon at {self.address}: UNAVAILABLE: (FakePeer down)",
                               status_code=LLMStatusCode.LLM_LINK_FAILED)
        if method in self.silent:
            await asyncio.sleep(timeout_s)  # the call's deadline passes unanswered
            raise LLMException(f"peer daemon at {self.address}: DEADLINE_EXCEEDED",
                               status_code=LLMStatusCode.LLM_TIMEOUT)
        failing = self._failing.get(method)
        if failing:
            status = failing.pop(0)
            raise LLMException(f"{method} failed (FakePeer)", status_code=status)

    @staticmethod
    def _answer(method: str, answer: Callable[[], Any]) -> Any:
        try:
            return answer()
        except Exception as exc:
            error = handler_error(method, exc)
            raise LLMException(str(error), status_code=error.status_code) from None

    @staticmethod
    async def _answer_async(method: str, answer: Callable[[], Any]) -> Any:
        try:
            return await answer()
        except Exception as exc:
            error = handler_error(method, exc)
            raise LLMException(str(error), status_code=error.status_code) from None

    @property
    def _inbound(self) -> InboundLinks:
        return self.daemon.inbound

    async def hello(self, daemon_id: str, src_cluster_id: int, dst_cluster_id: int,
                    timeout_s: float, backend: str = "host") -> PeerHello:
        await self._reach("hello", daemon_id, timeout_s)
        hello: PeerHello = self._answer("Hello", lambda: self._inbound.accept_link(
            PROTOCOL_VERSION, daemon_id, src_cluster_id, dst_cluster_id, backend,
            peer_calls=PEER_CALLS))
        return PeerHello(hello.daemon_id, hello.version, hello.data_host, hello.data_port,
                         hello.token, hello.backend or "host", hello.lane_port,
                         link_key=hello.link_key, lease_ms=hello.lease_ms,
                         peer_calls=PEER_CALLS)

    async def resolve(self, token: int, ref: CacheRefSpec, timeout_s: float) -> ResolvedCache:
        await self._reach("resolve", token, timeout_s)
        seen = ref_from_proto(ref_to_proto(ref))
        assert seen is not None
        found = self._answer("ResolveCache", lambda: self._inbound.resolve_for_peer(token, seen))
        reply = peer_pb2.ResolveCacheReply(
            cache_id=found.cache_id, region_id=found.region_id,
            tensor_offsets=found.tensor_offsets, tensor_size=found.tensor_size,
            stride=found.tensor_size // found.batch_size, batch_size=found.batch_size,
            batch_index=found.batch_index, blocks=found.blocks, writable=found.writable)
        return ResolvedCache(reply.cache_id, reply.region_id, tuple(reply.tensor_offsets),
                             reply.tensor_size, reply.batch_size, reply.batch_index,
                             reply.blocks, reply.writable)

    async def release_key(self, token: int, key: KeySpec, tensor_indices: Sequence[int],
                          timeout_s: float) -> None:
        await self._reach("release_key", token, timeout_s)
        seen = key_from_proto(key_to_proto(0, key))
        await self._answer_async("ReleaseKey", lambda: self._inbound.release_for_peer(
            token, seen, list(tensor_indices)))

    async def unlink(self, token: int, timeout_s: float) -> None:
        await self._reach("unlink", token, timeout_s)
        self._answer("Unlink", lambda: self._inbound.drop_inbound_link(token))

    async def notify(self, token: int, name: str, message: bytes, timeout_s: float) -> None:
        await self._reach("notify", token, timeout_s)
        self._answer("Notify", lambda: self._inbound.notify_for_peer(token, name, message))

    async def heartbeat(self, daemon_id: str, tokens: Sequence[int],
                        timeout_s: float) -> HeartbeatAnswer:
        await self._reach("heartbeat", daemon_id, timeout_s)
        leases = self._answer("Heartbeat", lambda: self._inbound.renew(daemon_id, list(tokens)))
        return HeartbeatAnswer(self.daemon.daemon_id, tuple(leases),
                               int(self._inbound.leases.lease_s * 1000))

    async def resolve_addresses(self, token: int, addresses: Sequence[int], length: int,
                                timeout_s: float) -> list[tuple[int, int, bool]]:
        await self._reach("resolve_addresses", token, timeout_s)
        found: list[tuple[int, int, bool]] = self._answer(
            "ResolveAddresses",
            lambda: self._inbound.resolve_addresses_for_peer(token, list(addresses), length))
        return found

    async def transport_call(self, method: str, request: Any, timeout_s: float) -> Any:
        await self._reach(method, request.link_token, timeout_s)
        return await self._answer_async(method, lambda: self._inbound.transport_call(
            method, request.link_token, request))


# -- daemons -----------------------------------------------------------------------


_daemon_numbers = itertools.count(1)
# The cluster ids the unit tests give the linking (near) and the owning (far) side.
NEAR, FAR = 1, 2


@dataclass
class Network:
    """In-memory daemons by peer address; ``peer(address)`` is what a daemon's
    peer factory gives (one FakePeer per address, shared, as PeerClients are)."""

    daemons: dict[str, InMemoryDaemon] = field(default_factory=dict)
    peers: dict[str, FakePeer] = field(default_factory=dict)

    def peer(self, address: str) -> FakePeer:
        found = self.peers.get(address)
        if found is None or found.daemon is not self.daemons[address]:
            found = self.peers[address] = FakePeer(self.daemons[address], address)
        return found


class InMemoryDaemon:
    """One daemon's real service parts around a ``FakeDataServer``: pools of host
    memory, regions, caches, clusters, inbound links (``inbound``) and outbound
    links (``outbound``, reaching other daemons of ``network`` through
    FakePeers), and the copier a local link copies with: a real ``Engine``
    composes them, and is the ``far_caches.Daemon`` a local link's
    ``DaemonCaches`` reads.
    """

    def __init__(self, network: Network, lease_s: float = 10.0,
                 trust: Trust | None = None, link_timeout_s: float = 1.0) -> None:
        number = next(_daemon_numbers)
        self.daemon_id = f"daemon-{number}"
        self.address = f"memory-{number}:1"
        self.network = network
        network.daemons[self.address] = self
        self.data_server = FakeDataServer()
        self.dispatcher = CompletionDispatcher(asyncio.get_running_loop())
        self.copier = Copier(1, self.dispatcher)
        # The daemon's own composition of its parts, around the doubles.
        self.engine = engine = Engine(EngineDeps(
            daemon_id=self.daemon_id, version="test",
            pools=PoolManager(HostBackend(64 << 20, populate=False)),
            data_server=self.data_server,  # type: ignore[arg-type]
            data_host="127.0.0.1", peer_factory=network.peer,
            kit=factory.TransportKit(self.copier, self.dispatcher),
            connect_timeout_s=link_timeout_s,
            trust=trust if trust is not None else insecure_trust(),
            leases=LeaseSettings(lease_s=lease_s)))
        self.pools, self.regions, self.clusters = engine.pools, engine.regions, engine.clusters
        self.caches, self.inbound, self.outbound = engine.caches, engine.inbound, engine.outbound
        self._closed = False

    async def cluster(self, cluster_id: int, sync_timeout_ms: int = 1000,
                      remote_accessible: bool = False, link_attempts: int = 1) -> Cluster:
        """An initialized cluster with a HOST pool."""
        settings = ClusterSettings(sync_timeout_ms=sync_timeout_ms,
                                   host_pool=PoolSpec(POOL_BYTES, PAGE_SHIFT),
                                   remote_cache_accessible=remote_accessible,
                                   link_attempts=link_attempts)
        cluster = Cluster(cluster_id, LLMRole.MIX, "session", {}, settings)
        assert settings.host_pool is not None
        cluster.pools[Placement.HOST] = await self.pools.create(cluster_id, Placement.HOST,
                                                                settings.host_pool)
        self.clusters[cluster_id] = cluster
        return cluster

    def cache(self, cluster: Cluster, keys: Sequence[KeySpec] = (), blocks: bool = False,
              blocks_model_id: int | None = None, tensors: int = 2) -> CacheEntry:
        """A cache of ``tensors`` tensors of BATCH slots (or blocks) of 256 bytes."""
        spec = NewCache(tensors, TENSOR_BYTES, BATCH, Placement.HOST, blocks, blocks_model_id)
        return self.caches.allocate(cluster, spec, list(keys))

    async def link(self, cluster: Cluster, far: InMemoryDaemon, far_cluster_id: int,
                   timeout_s: float = 1.0) -> Any:
        """Link ``cluster`` to a cluster of ``far`` (this daemon for a local link)."""
        return await self.outbound.link(cluster, far_cluster_id, far.address, timeout_s)

    async def close(self) -> None:
        """Free what the daemon holds (once; a second call does nothing)."""
        if self._closed:
            return
        self._closed = True
        await self.outbound.close_all()
        await self.inbound.close()
        for cluster in self.clusters.values():
            cluster.closed = True
            for link in cluster.links.values():
                await link.transport.close()
        for pool in self.pools.pools():
            await self.pools.destroy(pool)
        self.copier.close()
        self.dispatcher.close()
        self.network.daemons.pop(self.address, None)


Pair = tuple["InMemoryDaemon", "InMemoryDaemon"]


async def linked(pair: Pair, sync_timeout_ms: int = 1000, remote_accessible: bool = False
                 ) -> tuple[Cluster, Cluster, Any]:
    """Cluster NEAR of the pair's first daemon linked to cluster FAR of its second
    (``pair[1]`` may be ``pair[0]``: a local link): puller, owner and the link."""
    near, far = pair
    owner = await far.cluster(FAR, remote_accessible=remote_accessible)
    puller = await near.cluster(NEAR, sync_timeout_ms)
    link = await near.link(puller, far, FAR)
    return puller, owner, link


@contextlib.asynccontextmanager
async def running_copier(threads: int = 2, busy: bool = False
                         ) -> AsyncIterator[tuple[Copier, TransferLoad, CompletionDispatcher]]:
    """A real copier over a real dispatcher, closed on exit; ``busy``: another
    transfer is under way, so nothing is copied on the loop's thread."""
    load = TransferLoad()
    dispatcher = CompletionDispatcher(asyncio.get_running_loop(), load)
    copier = Copier(threads, dispatcher)
    if busy:
        load.begin()
        load.begin()
    try:
        yield copier, load, dispatcher
    finally:
        copier.close()
        dispatcher.close()


# -- bytes of caches -----------------------------------------------------------------


def slot_bytes(entry: CacheEntry, tensor: int, slot: int) -> bytes:
    """A copy of one slot (or block) of one tensor of a cache."""
    stride = entry.stride
    start = entry.tensor_offsets[tensor] + slot * stride
    with memoryview(entry.memory.native) as memory:
        return bytes(memory[start:start + stride])


def fill(entry: CacheEntry, seed: int) -> None:
    """Random bytes in every slot of every tensor of a cache."""
    rng = np.random.default_rng(seed)
    with memoryview(entry.memory.native) as memory:
        for offset in entry.tensor_offsets:
            memory[offset:offset + entry.tensor_size] = rng.integers(
                0, 256, entry.tensor_size, dtype=np.uint8).tobytes()


def same_slot(src: CacheEntry, src_slot: int, dst: CacheEntry, dst_slot: int,
              tensors: Sequence[int] = (0, 1)) -> bool:
    """Whether ``dst_slot`` of ``dst`` holds the bytes of ``src_slot`` of ``src``."""
    return all(slot_bytes(src, t, src_slot) == slot_bytes(dst, t, dst_slot) for t in tensors)
