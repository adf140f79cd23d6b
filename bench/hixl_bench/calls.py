"""Python calls per request: ``python -m hixl_bench.calls [--op pull] [--path tcp]``.

On a shared two-core guest a row's latency swings by a fifth between
neighbouring minutes, which hides a change of a few microseconds per
request. The number of Python function calls a request costs does not
swing: cProfile counts them exactly. This runs requests of one shape
between two real daemons and prints, for the client and for each daemon,
the calls per request and the functions called most. Comparing the output
of two builds shows whether a change added work on the per-request path,
whatever the host did meanwhile.

Operations: ``pull`` (pull_cache by cache id: the repeat path after the
first request), ``push`` (push_cache by cache id, likewise) and ``blocks``
(pull_blocks by BlocksCacheKey with layer ranges, as engines call it: the
full path every time).

The daemons are profiled on their event-loop thread only, between two
signals this tool sends, so their timers' work in that window (lease checks,
the status line) counts too: well under one call per request over a few
hundred requests (link heartbeats are slowed down for the run). A
``sitecustomize`` module placed on their ``PYTHONPATH`` installs the handlers.
Copies run natively and are not counted.

Before the profiled window, an unprofiled one of as many requests reads
each process's context switches and CPU time (every thread's, from
``/proc``): a request that wakes a sleeping thread shows up there as a
voluntary switch, so that figure says how many hand-offs between threads a
request costs, as exactly as the call count says how much Python it runs.
With ``--conc N`` that window keeps N requests in flight, and says how many
it ran a second: where the CPU of each process goes when calls overlap.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import pstats
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from hixl_bench.env import Clusters, clusters, daemons, slot_desc
from hixl_bench.model import MIB
from hixl_bench.procstat import TaskTotals, task_totals
from hixl_client import BlocksCacheKey, Cache, CacheDesc, CacheKeyByIdAndIndex, DataType

START, STOP = signal.SIGUSR1, signal.SIGUSR2
_ENV = "HIXL_BENCH_CALLS_DIR"
# Loaded by every Python process that has the directory on its path: only a
# daemon started with the variable set installs the handlers.
_SITECUSTOMIZE = f"""
import os, sys
_out = os.environ.get("{_ENV}")
if _out and "hixl_service" in " ".join(sys.orig_argv):
    import cProfile, signal
    _profile = cProfile.Profile()
    def _start(signum, frame):
        _profile.enable()
    def _stop(signum, frame):
        _profile.disable()
        _profile.dump_stats(os.path.join(_out, f"{{os.getpid()}}.prof"))
    signal.signal({int(START)}, _start)
    signal.signal({int(STOP)}, _stop)
"""
SLOTS = 64
LAYERS = range(1)  # the blocks caches hold one layer of two tensors
BLOCKS = 256
WARM_UP = 200
DUMP_WAIT_S = 10.0
QUIET_LINKS = {"HIXL_LINKS__HEARTBEAT_INTERVAL_S": "60", "HIXL_LINKS__DOWN_AFTER_S": "600",
               "HIXL_LINKS__LEASE_S": "3600"}


def requests_of(env: Clusters, op: str, path: str, nblocks: int,
              caches: tuple[Cache, Cache]) -> Callable[[int], Awaitable[None]]:
    local, remote = caches
    target = env.target_id(path)
    if op == "blocks":
        def blocks(i: int) -> tuple[list[int], list[int]]:
            return ([(i * 7 + j * 3) % BLOCKS for j in range(nblocks)],
                    [(i * 5 + j * 11) % BLOCKS for j in range(nblocks)])

        async def pull_blocks(i: int) -> None:
            src, dst = blocks(i)
            await env.cm.pull_blocks(BlocksCacheKey(target, 1), local, src, dst,
                                     src_layer_range=LAYERS, dst_layer_range=LAYERS)
        return pull_blocks

    async def by_id(i: int) -> None:
        key = CacheKeyByIdAndIndex(target, remote.cache_id, i % SLOTS)
        if op == "pull":
            await env.cm.pull_cache(key, local, batch_index=i % SLOTS)
        else:
            await env.cm.push_cache(key, local, src_batch_index=i % SLOTS,
                                    tensor_num_per_layer=1)
    return by_id


@contextlib.asynccontextmanager
async def request_caches(env: Clusters, op: str, path: str, nblocks: int,
                  block: int) -> AsyncIterator[tuple[Cache, Cache]]:
    target = env.target_cm(path)
    if op == "blocks":
        desc = CacheDesc(2, [BLOCKS, block], DataType.DT_UINT8)
        remote = await target.allocate_blocks_cache(desc, BlocksCacheKey(0, 1))
        local = await env.cm.allocate_blocks_cache(desc, BlocksCacheKey(0, 1))
    else:
        desc = slot_desc(block, nblocks, SLOTS)
        remote = await target.allocate_cache(desc)
        local = await env.cm.allocate_cache(desc)
    try:
        yield local, remote
    finally:
        if op == "blocks":
            await env.cm.deallocate_blocks_cache(local)
            await target.deallocate_blocks_cache(remote)
        else:
            await env.cm.deallocate_cache(local)
            await target.deallocate_cache(remote)


def _calls(stats: pstats.Stats) -> int:
    return sum(entry[1] for entry in stats.stats.values())  # type: ignore[attr-defined]


def _report(name: str, stats: pstats.Stats, requests: int, top: int) -> None:
    print(f"{name}: {_calls(stats) / requests:.1f} Python calls per request")
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][1])  # type: ignore[attr-defined]
    for (filename, line, function), entry in rows[:top]:
        where = function if filename == "~" else f"{Path(filename).name}:{line} {function}"
        print(f"  {entry[1] / requests:6.2f}  {where}")


def _report_tasks(name: str, totals: TaskTotals, requests: int) -> None:
    print(f"{name}: {(totals.voluntary + totals.involuntary) / requests:.2f} context switches "
          f"per request ({totals.voluntary / requests:.2f} voluntary), "
          f"{totals.cpu_ns / requests / 1000:.1f} us of CPU")


async def _unprofiled(pids: dict[str, int], requests: int,
                      request: Callable[[int], Awaitable[None]], conc: int) -> None:
    """Run ``requests`` with ``conc`` in flight, and print what each process spent."""
    before = {name: task_totals(pid) for name, pid in pids.items()}
    numbers = iter(range(requests))
    started = time.perf_counter()

    async def worker() -> None:
        for i in numbers:  # shared: the workers take the requests in turn
            await request(i)

    await asyncio.gather(*(worker() for _ in range(conc)))
    took_s = time.perf_counter() - started
    print(f"{requests} requests, {conc} in flight: {requests / took_s:,.0f} a second")
    for name, pid in pids.items():
        _report_tasks(name, task_totals(pid) - before[name], requests)


async def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + DUMP_WAIT_S
    while not await asyncio.to_thread(path.exists):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no profile came back from the daemon ({path.name})")
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)  # the dump is written in one go; let it finish


async def run(op: str, path: str, nblocks: int, block: int, requests: int, top: int,
              conc: int = 1) -> None:
    with tempfile.TemporaryDirectory(prefix="hixl-calls-") as scratch:
        root = Path(scratch)
        (root / "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
        os.environ[_ENV] = str(root)
        # Link heartbeats and lease checks run on a timer, not per request: slowed
        # down here, so that what is counted is the requests' own work.
        os.environ.update(QUIET_LINKS)
        async with daemons(256 * MIB, 256 * MIB, 4) as pair, \
                clusters(pair, 64 * MIB, (path,)) as env, \
                request_caches(env, op, path, nblocks, block) as caches:
            request = requests_of(env, op, path, nblocks, caches)
            for i in range(WARM_UP):
                await request(i)
            pids = {"daemon A (initiator)": pair.a.pid}
            if path == "tcp":
                pids["daemon B (target)"] = pair.b.pid
            await _unprofiled({"client": os.getpid(), **pids}, requests,
                              lambda i: request(WARM_UP + i), conc)
            for pid in pids.values():
                os.kill(pid, START)
            await asyncio.sleep(0.2)  # let the handlers run before counting starts
            client = cProfile.Profile()
            client.enable()
            for i in range(requests):
                await request(WARM_UP + requests + i)
            client.disable()
            for pid in pids.values():
                os.kill(pid, STOP)
            _report("client", pstats.Stats(client), requests, top)
            for name, pid in pids.items():
                dump = root / f"{pid}.prof"
                await _wait_for(dump)
                _report(name, pstats.Stats(str(dump)), requests, top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hixl_bench.calls", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--op", choices=("pull", "push", "blocks"), default="pull")
    parser.add_argument("--path", choices=("local", "tcp"), default="tcp")
    parser.add_argument("--blocks", type=int, default=1, help="ranges per request")
    parser.add_argument("--block", type=int, default=4096, help="bytes per range")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--top", type=int, default=15, help="functions shown per process")
    parser.add_argument("--conc", type=int, default=1,
                        help="requests in flight while CPU and context switches are counted "
                             "(the profiled window runs one at a time)")
    args = parser.parse_args(argv)
    if not 1 <= args.blocks <= BLOCKS or args.requests < 1:
        parser.error(f"--blocks must be in [1, {BLOCKS}] and --requests positive")
    if not 1 <= args.conc <= SLOTS:
        parser.error(f"--conc must be in [1, {SLOTS}]")
    import uvloop
    uvloop.run(run(args.op, args.path, args.blocks, args.block, args.requests, args.top,
                   args.conc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
