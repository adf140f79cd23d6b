"""What links cost at scale: ``python -m hixl_bench.links [--links 1000] [--streams 4]``.

Two daemons on loopback, a prompt and a decode one, with their clusters
initialised (see ``linkmesh``: about ``sqrt(L)`` of each, one small pool
each). The tool reads each daemon's threads, open fds and RSS, links ``L``
links, waits until Admin shows every one up on both sides, reads them
again and pulls once over a sample of links (checking the bytes). It then
unlinks everything, reads them, and does it all once more (``--cycles``).
It prints the figures with the cost per link (linked minus before, over
``L``) and exits non-zero when a link did not come up, a sample pull
failed, or the second unlink left more threads or fds than the first (the
first leaves what a daemon keeps once it has used them: its channel to the
far daemon, its executor's threads, and the sampled links' remembered
repeats: docs/architecture.md, "Data plane").

The linking daemon holds ``streams + 1`` descriptors per link (a socket
per stream, a stop eventfd; the data plane before its shared threads also
had an eventfd per stream), so the tool raises its soft RLIMIT_NOFILE,
which the daemons inherit, towards ``2 x streams + 1`` a link, never
above the hard limit, and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
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
from hixl_client import CacheKeyByIdAndIndex, LLMClusterInfo, LLMException, LLMStatusCode

_UP_BOUND_S = 120.0
_SETTLE_S = 1.0
# Link threads end a little after the unlink that ended their link.
_UNLINK_SETTLE_S = 30.0
_STEADY_S = 2.0
# Descriptors a daemon holds besides its links': clusters, sessions, listeners.
_FDS_BESIDE_LINKS = 4096


@dataclass
class LinkScale:
    """One run's figures: ``procs[phase][name]`` for name in decode, prompt, tool."""

    links: int
    streams: int
    prompts: int
    decoders: int
    nofile: tuple[int, int]
    link_s: float = 0.0
    up_s: float | None = None
    procs: dict[str, dict[str, ProcFigures]] = field(default_factory=dict)
    admin: dict[str, dict[str, PoolFigures]] = field(default_factory=dict)
    sampled: int = 0
    sample_failures: list[str] = field(default_factory=list)

    def per_link(self, name: str, what: str) -> float:
        """(linked - before) / links of ``what`` (threads, fds, rss_bytes) of ``name``."""
        return self.delta(name, what) / self.links

    def delta(self, name: str, what: str, phase: str = "linked") -> int:
        before: int = getattr(self.procs["before"][name], what)
        return int(getattr(self.procs[phase][name], what)) - before

    def problems(self) -> list[str]:
        found = []
        if self.up_s is None:
            found.append(f"not every one of {self.links} links came up within {_UP_BOUND_S} s")
        for phase in (p for p in self.admin if p.startswith("linked")):
            for side, direction in (("decode", "outbound"), ("prompt", "inbound")):
                up = self.admin[phase][side].links_in(direction, "up")
                if up != self.links:
                    found.append(f"{phase}: the {side} daemon shows {up} {direction} links "
                                 f"up, not {self.links}")
        found += self.sample_failures
        # The first cycle leaves what a daemon keeps per far daemon; every
        # later one must leave nothing more.
        later = sorted(p for p in self.procs if p.startswith("unlinked "))
        for phase in later:
            for name in ("decode", "prompt", "tool"):
                for what in ("threads", "fds"):
                    grown = self.delta(name, what, phase) - self.delta(name, what, "unlinked")
                    if grown > 0:
                        found.append(f"{name}: {grown} {what} more after {phase} than after "
                                     "the first unlink")
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "link_scale", "links": self.links, "streams": self.streams,
            "prompts": self.prompts, "decoders": self.decoders,
            "nofile_soft": {"before": self.nofile[0], "after": self.nofile[1]},
            "link_s": round(self.link_s, 2),
            "up_s": None if self.up_s is None else round(self.up_s, 2),
            "procs": {phase: {name: f.to_json() for name, f in figures.items()}
                      for phase, figures in self.procs.items()},
            "admin": {phase: {name: f.to_json() for name, f in figures.items()}
                      for phase, figures in self.admin.items()},
            "per_link": {name: {what: round(self.per_link(name, what), 2)
                                for what in ("threads", "fds", "rss_bytes", "anon_bytes")}
                         for name in ("decode", "prompt", "tool")},
            "sampled": self.sampled, "problems": self.problems()}


def measure(made: Mesh) -> dict[str, ProcFigures]:
    return {"decode": made.daemon_figures(made.decode_daemon),
            "prompt": made.daemon_figures(made.prompt_daemon),
            "tool": own_figures()}


async def reading(made: Mesh) -> dict[str, ProcFigures]:
    """Figures after a full garbage collection in every process (see ``collect``)."""
    if not await made.collect():
        raise RuntimeError("a daemon did not answer the request for a full garbage collection")
    return measure(made)


async def admin(made: Mesh) -> dict[str, PoolFigures]:
    decode, prompt = await asyncio.gather(made.status(made.decode_daemon),
                                          made.status(made.prompt_daemon))
    return {"decode": pool_figures(decode), "prompt": pool_figures(prompt)}


def sample_pairs(made: Mesh, count: int) -> list[tuple[int, int]]:
    """``count`` links spread evenly over all of them."""
    pairs = made.shape.pairs()
    step = max(1, len(pairs) // max(1, count))
    return pairs[::step][:count]


async def sample_pulls(made: Mesh, count: int) -> list[str]:
    """One pull over each sampled link, its bytes checked; the failures."""
    failures: list[str] = []
    for decoder, prompt in sample_pairs(made, count):
        key = CacheKeyByIdAndIndex(made.prompt_id(prompt), made.sources[prompt].cache_id, 0)
        landing = made.landing[decoder]
        landing.numpy(0)[0] = 0
        try:
            await made.decoders[decoder].cache_manager.pull_cache(key, landing, batch_index=0)
        except LLMException as exc:
            failures.append(f"pull {decoder}->{prompt}: {exc.status_code.name}")
            continue
        if not np.array_equal(landing.numpy(0)[0], pattern(prompt, made.shape.block)):
            failures.append(f"pull {decoder}->{prompt}: wrong bytes")
    return failures


async def unlink_all(made: Mesh) -> None:

    peer = made.prompt_daemon.peer_address

    async def one(decoder: int) -> None:
        infos = [LLMClusterInfo.for_peer(made.prompt_id(p), peer)
                 for p in made.linked_prompts(decoder)]
        if infos:
            status, _ = await made.decoders[decoder].unlink_clusters(infos, timeout=60_000)
            if status != LLMStatusCode.LLM_SUCCESS:
                raise RuntimeError(f"decoder {decoder}: unlink_clusters answered {status.name}")

    await asyncio.gather(*(one(d) for d in range(made.shape.decoders)))


async def settle_to(made: Mesh, reference: dict[str, ProcFigures], bound_s: float
                    ) -> dict[str, ProcFigures]:
    """Figures once both daemons' threads and fds are back to ``reference``, or have
    not changed for ``_STEADY_S`` (or the last ones read when ``bound_s`` passed):
    threads end a little after the call that ended their link."""
    deadline = time.monotonic() + bound_s
    last: tuple[int, ...] = ()
    steady_since = time.monotonic()
    while True:
        now = measure(made)
        daemons = [now[n] for n in ("decode", "prompt")]
        back = all(f.threads <= reference[n].threads and f.fds <= reference[n].fds
                   for n, f in zip(("decode", "prompt"), daemons, strict=True))
        figures = tuple(x for f in daemons for x in (f.threads, f.fds))
        if figures != last:
            last, steady_since = figures, time.monotonic()
        if back or time.monotonic() - steady_since >= _STEADY_S or time.monotonic() > deadline:
            return await reading(made)
        await asyncio.sleep(0.2)


async def run_link_scale(links: int, streams: int = 4, sample: int = 16, block: int = 4096,
                         pool_kib: int = 256, cycles: int = 2,
                         progress: Any = None) -> LinkScale:
    """Measure ``links`` links between two fresh daemons (see the module's doc)."""
    say = progress or (lambda _text: None)
    nofile = raise_nofile((2 * streams + 1) * links + _FDS_BESIDE_LINKS)
    shape = MeshShape.for_links(links, block)
    result = LinkScale(links, streams, shape.prompts, shape.decoders, nofile)
    say(f"{shape.prompts} prompt and {shape.decoders} decode clusters, {links} links of "
        f"{streams} streams; RLIMIT_NOFILE soft {nofile[0]} -> {nofile[1]}")
    async with mesh(shape, streams=streams, pool_floor=pool_kib << 10, fast_links=False,
                    link=False) as made:
        await asyncio.sleep(_SETTLE_S)
        result.procs["before"], result.admin["before"] = await reading(made), await admin(made)
        for cycle in range(1, cycles + 1):
            started = time.monotonic()
            await made.link()
            link_s = time.monotonic() - started
            up_s = await made.wait_links_up(_UP_BOUND_S)
            up = "not all up" if up_s is None else f"all up {up_s:.2f} s later"
            say(f"cycle {cycle}: linked in {link_s:.2f} s, {up}")
            await asyncio.sleep(_SETTLE_S)
            linked = "linked" if cycle == 1 else f"linked {cycle}"
            result.procs[linked], result.admin[linked] = await reading(made), await admin(made)
            result.sample_failures += await sample_pulls(made, sample)
            if cycle == 1:
                result.link_s, result.up_s = link_s, up_s
                result.sampled = len(sample_pairs(made, sample))
            if cycles == 1:
                break
            await unlink_all(made)
            reference = result.procs["before" if cycle == 1 else "unlinked"]
            unlinked = "unlinked" if cycle == 1 else f"unlinked {cycle}"
            result.procs[unlinked] = await settle_to(made, reference, _UNLINK_SETTLE_S)
            result.admin[unlinked] = await admin(made)
    return result


def print_report(result: LinkScale) -> None:
    phases = list(result.procs)
    print(f"\n{result.links} links ({result.prompts} prompt x {result.decoders} decode "
          f"clusters, {result.streams} streams each), linked in {result.link_s:.2f} s")
    header = f"{'process':<8} {'figure':<12}" + "".join(f"{p:>12}" for p in phases) + \
        f"{'per link':>10}"
    print(header)
    for name in ("decode", "prompt", "tool"):
        for what, label in (("threads", "threads"), ("fds", "fds"), ("rss_bytes", "VmRSS MiB"),
                            ("anon_bytes", "RssAnon MiB")):
            unit = what.endswith("bytes")
            values = [getattr(result.procs[p][name], what) for p in phases]
            shown = [mib(v) if unit else v for v in values]
            per = result.per_link(name, what)
            per_shown = f"{per / 1024:.1f}K" if unit else f"{per:.2f}"
            print(f"{name:<8} {label:<12}" + "".join(f"{v:>12}" for v in shown)
                  + f"{per_shown:>10}")
    linked = result.admin["linked"]
    print(f"Admin: decode {linked['decode'].links}, prompt {linked['prompt'].links}")
    print(f"sample pulls: {result.sampled - len(result.sample_failures)} of {result.sampled} ok")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hixl_bench.links",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--links", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=4, help="TCP streams per link")
    parser.add_argument("--sample", type=int, default=16, help="links to pull over once")
    parser.add_argument("--pool-kib", type=int, default=256,
                        help="each cluster's pool (KiB; at least what its cache needs)")
    parser.add_argument("--cycles", type=int, default=2,
                        help="link and unlink everything this many times; with 2 or more, "
                        "every unlink after the first must leave the threads and fds the "
                        "first left (1: link once, no unlink)")
    parser.add_argument("--json-out", type=Path, help="write the figures here (one JSON object)")
    args = parser.parse_args(argv)
    if not 1 <= args.links <= 100_000 or not 1 <= args.streams <= 64 or args.sample < 0 \
            or not 1 <= args.cycles <= 10:
        parser.error("--links must be in [1, 100000], --streams in [1, 64], --sample >= 0, "
                     "--cycles in [1, 10]")
    import uvloop

    result = uvloop.run(run_link_scale(args.links, args.streams, args.sample,
                                       pool_kib=args.pool_kib, cycles=args.cycles,
                                       progress=print))
    print_report(result)
    if args.json_out:
        args.json_out.write_text(json.dumps(result.to_json(), indent=1) + "\n", encoding="utf-8")
        print(f"JSON: {args.json_out}")
    problems = result.problems()
    for problem in problems:
        print(f"PROBLEM: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
