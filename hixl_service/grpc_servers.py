"""The daemon's gRPC servers: what each serves, with which interceptors and
options, and how their ports are bound.

The client server carries the Client and Admin services, a peer server the
Peer service only (the daemon's peer port and every cluster's own listener,
``cluster_listeners``). Each also carries health, answering for its own
services only, and reflection (v1 and v1alpha). ``server`` builds them and
binds their ports.
"""

from __future__ import annotations

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from hixl_wire._proto.hixl.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    client_pb2,
    client_pb2_grpc,
    peer_pb2,
    peer_pb2_grpc,
)
from hixl_wire.lane import CLIENT_METHODS

from . import tracing
from .interceptors import LoadInterceptor, RequestIdInterceptor, generic_only
from .listeners import refuse_busy_port
from .load import TransferLoad
from .reflection import enable_reflection
from .servicer_admin import AdminServicer
from .servicer_client import ClientServicer
from .servicer_peer import PeerServicer

CLIENT_NAME = client_pb2.DESCRIPTOR.services_by_name["Client"].full_name
PEER_NAME = peer_pb2.DESCRIPTOR.services_by_name["Peer"].full_name
ADMIN_NAME = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name
# gRPC turns SO_REUSEPORT on by default: a second daemon could then bind a
# port already served, and a port-0 bind could even be handed one, so peers
# would be split between two daemons at random.
SERVER_OPTIONS = (("grpc.so_reuseport", 0),)


class Health:
    """The health servicers, one per gRPC server: each answers for the services its
    own server serves (and "", the server as a whole), NOT_FOUND for the others."""

    def __init__(self) -> None:
        self._servicers: dict[tuple[str, ...], health.aio.HealthServicer] = {}

    def servicer(self, services: tuple[str, ...]) -> health.aio.HealthServicer:
        return self._servicers.setdefault(services, health.aio.HealthServicer())

    async def serving(self) -> None:
        for services, servicer in self._servicers.items():
            for name in ("", *services):
                await servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def enter_graceful_shutdown(self) -> None:
        for servicer in self._servicers.values():
            await servicer.enter_graceful_shutdown()


def peer_server(max_concurrent_rpcs: int, servicer: PeerServicer,
                healths: Health) -> grpc.aio.Server:
    """A server of the Peer service, no port yet: the daemon's peer port and every
    cluster's own listener (``cluster_listeners``) are built here, so they cannot
    differ in what they serve."""
    server = grpc.aio.server(interceptors=[RequestIdInterceptor(),
                                           *_tracing_interceptors("hixl.peer")],
                             options=SERVER_OPTIONS,
                             maximum_concurrent_rpcs=max_concurrent_rpcs)
    peer_pb2_grpc.add_PeerServicer_to_server(servicer, generic_only(server))
    _add_common(server, healths, (PEER_NAME,))
    return server


def client_server(max_concurrent_rpcs: int, load: TransferLoad, client: ClientServicer,
                  admin: AdminServicer, healths: Health) -> grpc.aio.Server:
    """The server of the Client and Admin services, no port yet; its transfer calls
    count in ``load`` (``interceptors.LoadInterceptor``)."""
    transfers = [f"/{CLIENT_NAME}/{name}" for name in CLIENT_METHODS]
    server = grpc.aio.server(
        interceptors=[LoadInterceptor(load, transfers), RequestIdInterceptor(),
                      *_tracing_interceptors("hixl.daemon")],
        options=SERVER_OPTIONS,
        maximum_concurrent_rpcs=max_concurrent_rpcs)
    client_pb2_grpc.add_ClientServicer_to_server(client, generic_only(server))
    admin_pb2_grpc.add_AdminServicer_to_server(admin, generic_only(server))
    _add_common(server, healths, (CLIENT_NAME, ADMIN_NAME))
    return server


def add_port(server: grpc.aio.Server, address: str, what: str,
             credentials: grpc.ServerCredentials | None) -> int:
    """Bind ``address`` now (gRPC binds when the port is added), or refuse the start."""
    try:
        if credentials is not None:
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise refuse_busy_port(what, address, exc) from None
    if port == 0 and not address.startswith("unix:"):
        raise refuse_busy_port(what, address, RuntimeError("bind failed"))
    return port


def _add_common(server: grpc.aio.Server, healths: Health, services: tuple[str, ...]) -> None:
    health_pb2_grpc.add_HealthServicer_to_server(healths.servicer(services),
                                                 generic_only(server))
    enable_reflection(server, (*services, health.SERVICE_NAME))


def _tracing_interceptors(prefix: str) -> list[grpc.aio.ServerInterceptor]:
    """The span-making interceptor while tracing is on; none otherwise (no cost)."""
    return [tracing.TracingInterceptor(prefix)] if tracing.ENABLED else []
