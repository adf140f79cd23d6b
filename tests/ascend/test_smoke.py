"""The hardware smoke test command runs against the CANN double: every check
passes on two devices of one host, and across a --listen / --peer pair."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ascend.conftest import child_env

SMALL = ["--buffer-mb", "1", "--size-mb", "8", "--blocks", "100", "--block-kib", "16"]
CHECKS = ("communicator", "first transfer", "one range", "many ranges", "throughput 8 MiB",
          "throughput 100 x 16 KiB", "one-sided prepare", "one-sided one range",
          "one-sided many ranges", "one-sided throughput 8 MiB",
          "one-sided throughput 100 x 16 KiB", "release while bound", "receive timeout")


def smoke(double_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hixl_service.ascend.smoke", "--cann-path", str(double_dir),
         *SMALL, *args],
        env=child_env(**env), capture_output=True, text=True, timeout=300, check=False)


def rows(report: str) -> dict[str, str]:
    found = {}
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1] in ("ok", "**FAIL**"):
            found[cells[0]] = cells[1]
    return found


def test_smoke_on_two_devices(double_dir: Path, runtime: object) -> None:
    done = smoke(double_dir, "--devices", "0,1")
    assert done.returncode == 0, done.stdout + done.stderr
    table = rows(done.stdout)
    assert table["load CANN"] == "ok" and table["IPC across processes"] == "ok"
    for check in CHECKS:
        name = next(n for n in table if n.startswith(check) and "devices 0-1" in n)
        assert table[name] == "ok", name
    assert "optional entry points found:" in done.stdout
    # the double has every optional entry point hixl knows, the one-sided API too
    assert "one_sided" in done.stdout and "missing: none" in done.stdout
    assert re.search(r"GB/s", done.stdout)
    # issue 30: the rank table's version and whether creation waits for the peer
    # (the double's does, as HCCL's: hcomm topoinfo_exchange_agent.cc)
    assert "rank table 1.0, SoC Ascend910B1" in done.stdout
    assert "creation waited for the late peer" in done.stdout


def test_smoke_writes_a3_rank_tables(double_dir: Path, runtime: object) -> None:
    done = smoke(double_dir, "--devices", "0,1", HIXL_DOUBLE_SOC="Ascend910_9391")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rank table 1.2, SoC Ascend910_9391 / Ascend910_9391" in done.stdout


@pytest.mark.parametrize("comm_init", ["rank_table", "root_info"])
def test_smoke_to_a_peer(double_dir: Path, runtime: object, comm_init: str) -> None:
    listener = subprocess.Popen(
        [sys.executable, "-m", "hixl_service.ascend.smoke", "--cann-path", str(double_dir),
         *SMALL, "--devices", "1", "--listen", "127.0.0.1:0"],
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None
        first = listener.stdout.readline()
        port = re.search(r"waiting at [\d.]+:(\d+)", first)
        assert port, first
        done = smoke(double_dir, "--devices", "0", "--comm-init", comm_init,
                     "--peer", f"127.0.0.1:{port.group(1)}")
        assert done.returncode == 0, done.stdout + done.stderr
        table = rows(done.stdout)
        for check in CHECKS:
            name = next(n for n in table if n.startswith(check) and "to 127.0.0.1" in n)
            assert table[name] == "ok", name
    finally:
        try:
            listener.wait(timeout=60)
        except subprocess.TimeoutExpired:
            listener.kill()
            listener.wait()
        for pipe in (listener.stdout, listener.stderr):
            if pipe is not None:
                pipe.close()
