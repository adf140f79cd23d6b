"""hixlctl doctor: what stands between this host's daemon and fast, safe transfers.

Each check yields findings (``ok``, ``warn``, ``fail``, or ``info``) that
say what was found and, when it is not ok, what to change:

* configuration: the TOML file (``--config``) and environment load;
* daemon: its Admin service answers on the client socket;
* listeners and socket permissions: the socket directory (the daemon's own
  user, no group or other write: the rules ``listeners`` enforces at start,
  checked again here since they can be loosened later), each socket (0660:
  no access for others), this user's access, and that the peer, data and
  metrics ports accept connections;
* limits of the daemon's process (``/proc/PID/limits`` and its cgroup):
  memlock, nofile, tasks, against what its configuration needs;
* peers (``--peer``): the peer port answers gRPC health;
* links: each link's transport, streams and data path, and its bandwidth by
  a short self-test transfer (``Admin/SelfTest``); it says plainly when a
  slower path was chosen than the one configured (fewer TCP streams than
  ``transfer.streams_per_link``, gRPC where the transfer lane is offered,
  the transfer lane off) or than the hardware offers (HCCL two-sided where
  CANN lacks or refuses the one-sided API), and notes links to a daemon on
  the same host that cross the loopback TCP stack.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hixl_wire._proto.hixl.v1 import admin_pb2, admin_pb2_grpc

from .config import ConfigError, DaemonConfig, load_config
from .tables import render_table
from .transports.base import ONE_SIDED, TCP_STREAMS
from .transports.factory import capabilities_of

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"
_CONNECT_TIMEOUT_S = 3.0
# Sockets are bound 0660 (listeners._SOCKET_UMASK): no access for others.
_SOCKET_OTHER_BITS = 0o007
# Threads and fds the daemon needs beyond its links: grpc, the loop, copy threads.
_BASE_TASKS = 64
_BASE_FILES = 256


@dataclass(frozen=True)
class Finding:
    check: str
    result: str
    detail: str


def _config(path: Path | None) -> tuple[DaemonConfig | None, list[Finding]]:
    try:
        config = load_config(path)
    except ConfigError as exc:
        return None, [Finding("configuration", FAIL, str(exc))]
    source = str(path) if path is not None else "defaults and environment"
    return config, [Finding("configuration", OK, f"valid ({source})")]


def _status(target: str, timeout_s: float) -> tuple[admin_pb2.DaemonStatus | None, Finding]:
    try:
        with grpc.insecure_channel(target) as channel:
            status = admin_pb2_grpc.AdminStub(channel).GetStatus(
                admin_pb2.GetStatusRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        return None, Finding("daemon", FAIL, f"no answer on {target}: {details}")
    return status, Finding("daemon", OK, f"{status.daemon_id} (hixl {status.version}, "
                                         f"pid {status.pid}) answers on {target}")


def _socket_dir(directory: Path, owner_uid: int | None) -> Iterator[Finding]:
    try:
        info = os.lstat(directory)
    except OSError as exc:
        yield Finding("socket directory", FAIL, f"{directory}: {exc.strerror}")
        return
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISDIR(info.st_mode):
        yield Finding("socket directory", FAIL, f"{directory} is not a directory")
    elif owner_uid is not None and info.st_uid != owner_uid:
        yield Finding("socket directory", FAIL,
                      f"{directory} is owned by uid {info.st_uid}, the daemon runs as uid "
                      f"{owner_uid}: another user could replace its sockets")
    elif mode & 0o022:
        yield Finding("socket directory", FAIL,
                      f"{directory} has mode {mode:04o}: group or others may write in it and "
                      f"replace the daemon's sockets; chmod 0750 {directory}")
    else:
        yield Finding("socket directory", OK, f"{directory} mode {mode:04o}, uid {info.st_uid}")


def _socket_file(what: str, path: Path) -> Iterator[Finding]:
    try:
        info = os.stat(path)
    except OSError as exc:
        yield Finding(what, FAIL, f"{path}: {exc.strerror}")
        return
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISSOCK(info.st_mode):
        yield Finding(what, FAIL, f"{path} is not a socket")
    elif mode & _SOCKET_OTHER_BITS:
        yield Finding(what, FAIL, f"{path} has mode {mode:04o}: users outside the daemon's "
                                  f"group may connect; it is bound 0660, chmod 0660 {path}")
    elif not os.access(path, os.R_OK | os.W_OK):
        yield Finding(what, WARN, f"{path} mode {mode:04o}: this user (uid {os.geteuid()}) "
                                  f"may not connect; join the daemon's group")
    else:
        yield Finding(what, OK, f"{path} mode {mode:04o}")


def _tcp_port(what: str, address: str) -> Finding:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), _CONNECT_TIMEOUT_S):
            pass
    except (OSError, ValueError) as exc:
        return Finding(what, FAIL, f"{address} does not accept connections: {exc}")
    return Finding(what, OK, f"{address} accepts connections")


def _metrics(address: str) -> Finding:
    try:
        with urllib.request.urlopen(f"http://{address}/metrics",
                                    timeout=_CONNECT_TIMEOUT_S) as reply:
            up = b"hixl_up 1.0" in reply.read()
    except OSError as exc:
        return Finding("metrics", FAIL, f"http://{address}/metrics: {exc}")
    if not up:
        return Finding("metrics", FAIL, f"http://{address}/metrics answers, but the daemon's "
                                        f"event loop did not (hixl_up is not 1)")
    return Finding("metrics", OK, f"http://{address}/metrics answers")


def _listeners(target: str, status: admin_pb2.DaemonStatus | None) -> Iterator[Finding]:
    owner_uid = _uid_of(status.pid) if status is not None and status.pid else None
    if target.startswith("unix:"):
        client_socket = Path(target[len("unix:"):])
        yield from _socket_dir(client_socket.parent, owner_uid)
        yield from _socket_file("client socket", client_socket)
    if status is None:
        return
    if status.transfer_lane:
        lane = Path(status.transfer_lane)
        yield from _socket_file("transfer lane socket", lane)
        yield from _socket_file("fd socket", lane.with_name(lane.name.replace(".lane.",
                                                                               ".fds.")))
    yield _tcp_port("peer port", status.peer_address)
    yield _tcp_port("data port", status.data_address)
    if status.peer_lane_address:
        yield _tcp_port("peer lane port", status.peer_lane_address)
    if status.metrics_address:
        yield _metrics(status.metrics_address)
    else:
        yield Finding("metrics", INFO, "off (set [metrics] listen to serve /metrics)")


def _uid_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _limits_of(pid: int) -> dict[str, tuple[str, str]]:
    """``/proc/PID/limits``: name -> (soft, hard)."""
    out = {}
    lines = Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]
    for line in lines:
        name, values = line[:26].strip(), line[26:].split()
        if len(values) >= 2:
            out[name] = (values[0], values[1])
    return out


def _cgroup_pids_max(pid: int) -> str | None:
    try:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            parts = line.split(":", 2)
            if parts[0] == "0" or "pids" in parts[1].split(","):
                base = "/sys/fs/cgroup" if parts[0] == "0" else "/sys/fs/cgroup/pids"
                found = Path(base + parts[2]) / "pids.max"
                if found.exists():
                    return found.read_text().strip()
    except OSError:
        pass
    return None


def _number(text: str) -> float:
    return float("inf") if text in ("unlimited", "max") else float(text)


def _threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def _limits(status: admin_pb2.DaemonStatus, config: DaemonConfig | None) -> Iterator[Finding]:
    try:
        limits = _limits_of(status.pid)
        threads = _threads_of(status.pid)
    except OSError as exc:
        yield Finding("limits", WARN, f"cannot read the limits of pid {status.pid}: {exc} "
                                      f"(run doctor as the daemon's user, on its host)")
        return
    links = len(status.links)
    streams = config.transfer.streams_per_link if config is not None else 4
    max_conns = config.limits.max_data_connections if config is not None else 1024
    copy_threads = config.transfer.copy_threads if config is not None else 2
    data_threads = config.transfer.data_threads if config is not None else 16

    files_needed = _BASE_FILES + max_conns + 2 * streams * max(links, 1)
    soft, hard = limits.get("Max open files", ("0", "0"))
    if _number(soft) < files_needed:
        yield Finding("limit nofile", WARN,
                      f"soft {soft} (hard {hard}): the data server may serve "
                      f"limits.max_data_connections = {max_conns} connections and each link "
                      f"holds {streams} streams; raise it to at least {files_needed} "
                      f"(LimitNOFILE= in the unit)")
    else:
        yield Finding("limit nofile", OK, f"soft {soft} (hard {hard})")

    soft, hard = limits.get("Max locked memory", ("0", "0"))
    budget = status.pool_budget_bytes
    if status.backend == "hccl" and _number(soft) < budget:
        yield Finding("limit memlock", WARN,
                      f"soft {soft} bytes (hard {hard}) is below pool.max_bytes = {budget}: "
                      f"host pools pinned for the device cannot all be locked "
                      f"(LimitMEMLOCK=infinity in the unit)")
    else:
        yield Finding("limit memlock", OK,
                      f"soft {soft} (hard {hard})" + ("; host pools are not locked on the "
                                                      "host backend" if status.backend ==
                                                      "host" else ""))

    # Data streams and connections hold no thread: the data plane runs a
    # fixed set on each side (links' workers and watcher, the data server's).
    tasks_needed = _BASE_TASKS + copy_threads + 2 * data_threads + 1
    soft, hard = limits.get("Max processes", ("0", "0"))
    pids_max = _cgroup_pids_max(status.pid)
    ceiling = min(_number(soft), _number(pids_max) if pids_max else float("inf"))
    where = f"RLIMIT_NPROC soft {soft}" + (f", cgroup pids.max {pids_max}" if pids_max else "")
    if ceiling < tasks_needed:
        yield Finding("limit tasks", WARN,
                      f"{where}; the daemon runs {threads} threads and may need up to "
                      f"{tasks_needed} (transfer.data_threads on each side of the data "
                      f"plane, the copy threads); raise TasksMax= / LimitNPROC=")
    else:
        yield Finding("limit tasks", OK, f"{where}; {threads} threads now")


def _peer(address: str, config: DaemonConfig | None) -> Finding:
    credentials = None
    if config is not None and config.security.mode == "mtls":
        from .trust import Trust

        credentials = Trust(config.security, config.limits).channel_credentials()
    try:
        channel = (grpc.secure_channel(address, credentials) if credentials is not None
                   else grpc.insecure_channel(address))
        with channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="hixl.v1.Peer"),
                timeout=_CONNECT_TIMEOUT_S)
    except grpc.RpcError as exc:
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        return Finding(f"peer {address}", FAIL, f"unreachable: {details}")
    state = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return Finding(f"peer {address}", FAIL, f"answers, but hixl.v1.Peer is {state}")
    return Finding(f"peer {address}", OK, "reachable, hixl.v1.Peer SERVING")


def _rate(nbytes: int, seconds: float) -> str:
    if seconds <= 0:
        return "-"
    rate = nbytes / seconds
    for unit in ("B/s", "KiB/s", "MiB/s", "GiB/s"):
        if rate < 1024 or unit == "GiB/s":
            return f"{rate:.1f} {unit}"
        rate /= 1024
    return f"{rate:.1f} GiB/s"


def _is_local_host(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    mine = {"127.0.0.1", "::1"}
    try:
        mine |= {str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        pass
    return bool(addresses & mine) or all(a.startswith("127.") for a in addresses)


def _links(target: str, status: admin_pb2.DaemonStatus, config: DaemonConfig | None,
           self_test_bytes: int, timeout_s: float) -> Iterator[Finding]:
    streams = config.transfer.streams_per_link if config is not None else None
    tests: dict[tuple[int, int], admin_pb2.LinkSelfTest] = {}
    if self_test_bytes > 0 and any(link.direction == "outbound" for link in status.links):
        try:
            with grpc.insecure_channel(target) as channel:
                reply = admin_pb2_grpc.AdminStub(channel).SelfTest(
                    admin_pb2.SelfTestRequest(bytes=self_test_bytes), timeout=timeout_s + 30)
            tests = {(t.local_cluster_id, t.remote_cluster_id): t for t in reply.links}
        except grpc.RpcError as exc:
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            yield Finding("self-test", FAIL, f"Admin/SelfTest failed: {details}")
    if not status.links:
        yield Finding("links", INFO, "no links")
    for link in status.links:
        name = (f"link {link.local_cluster_id}->{link.remote_cluster_id}"
                if link.direction == "outbound" else
                f"link {link.remote_cluster_id}->{link.local_cluster_id} (inbound)")
        state = link.health.state or ("up" if link.alive else "down")
        if link.health.last_error and state != "up":
            state += f" ({link.health.last_error})"
        path = link.transport + (f", {link.streams} streams" if link.streams else "") + (
            f", {link.data_path}" if link.data_path else "")
        if not link.alive or link.health.state in ("down", "closed"):
            yield Finding(name, FAIL, f"{path}: {state}")
            continue
        if link.health.state == "degraded":
            yield Finding(name, WARN, f"{path}: {state}")
            continue
        test = tests.get((link.local_cluster_id, link.remote_cluster_id))
        if link.direction != "outbound":
            yield Finding(name, OK, f"{path}, {state} (self-tested from the linking side)")
        elif test is None:
            yield Finding(name, OK, f"{path}, {state}")
        elif test.error:
            yield Finding(name, FAIL, f"{path}: the self-test transfer failed: {test.error}")
        elif test.skipped:
            yield Finding(name, OK, f"{path}, {state}; bandwidth not measured: {test.skipped}")
        else:
            yield Finding(name, OK, f"{path}, {state}; self-test read {test.bytes} bytes in "
                                    f"{test.seconds * 1e3:.2f} ms: "
                                    f"{_rate(test.bytes, test.seconds)}")
        yield from _slow_path(f"{name} path", link, status, streams)
    yield from _sessions(status)


def _slow_path(name: str, link: admin_pb2.LinkStatus, status: admin_pb2.DaemonStatus,
               streams: int | None) -> Iterator[Finding]:
    capabilities = capabilities_of(link.transport)
    if ONE_SIDED in capabilities and link.data_path and link.data_path != ONE_SIDED:
        yield Finding(name, WARN, f"slower path than the hardware offers: {link.transport} "
                                  f"{link.data_path} (the one-sided path is not in use: with "
                                  f"HCCL, HcclBatchSendRecv, one range per call, where this "
                                  f"CANN lacks or refuses HcclBatchGet/Put); see the daemon log")
    tcp = TCP_STREAMS in capabilities
    if link.direction == "outbound" and tcp and streams is not None and link.streams < streams:
        yield Finding(name, WARN, f"slower path than configured: {link.streams} TCP streams, "
                                  f"transfer.streams_per_link = {streams}")
    if (link.direction == "outbound" and tcp
            and link.remote_peer_address and _is_local_host(link.remote_peer_address)
            and link.remote_daemon_id != status.daemon_id):
        yield Finding(name, INFO, f"the far daemon ({link.remote_peer_address}) is on this "
                                  f"host: bytes cross the loopback TCP stack; clusters of one "
                                  f"daemon link over memory copies (transport local)")


def _sessions(status: admin_pb2.DaemonStatus) -> Iterator[Finding]:
    if not status.transfer_lane:
        yield Finding("transfer lane", WARN, "off (server.transfer_lane = false): every "
                                             "transfer call goes over gRPC, the slower path")
        return
    for session in status.sessions:
        if session.lane_connections == 0:
            yield Finding(f"session {session.session_id[:8]}", WARN,
                          f"slower path than configured: client pid {session.client_pid} "
                          f"({session.client_name or 'unnamed'}) sends its transfer calls over "
                          f"gRPC, though the daemon offers the transfer lane "
                          f"(HIXL_TRANSFER_LANE=0, transfer_lane=False, or the lane could not "
                          f"be opened: see the client's log)")


def diagnose(target: str, config_path: Path | None, peers: Sequence[str],
             self_test_bytes: int, timeout_s: float) -> list[Finding]:
    """Every finding of the doctor, in the order of the module docstring."""
    config, findings = _config(config_path)
    status, reached = _status(target, timeout_s)
    findings.append(reached)
    findings += _listeners(target, status)
    if status is not None and status.pid:
        findings += _limits(status, config)
    findings += [_peer(address, config) for address in peers]
    if status is not None:
        findings += _links(target, status, config, self_test_bytes, timeout_s)
    return findings


def run_doctor(target: str, config_path: Path | None, peers: Sequence[str],
               self_test_bytes: int, output: str, timeout_s: float) -> int:
    """Print the findings; 1 if any failed, else 0."""
    findings = diagnose(target, config_path, peers, self_test_bytes, timeout_s)
    rows = [asdict(finding) for finding in findings]
    if output == "json":
        print(json.dumps(rows, indent=2))
    else:
        print(render_table(["check", "result", "detail"], rows))
    return 1 if any(finding.result == FAIL for finding in findings) else 0
