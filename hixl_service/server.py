"""The process shell: listeners, health, reflection, signals, drain.

Two grpc.aio servers share one event loop: the client server (unix socket,
optionally TCP) carries the Client and Admin services, the peer server (TCP)
carries the Peer service only, so that nothing of sessions or clients
reaches peers (a cluster whose options name listen_ip_info gets a Peer
server of its own there, built the same way: ``cluster_listeners``). Both
carry health (each answering for its own services only) and reflection (v1
and v1alpha), so ``grpcurl`` works on every listener; with
``security.mode = "mtls"`` every TCP listener requires client certificates
(``trust``), and listeners are checked before they start (``listeners``).
Readiness (ready file, sd_notify) is announced only once everything listens.
SIGTERM, SIGINT and ``Admin/Drain`` begin the drain (``drain``): new
sessions, links and transfers are refused, the transfers and layer-wise tasks
in flight get ``server.grace_period_s`` to end, then the sessions end (their
links closed, peers told) and the pools are freed; the process exits 0. Every
way out of :meth:`Daemon.run` removes the sockets it created; a refused start
creates none. Under systemd a task on the loop sends watchdog pings and
``STATUS=`` lines; SIGHUP reloads what can be reloaded (``reload``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import grpc.aio
import hixl_native
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

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

from . import __version__, _systemd, tracing
from .ascend.backend import AscendBackend
from .ascend.comms import host_address
from .ascend.pools import AscendMemory
from .cluster_listeners import DaemonPort, PeerListeners
from .completions import CompletionDispatcher
from .config import ConfigError, DaemonConfig, load_config
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
    check_start,
    clear_stale_socket,
    prepare_socket_dir,
    refuse_busy_port,
    socket_umask,
    unlink_all,
)
from .load import TransferLoad
from .memory.host import HostMemory
from .memory.process import cross_memory_policy
from .metrics import MetricsServer, check_metrics_exposure
from .outbound import LinkerSettings
from .peer_api import PeerApi
from .peer_client import PeerClient
from .pools import PoolManager
from .reflection import enable_reflection
from .reload import ReloadPlan, apply_reload, plan_reload
from .servicer_admin import AdminFacts, AdminServicer, summary
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


class _Health:
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


def _add_common(server: grpc.aio.Server, healths: _Health, services: tuple[str, ...]) -> None:
    health_pb2_grpc.add_HealthServicer_to_server(healths.servicer(services),
                                                 generic_only(server))
    enable_reflection(server, (*services, health.SERVICE_NAME))


def _peer_server(cfg: DaemonConfig, servicer: PeerServicer,
                 health_servicer: _Health) -> grpc.aio.Server:
    """A server of the Peer service, no port yet: the daemon's peer port and every
    cluster's own listener (``cluster_listeners``) are built here, so they cannot
    differ in what they serve."""
    server = grpc.aio.server(interceptors=[RequestIdInterceptor(),
                                           *_tracing_interceptors("hixl.peer")],
                             options=SERVER_OPTIONS,
                             maximum_concurrent_rpcs=cfg.server.max_concurrent_rpcs)
    peer_pb2_grpc.add_PeerServicer_to_server(servicer, generic_only(server))
    _add_common(server, health_servicer, SERVICE_NAMES["peer"])
    return server


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


def _tracing_interceptors(prefix: str) -> list[grpc.aio.ServerInterceptor]:
    """The span-making interceptor while tracing is on; none otherwise (no cost)."""
    return [tracing.TracingInterceptor(prefix)] if tracing.ENABLED else []


def _write_ready_file(path: Path, record: dict[str, object]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


class Daemon:
    """Everything one running daemon owns, started and stopped in order."""

    def __init__(self, config: DaemonConfig, config_path: Path | None = None) -> None:
        self.config = config
        self.config_path = config_path  # read again on SIGHUP
        self._reload_lock = asyncio.Lock()
        self._reload_when_ready = False
        self._background: set[asyncio.Task[object]] = set()
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
        """Begin the graceful stop that SIGTERM begins (the drain)."""
        self._stop.set()

    def _handle_signals(self, loop: asyncio.AbstractEventLoop, on: bool) -> None:
        # From the start on: a stop asked for while starting drains once
        # serving, and SIGHUP (whose default would end the process) reloads.
        for sig in (signal.SIGTERM, signal.SIGINT):
            if on:
                loop.add_signal_handler(sig, self.stop)
            else:
                loop.remove_signal_handler(sig)
        if on:
            loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
        else:
            loop.remove_signal_handler(signal.SIGHUP)

    # -- systemd and SIGHUP (README "Operating hixl") ---------------------------

    def _in_background(self, coro: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _on_sighup(self) -> None:
        # Handled from the start of run(): SIGHUP's default action would end
        # the process. One that comes while the daemon starts is served once
        # it is ready (the file may have changed after it was read).
        if self.ready.is_set():
            self._in_background(self.reload())
        else:
            logger.info("SIGHUP while starting: reloading once the daemon is ready")
            self._reload_when_ready = True

    async def reload(self) -> ReloadPlan | None:
        """Read the configuration again and apply what a running daemon can (SIGHUP).

        See ``reload``: the log level, ``[limits]``, the allow-list and the
        checksum default change now, other changes are logged as needing a
        restart. Returns the plan,
        or None when the configuration did not load (logged; nothing changes).
        """
        async with self._reload_lock:
            _systemd.notify(f"RELOADING=1\nMONOTONIC_USEC={_systemd.monotonic_usec()}\n"
                            "STATUS=reloading the configuration")
            plan: ReloadPlan | None = None
            try:
                loaded = await asyncio.to_thread(load_config, self.config_path)
            except ConfigError as exc:
                logger.error("reload refused, the running configuration stays: %s", exc)
            else:
                plan = plan_reload(self.config, loaded)
                apply_reload(plan, self.trust, self.engine.deps)
                self.config = plan.config
            _systemd.notify(f"READY=1\nSTATUS={summary(self.engine)}")
            return plan

    async def run(self, handle_signals: bool = True) -> None:
        """Serve until stopped; ``handle_signals=False`` leaves SIGTERM and SIGINT
        to the caller (a daemon run inside a test process)."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        # Refusals (exit 2) come before anything listens or is created.
        check_start(cfg)
        check_metrics_exposure(cfg.metrics)
        self.trust = Trust(cfg.security, cfg.limits)
        prepare_socket_dir(self.fd_path.parent)
        if handle_signals:
            self._handle_signals(loop, on=True)
        created: list[Path] = []  # sockets and the ready file: removed on every way out
        try:
            await self._run(cfg, loop, created)
        finally:
            unlink_all(created)
            if handle_signals:
                self._handle_signals(loop, on=False)

    async def _run(self, cfg: DaemonConfig, loop: asyncio.AbstractEventLoop,
                   created: list[Path]) -> None:
        trust = self.trust
        ascend: AscendBackend | None = None
        if cfg.pool.backend == "hccl":
            # Raises BackendUnavailable (the process exits 2): never a silent fallback.
            ascend = await asyncio.to_thread(AscendBackend.open, cfg.ascend,
                                             host_address(self.advertise_host))
        # A start that fails part way releases what it had taken (sockets,
        # listeners, the data server) before the error ends the process.
        unwind = contextlib.AsyncExitStack()
        try:
            # branch metrics: off by default; one tracing configuration per process
            tracing.configure(cfg.tracing, self.daemon_id)
            data_address = f"{cfg.server.peer_host}:{cfg.server.data_port}"
            links = cfg.links
            hixl_native.set_tcp_liveness(links.tcp_keepalive_idle_s,
                                         links.tcp_keepalive_interval_s,
                                         links.tcp_keepalive_count,
                                         int(links.tcp_user_timeout_s * 1000))
            hixl_native.set_link_threads(cfg.transfer.data_threads)
            try:
                data_server = await asyncio.to_thread(
                    hixl_native.DataServer, cfg.server.peer_host, cfg.server.data_port,
                    cfg.limits.max_data_connections, cfg.transfer.data_threads)
            except hixl_native.NativeError as exc:
                raise refuse_busy_port("the data plane", data_address, exc) from None
            unwind.callback(data_server.close)
            pools = PoolManager(HostMemory(int(cfg.pool.max_bytes), cfg.pool.populate,
                                           ascend.pin_host if ascend is not None else None),
                                AscendMemory(ascend) if ascend is not None else None)
            load = TransferLoad()
            # xmem: engine-allocated client memory, as far as the kernel allows it.
            cross_memory = cross_memory_policy()
            if ascend is None:
                logger.info("engine-allocated client memory: %s", cross_memory.summary())
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
                cross_memory=cross_memory,
                bounce_buffers=cfg.transfer.bounce_buffers,
                bounce_buffer_bytes=int(cfg.transfer.bounce_buffer_bytes),
                checksum=cfg.transfer.checksum,
                linker=LinkerSettings(cfg.links.heartbeat_interval_s,
                                      cfg.links.heartbeat_timeout_s, cfg.links.down_after_s),
                leases=LeaseSettings(cfg.links.lease_s, cfg.links.down_after_s,
                                     min(cfg.links.down_after_s, cfg.links.lease_s / 3
                                         + cfg.links.heartbeat_timeout_s))))
            unwind.callback(dispatcher.close)
            unwind.callback(engine.deps.copier.close)  # its threads post to the dispatcher
            health_servicer = _Health()
            install_log_record_factory()
            credentials = trust.server_credentials()
            peer_servicer = PeerServicer(engine)
            peer_server = _peer_server(cfg, peer_servicer, health_servicer)
            peer_port = _add_port(peer_server, f"{cfg.server.peer_host}:{cfg.server.peer_port}",
                                  "the peer service", credentials)
            peer_address = f"{self.advertise_host}:{peer_port}"
            engine.listeners = PeerListeners(
                lambda cluster_id: _peer_server(cfg, PeerServicer(engine, cluster_id),
                                                health_servicer),
                credentials, trust.mode, cfg.security.insecure,
                DaemonPort(cfg.server.peer_host, self.advertise_host, peer_port))
            fd_server = FdServer(self.fd_path, pools.take_fd, engine.caches.add_user_buffer,
                                 engine.caches.bind_process, engine.caches.drop_user_buffer)
            created.append(self.fd_path)
            with socket_umask():
                await fd_server.start()
            unwind.push_async_callback(fd_server.close)
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

            transfers = [f"/{SERVICE_NAMES['client'][0]}/{name}" for name in CLIENT_METHODS]
            client_server = grpc.aio.server(
                interceptors=[LoadInterceptor(load, transfers), RequestIdInterceptor(),
                              *_tracing_interceptors("hixl.daemon")],
                options=SERVER_OPTIONS,
                maximum_concurrent_rpcs=cfg.server.max_concurrent_rpcs)
            lane_socket = str(self.lane_path) if cfg.server.transfer_lane else ""
            client_servicer = ClientServicer(engine, __version__, str(self.fd_path), lane_socket,
                                            peer_address)
            lane_server: LaneServer | None = None
            if lane_socket:
                lane_server = LaneServer.for_clients(engine, client_servicer)
                created.append(self.lane_path)
                await lane_server.start_unix(self.lane_path)
                unwind.push_async_callback(lane_server.stop, 0)
            client_pb2_grpc.add_ClientServicer_to_server(client_servicer,
                                                         generic_only(client_server))
            # branch metrics: /metrics, bound here so that a busy port refuses the start
            metrics: MetricsServer | None = None
            if cfg.metrics.listen is not None:
                metrics = MetricsServer.start(cfg.metrics, engine, loop, __version__)
                unwind.callback(metrics.close)
            admin_facts = AdminFacts(cfg.pool.backend, peer_address,
                                     metrics.address if metrics is not None else "",
                                     lane_socket)
            admin_pb2_grpc.add_AdminServicer_to_server(
                AdminServicer(engine, cfg.pool.backend, peer_address, admin_facts, self.stop,
                              cfg.server.grace_period_s),
                generic_only(client_server))
            _add_common(client_server, health_servicer, (*SERVICE_NAMES["client"], ADMIN_NAME))
            client_target = ""
            if self.socket_path is not None:
                clear_stale_socket(self.socket_path)  # checked at the start; gone since?
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
            await asyncio.to_thread(tracing.shutdown)
            raise
        await health_servicer.serving()
        record = {"pid": os.getpid(), "client_target": client_target,
                  "peer_address": peer_address,
                  "data_address": f"{self.advertise_host}:{data_server.port}",
                  "daemon_id": self.daemon_id}
        if metrics is not None:
            record["metrics_address"] = metrics.address
        if cfg.server.ready_file is not None:
            _write_ready_file(cfg.server.ready_file, record)
            created.append(cfg.server.ready_file)
        _systemd.notify("READY=1\nSTATUS=serving")
        logger.info("hixl-serviced %s ready: clients %s, peers %s, data %s%s", __version__,
                    client_target, peer_address, record["data_address"],
                    f", metrics http://{metrics.address}/metrics" if metrics else "")
        self.peer_address = peer_address
        engine.monitor.start()
        self.ready.set()
        self._in_background(_systemd.keep_alive(lambda: summary(engine),
                                                _systemd.watchdog_interval()))
        if self._reload_when_ready:
            self._in_background(self.reload())

        await self._stop.wait()
        for task in self._background:
            task.cancel()

        # The drain (drain.py): refuse new work, let what runs end, then stop.
        grace = cfg.server.grace_period_s
        deadline = loop.time() + grace
        engine.begin_drain()
        _systemd.notify("STOPPING=1\nSTATUS=draining")
        logger.info("draining: refusing new sessions, links and transfers; %s in flight get "
                    "up to %g s to end", engine.drain.in_flight(), grace)
        await health_servicer.enter_graceful_shutdown()
        if not await engine.drain.wait_idle(grace):
            logger.warning("grace_period_s (%g s) is over with %s still running: they are "
                           "cancelled", grace, engine.drain.in_flight())
        # Linking daemons hear of the stop from their heartbeats' answers, so
        # their links go down at once, with the reason, instead of timing out.
        told_bound = min(max(0.0, deadline - loop.time()),
                         engine.inbound.leases.lease_s / 3 + 1.0)
        if not await engine.inbound.wait_told_of_stop(told_bound):
            logger.warning("%d linking daemons did not heartbeat within %.1f s of the drain: "
                           "their links end when their leases do",
                           engine.inbound.untold_of_stop(), told_bound)
        client_servicer.stop_sessions()  # their links close, the peers told
        left = max(0.0, deadline - loop.time())
        lanes = [lane.stop(left) for lane in (lane_server, peer_lane) if lane is not None]
        await asyncio.gather(client_server.stop(left), peer_server.stop(left), *lanes)
        await client_servicer.wait_cleanups()
        await engine.close()
        await fd_server.close()
        for peer in self._peers.values():
            await peer.close()
        await asyncio.to_thread(data_server.close)
        if metrics is not None:
            await asyncio.to_thread(metrics.close)
        await asyncio.to_thread(tracing.shutdown)
        logger.info("stopped")


__all__ = ["Daemon", "StartRefused", "run_daemon"]


async def run_daemon(config: DaemonConfig, config_path: Path | None = None) -> None:
    """Run a daemon until SIGTERM or SIGINT, then stop it cleanly; SIGHUP reloads
    ``config_path`` (and the environment)."""
    await Daemon(config, config_path).run()
