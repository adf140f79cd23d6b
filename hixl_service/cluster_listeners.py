"""A cluster's own peer listener, at the ``listen_ip_info`` its options name.

Engine connectors (vLLM-Ascend, MindIE) tell the other side a cluster's
``listen_ip_info`` ("ip:port", ``llm.listenIpInfo``) and link to exactly
that address, as LLM-DataDist listens there per cluster. So a cluster whose
options name one gets a gRPC server of the Peer service at that address,
bound to the cluster: a Hello there must name that cluster, and the link
calls made there must be of links to it. It is built by the same function
as the daemon's own peer port (``server``), with the same credentials, the
same ``trust.Trust`` (handshake, allowed_peers, limits, Hello rate) and the
same refusal of an unauthenticated listener off loopback, so it is exactly
as secure as that port. The data plane and the peer lane stay on the
daemon's own ports, which the Hello reply announces.

An address that is the daemon's own peer port is that port: the cluster is
reached there by its id, as every cluster is, and no listener is opened.

Checks, each an ``LLM_PARAM_INVALID`` at init naming the address: an IP
literal and a port in 1..65535 (port 0 is refused: the other side must know
the port), not a wildcard (the other side dials this address), an address
of this host, a port nobody listens on, and mode "none" only on loopback
unless ``security.insecure``.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpc
import grpc.aio

from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.status import param_invalid as _invalid

from .listeners import is_loopback

logger = logging.getLogger(__name__)

OPT_LISTEN_IP_INFO = "llm.listenIpInfo"



@dataclass(frozen=True)
class ListenAddress:
    """A parsed ``listen_ip_info``: an IP literal and a port."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def family(self) -> socket.AddressFamily:
        return socket.AF_INET6 if ":" in self.host else socket.AF_INET


def parse_listen_ip_info(text: str) -> ListenAddress | None:
    """``llm.listenIpInfo`` checked (LLM_PARAM_INVALID); None when it is empty."""
    if not text:
        return None
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise _invalid(f"{OPT_LISTEN_IP_INFO} must be 'ip:port', got {text!r}")
    if not port_text.isdigit() or not 0 < int(port_text) <= 0xFFFF:
        raise _invalid(f"{OPT_LISTEN_IP_INFO} {text!r}: the port must be in 1..65535 (the other "
                       f"side dials it, so it cannot be chosen by the system)")
    try:
        ip = ipaddress.ip_address(host[1:-1] if host.startswith("[") else host)
    except ValueError:
        raise _invalid(f"{OPT_LISTEN_IP_INFO} {text!r}: {host!r} is not an IP address") from None
    if ip.is_unspecified:
        raise _invalid(f"{OPT_LISTEN_IP_INFO} {text!r}: other clusters dial this address, so "
                       f"it must be an address of this host, not the wildcard {ip}")
    return ListenAddress(str(ip), int(port_text))


class ClusterListener(Protocol):
    """What a cluster holds of its listener."""

    @property
    def address(self) -> str: ...

    @property
    def shared(self) -> bool:
        """True: the address is the daemon's own peer port; nothing was opened."""

    async def close(self) -> None: ...


class ListenerFactory(Protocol):
    """Opens the listener of a cluster (``Engine.init_cluster``)."""

    async def open(self, cluster_id: int, address: ListenAddress) -> ClusterListener: ...


class NoListeners:
    """An engine without a daemon's peer service (built in-process): no listeners."""

    async def open(self, cluster_id: int, address: ListenAddress) -> ClusterListener:
        raise LLMException(f"{OPT_LISTEN_IP_INFO} {address}: this engine serves no peer "
                           f"listeners", status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)


@dataclass
class PeerListener:
    """One cluster's listener; ``server`` is None where it shares the daemon's port."""

    address: str
    server: grpc.aio.Server | None = None

    @property
    def shared(self) -> bool:
        return self.server is None

    async def close(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            # Calls in flight there are of this cluster, which is going away.
            await server.stop(0)
            logger.info("peer listener %s closed", self.address)


@dataclass(frozen=True)
class DaemonPort:
    """The daemon's own peer listener, which a cluster's address may name."""

    host: str  # server.peer_host
    advertise_host: str
    port: int  # as bound


def _probe(address: ListenAddress) -> None:
    """Bind ``address`` once (as gRPC will) to name what stands in the way."""
    with socket.socket(address.family, socket.SOCK_STREAM) as probe:
        # gRPC sets it too: a port left in TIME_WAIT by a closed listener is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address.host, address.port))
        except OSError as exc:
            prefix = f"{OPT_LISTEN_IP_INFO} {address}"
            if exc.errno == errno.EADDRINUSE:
                raise _invalid(f"{prefix}: the port is already in use (another cluster, daemon "
                               f"or program listens there); choose another port") from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise _invalid(f"{prefix}: {address.host} is not an address of this host") \
                    from None
            if exc.errno == errno.EACCES:
                raise _invalid(f"{prefix}: the daemon may not listen on port {address.port} "
                               f"(ports below 1024 need privileges)") from None
            raise _invalid(f"{prefix}: cannot listen there ({exc.strerror})") from None


class PeerListeners:
    """The daemon's ListenerFactory: a Peer gRPC server per cluster that names an address.

    ``new_server(cluster_id)`` builds the server (services, interceptors,
    options: the daemon's peer port is built by the same function) with no
    port yet; ``credentials`` are the daemon's (``Trust.server_credentials``).
    """

    def __init__(self, new_server: Callable[[int], grpc.aio.Server],
                 credentials: grpc.ServerCredentials | None, mode: str, insecure: bool,
                 daemon_port: DaemonPort) -> None:
        self._new_server = new_server
        self._credentials = credentials
        self._mode = mode
        self._insecure = insecure
        self._daemon_port = daemon_port
        self._daemon_hosts = _addresses_of(daemon_port.host, daemon_port.advertise_host)

    def _is_daemon_port(self, address: ListenAddress) -> bool:
        if address.port != self._daemon_port.port:
            return False
        return address.host in self._daemon_hosts or _is_wildcard(self._daemon_port.host)

    async def open(self, cluster_id: int, address: ListenAddress) -> ClusterListener:
        if self._is_daemon_port(address):
            return PeerListener(str(address))
        _probe(address)
        self._check_exposure(address)
        server = self._new_server(cluster_id)
        target = str(address)
        try:
            if self._credentials is not None:
                port = server.add_secure_port(target, self._credentials)
            else:
                port = server.add_insecure_port(target)
        except RuntimeError as exc:
            port = 0
            logger.debug("binding %s failed: %s", target, exc)
        if port != address.port:
            await server.stop(0)
            raise _invalid(f"{OPT_LISTEN_IP_INFO} {address}: cannot listen there (the port was "
                           f"taken meanwhile?); choose another port")
        try:
            await server.start()
        except BaseException:
            await server.stop(0)
            raise
        logger.info("cluster %d: peer listener at %s", cluster_id, address)
        return PeerListener(target, server)

    def _check_exposure(self, address: ListenAddress) -> None:
        """listeners.check_exposure's rule for the daemon's peer port, for this one."""
        if self._mode != "none" or is_loopback(address.host):
            return
        if not self._insecure:
            raise _invalid(
                f"{OPT_LISTEN_IP_INFO} {address} is not loopback, and this daemon's "
                f"security.mode is \"none\": anyone who reaches it could read and overwrite "
                f"this cluster's caches. The daemon needs security.mode \"token\" or \"mtls\" "
                f"(docs/security.md), or security.insecure = true to accept that")
        logger.warning("security.insecure: cluster listener at %s with security.mode = "
                       "\"none\"; anyone who reaches it can read and overwrite its caches",
                       address)


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def _addresses_of(*hosts: str) -> frozenset[str]:
    """The IP literals ``hosts`` name (the daemon bound them, so they resolve)."""
    found: set[str] = set()
    for host in hosts:
        try:
            entries = socket.getaddrinfo(host.strip("[]"), None, type=socket.SOCK_STREAM)
        except OSError:
            continue
        found.update(str(ipaddress.ip_address(str(entry[4][0]).split("%")[0]))
                     for entry in entries)
    return frozenset(found)
