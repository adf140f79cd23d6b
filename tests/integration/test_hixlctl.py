"""hixlctl against real daemons: every command, as a table and as JSON, and
doctor's findings on a bad socket permission, an unreachable peer and a
slower path than the one configured."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hixl_client import CacheDesc, CacheKeyByIdAndIndex, DataType, LLMDataDist, LLMRole
from hixl_service.testing import DaemonProcess, unused_port

from .conftest import Pair, daemon_process, daemon_status, options

pytestmark = pytest.mark.asyncio

DESC = CacheDesc(2, [2, 65536], DataType.DT_UINT8)
LISTINGS = ("sessions", "clusters", "caches", "links", "pools", "transfers")


def hixlctl(daemon: DaemonProcess | str, *args: str) -> subprocess.CompletedProcess[str]:
    target = daemon if isinstance(daemon, str) else daemon.client_target
    return subprocess.run([sys.executable, "-m", "hixl_service.ctl", "--daemon", target,
                           "--timeout", "20", *args],
                          capture_output=True, text=True, timeout=120, check=False)


async def ahixlctl(daemon: DaemonProcess | str, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(hixlctl, daemon, *args)


async def as_json(daemon: DaemonProcess, *args: str) -> Any:
    done = await ahixlctl(daemon, "-o", "json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def findings(done: subprocess.CompletedProcess[str]) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = json.loads(done.stdout)
    return rows


async def _pull_by_id(pair: Pair) -> None:
    src = await pair.prompt.cache_manager.allocate_cache(DESC)
    dst = await pair.decoder.cache_manager.allocate_cache(DESC)
    await pair.decoder.cache_manager.pull_cache(
        CacheKeyByIdAndIndex(pair.prompt.cluster_id, src.cache_id, 1), dst)


async def test_every_listing_as_table_and_json(pair: Pair) -> None:
    await _pull_by_id(pair)
    decode = pair.decoder_daemon
    status = await daemon_status(decode.client_target)

    summary = await ahixlctl(decode, "status")
    assert summary.returncode == 0, summary.stderr
    assert status.daemon_id in summary.stdout and "transfer lane" in summary.stdout
    as_status = await as_json(decode, "status")
    assert as_status["daemon_id"] == status.daemon_id and as_status["pid"] == decode.pid

    for listing in LISTINGS:
        table = await ahixlctl(decode, listing)
        assert table.returncode == 0, (listing, table.stderr)
        header = table.stdout.splitlines()[0].split()
        rows = await as_json(decode, listing)
        assert isinstance(rows, list) and rows, listing
        # Every field of the message is a column, and a row a line.
        assert set(header) == {name.upper() for name in rows[0]}, listing
        assert len(table.stdout.splitlines()) == len(rows) + 1, listing

    sessions = await as_json(decode, "sessions")
    assert pair.decoder.cluster_id in {int(s["cluster_id"]) for s in sessions}
    links = await as_json(decode, "links")
    mine = [link for link in links if int(link["local_cluster_id"]) == pair.decoder.cluster_id]
    assert [(link["transport"], link["direction"], link["alive"]) for link in mine] == [
        ("tcp", "outbound", True)]
    links_table = (await ahixlctl(decode, "links")).stdout.splitlines()
    assert links_table[0].split()[:4] == ["DIRECTION", "LOCAL_CLUSTER_ID", "REMOTE_CLUSTER_ID",
                                          "TRANSPORT"]
    transfers = await as_json(decode, "transfers")
    assert any(t["op"] == "pull_cache" and t["transport"] == "tcp"
               and t["status"] == "LLM_SUCCESS" and int(t["calls"]) >= 1 for t in transfers)
    pools = await as_json(decode, "pools")
    assert {int(p["cluster_id"]) for p in pools} >= {pair.decoder.cluster_id}


async def test_unreachable_daemon_exits_2(tmp_path: Any) -> None:
    done = await ahixlctl(f"unix:{tmp_path}/absent.sock", "--timeout", "2", "status")
    assert done.returncode == 2
    assert "absent.sock" in done.stderr


async def test_doctor_measures_links_and_finds_an_unreachable_peer(pair: Pair) -> None:
    await _pull_by_id(pair)
    dead = f"127.0.0.1:{unused_port()}"  # a port nothing listens on
    done = await ahixlctl(pair.decoder_daemon, "-o", "json", "doctor",
                          "--peer", pair.prompt_daemon.peer_address, "--peer", dead)
    assert done.returncode == 1, done.stdout  # the unreachable peer fails
    by_check = {row["check"]: row for row in findings(done)}
    assert by_check[f"peer {dead}"]["result"] == "fail"
    assert "unreachable" in by_check[f"peer {dead}"]["detail"]
    assert by_check[f"peer {pair.prompt_daemon.peer_address}"]["result"] == "ok"
    link = by_check[f"link {pair.decoder.cluster_id}->{pair.prompt.cluster_id}"]
    assert link["result"] == "ok"
    assert link["detail"].startswith("tcp, ")
    assert "self-test read" in link["detail"] and "/s" in link["detail"]
    for check in ("configuration", "daemon", "socket directory", "client socket",
                  "transfer lane socket", "peer port", "data port", "limit nofile",
                  "limit memlock", "limit tasks"):
        assert check in by_check, check
        assert by_check[check]["result"] in ("ok", "warn"), by_check[check]
    table = await ahixlctl(pair.decoder_daemon, "doctor", "--self-test-bytes", "0")
    assert table.stdout.splitlines()[0].split() == ["CHECK", "RESULT", "DETAIL"]


async def test_doctor_reports_a_socket_others_may_open_and_a_slow_path(
        next_cluster_id: Callable[[], int]) -> None:
    with daemon_process() as daemon:
        # A client that keeps its transfers on gRPC though the daemon offers the lane.
        slow = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=daemon.client_target,
                           transfer_lane=False)
        await slow.init(options())
        try:
            socket_path = daemon.client_target[len("unix:"):]
            os.chmod(socket_path, 0o666)
            done = await ahixlctl(daemon, "-o", "json", "doctor")
            os.chmod(socket_path, 0o660)
            assert done.returncode == 1
            rows = findings(done)
            by_check = {row["check"]: row for row in rows}
            assert by_check["client socket"]["result"] == "fail"
            assert "mode 0666" in by_check["client socket"]["detail"]
            slow_rows = [row for row in rows if row["check"].startswith("session ")]
            assert len(slow_rows) == 1 and slow_rows[0]["result"] == "warn"
            assert "slower path than configured" in slow_rows[0]["detail"]
            assert "over gRPC" in slow_rows[0]["detail"]

            fixed = await ahixlctl(daemon, "-o", "json", "doctor")
            assert {row["check"]: row for row in findings(fixed)}["client socket"][
                "result"] == "ok"
        finally:
            await slow.finalize()


async def test_doctor_reports_a_loosened_socket_directory() -> None:
    with daemon_process() as daemon:
        directory = os.path.dirname(daemon.client_target[len("unix:"):])
        mode = os.stat(directory).st_mode & 0o777
        os.chmod(directory, 0o777)
        try:
            done = await ahixlctl(daemon, "-o", "json", "doctor")
        finally:
            os.chmod(directory, mode)
        row = {row["check"]: row for row in findings(done)}["socket directory"]
        assert row["result"] == "fail" and "mode 0777" in row["detail"], row
        assert done.returncode == 1


async def test_drain_stops_the_daemon_as_sigterm_does() -> None:
    daemon = daemon_process()
    daemon.start()
    try:
        done = await ahixlctl(daemon, "drain")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("draining:")
        deadline = time.monotonic() + 60
        while daemon.returncode is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert daemon.returncode == 0, daemon.log_tail()
        assert "Admin/Drain" in daemon.log_tail(20000)
    finally:
        daemon.close()


async def test_config_names_the_daemon_and_doctor_reports_a_bad_one(
        pair: Pair, tmp_path: Path) -> None:
    socket_path = pair.decoder_daemon.client_target[len("unix:"):]
    good = tmp_path / "good.toml"
    good.write_text(f'[server]\nclient_socket = "{socket_path}"\n')
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "hixl_service.ctl", "--config", str(good),
                         "-o", "json", "status"],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["daemon_id"] == pair.decoder_daemon.daemon_id

    bad = tmp_path / "bad.toml"
    bad.write_text(f'[server]\nclient_socket = "{socket_path}"\n[pool]\nmax_bytse = 1\n')
    done = await ahixlctl(pair.decoder_daemon, "--config", str(bad), "-o", "json", "doctor",
                          "--self-test-bytes", "0")
    row = {row["check"]: row for row in findings(done)}["configuration"]
    assert row["result"] == "fail" and "max_bytse" in row["detail"], row
    assert done.returncode == 1
