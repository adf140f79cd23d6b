"""What the engine needs from another daemon, independent of gRPC.

``peer_client.PeerClient`` implements it over the Peer service; the engine
only sees these types, so it stays testable without a network.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .planning import Layout
from .registry import KeySpec

PROTOCOL_VERSION = 1


@dataclass(frozen=True)
class KeyRef:
    """A remote cache slot named by CacheKey."""

    cluster_id: int
    key: KeySpec


@dataclass(frozen=True)
class IdRef:
    """A remote cache slot named by CacheKeyByIdAndIndex."""

    cluster_id: int
    cache_id: int
    batch_index: int


@dataclass(frozen=True)
class BlocksRef:
    """A remote blocks cache named by BlocksCacheKey."""

    cluster_id: int
    model_id: int


CacheRefSpec = KeyRef | IdRef | BlocksRef


@dataclass(frozen=True)
class ResolvedCache:
    """A cache of a linked cluster, as its owner describes it."""

    cache_id: int
    region_id: int
    tensor_offsets: tuple[int, ...]  # inside the region
    tensor_size: int
    batch_size: int
    batch_index: int
    blocks: bool
    writable: bool = False

    @functools.cached_property
    def layout(self) -> Layout:
        """Built once: every transfer against the cache asks."""
        return Layout(self.tensor_offsets, self.tensor_size, self.batch_size)


@dataclass(frozen=True)
class PeerHello:
    """The answer of a daemon that accepted a link."""

    daemon_id: str
    version: str
    data_host: str
    data_port: int
    token: int
    backend: str = "host"
    lane_port: int = 0  # the peer lane's TCP port on data_host; 0: none
    # The link's data-plane key (trust.py): sent by modes none and mtls; in
    # token mode empty on the wire, derived by both ends.
    link_key: bytes = b""
    server_proof: bytes = b""  # token mode: the linked daemon knows the secret
    lease_ms: int = 0  # how long the linked daemon keeps the link unrenewed; 0: no lease
    peer_calls: tuple[str, ...] = ()  # the Peer calls the linked daemon serves


class Lease(enum.Enum):
    """What a heartbeat learnt of one link's lease (peer.proto's LeaseState)."""

    RENEWED = 0
    UNKNOWN = 1  # the far daemon holds no such link (its lease ended, or it restarted)
    DROPPED = 2  # the far cluster dropped the link itself
    STOPPING = 3  # the far daemon is draining: the link ends with it


@dataclass(frozen=True)
class HeartbeatAnswer:
    """A far daemon's answer to a heartbeat naming some of our links' tokens."""

    daemon_id: str
    leases: tuple[Lease, ...]  # one per token asked about, in order
    lease_ms: int



class PeerApi(Protocol):
    """The calls one daemon makes on another."""

    address: str

    async def hello(self, daemon_id: str, src_cluster_id: int, dst_cluster_id: int,
                    timeout_s: float, backend: str = "host") -> PeerHello: ...

    async def resolve(self, token: int, ref: CacheRefSpec, timeout_s: float) -> ResolvedCache: ...

    async def release_key(self, token: int, key: KeySpec, tensor_indices: Sequence[int],
                          timeout_s: float) -> None: ...

    async def unlink(self, token: int, timeout_s: float) -> None: ...

    async def notify(self, token: int, name: str, message: bytes, timeout_s: float) -> None: ...

    async def heartbeat(self, daemon_id: str, tokens: Sequence[int],
                        timeout_s: float) -> HeartbeatAnswer:
        """Renew the leases of ``tokens``; the far daemon's id and each lease's fate."""
        ...

    async def resolve_addresses(self, token: int, addresses: Sequence[int], length: int,
                                timeout_s: float) -> list[tuple[int, int, bool]]: ...

    async def transport_call(self, method: str, request: Any, timeout_s: float) -> Any:
        """A Peer call of a link's transport (``method``: a name of
        ``transports.factory.PEER_HANDLERS``), its request message in and its reply
        message out; the transport builds and reads both."""
        ...
