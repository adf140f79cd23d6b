"""Starts the daemon refuses (exit 2, a message saying what to change), and listeners
it makes right: socket directory and socket modes, busy ports, exposure off loopback,
token files anyone could read."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hixl_service.testing import DaemonProcess
from hixl_service.testing_credentials import token_settings, write_token


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path (unix socket paths are short)."""
    with tempfile.TemporaryDirectory(prefix="hixl-l-") as name:
        yield Path(name)


def refusal(**overrides: Any) -> str:
    """Start a daemon that must exit 2 before it is ready; its log."""
    daemon = DaemonProcess(**overrides)
    try:
        with pytest.raises(RuntimeError, match="exited with code 2") as failed:
            daemon.start()
        return str(failed.value)
    finally:
        daemon.close()


def test_socket_directory_and_sockets_are_private(short_dir: Path) -> None:
    sockets = short_dir / "run"
    with DaemonProcess(server__client_socket=str(sockets / "hixl.sock")):
        assert stat.S_IMODE(os.stat(sockets).st_mode) == 0o750
        found = sorted(sockets.glob("*.sock"))
        assert len(found) == 3  # client, fd and transfer lane sockets
        for path in found:
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o660, path


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o752])
def test_a_loose_socket_directory_is_refused(short_dir: Path, mode: int) -> None:
    squatted = short_dir / "squat"
    squatted.mkdir()
    os.chmod(squatted, mode)
    log = refusal(server__client_socket=str(squatted / "hixl.sock"))
    assert f"has mode {mode:04o}" in log
    assert not list(squatted.iterdir())


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory of another user needs root")
def test_a_directory_of_another_user_is_refused(short_dir: Path) -> None:
    squatted = short_dir / "other"
    squatted.mkdir(mode=0o750)
    os.chown(squatted, 12345, 12345)
    log = refusal(server__client_socket=str(squatted / "hixl.sock"))
    assert "owned by uid 12345" in log


def test_a_busy_port_is_refused_and_leaves_no_socket(short_dir: Path) -> None:
    with DaemonProcess() as first:
        port = int(first.peer_address.rsplit(":", 1)[1])
        second_dir = short_dir / "second"
        log = refusal(server__client_socket=str(second_dir / "hixl.sock"),
                      server__peer_port=port)
        assert f"127.0.0.1:{port}" in log and "Ports are never shared" in log
        assert not list(second_dir.glob("*.sock"))
        data_port = int(first.data_address.rsplit(":", 1)[1])
        log = refusal(server__client_socket=str(second_dir / "hixl.sock"),
                      server__data_port=data_port)
        assert "the data plane" in log
        assert not list(second_dir.glob("*.sock"))


def test_a_listener_off_loopback_needs_security() -> None:
    log = refusal(server__peer_host="0.0.0.0", server__advertise_host="127.0.0.1")
    assert "security.mode" in log and "0.0.0.0" in log
    log = refusal(server__client_tcp="0.0.0.0:0")
    assert "security.mode" in log


def test_clients_on_tcp_off_loopback_need_mtls(short_dir: Path) -> None:
    token = write_token(short_dir / "token")
    log = refusal(server__client_tcp="0.0.0.0:0", security=token_settings(token))
    assert "(clients)" in log and "mtls" in log


def test_insecure_allows_it_with_a_warning() -> None:
    with DaemonProcess(server__peer_host="0.0.0.0", server__advertise_host="127.0.0.1",
                       security__insecure=True) as daemon:
        assert "security.insecure" in daemon.log_tail(20000)


def test_token_mode_off_loopback_starts(short_dir: Path) -> None:
    token = write_token(short_dir / "token")
    with DaemonProcess(server__peer_host="0.0.0.0", server__advertise_host="127.0.0.1",
                       security=token_settings(token)) as daemon:
        assert daemon.returncode is None


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_token_file_others_can_read_is_refused(short_dir: Path, mode: int) -> None:
    token = write_token(short_dir / "token", mode=mode)
    log = refusal(security=token_settings(token))
    assert "security.token_file" in log and f"{mode:04o}" in log


def test_a_short_or_missing_secret_is_refused(short_dir: Path) -> None:
    log = refusal(security=token_settings(write_token(short_dir / "short", "tiny")))
    assert "at least 16" in log
    log = refusal(security=token_settings(short_dir / "missing"))
    assert "security.token_file" in log
