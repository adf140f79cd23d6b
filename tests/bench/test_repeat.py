"""hixl-bench --repeat: rows of several runs folded into their medians."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hixl_bench.model import CEILING, HIXL, Row
from hixl_bench.repeat import median_of_runs

ROOT = Path(__file__).resolve().parents[2]


def _run(ratios: tuple[float, float], gbps: float, status: str = "ok") -> list[Row]:
    ceiling = Row(CEILING, "memcpy", "ceiling", "copy", "local", 4096, 1, gbps=10.0)
    # The same ceiling shape measured twice in one run (as KV cases do).
    again = Row(CEILING, "memcpy", "ceiling", "copy", "local", 4096, 1, gbps=20.0)
    hixl = Row(HIXL, "hixl", "block", "pull", "local", 4096, 1, status=status, requests=10,
               gbps=gbps, p50_us=gbps * 10, ratio=ratios[0], extra={"lag_ratio": ratios[1],
                                                                    "model": "tiny"})
    return [ceiling, hixl, again]


def test_each_figure_is_the_median_over_runs_with_the_ratio_spread() -> None:
    runs = [_run((0.5, 1.0), 5.0), _run((0.9, 3.0), 9.0), _run((0.6, 2.0), 6.0)]
    ceiling, hixl, again = median_of_runs(runs)
    assert (ceiling.gbps, again.gbps) == (10.0, 20.0)  # occurrences stay apart
    assert hixl.ratio == 0.6 and hixl.gbps == 6.0 and hixl.p50_us == 60.0
    assert hixl.extra["lag_ratio"] == 2.0 and hixl.extra["model"] == "tiny"
    assert (hixl.extra["ratio_min"], hixl.extra["ratio_max"], hixl.extra["runs"]) == (0.5, 0.9, 3)
    assert hixl.requests == 30
    assert runs[0][1].ratio == 0.5  # the runs' own rows are left as they were


def test_a_row_that_failed_in_any_run_keeps_the_failure() -> None:
    merged = median_of_runs([_run((0.5, 1.0), 5.0), _run((0.9, 1.0), 9.0, "error: boom")])
    assert merged[1].status == "error: boom"


def test_one_run_is_returned_as_is() -> None:
    rows = _run((0.5, 1.0), 5.0)
    assert median_of_runs([rows]) is rows


@pytest.mark.parametrize("bad", ["0", "21"])
def test_repeat_out_of_range_exits_2(bad: str) -> None:
    done = subprocess.run([sys.executable, "-m", "hixl_bench", "--repeat", bad],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--repeat" in done.stderr
