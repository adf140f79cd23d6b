"""hixl-bench's serving suite: block tables, the byte-exact check, targets, a smoke run.

Nothing here asserts anything about speed: the targets are judged on
hand-made rows (their logic), and the smoke run only checks that rows come
out and that their pulls were checked byte-exact.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from hixl_bench import ceilings, cli, env, report, serve, serve_group, targets
from hixl_bench.model import CEILING, HIXL, MIB, PROBE, Budget, Row, Timing
from hixl_bench.plan import PRESETS, SERVE_LAYOUTS, Plan, ServeCase, serve_plan
from hixl_wire._proto.hixl.v1 import admin_pb2, admin_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


def _case(conc: int = 1, tokens: int = 256, client: str = "async") -> ServeCase:
    return ServeCase(PRESETS["tiny"], "fp16", tokens, 16, conc, client=client)


@pytest.mark.parametrize("conc", [1, 4, 16])
def test_block_tables_are_scattered_disjoint_in_flight_and_differ_by_side(conc: int) -> None:
    case = _case(conc)
    prefill, decode = serve.side_tables(case, 3)
    assert prefill != decode
    assert serve.side_tables(case, 3) == (prefill, decode)  # seeded
    for tables in (prefill, decode):
        assert len(tables) == conc and all(len(t) == serve.ROTATIONS for t in tables)
        for rotation in range(serve.ROTATIONS):
            in_flight = [b for slot in tables for b in slot[rotation]]
            # the requests in flight at once never share a block
            assert len(set(in_flight)) == len(in_flight) == conc * case.blocks
            assert all(0 <= b < case.pool_blocks for b in in_flight)
        # rarely contiguous: most neighbours in a table are not next to each other
        table = tables[0][0]
        steps = sum(abs(b - a) == 1 for a, b in itertools.pairwise(table))
        assert steps < len(table) // 2


def test_the_check_finds_a_block_that_landed_wrong() -> None:
    case = _case()
    words = case.pool_blocks * case.block_bytes // 4
    src = [np.zeros(words, np.uint32) for _ in range(case.tensors)]
    dst = [np.zeros(words, np.uint32) for _ in range(case.tensors)]
    src_addrs = [a.ctypes.data for a in src]
    dst_addrs = [a.ctypes.data for a in dst]
    serve.fill_source(case, src_addrs)
    (src_table, *_), (dst_table, *_) = (t[0] for t in serve.side_tables(case, 0))
    blocks = case.block_bytes // 4
    for tensor in range(case.tensors):  # what a pull does
        s = src[tensor].reshape(case.pool_blocks, blocks)
        dst[tensor].reshape(case.pool_blocks, blocks)[dst_table] = s[src_table]
    serve.check_blocks(case, dst_addrs, src_table, dst_table)
    dst[1].reshape(case.pool_blocks, blocks)[dst_table[2], 5] ^= 1
    with pytest.raises(RuntimeError, match="tensor 1"):
        serve.check_blocks(case, dst_addrs, src_table, dst_table)
    serve.clear_blocks(case, dst_addrs, dst_table)
    assert not any(d.any() for d in dst)


def test_cases_match_the_layouts_of_the_issue() -> None:
    eight, seventy = PRESETS["llama3-8b"], PRESETS["llama3-70b"]
    big = ServeCase(eight, "fp16", 1024, 128)
    assert (big.tensors, big.blocks, big.block_bytes) == (64, 8, 256 << 10)
    assert big.request_bytes == 128 << 20
    assert ServeCase(eight, "fp16", 1024, 16).ranges == 4096
    assert ServeCase(seventy, "bf16", 128, 16).tensors == 160
    small = ServeCase(SERVE_LAYOUTS["kv-2x16k"], "fp16", 256, 16)
    assert (small.blocks, small.tensors, small.block_bytes) == (16, 2, 16 << 10)
    quick, _ = serve_plan(True)
    assert {(c.memory, c.client) for c in quick} >= {(m, k) for m in ("shareable", "pool",
                                                                      "engine")
                                                     for k in ("async", "sync")}
    assert {c.dtype for c in quick} == {"fp16", "bf16"}
    full, _ = serve_plan(False)
    assert {c.conc for c in full} == {1, 4, 16}
    assert min(c.tokens for c in full) == 128 and max(c.tokens for c in full) == 32768


def test_serve_runs_only_when_asked() -> None:
    assert not cli.make_plan(cli.parser().parse_args([])).serve_cases
    asked = cli.make_plan(cli.parser().parse_args(["--suites", "serve", "--quick"]))
    assert asked.serve_cases and not asked.cases and not asked.kv_cases


def _row(client: str = "async", memory: str = "shareable", *, tokens: int = 1024,
         block_tokens: int = 128, model: str = "llama3-8b", **values: object) -> Row:
    case = ServeCase(SERVE_LAYOUTS.get(model) or PRESETS[model], "fp16", tokens, block_tokens,
                     memory=memory, client=client)
    row = serve.row_of(case, 0, 1 << 30)
    for name, value in values.items():
        setattr(row, name, value)
    return row


def test_targets_are_judged_on_the_rows_of_one_run() -> None:
    rows = [
        _row(gbps=2.0, p50_us=60_000.0, ratio=0.85, ratio_to="tcp-cx4"),
        _row(block_tokens=16, gbps=1.0, p50_us=130_000.0, ratio=0.5, ratio_to="tcp-cx4"),
        _row("sync", gbps=1.9, p50_us=64_000.0),
        _row(model="kv-2x16k", tokens=256, block_tokens=16, p50_us=300.0, gbps=1.7),
        Row(PROBE, serve.REF_4K, "serve", "pull", "tcp", 4096, 1, p50_us=200.0),
        _row(memory="engine", status="skipped: unsupported"),
    ]
    tcp128, tcp16, small, facade, engine = targets.check(rows)
    assert tcp128.met is True and tcp16.met is False
    assert small.met is True and "1.50 x" in small.measured
    assert facade.met is True and "1.07" in facade.measured
    assert engine.met is None  # the engine row was skipped: nothing to judge
    rows[2].p50_us = 80_000.0
    assert targets.check(rows)[3].met is False
    assert "[MISSED]" in targets.check(rows)[3].line()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_tiny_serve_run_pulls_byte_exact_rows(tmp_path: Path) -> None:
    out = tmp_path / "serve.jsonl"
    command = [sys.executable, "-m", "hixl_bench", "--suites", "serve", "--quick",
               "--models", "tiny", "--tokens", "256", "--budget-scale", "0.2",
               "--json-out", str(out), "--quiet"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=230,
                          check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "serving targets" in done.stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    meta, rows = records[0], records[1:]
    assert len(meta["serve_targets"]) == 5
    serving = [r for r in rows if r["kind"] == HIXL and r["suite"] == "serve"]
    ok = [r for r in serving if r["status"] == "ok"]
    # shareable and pool memory on both clients, and several in flight
    assert {(r["memory"], r["client"]) for r in ok} >= {
        ("shareable", "async"), ("shareable", "sync"), ("pool", "async"), ("pool", "sync")}
    assert {r["client"] for r in ok if r["conc"] == 4 and r["dtype"] == "bf16"} == {
        "async", "sync"}
    for row in ok:
        # checked byte-exact before (every table) and after the timed pulls (the last ones)
        assert row["verified_pulls"] == (serve.ROTATIONS + 1) * row["conc"], row
        assert row["requests"] > 0 and row["p50_us"] > 0 and row["p99_us"] >= row["p50_us"]
        assert row["ratio"] is not None and row["ratio_to"] == "tcp-cx4", row
    # memory the engine allocated itself: measured where registration works, else said so
    for row in (r for r in serving if r["memory"] == "engine"):
        assert row["status"] == "ok" or row["status"].startswith("skipped: unsupported"), row
    assert all(r["status"] == "ok" or r["status"].startswith("skipped") for r in rows)
    assert any(r["name"] == serve.REF_4K and r["status"] == "ok" for r in rows)
    assert {"mooncake-tcp", "nixl-ucx-tcp"} <= {r["name"] for r in rows if r["kind"] == "peer"}


async def _clustered_sessions(target: str) -> set[str]:
    """The sessions of a daemon that hold a cluster now."""
    async with grpc.aio.insecure_channel(target) as channel:
        status = await admin_pb2_grpc.AdminStub(channel).GetStatus(
            admin_pb2.GetStatusRequest(), timeout=10)
    return {s.session_id for s in status.sessions if s.has_cluster}


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_each_group_runs_between_clusters_of_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon keeps a cluster's pool until the cluster ends, so each group of
    cases gets clusters of its own, finalized before the next group starts:
    the sweep's peak memory is its largest group's."""
    budget = Budget(0.05, 2, 20, 1)
    cases = (_case(), _case(client="sync"), _case(tokens=512))
    made = Plan((), (), 64 * MIB, budget, budget, serve_cases=cases, serve_budget=budget)
    seen: list[tuple[set[str], set[str]]] = []
    measure = serve_group.serve_group

    async def observed(pair: env.Daemons, *args: Any, **kwargs: Any) -> list[Row]:
        seen.append((await _clustered_sessions(pair.a.client_target),
                     await _clustered_sessions(pair.b.client_target)))
        return await measure(pair, *args, **kwargs)

    monkeypatch.setattr(serve_group, "serve_group", observed)
    progress = report.Progress(0, quiet=True)
    native = ceilings.NativeCeilings(made.cold_bytes, [1], False, budget, progress)
    async with env.daemons(512 * MIB, 512 * MIB, 1) as pair:
        await native.open()
        try:
            rows = await cli._serve_rows(made, pair, native, progress)
        finally:
            await native.close()
        left = (await _clustered_sessions(pair.a.client_target),
                await _clustered_sessions(pair.b.client_target))
    hixl = [r for r in rows if r.kind == HIXL]
    assert [(r.extra["client"], r.extra["tokens"], r.status) for r in hixl] == [
        ("async", 256, "ok"), ("sync", 256, "ok"), ("async", 512, "ok")], rows
    # each group's ceiling row comes before its cases, timed with them
    assert [r.kind for r in rows[1:]] == [CEILING, HIXL, HIXL, CEILING, HIXL], rows
    assert all(r.requests > 0 for r in rows[1:]), rows
    assert hixl[0].extra["ref_4k_p50_us"] > 0  # the small async row paced the reference
    (first_a, first_b), (second_a, second_b) = seen
    # one decode cluster on A and one prefill cluster on B per group (the
    # facade's cluster opens inside the group), none of the 4 KiB reference's
    # or the previous group's left beside them
    assert len(first_a) == len(first_b) == len(second_a) == len(second_b) == 1, seen
    assert not first_a & second_a and not first_b & second_b, seen
    assert left == (set(), set())


class _Slices:
    """A member that records when it was timed, and may fail on one slice."""

    def __init__(self, name: str, log: list[str], fail_on: int | None = None) -> None:
        self.name, self.log, self.fail_on = name, log, fail_on
        self.row = Row(HIXL, name, "serve", "pull", "tcp")
        self.request_bytes = 1
        self.calls = 0

    async def slice(self, budget: Budget) -> Timing:
        self.calls += 1
        self.log.append(self.name)
        if self.calls == self.fail_on:
            raise RuntimeError("lost")
        return Timing([budget.seconds], budget.seconds)


@pytest.mark.asyncio
async def test_members_take_turns_in_alternating_order() -> None:
    log: list[str] = []
    a, b, c = _Slices("a", log), _Slices("b", log, fail_on=2), _Slices("c", log)
    timings = await serve_group.take_turns([a, b, c], Budget(1.0, 4, 40, 1), rounds=4)
    assert log == ["a", "b", "c", "c", "b", "a", "a", "c", "c", "a"]
    assert sorted(timings) == [0, 2] and b.row.status == "error: RuntimeError: lost"
    assert timings[0].latencies == [0.25] * 4 and timings[0].wall_s == 1.0
    assert serve_group.sliced(Budget(1.0, 5, 2000, 2), 4) == Budget(0.25, 2, 500, 2)
    # rows a target compares time enough requests, in as many rounds
    assert serve_group.sliced(Budget(0.3, 3, 500, 1), 4, at_least=48) == Budget(0.075, 12, 125, 1)
