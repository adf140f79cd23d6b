"""hixl_wire.defaults (where a client and its local daemon meet) and hixl_wire.compat."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from hixl_wire import compat, defaults

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return monkeypatch


def test_systemds_runtime_directory_wins_and_only_its_first_entry(
        bare_env: pytest.MonkeyPatch) -> None:
    bare_env.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    bare_env.setenv("RUNTIME_DIRECTORY", "/run/hixl-a:/run/hixl-b")
    assert defaults.default_runtime_dir() == Path("/run/hixl-a")
    assert defaults.default_socket_path() == Path("/run/hixl-a/hixl.sock")


def test_then_the_users_runtime_dir(bare_env: pytest.MonkeyPatch) -> None:
    bare_env.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    assert defaults.default_runtime_dir() == Path("/run/user/7/hixl")


@pytest.mark.parametrize(("euid", "expected"), [(0, "/run/hixl"), (1234, "/tmp/hixl-1234")])
def test_then_root_or_a_per_user_directory(bare_env: pytest.MonkeyPatch, euid: int,
                                          expected: str) -> None:
    bare_env.setattr(defaults.os, "geteuid", lambda: euid)
    assert defaults.default_runtime_dir() == Path(expected)
    assert defaults.default_socket_path().name == defaults.SOCKET_NAME


def test_the_session_key_is_plain_grpc_metadata() -> None:
    key = defaults.SESSION_METADATA_KEY
    assert key == key.lower() and not key.endswith("-bin") and key.startswith("hixl-")


def test_defaults_imports_no_grpc() -> None:
    # The daemon's --check reads the defaults without loading gRPC.
    code = ("import sys, hixl_wire.defaults; "
            "print(sorted(m for m in sys.modules if m.partition('.')[0] == 'grpc'))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.asyncio
async def test_compat_timeout_cuts_a_wait_short_with_asyncios_timeout_error() -> None:
    with pytest.raises(asyncio.TimeoutError):
        async with compat.timeout(0):
            await asyncio.Event().wait()
    async with compat.timeout(None):  # no deadline
        await asyncio.sleep(0)
