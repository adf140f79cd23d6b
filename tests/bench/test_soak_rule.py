"""hixl_bench.soak's judgement, on figures made up here: what counts as a leak or a failure.

The tool's runs (tests/integration/test_soak.py) show it passing real
daemons; these show it would fail them for each thing it claims to check.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

from hixl_bench.procstat import PoolFigures, ProcFigures
from hixl_bench.soak import (
    ALLOWED,
    HUNG,
    SUCCESS,
    Restart,
    Snapshot,
    Soak,
    SoakConfig,
    restart_points,
)

MIB = 1 << 20
POOLS = PoolFigures(reserved_bytes=8 * MIB, used_bytes=MIB, pools=8, caches=8, sessions=8,
                    clusters=8, links={"outbound up": 8})
PROC = ProcFigures(rss_bytes=80 * MIB, anon_bytes=40 * MIB, fds=100, threads=50)


def clean_soak() -> Soak:
    config = SoakConfig(links=8, transfers=100, restarts=1)
    snap = Snapshot({"decode": PROC, "prompt": PROC, "tool": PROC},
                    {"decode": POOLS, "prompt": POOLS})
    return Soak(config, started=100, statuses=Counter({SUCCESS: 90, "LLM_LINK_FAILED": 10}),
                restarts=[Restart(40, "SIGKILL", 1.0, 0.5)],
                final_sweep=Counter({SUCCESS: 16}), baseline=snap, held=snap, after=snap)


def test_a_clean_run_has_no_problem() -> None:
    assert clean_soak().problems() == []


def test_each_kind_of_leak_is_reported() -> None:
    soak = clean_soak()
    assert soak.after is not None
    procs = dict(soak.after.procs)
    procs["decode"] = dataclasses.replace(PROC, fds=PROC.fds + 3)  # slack is 2
    procs["prompt"] = dataclasses.replace(PROC, threads=PROC.threads + 3)
    procs["tool"] = dataclasses.replace(PROC, anon_bytes=PROC.anon_bytes + 33 * MIB,
                                        rss_bytes=PROC.rss_bytes + 99 * MIB)
    admin = {"decode": dataclasses.replace(POOLS, used_bytes=2 * MIB),
             "prompt": dataclasses.replace(POOLS, links={"outbound up": 7, "outbound down": 1})}
    soak.after = Snapshot(procs, admin)
    leaks = soak.leaks()
    assert len(leaks) == 5, leaks
    assert any(leak.startswith("decode: fds 100 -> 103") for leak in leaks)
    assert any(leak.startswith("prompt: threads 50 -> 53") for leak in leaks)
    assert any(leak.startswith("tool: RssAnon grew 33.0 MiB") for leak in leaks)
    assert any("used_bytes" in leak for leak in leaks)
    assert any("links" in leak for leak in leaks)


def test_unended_odd_and_unhealed_runs_are_failures() -> None:
    soak = clean_soak()
    soak.statuses[HUNG] += 1
    soak.started += 1
    soak.final_sweep = Counter({SUCCESS: 15, "LLM_LINK_FAILED": 1})
    soak.restarts[0].heal_s = None
    problems = soak.problems()
    assert any("never ended" in p and HUNG in p for p in problems)
    assert any("did not all heal" in p for p in problems)
    assert any("every link after the run" in p for p in problems)
    assert any("101 transfers started" in p for p in problems)
    assert HUNG not in ALLOWED


def test_restart_points_leave_room_before_and_after() -> None:
    points = restart_points(20_000, 10, random.Random(1))
    assert len(points) == 10 and points == sorted(points)
    assert 0 < points[0] and points[-1] < 20_000 - 20_000 // 11 * 0.2


def test_bad_settings_are_refused_with_their_reason() -> None:
    assert SoakConfig(guard_s=1.0).check() == ["--guard-s must be above the sync_kv_timeout"]
    assert SoakConfig(signals=("SIGSTOP",)).check() == ["--signals takes SIGKILL and SIGTERM"]
    assert SoakConfig(transfers=100, restarts=5).check() == [
        "--restarts must be in [0, transfers / 50]"]
