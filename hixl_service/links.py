"""Links between clusters: who is linked to whom, over which transport.

A link owns one ``Transport`` (how its bytes move: ``transports``) and one
``FarCaches`` (where the far cluster's caches are found: ``far_caches``),
both chosen together by the factory when the far daemon answered Hello, and
a ``LinkHealth`` (its state and counters: ``link_health``). When the far
daemon restarts, the link monitor (``link_monitor``) replaces the link by a
new one under the same id and health; nothing else changes a link.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .link_health import LinkHealth, link_id
from .transports.base import Place

if TYPE_CHECKING:
    from .peer_api import CacheRefSpec, KeyRef, PeerApi, ResolvedCache
    from .planning import Layout
    from .registry import CacheEntry
    from .transports.base import InboundSide, Transport, TransportInfo


@dataclass(slots=True)
class FarCache:
    """The far end of a transfer, wherever it lives."""

    layout: Layout
    batch_index: int
    blocks: bool
    writable: bool
    place: Place
    cached: bool = False  # from the link's memory of an earlier resolve (may be stale)
    # What was found (the remote daemon's answer, or this daemon's cache
    # entry): a repeat relies on it only while it is still the one in use.
    origin: ResolvedCache | CacheEntry | None = None


class FarCaches(Protocol):
    """The caches of a link's far cluster."""

    async def find(self, ref: CacheRefSpec, wait_s: float, call_timeout_s: float,
                   fresh: bool = False) -> FarCache:
        """Locate the cache ``ref`` names; ``fresh`` skips remembered answers.

        Raises:
            asyncio.TimeoutError: no answer within ``wait_s``.
            LLMException: the far cluster has no such cache, or is gone.
        """

    def forget(self, ref: CacheRefSpec) -> None:
        """Drop a remembered answer for ``ref`` (it proved stale)."""

    def still_current(self, cache_id: int, found: FarCache) -> bool:
        """Whether ``found`` (a cache by id) is still the one a find would give."""

    async def find_addresses(self, addresses: Sequence[int], span: int,
                             wait_s: float) -> list[tuple[Place, int, bool]]:
        """(place, offset, writable) of each far-client address of ``span`` bytes."""

    async def release_key(self, ref: KeyRef, tensor_indices: list[int]) -> None:
        """Tell the owner that a pull by key moved ``tensor_indices`` of its slot."""

    async def tell_unlinked(self, timeout_s: float) -> bool:
        """Tell the far daemon that the link is gone; False if it could not be told."""

    async def notify(self, src_cluster_id: int, name: str, message: bytes,
                     timeout_s: float) -> None:
        """Queue a notification from ``src_cluster_id`` for the far cluster's client.

        Raises:
            LLMException: the far cluster is gone, or its inbox is full.
        """

    def known(self) -> FarCache | None:
        """A far cache found before, without asking anyone (the doctor's self-test
        reads from it); None when none is known."""

    @property
    def peer(self) -> PeerApi | None:
        """The far daemon, which the link monitor heartbeats; None when the far
        cluster lives in this daemon."""

    def reachable(self) -> bool:
        """Whether the far cluster is still there, as far as this daemon can tell
        without asking (a far daemon is asked by heartbeat instead)."""


@dataclass
class OutboundLink:
    """A link this daemon opened from a local cluster to a (possibly local) remote one."""

    local_cluster_id: int
    remote_cluster_id: int
    remote_peer_address: str
    remote_daemon_id: str
    token: int
    transport: Transport
    far: FarCaches
    # How long the far daemon keeps the link without a heartbeat (its Hello
    # said; 0: no lease, the far cluster lives in this daemon).
    lease_s: float = 0.0
    health: LinkHealth = field(default_factory=lambda: LinkHealth(""))
    # loop.time() of the far daemon's last answer (Hello, heartbeat).
    last_heard: float = 0.0
    # The far cluster dropped the link itself: it is not renewed any more.
    dropped: bool = False
    # The far daemon said it is stopping: down until it runs again.
    far_stopping: bool = False
    # Linking again after a far restart failed: not before retry_at
    # (loop.time()), the pause doubling while it fails.
    retry_at: float = 0.0
    retry_pause_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.health.link_id:
            self.health.link_id = link_id(self.local_cluster_id, self.remote_cluster_id)

    @property
    def link_id(self) -> str:
        return self.health.link_id

    @property
    def alive(self) -> bool:
        return self.transport.alive

    def info(self) -> TransportInfo:
        return self.transport.info()


@dataclass
class InboundLink:
    """A link another daemon (or this one) opened to one of our clusters."""

    token: int
    src_daemon_id: str
    src_cluster_id: int
    dst_cluster_id: int
    side: InboundSide  # what the transport keeps on this side
    identity: str = ""  # the peer's, as trust.Trust.identity_of saw it (limits count it)
    may_write: bool = True  # security.allowed_peers lets it write into the cluster
    # The lease: the link is kept while the linking daemon renews it within
    # lease_s (0: no lease, the linking cluster lives in this daemon).
    lease_s: float = 0.0
    renewed_at: float = 0.0  # loop.time() of the last renewal
    told_stopping: bool = False  # a heartbeat of the linker heard that this daemon drains
    health: LinkHealth = field(default_factory=lambda: LinkHealth(""))

    def __post_init__(self) -> None:
        if not self.health.link_id:
            self.health.link_id = link_id(self.src_cluster_id, self.dst_cluster_id)

    @property
    def link_id(self) -> str:
        return self.health.link_id
