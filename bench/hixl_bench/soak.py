"""Transfers over many links while the prompt daemon restarts: ``python -m hixl_bench.soak``.

Two daemons on loopback (see ``linkmesh``): ``--links`` links from decode
clusters to prompt clusters, ``--transfers`` pulls and pushes of one slot
spread at random over them by ``--concurrency`` workers, and ``--restarts``
restarts of the prompt daemon at random points (SIGKILL or SIGTERM, then a
start on the same peer port; its clusters initialise again and register
their caches anew, and the decoders' links heal by themselves).

Every transfer runs under a bound (``--guard-s``, well above the clusters'
``sync_kv_timeout``) and ends with a status: success, or one a restart
explains (``ALLOWED``). A pull's landed bytes are checked against what the
prompt cluster serves. After the last transfer, and once all links are up
again, a pull and a push over every link must succeed.

Before the run (after a warm-up of ``--warmup`` transfers around one
restart of its own, and a pull and a push over every link) and after it
(once figures settle) the tool reads, for both daemons and for itself,
RSS, open fds and threads, and each daemon's pool bytes, caches, sessions
and links (Admin), each time after a full garbage collection in every
process (``collect``; the figures before it are reported as "held"). The
rule for a leak (``Soak.leaks``):

* fds and threads of every process at most their warm-up value plus
  ``--fd-slack`` / ``--thread-slack`` (threads less the process's
  default-executor threads, which it starts as its ``to_thread`` calls
  overlap and then keeps: ``procstat.executor_threads``; a daemon's as of
  its last collection);
* private memory (``RssAnon``) grown by at most ``--rss-slack-mib``
  (``VmRSS`` is reported too; it also counts pool pages as the run first
  touches them);
* each daemon's pool bytes (reserved and used), pools, caches and sessions
  exactly their warm-up value, and every link up.

The prompt daemon after the run is a process started at the last restart:
its figures are compared with the first one's, which carried the same
clusters, caches and links. The tool prints a table, writes JSON
(``--json-out``) and exits 1 on a leak, a transfer that never ended, a
status no restart explains, wrong bytes, or a link that did not heal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hixl_bench.linkmesh import Mesh, MeshShape, mesh, pattern
from hixl_bench.procstat import (
    PoolFigures,
    ProcFigures,
    mib,
    own_figures,
    pool_figures,
    raise_nofile,
)
from hixl_client import CacheKeyByIdAndIndex, LLMException, LLMStatusCode

SUCCESS = LLMStatusCode.LLM_SUCCESS.name
# What a transfer may end with while the prompt daemon restarts.
ALLOWED = frozenset({
    SUCCESS,
    LLMStatusCode.LLM_LINK_FAILED.name,
    LLMStatusCode.LLM_TIMEOUT.name,
    LLMStatusCode.LLM_KV_CACHE_NOT_EXIST.name,
    LLMStatusCode.LLM_NOT_YET_LINK.name,
})
HUNG = "HUNG"  # the guard ended it: it would never have ended by itself
WRONG_BYTES = "WRONG_BYTES"
_POLL_S = 0.2
_STEADY_S = 2.0
_SETTLE_POLL_S = 1.0


@dataclass(frozen=True)
class SoakConfig:
    links: int = 64
    transfers: int = 20_000
    concurrency: int = 16
    restarts: int | None = None  # None: one per 2,000 transfers
    kill_share: float = 0.5  # of restarts, SIGKILL; the others SIGTERM
    signals: tuple[str, ...] = ()  # if given: restart i stops with signals[i % len], not by chance
    push_share: float = 0.5
    warmup: int = 200
    block: int = 4096
    streams: int = 4
    sync_kv_timeout_ms: int = 3000
    guard_s: float = 20.0
    # A worker whose transfer failed waits this long before its next, as a
    # serving stack would back off: a restart then costs a few hundred
    # failed transfers, not the whole run.
    fail_pause_s: float = 0.2
    heal_s: float = 30.0  # a restart's links must all be up again within this
    settle_s: float = 30.0
    fd_slack: int = 2
    thread_slack: int = 2
    rss_slack_mib: float = 32.0
    seed: int = 21

    @property
    def restart_count(self) -> int:
        return self.transfers // 2000 if self.restarts is None else self.restarts

    def check(self) -> list[str]:
        problems = []
        if not 1 <= self.links <= 100_000:
            problems.append("--links must be in [1, 100000]")
        if self.transfers < 1 or not 1 <= self.concurrency <= 1024:
            problems.append("--transfers must be >= 1 and --concurrency in [1, 1024]")
        if self.restart_count < 0 or self.restart_count > self.transfers // 50:
            problems.append("--restarts must be in [0, transfers / 50]")
        if not (0 <= self.kill_share <= 1 and 0 <= self.push_share <= 1):
            problems.append("--kill-share and --push-share must be in [0, 1]")
        if set(self.signals) - {"SIGKILL", "SIGTERM"}:
            problems.append("--signals takes SIGKILL and SIGTERM")
        if self.guard_s * 1000 <= self.sync_kv_timeout_ms:
            problems.append("--guard-s must be above the sync_kv_timeout")
        return problems


@dataclass
class Restart:
    at: int  # transfers started when it began
    signal: str
    down_s: float = 0.0  # stop, start and the clusters registered again
    heal_s: float | None = None  # then until every link was up


@dataclass
class Snapshot:
    procs: dict[str, ProcFigures]
    admin: dict[str, PoolFigures]

    def to_json(self) -> dict[str, Any]:
        return {"procs": {k: v.to_json() for k, v in self.procs.items()},
                "admin": {k: v.to_json() for k, v in self.admin.items()}}


@dataclass
class Soak:
    config: SoakConfig
    started: int = 0
    statuses: Counter[str] = field(default_factory=Counter)  # every transfer
    steady: Counter[str] = field(default_factory=Counter)  # no restart under way
    by_op: Counter[str] = field(default_factory=Counter)
    restarts: list[Restart] = field(default_factory=list)
    warm_restart: Restart | None = None  # in the warm-up: not counted
    final_sweep: Counter[str] = field(default_factory=Counter)
    baseline: Snapshot | None = None
    held: Snapshot | None = None  # after the run, settled, before the full collection
    after: Snapshot | None = None  # after it: what the leak rule reads
    collected: bool = True  # every full collection asked for was answered
    init_retries: int = 0  # prompt inits refused right after a restart, then retried
    elapsed_s: float = 0.0

    @property
    def ended(self) -> int:
        return sum(self.statuses.values())

    def leaks(self) -> list[str]:
        """What the run left behind (see the module's doc for the rule)."""
        if self.baseline is None or self.after is None:
            return ["no baseline or no final figures"]
        c, found = self.config, []
        if not self.collected:
            found.append("a daemon did not answer the request for a full garbage collection")
        for name, before in self.baseline.procs.items():
            now = self.after.procs[name]
            for what, slack in (("fds", c.fd_slack), ("threads", c.thread_slack)):
                if getattr(now, what) > getattr(before, what) + slack:
                    found.append(f"{name}: {what} {getattr(before, what)} -> "
                                 f"{getattr(now, what)} (slack {slack})")
            grown = mib(now.anon_bytes - before.anon_bytes)
            if grown > c.rss_slack_mib:
                found.append(f"{name}: RssAnon grew {grown} MiB (bound {c.rss_slack_mib})")
        for name, before_admin in self.baseline.admin.items():
            now_admin = self.after.admin[name]
            for what in ("reserved_bytes", "used_bytes", "pools", "caches", "sessions"):
                if getattr(now_admin, what) != getattr(before_admin, what):
                    found.append(f"{name} daemon: {what} {getattr(before_admin, what)} -> "
                                 f"{getattr(now_admin, what)}")
            if now_admin.links != before_admin.links:
                found.append(f"{name} daemon: links {before_admin.links} -> {now_admin.links}")
        return found

    def problems(self) -> list[str]:
        found = self.leaks()
        if self.ended != self.started or self.started != self.config.transfers:
            found.append(f"{self.started} transfers started, {self.ended} ended, "
                         f"{self.config.transfers} asked for")
        odd = {s: n for s, n in self.statuses.items() if s not in ALLOWED}
        if odd:
            found.append(f"transfers that ended badly (never ended, wrong bytes or a status "
                         f"no restart explains): {odd}")
        unhealed = [r.at for r in self.restarts if r.heal_s is None]
        if self.warm_restart is not None and self.warm_restart.heal_s is None:
            unhealed.insert(0, self.warm_restart.at)
        if unhealed:
            found.append(f"links did not all heal within {self.config.heal_s} s of the "
                         f"restarts at {unhealed}")
        if len(self.restarts) != self.config.restart_count:
            found.append(f"{len(self.restarts)} restarts made, "
                         f"{self.config.restart_count} asked for")
        failed = {s: n for s, n in self.final_sweep.items() if s != SUCCESS}
        if failed or sum(self.final_sweep.values()) != 2 * self.config.links:
            found.append(f"the pull and push over every link after the run: "
                         f"{dict(self.final_sweep)}")
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "soak", "config": asdict(self.config),
            "restart_count": self.config.restart_count, "started": self.started,
            "ended": self.ended, "statuses": dict(self.statuses),
            "steady_statuses": dict(self.steady), "by_op": dict(self.by_op),
            "restarts": [asdict(r) for r in self.restarts],
            "warm_restart": asdict(self.warm_restart) if self.warm_restart else None,
            "final_sweep": dict(self.final_sweep),
            "baseline": self.baseline.to_json() if self.baseline else None,
            "held": self.held.to_json() if self.held else None,
            "after": self.after.to_json() if self.after else None,
            "init_retries": self.init_retries,
            "elapsed_s": round(self.elapsed_s, 1), "problems": self.problems()}


def restart_points(transfers: int, count: int, rng: random.Random) -> list[int]:
    """``count`` random points, one in each of the first ``count`` of ``count + 1``
    equal stretches (kept off their edges), so every restart has transfers
    before it and the last leaves a stretch in which to see the links healed."""
    stretch = transfers / (count + 1)
    return [int(stretch * (i + 0.2 + 0.6 * rng.random())) for i in range(count)]


class Run:
    """The workers and the restarter of one soak."""

    def __init__(self, made: Mesh, config: SoakConfig, soak: Soak) -> None:
        self.made = made
        self.config = config
        self.soak = soak
        self.rng = random.Random(config.seed)
        self.pairs = made.shape.pairs()
        # Cache ids each worker uses: the last ones registered, stale during a restart.
        self.source_ids = [cache.cache_id for cache in made.sources]
        self.restarting = False
        self.issued = 0
        self.limit = 0
        self.reached = asyncio.Event()
        self.next_point: int | None = None

    async def transfer(self, worker: int, decoder: int, prompt: int, push: bool) -> str:
        made = self.made
        manager = made.decoders[decoder].cache_manager
        landing = made.landing[decoder]
        cluster = made.prompt_id(prompt)
        source = self.source_ids[prompt]
        try:
            if push:
                key = CacheKeyByIdAndIndex(cluster, source, 1 + decoder)
                await asyncio.wait_for(manager.push_cache(
                    key, landing, src_batch_index=made.shape.decoder_slots), self.config.guard_s)
                return SUCCESS
            landing.numpy(0)[worker] = 0
            key = CacheKeyByIdAndIndex(cluster, source, 0)
            await asyncio.wait_for(manager.pull_cache(key, landing, batch_index=worker),
                                   self.config.guard_s)
        except LLMException as exc:
            return exc.status_code.name
        except asyncio.TimeoutError:  # the guard's (TimeoutError itself from 3.11)
            return HUNG
        except Exception as exc:  # counted, not raised: the run goes on and reports it
            return type(exc).__name__
        if not np.array_equal(landing.numpy(0)[worker], pattern(prompt, made.shape.block)):
            return WRONG_BYTES
        return SUCCESS

    async def worker(self, worker: int, count: bool) -> None:
        while self.issued < self.limit:
            self.issued += 1
            if self.next_point is not None and self.issued >= self.next_point:
                self.reached.set()
            decoder, prompt = self.rng.choice(self.pairs)
            push = self.rng.random() < self.config.push_share
            during = self.restarting
            status = await self.transfer(worker, decoder, prompt, push)
            if status != SUCCESS:
                await asyncio.sleep(self.config.fail_pause_s)
            if count:
                self.soak.started += 1
                self.soak.statuses[status] += 1
                self.soak.by_op[f"{'push' if push else 'pull'} {status}"] += 1
                if not (during or self.restarting):
                    self.soak.steady[status] += 1

    async def workers(self, transfers: int, count: bool) -> None:
        self.issued, self.limit = 0, transfers
        await asyncio.gather(*(self.worker(w, count) for w in range(self.config.concurrency)))

    async def restarter(self, points: list[int], warm_up: bool = False) -> None:
        """Restart the prompt daemon once the transfers started reach each point."""
        signals = self.config.signals
        for index, point in enumerate(points):
            self.next_point = point
            self.reached.clear()
            if self.issued < point:
                await self.reached.wait()
            kill = signals[index % len(signals)] == "SIGKILL" if signals else \
                self.rng.random() < self.config.kill_share
            record = Restart(self.issued, "SIGKILL" if kill else "SIGTERM")
            if warm_up:
                self.soak.warm_restart = record
            else:
                self.soak.restarts.append(record)
            self.restarting = True
            started = time.monotonic()
            try:
                await self.made.restart_prompt(signal.SIGKILL if kill else signal.SIGTERM)
                self.source_ids = [cache.cache_id for cache in self.made.sources]
                record.down_s = round(time.monotonic() - started, 2)
                heal = await self.made.wait_links_up(self.config.heal_s)
                record.heal_s = None if heal is None else round(heal, 2)
            finally:
                self.restarting = False
        self.next_point = None

    def stop_if_failed(self, restarter: asyncio.Task[None]) -> None:
        """A restart that failed (the daemon did not start again) ends the run."""
        if not restarter.cancelled() and restarter.exception() is not None:
            self.limit = self.issued

    async def sweep(self, counts: Counter[str] | None) -> None:
        """A pull and a push over every link, one at a time: every link healed,
        and each shape's remembered repeat on the link in use, the same in the
        baseline as after the run."""
        for decoder, prompt in self.pairs:
            for push in (False, True):
                status = await self.transfer(0, decoder, prompt, push)
                if counts is not None:
                    counts[status] += 1


async def snapshot(made: Mesh) -> Snapshot:
    decode, prompt = await asyncio.gather(made.status(made.decode_daemon),
                                          made.status(made.prompt_daemon))
    procs = {"decode": made.daemon_figures(made.decode_daemon),
             "prompt": made.daemon_figures(made.prompt_daemon), "tool": own_figures()}
    return Snapshot(procs, {"decode": pool_figures(decode), "prompt": pool_figures(prompt)})


def within(now: Snapshot, baseline: Snapshot, config: SoakConfig) -> bool:
    """Whether every process's fds and threads are within the slack of ``baseline``."""
    return all(now.procs[n].fds <= b.fds + config.fd_slack
               and now.procs[n].threads <= b.threads + config.thread_slack
               for n, b in baseline.procs.items())


async def steady(made: Mesh, config: SoakConfig) -> Snapshot:
    """A snapshot once every process's fds and threads have not changed for
    ``_STEADY_S`` (or ``settle_s`` passed)."""
    deadline = time.monotonic() + config.settle_s
    last: tuple[int, ...] = ()
    steady_since = time.monotonic()
    while True:
        now = await snapshot(made)
        figures = tuple(x for f in now.procs.values() for x in (f.fds, f.threads))
        if figures != last:
            last, steady_since = figures, time.monotonic()
        if time.monotonic() - steady_since >= _STEADY_S or time.monotonic() > deadline:
            return now
        await asyncio.sleep(_POLL_S)


async def collected(made: Mesh, config: SoakConfig, baseline: Snapshot) -> tuple[Snapshot, bool]:
    """A snapshot after a full collection in every process, taken again (each
    time after another collection) until it is within the slack of
    ``baseline`` or ``settle_s`` passed: the libraries' thread pools (gRPC's,
    the executors) shrink a while after the load that grew them. Whether
    every collection was answered."""
    deadline = time.monotonic() + config.settle_s
    answered = True
    while True:
        answered = await made.collect() and answered
        now = await snapshot(made)
        if within(now, baseline, config) or time.monotonic() > deadline:
            return now, answered
        await asyncio.sleep(_SETTLE_POLL_S)


async def run_soak(config: SoakConfig, progress: Any = None) -> Soak:
    """One soak (see the module's doc); the figures, whatever happened."""
    say = progress or (lambda _text: None)
    soak = Soak(config)
    shape = MeshShape.for_links(config.links, config.block, decoder_slots=config.concurrency)
    # As in ``links``: what the linking daemon's descriptors need, within the hard limit.
    nofile = raise_nofile((2 * config.streams + 1) * config.links + 4096)
    say(f"{shape.prompts} prompt and {shape.decoders} decode clusters, {config.links} links, "
        f"{config.transfers} transfers, {config.restart_count} restarts of the prompt daemon; "
        f"RLIMIT_NOFILE soft {nofile[0]} -> {nofile[1]}")
    started = time.monotonic()
    async with mesh(shape, streams=config.streams,
                    sync_kv_timeout_ms=config.sync_kv_timeout_ms) as made:
        run = Run(made, config, soak)
        # The warm-up restarts the prompt daemon once too, so that what a
        # restart starts once and keeps (the executor's threads in this
        # process and in the decode daemon) is in the baseline.
        warm_points = [config.warmup // 2] if config.restart_count else []
        restarter = asyncio.create_task(run.restarter(warm_points, warm_up=True))
        restarter.add_done_callback(run.stop_if_failed)
        await run.workers(config.warmup, count=False)
        await restarter
        await run.sweep(None)
        await steady(made, config)
        soak.collected = await made.collect()
        soak.baseline = await snapshot(made)
        say(f"warm-up done; baseline {summary(soak.baseline)}")
        points = restart_points(config.transfers, config.restart_count, run.rng)
        restarter = asyncio.create_task(run.restarter(points))
        restarter.add_done_callback(run.stop_if_failed)
        try:
            await run.workers(config.transfers, count=True)
        finally:
            run.reached.set()  # a point past the last transfer: restart now, then stop
            await restarter
        say(f"{soak.ended} transfers ended: {dict(soak.statuses)}")
        await made.wait_links_up(config.heal_s)
        await run.sweep(soak.final_sweep)
        soak.held = await steady(made, config)
        soak.after, answered = await collected(made, config, soak.baseline)
        soak.collected = soak.collected and answered
        soak.init_retries = made.init_retries
    soak.elapsed_s = time.monotonic() - started
    return soak


def summary(snap: Snapshot) -> str:
    return ", ".join(f"{name} {f.threads} threads {f.fds} fds {mib(f.rss_bytes)} MiB"
                     for name, f in snap.procs.items())


def print_report(soak: Soak) -> None:
    c = soak.config
    print(f"\nsoak: {c.links} links, {soak.ended} of {soak.started} transfers ended "
          f"({c.concurrency} in flight), {len(soak.restarts)} restarts, "
          f"{soak.elapsed_s:.0f} s")
    print(f"{'status':<26}{'all':>8}{'steady':>8}{'pull':>8}{'push':>8}")
    for status, count in soak.statuses.most_common():
        print(f"{status:<26}{count:>8}{soak.steady.get(status, 0):>8}"
              f"{soak.by_op.get(f'pull {status}', 0):>8}{soak.by_op.get(f'push {status}', 0):>8}")
    for r in soak.restarts:
        print(f"restart at {r.at:>6}: {r.signal:<8} back in {r.down_s:5.2f} s, links up "
              f"{'never' if r.heal_s is None else f'{r.heal_s:.2f} s'} later")
    print(f"a pull and a push over every link afterwards: {dict(soak.final_sweep)}; "
          f"prompt inits refused right after a restart and retried: {soak.init_retries}")
    if soak.baseline and soak.held and soak.after:
        print(f"\n{'process':<8}{'figure':<16}{'baseline':>14}{'after, held':>14}"
              f"{'after':>14}   (held: before a full garbage collection)")
        for name, before in soak.baseline.procs.items():
            held, now = soak.held.procs[name], soak.after.procs[name]
            for what in ("threads", "fds"):
                print(f"{name:<8}{what:<16}{getattr(before, what):>14}"
                      f"{getattr(held, what):>14}{getattr(now, what):>14}")
            for what, label in (("rss_bytes", "VmRSS MiB"), ("anon_bytes", "RssAnon MiB")):
                print(f"{name:<8}{label:<16}{mib(getattr(before, what)):>14}"
                      f"{mib(getattr(held, what)):>14}{mib(getattr(now, what)):>14}")
        for name, before_admin in soak.baseline.admin.items():
            held_admin, now_admin = soak.held.admin[name], soak.after.admin[name]
            for what in ("reserved_bytes", "used_bytes", "caches", "sessions"):
                print(f"{name:<8}{what:<16}{getattr(before_admin, what):>14}"
                      f"{getattr(held_admin, what):>14}{getattr(now_admin, what):>14}")


def parser() -> argparse.ArgumentParser:
    d = SoakConfig()
    p = argparse.ArgumentParser(prog="python -m hixl_bench.soak",
                                description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--links", type=int, default=d.links)
    p.add_argument("--transfers", type=int, default=d.transfers)
    p.add_argument("--concurrency", type=int, default=d.concurrency, help="transfers in flight")
    p.add_argument("--restarts", type=int, help="prompt daemon restarts (default: one per "
                   "2,000 transfers)")
    p.add_argument("--kill-share", type=float, default=d.kill_share,
                   help="share of restarts by SIGKILL (the others: SIGTERM)")
    p.add_argument("--signals", type=lambda text: tuple(text.split(",")), default=(),
                   help="e.g. SIGKILL,SIGTERM: the restarts' signals in turn (not by chance)")
    p.add_argument("--push-share", type=float, default=d.push_share)
    p.add_argument("--warmup", type=int, default=d.warmup, help="transfers before the baseline")
    p.add_argument("--block", type=int, default=d.block, help="bytes per slot and tensor")
    p.add_argument("--streams", type=int, default=d.streams, help="TCP streams per link")
    p.add_argument("--guard-s", type=float, default=d.guard_s,
                   help="a transfer not ended after this long counts as never ending")
    p.add_argument("--fail-pause-s", type=float, default=d.fail_pause_s,
                   help="a worker's pause after a failed transfer")
    p.add_argument("--fd-slack", type=int, default=d.fd_slack)
    p.add_argument("--thread-slack", type=int, default=d.thread_slack)
    p.add_argument("--rss-slack-mib", type=float, default=d.rss_slack_mib)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--json-out", type=Path, help="write the figures here (one JSON object)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    config = SoakConfig(
        links=args.links, transfers=args.transfers, concurrency=args.concurrency,
        restarts=args.restarts, kill_share=args.kill_share, signals=args.signals,
        push_share=args.push_share,
        warmup=args.warmup, block=args.block, streams=args.streams, guard_s=args.guard_s,
        fail_pause_s=args.fail_pause_s,
        fd_slack=args.fd_slack, thread_slack=args.thread_slack,
        rss_slack_mib=args.rss_slack_mib, seed=args.seed)
    bad = config.check()
    if bad:
        parser().error("; ".join(bad))
    # Each restart has every prompt cluster's finalize warn that its daemon is
    # gone, on purpose here; the tool's own report says what happened.
    logging.getLogger("hixl_client").setLevel(logging.ERROR)
    import uvloop

    soak = uvloop.run(run_soak(config, progress=print))
    print_report(soak)
    if args.json_out:
        args.json_out.write_text(json.dumps(soak.to_json(), indent=1) + "\n", encoding="utf-8")
        print(f"JSON: {args.json_out}")
    problems = soak.problems()
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print("soak: " + ("FAILED" if problems else "ok"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
