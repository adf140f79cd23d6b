"""hixl-bench smoke tests: the harness runs end to end and reports ratios.

Nothing here asserts anything about speed: figures come from benchmarks,
never from timed assertions.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hixl_bench.model import JSON_KEYS

ROOT = Path(__file__).resolve().parents[2]


def test_native_ceilings_move_bytes() -> None:
    from hixl_bench._ceiling import MemcpyCeiling, TcpCeiling

    with MemcpyCeiling(8 << 20) as memcpy:
        times = memcpy.run(4096, 4, 10)
        assert len(times) == 10 and all(t > 0 for t in times)
        with pytest.raises(ValueError):
            memcpy.run(16 << 20, 1, 1)  # larger than the cold buffers
    for streams in (1, 3):
        with TcpCeiling(8 << 20, streams) as tcp:
            for block, nblocks in ((4096, 1), (65536, 8), (1 << 20, 3)):
                times = tcp.run(block, nblocks, 5)
                assert len(times) == 5 and all(t > 0 for t in times)
    tcp = TcpCeiling(1 << 20)
    tcp.close()
    with pytest.raises(RuntimeError):
        tcp.run(4096, 1, 1)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_quick_run_prints_ratios_and_writes_json_lines(tmp_path: Path) -> None:
    out = tmp_path / "bench.jsonl"
    command = [sys.executable, "-m", "hixl_bench", "--quick", "--json-out", str(out),
               "--budget-scale", "0.3", "--models", "tiny", "--tokens", "256",
               "--page-tokens", "64"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=170,
                          check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    # The progress count was right: it ends at its total, which the summary repeats.
    counts = re.findall(r"^\[ *(\d+)/(\d+)\] ", done.stderr, re.MULTILINE)
    assert counts and counts[-1][0] == counts[-1][1], counts[-3:]
    assert [int(n) for n, _ in counts] == list(range(1, len(counts) + 1))
    assert f"\n{counts[-1][1]} rows in " in done.stdout
    assert "counted" not in done.stderr
    # No child forked while gRPC's threads ran (gRPC says so when one is).
    assert "fork" not in done.stderr, [line for line in done.stderr.splitlines() if "fork" in line]
    header = next(line for line in done.stdout.splitlines() if line.startswith("what"))
    for column in ("GB/s", "p50 us", "p99 us", "client", "ctrl", "data", "ratio", "p50/rtt"):
        assert column in header

    records = [json.loads(line) for line in out.read_text().splitlines()]
    meta, rows = records[0], records[1:]
    assert meta["kind"] == "meta" and meta["quick"] is True
    # Both daemons' memory beside their pools, sampled through the run.
    peaks = meta["daemon_beside_pools_peak_mib"]
    assert set(peaks) == {"A", "B"} and all(mib > 0 for mib in peaks.values())
    assert "daemon memory beside its pools" in done.stdout
    for row in rows:
        assert set(JSON_KEYS) <= set(row), row
        assert row["status"] == "ok" or row["status"].startswith("skipped"), row
    names = {row["name"] for row in rows if row["status"] == "ok"}
    assert {"memcpy", "tcp-c", "grpc-rtt", "hixl", "hixl-noop", "hixl-tiny"} <= names
    hixl = [row for row in rows if row["kind"] == "hixl" and row["status"] == "ok"
            and row["suite"] != "scale"]
    assert {row["path"] for row in hixl} == {"local", "tcp"}
    # The scale suite: control time per block, and its growth from 1k to 10k blocks.
    scale = [row for row in rows if row["suite"] == "scale"]
    assert [row["nblocks"] for row in scale] == [2_000, 20_000]
    assert all(row["ctrl_us_per_block"] > 0 for row in scale)
    assert scale[-1]["ctrl_us_per_added_block"] is not None
    assert all(row["ratio"] is not None and row["ratio_to"] for row in hixl), hixl
    assert all(row["rtt_ratio"] is not None for row in hixl)
    kv = [row for row in rows if row["suite"] == "kv"]
    assert kv and all(row["model"] == "tiny" for row in kv)
    # The layer-wise row: the last layer's lag against one layer pushed alone.
    (layerwise,) = [row for row in kv if row["kv_mode"] == "transfer_cache_async"]
    assert layerwise["layer_alone_ms"] > 0 and layerwise["last_lag_ms"] > 0
    assert layerwise["lag_ratio"] == pytest.approx(
        layerwise["last_lag_ms"] / layerwise["layer_alone_ms"])
    # Every peer is measured or reported as skipped, never left out.
    assert {"mooncake-tcp", "nixl-ucx-tcp"} <= {row["name"] for row in rows if row["kind"] == "peer"}


def test_bad_arguments_exit_2() -> None:
    done = subprocess.run([sys.executable, "-m", "hixl_bench", "--suites", "nope"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "unknown" in done.stderr


def test_security_suite_rows_in_each_mode(tmp_path: Path) -> None:
    out = tmp_path / "sec.jsonl"
    done = subprocess.run([sys.executable, "-m", "hixl_bench", "--quick", "--suites", "none",
                           "--peers", "none", "--security", "none,token,mtls", "--quiet",
                           "--json-out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    sec = [row for row in rows if row["suite"] == "sec"]
    assert {(row["security"], row["block"]) for row in sec} == {
        (mode, block) for mode in ("none", "token", "mtls") for block in (4096, 1 << 20)}
    assert all(row["status"] == "ok" and row["link_setup_ms"] > 0 for row in sec), sec


def test_checksum_suite_pairs_rows_without_and_with_the_crc(tmp_path: Path) -> None:
    out = tmp_path / "crc.jsonl"
    done = subprocess.run([sys.executable, "-m", "hixl_bench", "--quick", "--suites", "none",
                           "--peers", "none", "--checksum", "--quiet", "--json-out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    crc = [row for row in rows if row["suite"] == "crc" and row["kind"] == "hixl"]
    assert {(row["op"], row["block"], row["checksum"]) for row in crc} == {
        (op, block, on) for op in ("pull", "push") for block in (64 << 10, 1 << 20, 16 << 20)
        for on in (False, True)}
    assert all(row["status"] == "ok" and row["gbps"] > 0 for row in crc), crc
    assert all(row["crc_gbps_ratio"] > 0 and row["crc_p50_ratio"] > 0
               for row in crc if row["checksum"])
    assert "vs crc off:" in done.stdout
    (speed,) = [row for row in rows if row["name"] == "crc32c"]
    assert speed["gbps"] > 0


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is not None,
                    reason="matplotlib is installed: --plot would plot")
def test_plot_without_matplotlib_fails_at_once_with_the_hint(tmp_path: Path) -> None:
    out = tmp_path / "plot.png"
    done = subprocess.run([sys.executable, "-m", "hixl_bench", "--quick", "--plot", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert f"{sys.executable} -m pip install matplotlib" in done.stderr
    assert "[  1/" not in done.stderr  # refused before the run
    assert not out.exists()
