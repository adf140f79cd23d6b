"""hixl_bench.compare: paired runs of two builds, row by row."""

from __future__ import annotations

import json
from pathlib import Path

from hixl_bench.compare import compare, load, main, render


def _run(path: Path, gbps: float, p50: float) -> Path:
    rows = [{"kind": "meta"},
            {"kind": "hixl", "suite": "block", "name": "hixl", "op": "pull", "path": "tcp",
             "block": 65536, "nblocks": 128, "conc": 1, "status": "ok", "gbps": gbps,
             "p50_us": 900.0},
            {"kind": "hixl", "suite": "kv", "name": "lag", "op": "push", "path": "tcp",
             "block": 0, "nblocks": 0, "conc": 1, "status": "ok", "gbps": 0, "p50_us": p50},
            {"kind": "ceiling", "suite": "block", "name": "tcp-cx4", "op": "pull",
             "path": "tcp", "block": 65536, "nblocks": 128, "conc": 1, "status": "ok",
             "gbps": 9.0}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_medians_of_each_build_are_compared(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    runs = [_run(tmp_path / f"{i}.jsonl", gbps, p50) for i, (gbps, p50) in
            enumerate([(1.0, 100.0), (2.0, 50.0), (3.0, 100.0), (2.0, 50.0)])]
    table = compare([load(runs[0]), load(runs[2])], [load(runs[1]), load(runs[3])])
    by_suite = {key[0]: (unit, a, b) for key, unit, a, b in table}
    assert by_suite == {"block": ("GB/s", 2.0, 2.0), "kv": ("p50 us", 100.0, 50.0)}
    assert "| 2.00 |" in render(table)  # half the latency: twice as good
    assert main([str(p) for p in runs]) == 0
    assert "tcp-cx4" not in capsys.readouterr().out  # ceilings are not compared
