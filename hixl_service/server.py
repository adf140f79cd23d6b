"""The process shell: build, serve, drain; listeners, signals, readiness.

:meth:`Daemon.run` refuses a start that cannot work before anything exists
(``listeners.check_start``), then runs three steps, each its own method:

* build (``_start``): the backend ``pool.backend`` names (``backends``: pools,
  copier, transport kit), the data server and the engine, then every
  listener bound one after the other, so a busy port refuses the start; a
  start that fails part way undoes what it had done.
* serve (``_serve``): readiness (health, ready file, sd_notify) is
  announced only once everything listens; then it waits for a stop.
* drain (``_drain``): SIGTERM, SIGINT and ``Admin/Drain`` begin it
  (``drain``): new sessions, links and transfers are refused, the transfers
  and layer-wise tasks in flight get ``server.grace_period_s`` to end, then
  the sessions end (their links closed, peers told) and the pools are
  freed; the process exits 0.

Two kinds of grpc.aio servers share the event loop (``grpc_servers``): the
client server (unix socket, optionally TCP) carries the Client and Admin
services, the peer server (TCP) the Peer service only, so that nothing of
sessions or clients reaches peers (a cluster whose options name
listen_ip_info gets a Peer server of its own there: ``cluster_listeners``).
Both carry health and reflection, so ``grpcurl`` works on every listener;
with ``security.mode = "mtls"`` every TCP listener requires client
certificates (``trust``). Every way out of :meth:`Daemon.run` removes the
sockets it created; a refused start creates none. Under systemd a task on
the loop sends watchdog pings and ``STATUS=`` lines; SIGHUP reloads what can
be reloaded (``reload``).
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import hixl_native

from hixl_wire.defaults import default_runtime_dir

from . import __version__, _systemd, tracing
from .backends import Backend, open_backend
from .cluster_listeners import DaemonPort, PeerListeners
from .completions import CompletionDispatcher
from .config import ConfigError, DaemonConfig, load_config
from .engine import Engine, EngineDeps
from .fd_server import FdServer
from .grpc_servers import Health, add_port, client_server, peer_server
from .inbound import LeaseSettings
from .interceptors import install_log_record_factory
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
from .metrics import MetricsServer, check_metrics_exposure
from .outbound import LinkerSettings
from .peer_api import PeerApi
from .peer_client import PeerClient
from .reload import ReloadPlan, apply_reload, plan_reload
from .servicer_admin import AdminFacts, AdminServicer, summary
from .servicer_client import ClientServicer
from .servicer_peer import PeerServicer
from .trust import Trust

logger = logging.getLogger(__name__)


@dataclass
class _Running:
    """What a started daemon serves with, and its drain stops."""

    engine: Engine
    health: Health
    fd_server: FdServer
    client_servicer: ClientServicer
    client_server: grpc.aio.Server
    peer_server: grpc.aio.Server
    lanes: list[LaneServer]  # the transfer lane and the peer lane, those that run
    metrics: MetricsServer | None
    client_target: str
    peer_address: str

    def ready_record(self) -> dict[str, object]:
        """What the ready file says (``server.ready_file``)."""
        record: dict[str, object] = {
            "pid": os.getpid(), "client_target": self.client_target,
            "peer_address": self.peer_address,
            "data_address": f"{self.engine.deps.data_host}:"
                            f"{self.engine.deps.data_server.port}",
            "daemon_id": self.engine.daemon_id}
        if self.metrics is not None:
            record["metrics_address"] = self.metrics.address
        return record


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

    # -- systemd and SIGHUP (docs/operating.md) -------------------------------

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
                # Before the new settings apply (and are logged): a native lane
                # runs no repeat prepared under the old checksum default after.
                self.engine.native.revoke_all()
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
        running = await self._start(cfg, loop, created)
        await self._serve(cfg, running, created)
        await self._drain(cfg, loop, running)

    # -- build: every part, then every listener ----------------------------------

    async def _start(self, cfg: DaemonConfig, loop: asyncio.AbstractEventLoop,
                     created: list[Path]) -> _Running:
        """Build the engine and start every listener. A start that fails part way
        releases what it had taken (sockets, listeners, the data server, the copy
        threads) before the error ends the process."""
        unwind = contextlib.AsyncExitStack()
        try:
            engine = await self._build_engine(cfg, loop, unwind)
            return await self._listen(cfg, engine, loop, created, unwind)
        except BaseException:
            await unwind.aclose()
            await asyncio.to_thread(tracing.shutdown)
            raise

    async def _build_engine(self, cfg: DaemonConfig, loop: asyncio.AbstractEventLoop,
                            unwind: contextlib.AsyncExitStack) -> Engine:
        load = TransferLoad()
        dispatcher = CompletionDispatcher(loop, load)
        unwind.callback(dispatcher.close)
        # First, before anything listens: BackendUnavailable ends the process
        # with exit 2, never a silent fallback.
        backend = await open_backend(cfg, dispatcher, self.advertise_host)
        unwind.callback(backend.copier.close)  # its threads post to the dispatcher
        # branch metrics: off by default; one tracing configuration per process
        tracing.configure(cfg.tracing, self.daemon_id)
        data_server = await _start_data_server(cfg)
        unwind.callback(data_server.close)
        self.engine = Engine(self._engine_deps(cfg, backend, data_server, load))
        return self.engine

    def _engine_deps(self, cfg: DaemonConfig, backend: Backend,
                     data_server: hixl_native.DataServer, load: TransferLoad) -> EngineDeps:
        links, transfer = cfg.links, cfg.transfer
        return EngineDeps(
            daemon_id=self.daemon_id, version=__version__, pools=backend.pools,
            data_server=data_server, data_host=self.advertise_host,
            peer_factory=self._peer, kit=backend.kit, load=load,
            connect_timeout_s=transfer.connect_timeout_s,
            backend=backend.name, ascend=backend.ascend, trust=self.trust,
            process=backend.process,
            checksum=transfer.checksum,
            linker=LinkerSettings(links.heartbeat_interval_s, links.heartbeat_timeout_s,
                                  links.down_after_s),
            leases=LeaseSettings(links.lease_s, links.down_after_s,
                                 min(links.down_after_s,
                                     links.lease_s / 3 + links.heartbeat_timeout_s)))

    async def _listen(self, cfg: DaemonConfig, engine: Engine,
                      loop: asyncio.AbstractEventLoop, created: list[Path],
                      unwind: contextlib.AsyncExitStack) -> _Running:
        """Bind every listener, one after the other (a busy port refuses the start),
        then start the gRPC servers."""
        health = Health()
        install_log_record_factory()
        credentials = self.trust.server_credentials()
        peer_servicer = PeerServicer(engine)
        peer_server, peer_address = self._peer_listeners(cfg, engine, peer_servicer, health,
                                                         credentials)
        fd_server = await self._start_fd_server(engine, created, unwind)
        lanes = [await self._start_peer_lane(cfg, engine, peer_servicer, unwind)]
        lane_socket = str(self.lane_path) if cfg.server.transfer_lane else ""
        client_servicer = ClientServicer(engine, __version__, str(self.fd_path), lane_socket,
                                        peer_address)
        if lane_socket:
            lanes.append(await self._start_transfer_lane(engine, client_servicer, created,
                                                         unwind))
        # branch metrics: /metrics, bound here so that a busy port refuses the start
        metrics: MetricsServer | None = None
        if cfg.metrics.listen is not None:
            metrics = MetricsServer.start(cfg.metrics, engine, loop, __version__)
            unwind.callback(metrics.close)
        facts = AdminFacts(cfg.pool.backend, peer_address,
                           metrics.address if metrics is not None else "", lane_socket)
        client_server = self._client_server(cfg, engine, client_servicer, facts, health)
        client_target = self._bind_clients(cfg, client_server, credentials, created)
        await peer_server.start()
        unwind.push_async_callback(peer_server.stop, 0)
        await client_server.start()
        return _Running(engine, health, fd_server, client_servicer, client_server, peer_server,
                        [lane for lane in lanes if lane is not None], metrics, client_target,
                        peer_address)

    def _peer_listeners(self, cfg: DaemonConfig, engine: Engine, servicer: PeerServicer,
                        health: Health, credentials: grpc.ServerCredentials | None
                        ) -> tuple[grpc.aio.Server, str]:
        """The daemon's peer server, its port bound, and its address for peers; the
        clusters' own listeners are built the same way (``cluster_listeners``)."""
        server_cfg = cfg.server
        rpcs = server_cfg.max_concurrent_rpcs
        server = peer_server(rpcs, servicer, health)
        port = add_port(server, f"{server_cfg.peer_host}:{server_cfg.peer_port}",
                        "the peer service", credentials)
        engine.listeners = PeerListeners(
            lambda cluster_id: peer_server(rpcs, PeerServicer(engine, cluster_id), health),
            credentials, self.trust.mode, cfg.security.insecure,
            DaemonPort(server_cfg.peer_host, self.advertise_host, port))
        return server, f"{self.advertise_host}:{port}"

    async def _start_fd_server(self, engine: Engine, created: list[Path],
                               unwind: contextlib.AsyncExitStack) -> FdServer:
        caches = engine.caches
        fd_server = FdServer(self.fd_path, engine.pools.take_fd, caches.add_user_buffer,
                             caches.bind_process, caches.drop_user_buffer)
        created.append(self.fd_path)
        with socket_umask():
            await fd_server.start()
        unwind.push_async_callback(fd_server.close)
        return fd_server

    async def _start_peer_lane(self, cfg: DaemonConfig, engine: Engine,
                               servicer: PeerServicer,
                               unwind: contextlib.AsyncExitStack) -> LaneServer | None:
        """The peer lane, where ``server.peer_lane`` asks for it; None otherwise."""
        # The peer lane has no credentials of its own: with authenticated
        # peers its calls go over the (mTLS) gRPC channel instead.
        if not cfg.server.peer_lane or self.trust.mode != "none":
            return None
        host, port = cfg.server.peer_host, cfg.server.peer_lane_port
        info = engine.deps.peer_lane
        lane = LaneServer.for_peers(servicer, info)
        try:
            info.port = await lane.start_tcp(host, port)
        except OSError as exc:
            raise refuse_busy_port("the peer lane", f"{host}:{port}", exc) from None
        unwind.push_async_callback(lane.stop, 0)
        return lane

    async def _start_transfer_lane(self, engine: Engine, servicer: ClientServicer,
                                   created: list[Path],
                                   unwind: contextlib.AsyncExitStack) -> LaneServer:
        lane = LaneServer.for_clients(engine, servicer)
        created.append(self.lane_path)
        await lane.start_unix(self.lane_path)
        unwind.push_async_callback(lane.stop, 0)
        return lane

    def _client_server(self, cfg: DaemonConfig, engine: Engine, servicer: ClientServicer,
                       facts: AdminFacts, health: Health) -> grpc.aio.Server:
        admin = AdminServicer(engine, cfg.pool.backend, facts.peer_address, facts, self.stop,
                              cfg.server.grace_period_s)
        return client_server(cfg.server.max_concurrent_rpcs, engine.deps.load, servicer,
                             admin, health)

    def _bind_clients(self, cfg: DaemonConfig, server: grpc.aio.Server,
                      credentials: grpc.ServerCredentials | None, created: list[Path]) -> str:
        """Bind the client socket and ``server.client_tcp``; the target clients use."""
        target = ""
        if self.socket_path is not None:
            clear_stale_socket(self.socket_path)  # checked at the start; gone since?
            created.append(self.socket_path)
            with socket_umask():  # 0660 from the start, never chmod'ed once it listens
                add_port(server, f"unix:{self.socket_path}", "clients", None)
            target = f"unix:{self.socket_path}"
        if cfg.server.client_tcp:
            port = add_port(server, cfg.server.client_tcp, "clients over TCP", credentials)
            host = cfg.server.client_tcp.rsplit(':', 1)[0]
            target = target or f"{host}:{port}"
        return target

    # -- serve: announce readiness, wait for the stop ------------------------------

    async def _serve(self, cfg: DaemonConfig, running: _Running, created: list[Path]) -> None:
        await running.health.serving()
        record = running.ready_record()
        if cfg.server.ready_file is not None:
            _write_ready_file(cfg.server.ready_file, record)
            created.append(cfg.server.ready_file)
        _systemd.notify("READY=1\nSTATUS=serving")
        metrics = running.metrics
        logger.info("hixl-serviced %s ready: clients %s, peers %s, data %s%s", __version__,
                    running.client_target, running.peer_address, record["data_address"],
                    f", metrics http://{metrics.address}/metrics" if metrics else "")
        self.peer_address = running.peer_address
        engine = running.engine
        engine.monitor.start()
        self.ready.set()
        self._in_background(_systemd.keep_alive(lambda: summary(engine),
                                                _systemd.watchdog_interval()))
        if self._reload_when_ready:
            self._in_background(self.reload())
        await self._stop.wait()
        for task in self._background:
            task.cancel()

    # -- drain: refuse new work, let what runs end, then stop (drain.py) -----------

    async def _drain(self, cfg: DaemonConfig, loop: asyncio.AbstractEventLoop,
                     running: _Running) -> None:
        grace = cfg.server.grace_period_s
        deadline = loop.time() + grace
        engine = running.engine
        engine.begin_drain()
        _systemd.notify("STOPPING=1\nSTATUS=draining")
        logger.info("draining: refusing new sessions, links and transfers; %s in flight get "
                    "up to %g s to end", engine.drain.in_flight(), grace)
        await running.health.enter_graceful_shutdown()
        if not await engine.drain.wait_idle(grace):
            logger.warning("grace_period_s (%g s) is over with %s still running: they are "
                           "cancelled", grace, engine.drain.in_flight())
        await _tell_linkers(engine, max(0.0, deadline - loop.time()))
        running.client_servicer.stop_sessions()  # their links close, the peers told
        await self._close(running, max(0.0, deadline - loop.time()))
        logger.info("stopped")

    async def _close(self, running: _Running, left_s: float) -> None:
        """Stop the listeners within ``left_s`` (what is left of the grace period), then
        free the engine and everything native."""
        await asyncio.gather(running.client_server.stop(left_s),
                             running.peer_server.stop(left_s),
                             *(lane.stop(left_s) for lane in running.lanes))
        await running.client_servicer.wait_cleanups()
        engine = running.engine
        await engine.close()
        await running.fd_server.close()
        for peer in self._peers.values():
            await peer.close()
        await asyncio.to_thread(engine.deps.data_server.close)
        if running.metrics is not None:
            await asyncio.to_thread(running.metrics.close)
        await asyncio.to_thread(tracing.shutdown)


async def _start_data_server(cfg: DaemonConfig) -> hixl_native.DataServer:
    """The native data plane's settings, and its server bound (a busy port refuses
    the start)."""
    links, server = cfg.links, cfg.server
    hixl_native.set_tcp_liveness(links.tcp_keepalive_idle_s, links.tcp_keepalive_interval_s,
                                 links.tcp_keepalive_count,
                                 int(links.tcp_user_timeout_s * 1000))
    hixl_native.set_link_threads(cfg.transfer.data_threads)
    try:
        return await asyncio.to_thread(
            hixl_native.DataServer, server.peer_host, server.data_port,
            cfg.limits.max_data_connections, cfg.transfer.data_threads)
    except hixl_native.NativeError as exc:
        raise refuse_busy_port("the data plane", f"{server.peer_host}:{server.data_port}",
                               exc) from None


async def _tell_linkers(engine: Engine, bound_s: float) -> None:
    """Wait, at most ``bound_s`` and a third of a lease plus a second, until every
    linking daemon heard of the stop.

    Linking daemons hear of it from their heartbeats' answers, so their links
    go down at once, with the reason, instead of timing out.
    """
    inbound = engine.inbound
    told_bound = min(bound_s, inbound.leases.lease_s / 3 + 1.0)
    if not await inbound.wait_told_of_stop(told_bound):
        logger.warning("%d linking daemons did not heartbeat within %.1f s of the drain: "
                       "their links end when their leases do",
                       inbound.untold_of_stop(), told_bound)


__all__ = ["Daemon", "StartRefused", "run_daemon"]


async def run_daemon(config: DaemonConfig, config_path: Path | None = None) -> None:
    """Run a daemon until SIGTERM or SIGINT, then stop it cleanly; SIGHUP reloads
    ``config_path`` (and the environment)."""
    await Daemon(config, config_path).run()
