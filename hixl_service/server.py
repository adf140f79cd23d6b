"""The process shell: listeners, health, reflection, signals, drain.

Two grpc.aio servers share one event loop: the client server (unix socket,
optionally TCP) carries the Client and Admin services, the peer server (TCP)
carries the Peer service only, so that nothing of sessions or clients
reaches peers. Both carry health and reflection, so ``grpcurl`` works on
every listener; with ``security.mode = "mtls"`` every TCP listener requires
client certificates (``trust``), and listeners are checked before they
start (``listeners``). Readiness (ready file, sd_notify) is announced only once
everything listens; SIGTERM/SIGINT stop taking work, end sessions, and free
the pools before the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
from pathlib import Path

import grpc.aio
import hixl_native
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from hixl_wire._proto.hixl.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    client_pb2,
    client_pb2_grpc,
    peer_pb2,
    peer_pb2_grpc,
)
from hixl_wire.defaults import default_runtime_dir
from hixl_wire.lane import CLIENT_METHODS

from . import __version__, _systemd
from .ascend.backend import AscendBackend
from .ascend.comms import host_address
from .ascend.pools import AscendMemory
from .completions import CompletionDispatcher
from .config import DaemonConfig
from .copier import Copier
from .engine import Engine, EngineDeps
from .fd_server import FdServer
from .inbound import LeaseSettings
from .interceptors import (
    LoadInterceptor,
    RequestIdInterceptor,
    generic_only,
    install_log_record_factory,
)
from .lane_server import LaneServer
from .listeners import (
    StartRefused,
    check_exposure,
    clear_stale_socket,
    prepare_socket_dir,
    refuse_busy_port,
    socket_umask,
    unlink_all,
)
from .load import TransferLoad
from .memory.host import HostMemory
from .outbound import LinkerSettings
from .peer_api import PeerApi
from .peer_client import PeerClient
from .pools import PoolManager
from .servicer_admin import AdminServicer
from .servicer_client import ClientServicer
from .servicer_peer import PeerServicer
from .trust import Trust

logger = logging.getLogger(__name__)

SERVICE_NAMES = {
    "client": (client_pb2.DESCRIPTOR.services_by_name["Client"].full_name,),
    "peer": (peer_pb2.DESCRIPTOR.services_by_name["Peer"].full_name,),
}
ADMIN_NAME = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name
# gRPC turns SO_REUSEPORT on by default: a second daemon could then bind a
# port already served, and a port-0 bind could even be handed one, so peers
# would be split between two daemons at random.
SERVER_OPTIONS = (("grpc.so_reuseport", 0),)


def _add_common(server: grpc.aio.Server, health_servicer: health.aio.HealthServicer,
                services: tuple[str, ...]) -> None:
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, generic_only(server))
    reflection.enable_server_reflection(
        (*services, health.SERVICE_NAME, reflection.SERVICE_NAME), server)


def _add_port(server: grpc.aio.Server, address: str, what: str,
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


def _write_ready_file(path: Path, record: dict[str, object]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


class Daemon:
    """Everything one running daemon owns, started and stopped in order."""

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.daemon_id = secrets.token_hex(8)
        server_cfg = config.server
        self.socket_path = server_cfg.client_socket
        runtime = self.socket_path.parent if self.socket_path else default_runtime_dir()
        self.fd_path = runtime / f"hixl-{self.daemon_id}.fds.sock"
        self.lane_path = runtime / f"hixl-{self.daemon_id}.lane.sock"
        self.advertise_host = server_cfg.effective_advertise_host
        self._peers: dict[str, PeerClient] = {}
        self._stop = asyncio.Event()
        # Set once every listener serves; ``peer_address`` is known from then on.
        self.ready = asyncio.Event()
        self.peer_address = ""

    def _peer(self, address: str) -> PeerApi:
        client = self._peers.get(address)
        if client is None:
            client = self._peers[address] = PeerClient(address, __version__, self.trust)
        return client

    def stop(self) -> None:
        """Begin the graceful stop that SIGTERM begins."""
        self._stop.set()

    async def run(self, handle_signals: bool = True) -> None:
        """Serve until stopped; ``handle_signals=False`` leaves SIGTERM and SIGINT
        to the caller (a daemon run inside a test process)."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        # Refusals (exit 2) come before anything listens.
        check_exposure(cfg)
        self.trust = trust = Trust(cfg.security, cfg.limits)
        prepare_socket_dir(self.fd_path.parent)
        ascend: AscendBackend | None = None
        if cfg.pool.backend == "hccl":
            # Raises BackendUnavailable (the process exits 2): never a silent fallback.
            ascend = await asyncio.to_thread(AscendBackend.open, cfg.ascend,
                                             host_address(self.advertise_host))
        # A start that fails part way releases what it had taken (sockets,
        # listeners, the data server) before the error ends the process.
        unwind = contextlib.AsyncExitStack()
        created: list[Path] = []  # sockets to remove if the start fails
        try:
            data_address = f"{cfg.server.peer_host}:{cfg.server.data_port}"
            links = cfg.links
            hixl_native.set_tcp_liveness(links.tcp_keepalive_idle_s,
                                         links.tcp_keepalive_interval_s,
                                         links.tcp_keepalive_count,
                                         int(links.tcp_user_timeout_s * 1000))
            try:
                data_server = await asyncio.to_thread(
                    hixl_native.DataServer, cfg.server.peer_host, cfg.server.data_port,
                    cfg.limits.max_data_connections)
            except hixl_native.NativeError as exc:
                raise refuse_busy_port("the data plane", data_address, exc) from None
            unwind.callback(data_server.close)
            pools = PoolManager(HostMemory(int(cfg.pool.max_bytes), cfg.pool.populate,
                                           ascend.pin_host if ascend is not None else None),
                                AscendMemory(ascend) if ascend is not None else None)
            load = TransferLoad()
            dispatcher = CompletionDispatcher(loop, load)
            self.engine = engine = Engine(EngineDeps(
                daemon_id=self.daemon_id, version=__version__, pools=pools,
                data_server=data_server, data_host=self.advertise_host,
                peer_factory=self._peer,
                copier=Copier(cfg.transfer.copy_threads, dispatcher, ascend),
                dispatcher=dispatcher, load=load,
                streams_per_link=cfg.transfer.streams_per_link,
                connect_timeout_s=cfg.transfer.connect_timeout_s,
                backend=cfg.pool.backend, ascend=ascend, trust=trust,
                linker=LinkerSettings(cfg.links.heartbeat_interval_s,
                                      cfg.links.heartbeat_timeout_s, cfg.links.down_after_s),
                leases=LeaseSettings(cfg.links.lease_s, cfg.links.down_after_s,
                                     min(cfg.links.down_after_s, cfg.links.lease_s / 3
                                         + cfg.links.heartbeat_timeout_s))))
            unwind.callback(dispatcher.close)
            unwind.callback(engine.deps.copier.close)  # its threads post to the dispatcher
            health_servicer = health.aio.HealthServicer()
            install_log_record_factory()
            credentials = trust.server_credentials()
            peer_server = grpc.aio.server(interceptors=[RequestIdInterceptor()],
                                          options=SERVER_OPTIONS,
                                          maximum_concurrent_rpcs=cfg.server.max_concurrent_rpcs)
            peer_port = _add_port(peer_server, f"{cfg.server.peer_host}:{cfg.server.peer_port}",
                                  "the peer service", credentials)
            peer_address = f"{self.advertise_host}:{peer_port}"
            fd_server = FdServer(self.fd_path, pools.take_fd, engine.caches.add_user_buffer)
            created.append(self.fd_path)
            with socket_umask():
                await fd_server.start()
            unwind.push_async_callback(fd_server.close)
            peer_servicer = PeerServicer(engine)
            peer_pb2_grpc.add_PeerServicer_to_server(peer_servicer, generic_only(peer_server))
            peer_lane: LaneServer | None = None
            # The peer lane has no credentials of its own: with authenticated
            # peers its calls go over the (mTLS) gRPC channel instead.
            if cfg.server.peer_lane and trust.mode == "none":
                peer_lane = LaneServer.for_peers(peer_servicer, engine.deps.peer_lane)
                lane_address = f"{cfg.server.peer_host}:{cfg.server.peer_lane_port}"
                try:
                    engine.deps.peer_lane.port = await peer_lane.start_tcp(
                        cfg.server.peer_host, cfg.server.peer_lane_port)
                except OSError as exc:
                    raise refuse_busy_port("the peer lane", lane_address, exc) from None
                unwind.push_async_callback(peer_lane.stop, 0)
            _add_common(peer_server, health_servicer, SERVICE_NAMES["peer"])

            transfers = [f"/{SERVICE_NAMES['client'][0]}/{name}" for name in CLIENT_METHODS]
            client_server = grpc.aio.server(
                interceptors=[LoadInterceptor(load, transfers), RequestIdInterceptor()],
                options=SERVER_OPTIONS,
                maximum_concurrent_rpcs=cfg.server.max_concurrent_rpcs)
            lane_socket = str(self.lane_path) if cfg.server.transfer_lane else ""
            client_servicer = ClientServicer(engine, __version__, str(self.fd_path), lane_socket)
            lane_server: LaneServer | None = None
            if lane_socket:
                lane_server = LaneServer.for_clients(engine, client_servicer)
                created.append(self.lane_path)
                await lane_server.start_unix(self.lane_path)
                unwind.push_async_callback(lane_server.stop, 0)
            client_pb2_grpc.add_ClientServicer_to_server(client_servicer,
                                                         generic_only(client_server))
            admin_pb2_grpc.add_AdminServicer_to_server(
                AdminServicer(engine, cfg.pool.backend, peer_address),
                generic_only(client_server))
            _add_common(client_server, health_servicer, (*SERVICE_NAMES["client"], ADMIN_NAME))
            client_target = ""
            if self.socket_path is not None:
                clear_stale_socket(self.socket_path)
                created.append(self.socket_path)
                with socket_umask():  # 0660 from the start, never chmod'ed once it listens
                    _add_port(client_server, f"unix:{self.socket_path}", "clients", None)
                client_target = f"unix:{self.socket_path}"
            if cfg.server.client_tcp:
                port = _add_port(client_server, cfg.server.client_tcp, "clients over TCP",
                                 credentials)
                host = cfg.server.client_tcp.rsplit(':', 1)[0]
                client_target = client_target or f"{host}:{port}"

            await peer_server.start()
            unwind.push_async_callback(peer_server.stop, 0)
            await client_server.start()
        except BaseException:
            await unwind.aclose()
            unlink_all(created)
            raise
        for name in ("", *SERVICE_NAMES["client"], *SERVICE_NAMES["peer"], ADMIN_NAME):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop.set)
        record = {"pid": os.getpid(), "client_target": client_target,
                  "peer_address": peer_address,
                  "data_address": f"{self.advertise_host}:{data_server.port}",
                  "daemon_id": self.daemon_id}
        if cfg.server.ready_file is not None:
            _write_ready_file(cfg.server.ready_file, record)
        _systemd.notify("READY=1\nSTATUS=serving")
        logger.info("hixl-serviced %s ready: clients %s, peers %s, data %s", __version__,
                    client_target, peer_address, record["data_address"])
        self.peer_address = peer_address
        engine.monitor.start()
        self.ready.set()

        await self._stop.wait()

        logger.info("stopping: draining sessions and transfers")
        _systemd.notify("STOPPING=1")
        await health_servicer.enter_graceful_shutdown()
        client_servicer.stop_sessions()
        grace = cfg.server.grace_period_s
        lanes = [lane.stop(grace) for lane in (lane_server, peer_lane) if lane is not None]
        await asyncio.gather(client_server.stop(grace), peer_server.stop(grace), *lanes)
        await client_servicer.wait_cleanups()
        await engine.close()
        await fd_server.close()
        for peer in self._peers.values():
            await peer.close()
        await asyncio.to_thread(data_server.close)
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)
        if cfg.server.ready_file is not None:
            cfg.server.ready_file.unlink(missing_ok=True)
        logger.info("stopped")


__all__ = ["Daemon", "StartRefused", "run_daemon"]


async def run_daemon(config: DaemonConfig) -> None:
    """Run a daemon until SIGTERM or SIGINT, then stop it cleanly."""
    await Daemon(config).run()
