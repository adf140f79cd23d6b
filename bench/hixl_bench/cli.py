"""hixl-bench's command line: parse, plan, run every part in order, report."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from hixl_bench import (
    ceilings,
    checksum,
    env,
    kvshape,
    memory,
    peers,
    plan,
    repeat,
    report,
    runner,
    scale,
    security,
    serve,
    serve_group,
    serve_peers,
    targets,
)
from hixl_bench.model import GIB, MIB, Case, Row

SUITES = ("block", "batch", "conc", "scale", "kv", "serve")
# The serving suite is run on its own (--suites serve): it would double the full sweep.
DEFAULT_SUITES = ("block", "batch", "conc", "scale", "kv")
# The serving suite's clusters (ids offset from the sweep's and the KV suite's);
# the blocking facade's decode cluster is one of its own.
SERVE_ID_BASE = 20
SERVE_FACADE_ID = 29


def _csv(choices: tuple[str, ...]) -> Any:
    def parse(text: str) -> list[str]:
        items = [] if text in ("", "none") else text.split(",")
        bad = [i for i in items if i not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(choices)}")
        return items
    return parse


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hixl-bench", description="hixl throughput and latency against ceilings and peers "
        "measured in the same run (two real daemons on this host).")
    p.add_argument("--quick", action="store_true", help="a smoke run, well under two minutes")
    p.add_argument("--json-out", type=Path, help="write JSON lines (one record per row) here")
    p.add_argument("--plot", type=Path, help="write a PNG of GB/s against block size here")
    p.add_argument("--suites", type=_csv(SUITES), default=list(DEFAULT_SUITES),
                   help="comma-separated: block,batch,conc,scale,kv,serve (default all but "
                   "serve, the serving pattern, which runs on its own)")
    p.add_argument("--ops", type=_csv(plan.OPS), default=list(plan.OPS), help="pull,push")
    p.add_argument("--paths", type=_csv(plan.PATHS), default=list(plan.PATHS), help="local,tcp")
    p.add_argument("--peers", type=_csv(tuple(peers.PEERS)), default=list(peers.PEERS),
                   help="mooncake,nixl or none (default: both; skipped if not installed)")
    p.add_argument("--mooncake-python", help="interpreter with mooncake installed")
    p.add_argument("--nixl-python", help="interpreter with nixl installed")
    p.add_argument("--streams", type=int, default=4,
                   help="TCP streams per link, for hixl and the matching TCP ceiling")
    p.add_argument("--cold-mib", type=int, help="bytes each side rotates through (MiB)")
    p.add_argument("--budget-scale", type=float, default=1.0, help="scale every row's time")
    p.add_argument("--repeat", type=int, default=1,
                   help="whole runs to make; the table shows each row's medians over them")
    p.add_argument("--models", type=_csv((*plan.PRESETS, *plan.SERVE_LAYOUTS)),
                   help="KV presets (kv, serve; the kv-2x* layouts: serve only)")
    p.add_argument("--tokens", type=_ints, help="KV prompt lengths, e.g. 1024,4096")
    p.add_argument("--page-tokens", type=int, default=128, help="tokens per KV page")
    p.add_argument("--no-uvloop", action="store_true", help="run on asyncio's default loop")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--security", type=_csv(security.MODES), default=[],
                   help="also run the sec suite in these modes (e.g. none,token,mtls): a pair "
                   "of daemons per mode, link set-up time and TCP pulls, side by side")
    p.add_argument("--checksum", action="store_true",
                   help="also run the crc suite: TCP pulls and pushes without and with the "
                   "CRC-32C of their bytes, back to back, and the checked row's GB/s and p50 "
                   "over the unchecked one's")
    return p


def make_plan(args: argparse.Namespace) -> plan.Plan:
    build = plan.quick_plan if args.quick else plan.full_plan
    kv_models = [m for m in args.models or [] if m in plan.PRESETS] or None
    made = build(kv_models if args.models else None, args.tokens, args.page_tokens,
                 args.budget_scale)
    cases = tuple(c for c in made.cases if c.suite in args.suites and c.path in args.paths
                  and c.op in args.ops)
    kv = tuple(k for k in made.kv_cases if "kv" in args.suites and k.path in args.paths)
    made = dataclasses.replace(made, cases=cases, kv_cases=kv)
    if "serve" in args.suites and "tcp" in args.paths and "pull" in args.ops:
        serve_cases, serve_budget = plan.serve_plan(args.quick, args.models, args.tokens)
        made = dataclasses.replace(made, serve_cases=serve_cases,
                                   serve_budget=serve_budget.scaled(args.budget_scale))
    if args.cold_mib:
        made = dataclasses.replace(made, cold_bytes=args.cold_mib * MIB)
    return dataclasses.replace(made, cold_bytes=plan.cold_bytes_for(made))


def _scale_counts(args: argparse.Namespace) -> tuple[int, ...]:
    """Block counts of the scale suite (it runs over TCP only)."""
    if "scale" not in args.suites or "tcp" not in args.paths or "pull" not in args.ops:
        return ()
    return scale.QUICK_COUNTS if args.quick else scale.FULL_COUNTS


def _budgets(p: plan.Plan, paths: tuple[str, ...]) -> tuple[int, int, int, int]:
    """(sweep pool, KV pool, budget of daemon A, budget of daemon B) in bytes."""
    sweep_pool = env.pool_bytes_for(p.cold_bytes)
    kv_pool = max([k.prompt_bytes for k in p.kv_cases] or [0]) + 64 * MIB
    # The serving suite: its clusters' pools, and on A the facade's cluster's beside them.
    serve_pool = serve.pool_bytes(p.serve_cases) if p.serve_cases else 0
    facade = max([serve_group.facade_pools([c for _, c in g])
                  for g in serve_group.groups(p.serve_cases)] or [0])
    a = max(sweep_pool * (1 + ("local" in paths)), kv_pool, serve_pool + facade)
    b = max(sweep_pool, kv_pool, serve_pool)
    return sweep_pool, kv_pool, a + 256 * MIB, b + 256 * MIB


def _by_shape(cases: tuple[Case, ...]) -> list[tuple[tuple[int, int], list[Case]]]:
    groups: dict[tuple[int, int], list[Case]] = {}
    for case in cases:
        groups.setdefault(case.shape_key, []).append(case)
    return list(groups.items())


def _ceilings_of(group: list[Case]) -> list[tuple[tuple[int, int], set[str]]]:
    """The ceiling shapes a group of cases compares with, each with its paths."""
    shapes: dict[tuple[int, int], set[str]] = {}
    for case in group:
        shapes.setdefault(case.ceiling_key, set()).add(case.path)
    return sorted(shapes.items())


async def run_hixl(p: plan.Plan, args: argparse.Namespace, native: ceilings.NativeCeilings,
                   progress: report.Progress, peaks: dict[str, int]) -> list[Row]:
    """hixl's rows, each shape's ceilings measured just before them; ``peaks``
    gets each daemon's largest memory beside its pools (see ``memory``)."""
    rows: list[Row] = []
    counts = _scale_counts(args)
    paths = tuple(sorted({c.path for c in p.cases} | ({"tcp"} if counts else set())))
    if not paths and not p.kv_cases and not p.serve_cases:
        return rows
    sweep_pool, kv_pool, budget_a, budget_b = _budgets(p, paths)
    progress.note(f"starting two daemons (pool budgets {budget_a / GIB:.1f} and "
                  f"{budget_b / GIB:.1f} GiB, {args.streams} streams per link)")
    async with env.daemons(budget_a, budget_b, args.streams) as pair, \
            memory.watch({"A": pair.a.pid, "B": pair.b.pid}, peaks) as sampler:
        if paths:
            async with env.clusters(pair, sweep_pool, paths) as linked, \
                    ceilings.echo_ping() as ping:
                # The gRPC ceiling with the daemons up; small rows also
                # interleave it with their own requests (their p50/rtt).
                rows.append(await ceilings.grpc_row(p.budget, ping))
                progress(rows[-1])
                rows += await runner.probe_rows(linked, paths, p.budget, progress, ping)
                rows += await runner.keyed_rows(pair, paths, p.budget, progress, ping)
                for _, group in _by_shape(p.cases):
                    for shape, shape_paths in _ceilings_of(group):
                        rows += await native.measure(shape, shape_paths)
                    for case in group:
                        rows.append(await runner.run_case(linked, case, p.cold_bytes, p.budget,
                                                          ping))
                        progress(rows[-1])
                with sampler.fast():  # the sweep's largest requests: catch their peak
                    scaled = await scale.scale_rows(linked, counts, p.budget) if counts else []
                for row in scaled:
                    rows.append(row)
                    progress(row)
        kv_paths = tuple(sorted({k.path for k in p.kv_cases}))
        if kv_paths:
            async with env.clusters(pair, kv_pool, kv_paths, id_base=10) as linked:
                for kv in p.kv_cases:
                    rows += await native.measure(kv.ceiling_shape(p.cold_bytes), {kv.path})
                    rows.append(await kvshape.run_kv(linked, kv, p.kv_budget))
                    progress(rows[-1])
        if p.serve_cases:
            rows += await _serve_rows(p, pair, native, progress)
    return rows


async def _serve_rows(p: plan.Plan, pair: env.Daemons, native: ceilings.NativeCeilings,
                      progress: report.Progress) -> list[Row]:
    """The serving suite: the 4 KiB reference pull, then each group of cases
    with its TCP ceilings, side by side (``serve_group``).

    Each group runs between clusters of its own, finalized before the next
    starts: a daemon keeps a cluster's pool until the cluster ends, so
    clusters serving the whole suite would hold every case's memory at once
    (the sweep's largest cases are gigabytes on each side). Their peak is
    then the largest group's."""
    rows: list[Row] = []
    async with env.clusters(pair, serve.pool_bytes(()), ("tcp",),
                            id_base=SERVE_ID_BASE) as linked:
        rows.append(await serve.ref_4k_row(linked, p.serve_budget))
        progress(rows[-1])
    for group in serve_group.groups(p.serve_cases):
        cases = tuple(case for _, case in group)
        async with env.clusters(pair, serve.pool_bytes(cases), ("tcp",),
                                id_base=SERVE_ID_BASE) as linked:
            measured = await serve_group.serve_group(pair, linked, native, group, p.cold_bytes,
                                                     p.serve_budget, SERVE_FACADE_ID)
        for row in measured:
            progress(row)
        rows += measured
    return rows


def peer_work(p: plan.Plan) -> peers.Work:
    """What the peers run: the block and batch shapes, and the serving pattern
    (its layouts and block tables, one request in flight: ``serve_peers``)."""
    return peers.Work(p.peer_cases(), serve_peers.jobs(p.serve_cases), p.cold_bytes, p.budget,
                      p.serve_budget)


def _pythons(args: argparse.Namespace) -> dict[str, str]:
    return {name: path for name, path in (("mooncake", args.mooncake_python),
                                          ("nixl", args.nixl_python)) if path}


async def run_measurements(p: plan.Plan, args: argparse.Namespace,
                           progress: report.Progress, peaks: dict[str, int],
                           absent: dict[str, str]) -> list[Row]:
    """hixl interleaved with the native ceilings (and the gRPC one), then the peers."""
    rows: list[Row] = []
    if not p.cases and not _scale_counts(args):  # no probes: the gRPC ceiling comes first
        rows.append(await ceilings.grpc_row(p.budget))
        progress(rows[-1])
    paths = {c.path for c in p.cases} | {k.path for k in p.kv_cases} | \
        ({"tcp"} if p.serve_cases else set())
    streams = sorted({1, args.streams}) if "tcp" in paths else []
    native = ceilings.NativeCeilings(p.cold_bytes, streams, "local" in paths, p.budget, progress)
    try:
        await native.open()
        rows += await run_hixl(p, args, native, progress, peaks)
    finally:
        await native.close()
    if args.security:
        rows += await security.security_rows(args.security, args.streams, p.budget, progress)
    if args.checksum:
        rows += await checksum.checksum_rows(args.streams, p.budget, progress)
    work = peer_work(p)
    if len(work):
        rows += await peers.peer_rows(args.peers, work, _pythons(args), progress, absent)
    return rows


def _meta(p: plan.Plan, args: argparse.Namespace, elapsed: float,
          peaks: dict[str, int]) -> dict[str, Any]:
    return {"command": "hixl-bench " + " ".join(sys.argv[1:]), "quick": args.quick,
            "cold_bytes": p.cold_bytes, "streams": args.streams, "cpus": os.cpu_count(),
            "machine": platform.machine(), "python": platform.python_version(),
            "budget_s": p.budget.seconds, "repeat": args.repeat, "elapsed_s": round(elapsed, 1),
            "daemon_beside_pools_peak_mib": {name: round(peak / MIB, 1)
                                             for name, peak in sorted(peaks.items())}}


def _count(p: plan.Plan, args: argparse.Namespace, absent: dict[str, str]) -> int:
    """Rows the run will print: a peer in ``absent`` (not installed) prints one."""
    tcp_names = [f"tcp{n}" for n in {1, args.streams}]
    ceiling_rows: set[tuple[str, tuple[int, int]]] = set()
    shapes = [shape for _, group in _by_shape(p.cases) for shape in _ceilings_of(group)]
    shapes += [(k.ceiling_shape(p.cold_bytes), {k.path}) for k in p.kv_cases]
    shapes += [(c.ceiling_shape(p.cold_bytes), {"tcp"}) for c in p.serve_cases]
    for shape, paths in shapes:
        names = (["memcpy"] if "local" in paths else []) + (tcp_names if "tcp" in paths else [])
        ceiling_rows |= {(name, shape) for name in names}
    counts = _scale_counts(args)
    paths = {c.path for c in p.cases} | ({"tcp"} if counts else set())
    probes = (1 + 2 * len(paths)) if paths else 0  # no-op; tiny and keyed per path
    serving = len(p.serve_cases) + 1 if p.serve_cases else 0  # and the 4 KiB reference
    return 1 + len(ceiling_rows) + probes + len(p.cases) + len(counts) + len(p.kv_cases) + \
        serving + _peer_count(p, args, absent) + \
        len(args.security) * len(security.BLOCKS) + \
        (checksum.rows_per_run() if args.checksum else 0)


def _peer_count(p: plan.Plan, args: argparse.Namespace, absent: dict[str, str]) -> int:
    cases = len(peer_work(p))
    if not cases:
        return 0  # run_measurements calls no peer
    return sum(1 if name in absent else cases for name in args.peers)


async def run(args: argparse.Namespace) -> int:
    p = make_plan(args)
    absent = await peers.missing(args.peers, _pythons(args),
                                 serving=bool(peer_work(p).serve_jobs))
    with report.Progress(_count(p, args, absent) * args.repeat, quiet=args.quiet) as progress:
        return await _run(p, args, absent, progress)


async def _run(p: plan.Plan, args: argparse.Namespace, absent: dict[str, str],
               progress: report.Progress) -> int:
    progress.note(f"{'quick' if args.quick else 'full'} run: {len(p.cases)} sweep cases, "
                  f"{len(p.kv_cases)} KV cases, {len(p.serve_cases)} serving cases, "
                  f"cold buffers {p.cold_bytes // MIB} MiB per side"
                  + (f", {args.repeat} times" if args.repeat > 1 else ""))
    started = time.monotonic()
    runs = []
    peaks: dict[str, int] = {}  # over every run
    for _ in range(args.repeat):
        rows = await run_measurements(p, args, progress, peaks, absent)
        report.add_ratios(rows, args.streams)  # within each run, between neighbouring rows
        runs.append(rows)
    rows = repeat.median_of_runs(runs)
    print()
    report.print_table(rows)
    meta = _meta(p, args, time.monotonic() - started, peaks)
    if p.serve_cases:
        outcomes = targets.check(rows)
        report.print_targets(outcomes)
        meta["serve_targets"] = [o.to_json() for o in outcomes]
    if peaks:
        print("\ndaemon memory beside its pools (RssAnon + RssFile), peak over the run: "
              + ", ".join(f"{name} {mib} MiB" for name, mib in
                          meta["daemon_beside_pools_peak_mib"].items()))
    if args.json_out:
        report.write_json(args.json_out, rows, meta)
        print(f"\nJSON lines: {args.json_out}")
    if args.plot:
        from hixl_bench.plot import plot

        problem = plot([{"kind": "meta", **meta}, *(r.to_json() for r in rows)], args.plot)
        print(f"plot: {problem or args.plot}")
    else:
        problem = None
    failed = [r for r in rows if r.status.startswith("error")]
    print(f"\n{len(rows)} rows in {meta['elapsed_s']} s; {len(failed)} failed, "
          f"{sum(r.status.startswith('skipped') for r in rows)} skipped")
    return 1 if failed or problem else 0


def run_cli(argv: list[str]) -> int:
    """Parse ``argv`` and run; returns the exit code (2 for bad arguments)."""
    args = parser().parse_args(argv)
    if not 1 <= args.streams <= 64:
        parser().error("--streams must be in [1, 64]")
    if not 1 <= args.repeat <= 20:
        parser().error("--repeat must be in [1, 20]")
    if args.plot:
        from hixl_bench.plot import missing_matplotlib

        hint = missing_matplotlib()
        if hint:  # before the run, not after minutes of it
            parser().error(hint)
    if args.no_uvloop:
        return asyncio.run(run(args))
    import uvloop

    return uvloop.run(run(args))
