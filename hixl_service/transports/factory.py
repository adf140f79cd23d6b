"""The one place that chooses a link's transport.

The choice follows from where the far cluster lives and from the daemon's
backend, both known once the far daemon answered Hello:

* the far cluster is in this daemon: ``LocalTransport``;
* another daemon, on the hccl backend: ``HcclTransport``;
* another daemon, on the host backend: ``TcpTransport``.

The linked daemon makes the matching inbound side (``inbound_side``).
``capabilities_of`` says what a transport can do from the name a status
reported (``hixlctl doctor`` reads the Admin status); ``PEER_HANDLERS``
holds the Peer calls each transport answers on the linked daemon,
``PEER_LANE_METHODS`` those the peer lane carries, and ``check_peer_calls``
refuses a far daemon that lacks a Peer call the transport's links need.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hixl_wire.lane import PEER_METHODS, Methods
from hixl_wire.status import LLMException, LLMStatusCode

from . import base, hccl_peer
from .base import InboundSide, PeerHandler, PlainInbound, Transport
from .hccl import HcclInbound, HcclTransport
from .local import LocalTransport
from .tcp import TcpTransport

if TYPE_CHECKING:
    from ..ascend.backend import AscendBackend
    from ..completions import CompletionDispatcher
    from ..copier import Copier
    from ..peer_api import PeerApi, PeerHello


# Each transport's own declaration, by the name its links report.
CAPABILITIES: Mapping[str, frozenset[str]] = {
    transport.name: transport.capabilities
    for transport in (LocalTransport, TcpTransport, HcclTransport)}


# The Peer calls each transport's linking side makes of the far daemon, by
# method name, answered by the far daemon's inbound side of the link
# (``InboundLinks.transport_call``); the servicer and the peer lane route
# them here by name.
PEER_HANDLERS: Mapping[str, PeerHandler] = {**hccl_peer.HANDLERS}


def _lane_methods(*tables: Methods) -> Methods:
    """One table of the peer lane's methods; a kind or a name taken twice is a bug."""
    merged: Methods = {}
    for table in tables:
        for name, method in table.items():
            taken = {known.kind for known in merged.values()}
            assert name not in merged and method.kind not in taken, (name, method.kind)
            merged[name] = method
    return merged


# The peer lane's methods: the calls of any transfer (``hixl_wire.lane``) and
# those of each transport's transfers; the peer client and the lane server use
# this table.
PEER_LANE_METHODS: Methods = _lane_methods(PEER_METHODS, hccl_peer.LANE_METHODS)


def check_peer_calls(kit: TransportKit, daemon_id: str, calls: Collection[str]) -> None:
    """Refuse a link to a far daemon (``daemon_id``, serving the Peer calls
    ``calls``, as its Hello names them) lacking a Peer call that this daemon's
    links to other daemons need (their transport's ``peer_calls``).

    Raises:
        LLMException: ``LLM_LINK_FAILED``, naming the missing calls.
    """
    transport = HcclTransport if kit.ascend is not None else TcpTransport
    base.check_peer_calls(transport.name, transport.peer_calls, daemon_id, calls)


def capabilities_of(name: str) -> frozenset[str]:
    """What the transport a status names ``name`` can do (none for a name this
    hixl does not know: a newer daemon's)."""
    return CAPABILITIES.get(name, frozenset())


@dataclass
class TransportKit:
    """What transports are built from (the server wires the real ones)."""

    copier: Copier
    dispatcher: CompletionDispatcher
    ascend: AscendBackend | None = None  # the hccl backend's devices
    streams_per_link: int = 4
    connect_timeout_s: float = 3.0
    # Tests put a FaultTransport around every transport a link opens.
    wrap: Callable[[Transport], Transport] | None = None


@dataclass(frozen=True)
class LinkEnds:
    """The two clusters a link joins, as the factory needs them."""

    local_cluster_id: int
    local_device_id: int
    remote_cluster_id: int
    # The far cluster's device when it lives in this daemon, else None.
    remote_device_id: int | None


async def open_transport(kit: TransportKit, ends: LinkEnds, hello: PeerHello, peer: PeerApi,
                         same_daemon: bool, timeout_s: float) -> Transport:
    """Open the transport of a new link (raises LLM_LINK_FAILED when it cannot)."""
    transport = await _open(kit, ends, hello, peer, same_daemon, timeout_s)
    return kit.wrap(transport) if kit.wrap is not None else transport


async def _open(kit: TransportKit, ends: LinkEnds, hello: PeerHello, peer: PeerApi,
                same_daemon: bool, timeout_s: float) -> Transport:
    if same_daemon:
        _check_one_device(kit, ends)
        return LocalTransport(kit.copier)
    check_peer_calls(kit, hello.daemon_id, hello.peer_calls)
    if kit.ascend is not None:
        return await HcclTransport.open(kit.ascend.device(ends.local_device_id), peer,
                                        hello.token, timeout_s, kit.ascend.comm_settings,
                                        kit.ascend.one_sided, ends.local_cluster_id)
    return await TcpTransport.open(hello.data_host, hello.data_port, hello.token,
                                   kit.streams_per_link, kit.dispatcher, kit.connect_timeout_s,
                                   ends.remote_cluster_id, hello.link_key)


def inbound_side(kit: TransportKit, same_daemon: bool, device_id: int,
                 cluster_id: int = 0) -> InboundSide:
    """What the linked daemon keeps for an inbound link (to ``cluster_id``) of the
    same transport."""
    if same_daemon:
        return PlainInbound(LocalTransport.name)
    if kit.ascend is not None:
        return HcclInbound(kit.ascend.device(device_id), kit.ascend.comm_settings,
                           kit.ascend.one_sided, cluster_id)
    return PlainInbound(TcpTransport.name)


def _check_one_device(kit: TransportKit, ends: LinkEnds) -> None:
    """Device memory is copied with ACL inside one daemon, which stays on one device."""
    if kit.ascend is None or ends.remote_device_id is None:
        return
    mine, theirs = ends.local_device_id, ends.remote_device_id
    if mine != theirs:
        raise LLMException(f"clusters {ends.local_cluster_id} (device {mine}) and "
                           f"{ends.remote_cluster_id} (device {theirs}) share a daemon but not a "
                           f"device; ACL copies inside a daemon stay on one device",
                           status_code=LLMStatusCode.LLM_LINK_FAILED)
