"""The process shell: CLI, logging setup, sd_notify and the DaemonProcess test utility."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hixl_service
from hixl_service import _systemd, testing
from hixl_service.__main__ import EXIT_CONFIG, EXIT_OK, configure_logging, main
from hixl_service.config import LoggingConfig, load_config
from hixl_service.testing import READY_FIELDS, DaemonProcess, _all_threads_stopped, start_daemon

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO_ROOT = Path(hixl_service.__file__).resolve().parent.parent


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("HIXL_")}
    child_env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
    )
    child_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hixl_service", *args],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("HIXL_") or key in ("JOURNAL_STREAM", "INVOCATION_ID"):
            monkeypatch.delenv(key)


# -- CLI ---------------------------------------------------------------------------


def test_check_bad_config_exits_2_naming_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[pool]\nmax_bytes = 0\n")
    result = run_cli("--config", str(bad), "--check")
    assert result.returncode == 2
    assert "pool.max_bytes" in result.stderr
    assert str(bad) in result.stderr
    assert result.stdout == ""


def test_missing_config_exits_2(tmp_path: Path) -> None:
    result = run_cli("--config", str(tmp_path / "absent.toml"), "--check")
    assert result.returncode == 2
    assert "absent.toml" in result.stderr


def test_bad_option_exits_2() -> None:
    assert run_cli("--no-such-option").returncode == 2


def test_print_config_shows_effective_values(tmp_path: Path) -> None:
    path = tmp_path / "hixl.toml"
    path.write_text('[server]\npeer_port = 26001\n[pool]\nmax_bytes = "2MiB"\n')
    env = {"HIXL_SERVER__DATA_PORT": "26100", "HIXL_DAEMON": "unix:/elsewhere.sock"}
    result = run_cli("--config", str(path), "--print-config", env=env)
    assert result.returncode == 0, result.stderr
    printed = tomllib.loads(result.stdout)
    assert printed["server"]["peer_port"] == 26001
    assert printed["server"]["data_port"] == 26100
    assert printed["pool"]["max_bytes"] == 2 << 20
    assert printed["transfer"]["streams_per_link"] == 4


def test_print_config_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_env: None
) -> None:
    assert main(["--print-config", "json"]) == EXIT_OK
    printed = json.loads(capsys.readouterr().out)
    assert printed["pool"]["backend"] == "host"
    assert printed["logging"] == {"level": "INFO", "format": "text"}


def test_printed_config_loads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HIXL_SERVER__CLIENT_TCP", "127.0.0.1:7001")
    monkeypatch.setenv("HIXL_SERVER__CLIENT_SOCKET", "")
    assert main(["--print-config"]) == EXIT_OK
    path = tmp_path / "printed.toml"
    path.write_text(capsys.readouterr().out)
    assert load_config(path, env={}) == load_config(None)


def test_check_ok_and_client_variable_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HIXL_DAEMON", "unix:/elsewhere.sock")
    path = tmp_path / "ok.toml"
    path.write_text("[transfer]\ncopy_threads = 3\n")
    assert main(["--config", str(path), "--check"]) == EXIT_OK
    assert "configuration OK" in capsys.readouterr().out


def test_env_error_exits_2(capsys: pytest.CaptureFixture[str], clean_env: None) -> None:
    os.environ["HIXL_TRANSFER__STREAMS_PER_LINK"] = "0"
    try:
        assert main(["--check"]) == EXIT_CONFIG
    finally:
        del os.environ["HIXL_TRANSFER__STREAMS_PER_LINK"]
    err = capsys.readouterr().err
    assert "transfer.streams_per_link" in err
    assert "$HIXL_TRANSFER__STREAMS_PER_LINK" in err


@pytest.mark.parametrize("name", ["HIXL_BOGUS__X", "HIXL_SERVER_PEER_PORT"])
def test_misspelt_variable_exits_2_naming_it(name: str) -> None:
    result = run_cli("--check", env={name: "1"})
    assert result.returncode == 2, result.stdout
    assert f"${name}: unknown variable" in result.stderr
    assert "configuration OK" not in result.stdout


# -- logging -----------------------------------------------------------------------


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    logging.captureWarnings(False)
    root.handlers[:] = handlers
    root.setLevel(level)


def _formatted(message: str, level: int = logging.INFO) -> str:
    record = logging.LogRecord("hixl_service.x", level, __file__, 1, message, None, None)
    formatter = logging.getLogger().handlers[0].formatter
    assert formatter is not None
    return formatter.format(record)


@pytest.mark.usefixtures("restore_logging")
def test_logging_has_timestamps_outside_systemd() -> None:
    configure_logging(LoggingConfig(level="DEBUG"), environ={})
    line = _formatted("hello")
    assert line[:4].isdigit()  # the year
    assert line.endswith("INFO hixl_service.x [-] hello")
    assert logging.getLogger().level == logging.DEBUG


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize("variable", ["INVOCATION_ID", "JOURNAL_STREAM"])
def test_logging_without_timestamps_under_systemd(variable: str) -> None:
    configure_logging(LoggingConfig(), environ={variable: "1:2"})
    assert _formatted("hello") == "INFO hixl_service.x [-] hello"


@pytest.mark.usefixtures("restore_logging")
def test_logging_carries_request_id() -> None:
    configure_logging(LoggingConfig(), environ={"INVOCATION_ID": "x"})
    record = logging.LogRecord("n", logging.WARNING, __file__, 1, "m %d", (7,), None)
    record.request_id = "r-42"
    assert logging.getLogger().handlers[0].format(record) == "WARNING n [r-42] m 7"


@pytest.mark.usefixtures("restore_logging")
def test_json_logging() -> None:
    configure_logging(LoggingConfig(format="json"), environ={})
    entry = json.loads(_formatted("x=%s", logging.ERROR).replace("%s", "%s"))
    assert entry["level"] == "ERROR"
    assert entry["logger"] == "hixl_service.x"
    assert entry["ts"].endswith("+00:00")


# -- sd_notify ---------------------------------------------------------------------


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # sun_path is short; pytest's tmp_path may not fit.
    path = Path(tempfile.mkdtemp(prefix="hixl-t-"))
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def test_notify_sends_datagram(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    address = short_tmp / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(address))
        server.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", str(address))
        assert _systemd.notify("READY=1") is True
        assert server.recv(4096) == b"READY=1"
        assert _systemd.notify("STOPPING=1\nSTATUS=draining") is True
        assert server.recv(4096) == b"STOPPING=1\nSTATUS=draining"


@pytest.mark.skipif(sys.platform != "linux", reason="abstract sockets are Linux-only")
def test_notify_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"hixl-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + name)
        server.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert _systemd.notify("READY=1") is True
        assert server.recv(4096) == b"READY=1"


@pytest.mark.parametrize(
    ("environ", "interval"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),
    ],
)
def test_watchdog_interval(environ: dict[str, str], interval: float | None) -> None:
    assert _systemd.watchdog_interval(environ) == interval


def test_notify_outside_systemd(monkeypatch: pytest.MonkeyPatch, short_tmp: Path) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert _systemd.notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert _systemd.notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", str(short_tmp / "nobody-listens"))
    assert _systemd.notify("READY=1") is False


# -- DaemonProcess: config generation ----------------------------------------------


def test_daemon_process_default_config() -> None:
    daemon = DaemonProcess()
    try:
        written = tomllib.loads(daemon.config_path.read_text())
        assert written == {
            "server": {
                "peer_host": "127.0.0.1",
                "peer_port": 0,
                "data_port": 0,
                "client_socket": str(daemon.tmpdir / "hixl.sock"),
                "ready_file": str(daemon.tmpdir / "ready.json"),
            },
            "pool": {"populate": False},
        }
        assert written == daemon.settings
        config = load_config(daemon.config_path, env={})
        assert config.server.ready_file == daemon.tmpdir / "ready.json"
        assert daemon.log_path.parent == daemon.tmpdir
        with pytest.raises(RuntimeError, match="not been started"):
            _ = daemon.client_target
        assert daemon.stop() is None
    finally:
        daemon.close()
    assert not daemon.tmpdir.exists()


def test_daemon_process_override_merging() -> None:
    daemon = DaemonProcess(
        pool={"max_bytes": "64MiB", "populate": True},
        pool__max_bytes=32 * 2**20,
        transfer__streams_per_link=2,
        server={"use_uvloop": False, "client_tcp": "127.0.0.1:0"},
        server__client_socket=None,
        logging={"level": "DEBUG"},
    )
    try:
        written = tomllib.loads(daemon.config_path.read_text())
        assert written["pool"] == {"populate": True, "max_bytes": 32 * 2**20}
        assert written["transfer"] == {"streams_per_link": 2}
        assert written["server"]["use_uvloop"] is False
        assert written["server"]["client_socket"] == ""
        assert written["server"]["peer_port"] == 0
        assert written["logging"] == {"level": "DEBUG"}
        config = load_config(daemon.config_path, env={})
        assert config.server.client_socket is None
        assert config.server.client_tcp == "127.0.0.1:0"
        assert config.pool.max_bytes == 32 << 20
    finally:
        daemon.close()


@pytest.mark.parametrize(
    "overrides",
    [{"poool": {}}, {"pool__": 1}, {"nonsense__x": 1}, {"pool": 5}],
)
def test_daemon_process_rejects_bad_overrides(overrides: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        DaemonProcess(**overrides)


def test_ready_fields_match_contract() -> None:
    assert dict(READY_FIELDS) == {
        "pid": int,
        "client_target": str,
        "peer_address": str,
        "data_address": str,
        "daemon_id": str,
    }


# -- DaemonProcess: lifecycle against a stand-in server -----------------------------

# Runs the real CLI (config, logging, loop choice, exit codes) with a stand-in
# for hixl_service.server that only speaks the ready-file contract.
FAKE_DAEMON = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys, time, types

    async def run_daemon(config, config_path=None):
        mode = os.environ.get("FAKE_MODE", "ok")
        if mode == "fail":
            raise RuntimeError("fake daemon cannot start")
        if mode == "stall":
            await asyncio.sleep(3600)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        if mode == "stubborn":
            loop.remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        record = {
            "pid": os.getpid(),
            "client_target": f"unix:{config.server.client_socket}",
            "peer_address": "127.0.0.1:1",
            "data_address": "127.0.0.1:2",
            "daemon_id": "ab" * 8,
            "loop": type(loop).__module__,
        }
        if mode == "badrecord":
            del record["daemon_id"]
        path = config.server.ready_file
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
        await stop.wait()

    fake = types.ModuleType("hixl_service.server")
    fake.run_daemon = run_daemon
    sys.modules["hixl_service.server"] = fake
    from hixl_service.__main__ import main
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.fixture
def fake_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "fake_daemon.py"
    script.write_text(FAKE_DAEMON)

    def command(self: DaemonProcess) -> list[str]:
        return [sys.executable, str(script), "--config", str(self.config_path)]

    monkeypatch.setattr(DaemonProcess, "_command", command)


@pytest.mark.usefixtures("fake_server")
def test_start_and_stop() -> None:
    with DaemonProcess() as daemon:
        assert daemon.pid == daemon.ready["pid"]
        assert daemon.client_target == f"unix:{daemon.tmpdir / 'hixl.sock'}"
        assert daemon.peer_address == "127.0.0.1:1"
        assert daemon.data_address == "127.0.0.1:2"
        assert daemon.daemon_id == "ab" * 8
        assert daemon.ready["loop"].startswith("uvloop")
        assert daemon.returncode is None
        assert daemon.stop() == 0
        log = daemon.log_path.read_text()
        assert "hixl-serviced 0.1.0 starting" in log
        assert "hixl-serviced stopped" in log
        assert daemon.stop() == 0  # already stopped
    assert not daemon.tmpdir.exists()


@pytest.mark.usefixtures("fake_server")
def test_restart_and_default_loop() -> None:
    with DaemonProcess(server__use_uvloop=False) as daemon:
        first = daemon.pid
        assert daemon.ready["loop"] == "asyncio.unix_events"
        with pytest.raises(RuntimeError, match="already running"):
            daemon.start()
        assert daemon.stop() == 0
        daemon.start()
        assert daemon.pid != first


@pytest.mark.usefixtures("fake_server")
def test_exit_before_ready_reports_log_tail() -> None:
    daemon = DaemonProcess(env={"FAKE_MODE": "fail"})
    try:
        with pytest.raises(RuntimeError, match="exited with code 1") as info:
            daemon.start()
        assert "fake daemon cannot start" in str(info.value)
    finally:
        daemon.close()


def test_config_error_reports_field() -> None:
    with pytest.raises(RuntimeError, match="code 2") as info, DaemonProcess(pool__max_bytes=0):
        pass
    assert "pool.max_bytes" in str(info.value)


@pytest.mark.usefixtures("fake_server")
def test_start_timeout_kills_daemon() -> None:
    daemon = DaemonProcess(env={"FAKE_MODE": "stall"})
    try:
        with pytest.raises(TimeoutError, match="not ready within"):
            daemon.start(timeout=0.5)
        assert daemon.returncode == -signal.SIGKILL
    finally:
        daemon.close()


@pytest.mark.usefixtures("fake_server")
def test_bad_ready_record() -> None:
    daemon = DaemonProcess(env={"FAKE_MODE": "badrecord"})
    try:
        with pytest.raises(RuntimeError, match="daemon_id should be str"):
            daemon.start()
    finally:
        daemon.close()


@pytest.mark.usefixtures("fake_server")
def test_stop_falls_back_to_sigkill() -> None:
    with DaemonProcess(env={"FAKE_MODE": "stubborn"}) as daemon:
        assert daemon.stop(timeout=0.3) == -signal.SIGKILL


@pytest.mark.usefixtures("fake_server")
def test_pause_resume_and_stop_while_paused() -> None:
    with DaemonProcess() as daemon:
        daemon.pause()
        assert _all_threads_stopped(daemon.pid)  # returns once the freeze took effect
        daemon.resume()
        daemon.pause()
        assert daemon.stop() == 0
        with pytest.raises(RuntimeError, match="not running"):
            daemon.pause()


@pytest.mark.usefixtures("fake_server")
def test_test_process_settings_do_not_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIXL_POOL__MAX_BYTES", "0")
    monkeypatch.setenv("NOTIFY_SOCKET", "@nobody-listens-here")
    with DaemonProcess() as daemon:
        assert daemon.stop() == 0


def test_unused_ports_are_free_distinct_and_never_ephemeral() -> None:
    """A daemon binding port 0 can never take a port handed out for a fixed bind."""
    first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [testing.unused_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= port < first_ephemeral for port in ports)
    with socket.socket() as server:
        server.bind(("127.0.0.1", ports[0]))  # free when handed out


def test_testing_module_imports_cheaply() -> None:
    code = (
        "import sys, hixl_service.testing; "
        "heavy = {'grpc', 'pydantic', 'hixl_client', 'hixl_service.config'} & set(sys.modules); "
        "sys.exit(sorted(heavy) or 0)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.usefixtures("fake_server")
def test_kill() -> None:
    with DaemonProcess() as daemon:
        assert daemon.kill() == -signal.SIGKILL


@pytest.mark.asyncio
@pytest.mark.usefixtures("fake_server")
async def test_start_daemon_async() -> None:
    async with start_daemon(transfer__copy_threads=3) as daemon:
        assert daemon.returncode is None
        assert load_config(daemon.config_path, env={}).transfer.copy_threads == 3
        tmpdir = daemon.tmpdir
    assert daemon.returncode == 0
    assert not tmpdir.exists()


@pytest.mark.asyncio
@pytest.mark.usefixtures("fake_server")
async def test_start_daemon_cancelled_while_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    created: list[DaemonProcess] = []
    original_start = DaemonProcess.start

    def start(self: DaemonProcess, timeout: float = 15.0) -> DaemonProcess:
        created.append(self)
        return original_start(self, timeout)

    monkeypatch.setattr(DaemonProcess, "start", start)

    async def enter() -> None:
        async with start_daemon(env={"FAKE_MODE": "stall"}):
            pytest.fail("a stalled daemon cannot become ready")

    task = asyncio.create_task(enter())
    deadline = time.monotonic() + 10
    # cancelled once the daemon's process runs and start() waits for its ready file
    while not created or created[0].returncode is not None or created[0]._proc is None:
        assert time.monotonic() < deadline, "the daemon's process never started"
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(250):  # close() runs on in a worker thread; the start thread then reaps
        if created[0].returncode is not None and not created[0].tmpdir.exists():
            break
        await asyncio.sleep(0.02)
    assert created[0].returncode is not None
    assert not created[0].tmpdir.exists()


# -- DaemonProcess against the real server ----------------------------------------


def test_real_daemon_ready_file_and_clean_stop() -> None:
    try:
        importlib.import_module("hixl_service.server")
    except ModuleNotFoundError as exc:  # the server, its stubs or the native extension
        pytest.skip(f"the real daemon cannot run here: {exc}")
    with DaemonProcess(pool__max_bytes="64MiB") as daemon:
        assert set(READY_FIELDS) <= set(daemon.ready)
        assert daemon.client_target == f"unix:{daemon.tmpdir / 'hixl.sock'}"
        host, _, port = daemon.peer_address.rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0
        host, _, port = daemon.data_address.rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0
        int(daemon.daemon_id, 16)
        assert daemon.stop() == 0, daemon.log_tail()
