"""Links between clusters: who is linked to whom, over which transport.

A link is made at link time and never changes silently. It owns one
``Transport`` (how its bytes move: ``transports``) and one ``FarCaches``
(where the far cluster's caches are found: ``far_caches``), both chosen
together by the factory when the far daemon answered Hello.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .far_caches import FarCaches
    from .transports.base import InboundSide, Transport, TransportInfo


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
