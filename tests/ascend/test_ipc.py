"""IPC export in this process, import in another one (the double shares a
memfd), byte-exact both ways; the pid whitelist."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.ascend._peer import pattern
from tests.ascend.conftest import MIB, child_env

if TYPE_CHECKING:
    from hixl_native import _ascend as ascend
else:
    ascend = pytest.importorskip("hixl_native._ascend")



class Peer:
    """A child process importing what we export (tests/ascend/_peer.py)."""

    def __init__(self, double_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.ascend._peer", "ipc", str(double_dir)],
            env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        words = self.proc.stdout.readline().split()
        assert words[0] == "ready", words
        self.pid = int(words[1])

    def ask(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        try:
            self.ask("quit")
        except BrokenPipeError:
            pass
        finally:
            self.proc.communicate(timeout=10)


@pytest.fixture
def peer(runtime: ascend.AscendRuntime, double_dir: Path) -> Iterator[Peer]:
    p = Peer(double_dir)
    yield p
    p.close()


def test_import_in_another_process(device: ascend.Device, peer: Peer) -> None:
    n = MIB + 17
    with device.malloc(4 * MIB) as buf:
        buf.write(0, pattern(n, 1))
        key = buf.export_key(pid_validation=False)
        assert buf.key == key and buf.export_key(pid_validation=False) == key
        assert peer.ask(f"import {key} {buf.size} {n} 1 2") == "ok"
        # the child wrote through its mapping: the same device memory
        assert buf.read(0, n) == pattern(n, 2)
        buf.unexport()
        assert buf.key is None
        assert peer.ask(f"import {key} {buf.size} 1 0 0") == "error 107000"


def test_the_exporter_closes_a_key_only_after_its_importers(double_dir: Path,
                                                            device: ascend.Device) -> None:
    """CANN's aclrtIpcMemClose: the exporting process may close a key only after
    every importing process closed it; an importer that died counts as closed."""
    peer = Peer(double_dir)
    try:
        with device.malloc(1) as buf:
            key = buf.export_key(pid_validation=False)
            assert peer.ask(f"hold {key} {buf.size}") == "ok"
            with pytest.raises(ascend.AclError, match="still imported") as caught:
                buf.unexport()
            assert caught.value.api == "aclrtIpcMemClose"
            assert peer.ask("release") == "ok"
            buf.unexport()
        with device.malloc(1) as buf:
            key = buf.export_key(pid_validation=False)
            assert peer.ask(f"hold {key} {buf.size}") == "ok"
            peer.proc.kill()
            peer.proc.wait(10)
            buf.unexport()
    finally:
        if peer.proc.poll() is None:
            peer.close()
        else:
            peer.proc.communicate(timeout=10)


def test_pid_whitelist(runtime: ascend.AscendRuntime, device: ascend.Device, peer: Peer) -> None:
    with device.malloc(1) as allowed, device.malloc(1) as other:
        allowed.write(0, pattern(64, 5))
        key = allowed.export_key()
        assert peer.ask(f"import {key} {allowed.size} 64 5 6") == "error 207006"
        # the whitelist names bare tgids ("aclrtIpcMemSetImportPid"): the process's
        # own pid, which differs from it in a container (and always in the double),
        # is refused
        assert peer.pid != peer.proc.pid
        allowed.allow_import([peer.proc.pid])
        assert peer.ask(f"import {key} {allowed.size} 64 5 6") == "error 207006"
        allowed.allow_import([peer.pid])
        assert peer.ask(f"import {key} {allowed.size} 64 5 6") == "ok"
        assert allowed.read(0, 64) == pattern(64, 6)
        okey = other.export_key()
        other.allow_import([runtime.bare_tgid()])  # someone else
        assert peer.ask(f"import {okey} {other.size} 1 0 0") == "error 207006"
        with pytest.raises(ValueError, match="export_key"):
            device.malloc(1).allow_import([1])


def test_import_in_this_process(runtime: ascend.AscendRuntime, device: ascend.Device) -> None:
    dev1 = runtime.set_device(1)
    with device.malloc(1) as buf:
        key = buf.export_key(pid_validation=False)
        with dev1.import_ipc(key, buf.size) as imported:
            assert imported.key == key and imported.size == buf.size
            imported.write(100, b"shared")
            assert buf.read(100, 6) == b"shared"
            with pytest.raises(ValueError):
                imported.read(buf.size, 1)
        # closing the exporter after the importer, as CANN asks


def test_bad_keys(device: ascend.Device) -> None:
    with pytest.raises(ValueError):
        device.import_ipc("", 1)
    with pytest.raises(ValueError):
        device.import_ipc("k" * 65, 1)
    with pytest.raises(TypeError):
        device.import_ipc(b"key", 1)  # type: ignore[arg-type]
    with pytest.raises(ascend.AclError) as caught:
        device.import_ipc("cann-double:1:999999", 1)
    assert caught.value.api == "aclrtIpcMemImportByKey"
