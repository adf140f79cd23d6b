"""What hixl costs while nothing moves: ``python -m hixl_bench.idle``.

Small transfers go fastest when every thread on their path spins for its
next event rather than sleeping (``native/hixl_native/csrc/spin.h``), and a
spin costs a core while it lasts. Each spin is bounded, so once traffic
stops every thread should be asleep. This checks that: it runs small pulls
by cache id between two real daemons (the native lanes' path), stops, and
reads each process's CPU time (every thread's, from ``/proc``) over the
next ``--seconds``: the client's, the initiating daemon's and the target's,
as a share of one core. The daemons run with their default settings, so
their timers (link heartbeats, lease checks) count too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from hixl_bench.calls import request_caches, requests_of
from hixl_bench.env import clusters, daemons
from hixl_bench.model import MIB
from hixl_bench.procstat import task_totals


async def run(requests: int, seconds: float, block: int) -> None:
    async with daemons(256 * MIB, 256 * MIB, 4) as pair, \
            clusters(pair, 64 * MIB, ("tcp",)) as env, \
            request_caches(env, "pull", "tcp", 1, block) as caches:
        request = requests_of(env, "pull", "tcp", 1, caches)
        started = time.perf_counter()
        for i in range(requests):
            await request(i)
        busy_s = time.perf_counter() - started
        pids = {"client": os.getpid(), "daemon A (initiator)": pair.a.pid,
                "daemon B (target)": pair.b.pid}
        before = {name: task_totals(pid) for name, pid in pids.items()}
        idle_started = time.perf_counter()
        await asyncio.sleep(seconds)
        idle_s = time.perf_counter() - idle_started
        print(f"{requests} pulls of {block} bytes in {busy_s:.2f} s, then {idle_s:.1f} s idle:")
        for name, pid in pids.items():
            spent = task_totals(pid) - before[name]
            print(f"  {name}: {100 * spent.cpu_ns / 1e9 / idle_s:.2f}% of a core, "
                  f"{(spent.voluntary + spent.involuntary) / idle_s:.0f} context switches a "
                  f"second")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hixl_bench.idle",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="pulls before the idle time")
    parser.add_argument("--seconds", type=float, default=5.0, help="idle time measured")
    parser.add_argument("--block", type=int, default=4096, help="bytes per pull")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.seconds <= 0:
        parser.error("--requests and --seconds must be positive")
    import uvloop
    uvloop.run(run(args.requests, args.seconds, args.block))
    return 0


if __name__ == "__main__":
    sys.exit(main())
