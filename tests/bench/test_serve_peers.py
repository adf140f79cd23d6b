"""The peers (Mooncake TE, NIXL) on the serving pattern: their jobs, ranges, checks and rows.

The peers are installed by hand (bench/pyproject.toml), so most of this runs
without them: the jobs they get, the ranges their worker moves and its
byte-exact check (in this process, on plain memory), their rows beside
hixl's, and a peer that is not installed becoming one skipped row. Where a
peer imports, in this interpreter or in the one named by
``HIXL_BENCH_MOONCAKE_PYTHON`` / ``HIXL_BENCH_NIXL_PYTHON``, a small real
run moves and checks serving jobs through it; otherwise that test is
skipped with the reason. Nothing here asserts anything about speed.
"""

from __future__ import annotations

import asyncio
import ctypes
import io
import os
import sys

import pytest

from hixl_bench import peer_worker, peers, report, serve, serve_peers
from hixl_bench.model import CEILING, PEER, Budget, Case, Row
from hixl_bench.plan import PRESETS, ServeCase, serve_plan

TINY = PRESETS["tiny"]


def test_jobs_are_the_one_in_flight_layouts_on_the_tables_of_hixls_rows() -> None:
    cases, _ = serve_plan(True)
    jobs = serve_peers.jobs(cases)
    layouts = {(c.model, c.dtype, c.tokens, c.block_tokens) for c in cases if c.conc == 1}
    assert {(j.case.model, j.case.dtype, j.case.tokens, j.case.block_tokens)
            for j in jobs} == layouts
    assert len(jobs) == len(layouts)  # one per layout, not one per memory and client
    for job in jobs:
        assert cases[job.index] == job.case and job.case.conc == 1
        # beside the shareable async row, whose seeded tables it moves
        assert (job.case.memory, job.case.client) == ("shareable", "async")
        src, dst = serve.side_tables(job.case, job.index)
        spec = job.spec()
        assert (spec["src"], spec["dst"]) == (src[0], dst[0])
        assert spec["tensors"] * spec["tensor_bytes"] == job.case.cache_bytes
    assert serve_peers.region_bytes(jobs) == max(j.case.cache_bytes for j in jobs)
    # a layout run only with several in flight has no job
    only_conc = ServeCase(TINY, "fp16", 256, 16, conc=4)
    assert serve_peers.jobs((only_conc,)) == []


def test_prompt_ranges_move_each_source_block_into_its_destination() -> None:
    block, pool = 4096, 16
    job = {"tensors": 2, "tensor_bytes": pool * block, "block_bytes": block,
           "src": [[0, 1, 2, 7]], "dst": [[3, 4, 5, 9]]}
    local, remote, lengths = peer_worker.prompt_ranges(job, 0)
    tensor = pool * block
    # blocks contiguous on both sides are one range; every tensor has its own
    assert list(zip(local, remote, lengths, strict=True)) == [
        (3 * block, 0, 3 * block), (9 * block, 7 * block, block),
        (tensor + 3 * block, tensor, 3 * block), (tensor + 9 * block, tensor + 7 * block, block)]
    case = ServeCase(TINY, "fp16", 256, 16)
    spec = serve_peers.ServeJob(case, 0).spec()
    for rotation in range(serve.ROTATIONS):
        local, remote, lengths = peer_worker.prompt_ranges(spec, rotation)
        assert sum(lengths) == case.request_bytes
        src, dst = spec["src"][rotation], spec["dst"][rotation]
        moved = {(lo + k * case.block_bytes, ro + k * case.block_bytes)
                 for lo, ro, n in zip(local, remote, lengths, strict=True)
                 for k in range(n // case.block_bytes)}
        bytes_per_tensor = spec["tensor_bytes"]
        assert moved == {(t * bytes_per_tensor + d * case.block_bytes,
                          t * bytes_per_tensor + s * case.block_bytes)
                         for t in range(case.tensors) for s, d in zip(src, dst, strict=True)}


def test_the_workers_check_finds_a_range_that_landed_wrong() -> None:
    size = 64 * 4096
    source, dest = peer_worker._Buffer(size, 0x5A), peer_worker._Buffer(size, 0)
    source.fill_pattern()
    ranges = ([4096, 65536], [8192, 0], [4096, 8192])
    for lo, ro, n in zip(*ranges, strict=True):  # what a pull does
        ctypes.memmove(dest.addr + lo, source.addr + ro, n)
    peer_worker.check_ranges(dest, ranges)
    ctypes.memset(dest.addr + 65536 + 100, 7, 1)
    with pytest.raises(RuntimeError, match="to local offset 65536"):
        peer_worker.check_ranges(dest, ranges)
    # a range pulled from the wrong offset differs too
    ctypes.memmove(dest.addr + 4096, source.addr + 4096, 4096)
    with pytest.raises(RuntimeError, match="not byte-exact"):
        peer_worker.check_ranges(dest, ([4096], [8192], [4096]))
    peer_worker.clear_ranges(dest, ranges)
    assert not any(dest.map[:])


def test_a_serving_peer_row_sits_beside_its_hixl_row_with_both_ratios() -> None:
    case = ServeCase(TINY, "fp16", 256, 16)
    hixl = serve.row_of(case, 3, 1 << 30)
    hixl.gbps, hixl.p50_us = 2.0, 500.0
    other = serve.row_of(ServeCase(TINY, "fp16", 256, 128), 4, 1 << 30)
    other.gbps = 1.0
    hixl.extra["verified_pulls"] = other.extra["verified_pulls"] = 5
    ceiling = Row(CEILING, "tcp-cx4", "serve", "pull", "tcp", hixl.block,
                  hixl.extra["ceiling_nblocks"], gbps=4.0)
    peer = serve_peers.ServeJob(case, 3).row("mooncake-tcp", 1 << 30)
    peer.gbps, peer.p50_us, peer.p99_us = 1.0, 900.0, 1200.0
    peer.extra.update(verified_pulls=5, ranges=100)
    block_peer = Row(PEER, "mooncake-tcp", "block", "pull", "tcp", 4096, 1, gbps=0.1)
    rows = [ceiling, hixl, other, peer, block_peer]
    report.add_ratios(rows, 4)
    assert peer.ratio == pytest.approx(0.25) and peer.ratio_to == "tcp-cx4"
    assert peer.extra["hixl_ratio"] == pytest.approx(0.5)
    assert hixl.ratio == pytest.approx(0.5)
    assert (peer.block, peer.nblocks, peer.conc) == (hixl.block, hixl.nblocks, 1)
    record = peer.to_json()
    assert record["case_index"] == hixl.to_json()["case_index"] == 3
    line = report.format_row(peer)
    assert "hixl row 3's tables, one in flight" in line and "0.50 x hixl's GB/s" in line
    out = io.StringIO()
    report.print_table(rows, out)
    lines = [line for line in out.getvalue().splitlines() if line]
    names = [line.split()[0] for line in lines[2:]]
    # ceilings, then hixl's row of case 3 with the peer's right after it, then case 4
    assert names == ["tcp-cx4", "hixl", "mooncake-tcp", "hixl", "mooncake-tcp"]
    assert "hixl row 3's tables" in lines[4] and lines[6].split()[1] == "block"


def _work(jobs: list[serve_peers.ServeJob], cases: list[Case] | None = None) -> peers.Work:
    budget = Budget(0.05, 2, 20, 1)
    return peers.Work(cases or [], jobs, 1 << 20, budget, budget)


def test_a_peer_that_is_not_installed_is_one_skipped_row() -> None:
    jobs = serve_peers.jobs((ServeCase(TINY, "fp16", 256, 16),))
    pythons = {"mooncake": os.devnull, "nixl": os.devnull}  # not an interpreter
    absent = asyncio.run(peers.missing(["mooncake", "nixl"], pythons, serving=True))
    assert set(absent) == {"mooncake", "nixl"}
    seen: list[Row] = []
    rows = asyncio.run(peers.peer_rows(["mooncake", "nixl"], _work(jobs), pythons,
                                       seen.append, absent))
    assert rows == seen and [r.name for r in rows] == ["mooncake-tcp", "nixl-ucx-tcp"]
    assert all(r.status.startswith("skipped: cannot run") and r.gbps is None for r in rows)


def _python_of(name: str) -> str:
    return os.environ.get(f"HIXL_BENCH_{name.upper()}_PYTHON") or sys.executable


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", sorted(peers.PEERS))
def test_an_installed_peer_moves_the_serving_pattern_byte_exact(name: str) -> None:
    python = _python_of(name)
    absent = asyncio.run(peers.missing([name], {name: python}, serving=True))
    if name in absent:
        pytest.skip(f"{name} under {python}: {absent[name]}")
    cases = (ServeCase(TINY, "fp16", 256, 16), ServeCase(TINY, "bf16", 128, 128))
    jobs = serve_peers.jobs(cases)
    work = _work(jobs, [Case("block", "pull", "tcp", 4096, 1)])
    seen: list[Row] = []
    rows = asyncio.run(peers.peer_rows([name], work, {name: python}, seen.append, absent))
    assert rows == seen and len(rows) == 3
    assert all(r.ok for r in rows), [r.status for r in rows]
    for row, job in zip(rows[1:], jobs, strict=True):
        assert row.suite == "serve" and row.extra["case_index"] == job.index
        assert row.extra["verified_pulls"] == serve_peers.CHECKED_PULLS
        assert 0 < row.extra["ranges"] <= job.case.ranges
        assert row.requests >= 2 and row.p99_us is not None and row.p50_us is not None
        assert row.p99_us >= row.p50_us
