"""systemd's side of a real daemon: readiness, watchdog pings, STATUS= and SIGHUP reloads.

The notify socket is a real unix datagram socket bound by the test, named in
the daemon's ``$NOTIFY_SOCKET`` as systemd would.
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hixl_service.config import dump_toml
from hixl_service.testing import DaemonProcess
from hixl_wire._proto.hixl.v1 import client_pb2, client_pb2_grpc

# Generous: the machine running the suite is shared and loaded.
WAIT_S = 30.0

Message = dict[str, str]


class NotifySocket:
    """The service manager's end: collects the daemon's datagrams."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "notify"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(self.path))
        self._sock.settimeout(0.5)
        self.messages: list[Message] = []

    def wait_for(self, what: str, done: Callable[[list[Message]], bool]) -> list[Message]:
        """Receive until ``done(messages)``, within WAIT_S; fails naming what was seen."""
        deadline = time.monotonic() + WAIT_S
        while not done(self.messages):
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {WAIT_S} s; received {self.messages}")
            try:
                data = self._sock.recv(4096)
            except TimeoutError:
                continue
            self.messages.append(dict(line.split("=", 1) for line in data.decode().splitlines()))
        return self.messages

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def notify_socket() -> Iterator[NotifySocket]:
    # sun_path is short: a directory under /tmp, not pytest's deep tmp_path.
    with tempfile.TemporaryDirectory(prefix="hixl-notify-", dir="/tmp") as directory:
        sock = NotifySocket(Path(directory))
        yield sock
        sock.close()


def after_ready(messages: list[Message]) -> list[Message]:
    for index, message in enumerate(messages):
        if message.get("READY") == "1":
            return messages[index + 1:]
    return []


def test_watchdog_pings_and_status_lines(notify_socket: NotifySocket) -> None:
    env = {"NOTIFY_SOCKET": str(notify_socket.path), "WATCHDOG_USEC": "400000"}  # ping each 0.2 s
    with DaemonProcess(env=env) as daemon:
        notify_socket.wait_for("three pings after READY=1", lambda seen: sum(
            m.get("WATCHDOG") == "1" for m in after_ready(seen)) >= 3)
        assert daemon.returncode is None
    statuses = [m["STATUS"] for m in notify_socket.messages if "STATUS" in m]
    assert any(s.startswith("serving: 0 sessions, 0 clusters") for s in statuses), statuses


def test_no_pings_for_another_process(notify_socket: NotifySocket) -> None:
    # WATCHDOG_PID of another process: the variables were inherited, not meant for the daemon.
    env = {"NOTIFY_SOCKET": str(notify_socket.path), "WATCHDOG_USEC": "400000",
           "WATCHDOG_PID": "1"}
    with DaemonProcess(env=env):
        seen = notify_socket.wait_for("a STATUS= summary after READY=1", lambda seen: any(
            m.get("STATUS", "").startswith("serving:") for m in after_ready(seen)))
    assert not any("WATCHDOG" in m for m in seen)


def health(target: str) -> int:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=10)
        return int(reply.status)


def refused_call(target: str) -> None:
    """A call without a session: refused, which the daemon logs at DEBUG."""
    with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError) as info:
        client_pb2_grpc.ClientStub(channel).Finalize(client_pb2.FinalizeRequest(), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def wait_log(daemon: DaemonProcess, text: str) -> str:
    deadline = time.monotonic() + WAIT_S
    while text not in (log := daemon.log_path.read_text(errors="replace")):
        if time.monotonic() > deadline:
            pytest.fail(f"{text!r} not logged within {WAIT_S} s; log tail:\n{daemon.log_tail()}")
        time.sleep(0.05)
    return log


def reloads_done(count: int) -> Callable[[list[Message]], bool]:
    def done(seen: list[Message]) -> bool:
        return sum(m.get("READY") == "1" for m in after_ready(seen)) >= count
    return done


def test_sighup_reloads_log_level_and_keeps_serving(notify_socket: NotifySocket) -> None:
    with DaemonProcess(env={"NOTIFY_SOCKET": str(notify_socket.path)},
                       logging__level="INFO") as daemon:
        target = daemon.client_target
        notify_socket.wait_for("READY=1", lambda seen: any(m.get("READY") for m in seen))
        refused_call(target)
        assert "Finalize failed" not in daemon.log_path.read_text()  # DEBUG: not logged yet

        settings = {name: dict(fields) for name, fields in daemon.settings.items()}
        settings["logging"] = {"level": "DEBUG"}
        settings["limits"] = {"max_inbound_links": 7}
        settings["server"]["grace_period_s"] = 9.0  # bound at start: needs a restart
        daemon.config_path.write_text(dump_toml(settings))
        os.kill(daemon.pid, signal.SIGHUP)
        notify_socket.wait_for("READY=1 after the reload", reloads_done(1))
        log = wait_log(daemon, "reloaded: ")
        assert "logging.level INFO -> DEBUG" in log
        assert "limits.max_inbound_links 4096 -> 7" in log
        assert "not reloaded" in log and "server.grace_period_s" in log
        reloading = [m for m in notify_socket.messages if m.get("RELOADING") == "1"]
        assert len(reloading) == 1 and int(reloading[0]["MONOTONIC_USEC"]) > 0

        refused_call(target)
        wait_log(daemon, "Finalize failed")  # the DEBUG line, now that DEBUG is on
        assert health(target) == health_pb2.HealthCheckResponse.SERVING

        # A file that does not load changes nothing, and the daemon goes on.
        daemon.config_path.write_text("[logging]\nlevel = 'LOUD'\n")
        os.kill(daemon.pid, signal.SIGHUP)
        notify_socket.wait_for("READY=1 after the refused reload", reloads_done(2))
        wait_log(daemon, "reload refused, the running configuration stays")
        assert health(target) == health_pb2.HealthCheckResponse.SERVING
        assert daemon.returncode is None
        assert daemon.stop() == 0
