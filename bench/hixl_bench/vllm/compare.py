"""HixlConnector beside vLLM's NixlConnector: the same prompts and model, one run.

``python -m hixl_bench.vllm.compare`` runs, for each model shape (the tiny
model, and ``--big``: one whose KV is about 19 MiB per 400-token prompt),
first HixlConnector (two hixl daemons, the TCP data plane) and then
NixlConnector (UCX over loopback), each with P on core 0 and D on core 1:

* the first P -> D pair after start-up, with vLLM's default KV space here
  (1 GiB: 65,536 blocks of the tiny model);
* after two warm-up pairs, per prompt: P's request (max_tokens 1), D's time
  to first token (streamed; it includes the KV load) and D's whole request
  (``--max-tokens``), p50 and p99;
* every P -> D completion against D computing the prompt alone (mismatches);
* idle CPU over ``--idle-s`` seconds once the requests are done: each
  server's processes (API server, EngineCore, worker) and each daemon, in %
  of one core.

Rows go to stdout as a table and, with ``--json-out``, as JSON lines.
Everything is bounded in time and every process is stopped on the way out.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hixl_service.testing import DaemonProcess

from .api import complete, pd_complete
from .nixl_check import nixl_specs, seeded_prompts
from .pd import hixl_spec, make_model
from .procs import cpu_seconds, group_members, thread_seconds
from .runs import append_row, stop_on_sigterm, without_missing_nixl
from .servers import VllmServer, ensure_vllm_python, start_servers

__all__ = ["main"]

BIG_MODEL = ("--layers", "12", "--hidden", "256", "--heads", "8", "--kv-heads", "8",
             "--head-dim", "128", "--intermediate", "512")


def idle_cpu(processes: dict[str, int], seconds: float
             ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Each named process's CPU use over ``seconds`` of idleness, in % of one
    core, and for each process above 0.5 % its busiest thread names."""
    before = {name: (cpu_seconds(pid), thread_seconds(pid)) for name, pid in processes.items()}
    time.sleep(seconds)
    totals, threads = {}, {}
    for name, pid in processes.items():
        totals[name] = round(100 * (cpu_seconds(pid) - before[name][0]) / seconds, 2)
        if totals[name] > 0.5:
            was = before[name][1]
            used = {thread: 100 * (spent - was.get(thread, 0.0)) / seconds
                    for thread, spent in thread_seconds(pid).items()}
            threads[name] = {t: round(u, 2) for t, u in sorted(used.items(), key=lambda x: -x[1])
                             if u > 0.05}
    return totals, threads


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def _servers(connector: str, python: str, model: Path, work: Path,
             timeout_s: float) -> Iterator[tuple[list[VllmServer], list[DaemonProcess]]]:
    with contextlib.ExitStack() as stack:
        daemons: list[DaemonProcess] = []
        if connector == "hixl":
            daemons = [stack.enter_context(DaemonProcess(pool__max_bytes="256MiB"))
                       for _ in range(2)]
            specs = [hixl_spec(python, model, work / f"{connector}-{name}.log", cpu,
                               daemon.client_target)
                     for name, cpu, daemon in (("prefill", 0, daemons[0]),
                                               ("decode", 1, daemons[1]))]
        else:
            specs = list(nixl_specs(python, model, work))
        servers = start_servers(specs, timeout_s)
        for server in servers:
            stack.callback(server.stop)
        yield servers, daemons


def measure(connector: str, shape: str, python: str, model: Path, work: Path,
            prompts: list[list[int]], max_tokens: int, idle_s: float,
            timeout_s: float) -> dict[str, Any]:
    """One connector's row for one model shape."""
    started = time.perf_counter()
    with _servers(connector, python, model, work, timeout_s) as (servers, daemons):
        p, d = servers
        up_s = time.perf_counter() - started
        first = pd_complete(p.port, d.port, prompts[0], max_tokens, stream_decode=True)
        for prompt in prompts[1:3]:
            pd_complete(p.port, d.port, prompt, max_tokens)
        runs = [pd_complete(p.port, d.port, prompt, max_tokens, stream_decode=True)
                for prompt in prompts[3:]]
        alone = [complete(d.port, prompt, max_tokens) for prompt in prompts[3:]]
        mismatches = sum(r.decode.token_ids != a.token_ids for r, a in zip(runs, alone,
                                                                           strict=True))
        time.sleep(2.0)  # let the last request's work settle before idling is measured
        processes = {f"{side}:{name}[{pid}]": pid
                     for side, server in (("P", p), ("D", d))
                     for pid, name, _ in group_members(server.pid)}
        processes.update({f"daemon {i}": daemon.pid for i, daemon in enumerate(daemons)})
        idle, idle_threads = idle_cpu(processes, idle_s)
    ttft = [r.decode.ttft_s or 0.0 for r in runs]
    whole = [r.decode.elapsed_s for r in runs]
    prefill = [r.prefill.elapsed_s for r in runs]
    ms = 1000.0
    return {
        "connector": connector, "shape": shape, "prompts": len(runs), "up_s": round(up_s, 1),
        "mismatches": mismatches,
        "first_pair_ms": round(first.elapsed_s * ms, 1),
        "first_d_ttft_ms": round((first.decode.ttft_s or 0.0) * ms, 1),
        "d_ttft_p50_ms": round(statistics.median(ttft) * ms, 1),
        "d_ttft_p99_ms": round(_pct(ttft, 0.99) * ms, 1),
        "d_request_p50_ms": round(statistics.median(whole) * ms, 1),
        "d_request_p99_ms": round(_pct(whole, 0.99) * ms, 1),
        "p_request_p50_ms": round(statistics.median(prefill) * ms, 1),
        "p_request_p99_ms": round(_pct(prefill, 0.99) * ms, 1),
        "idle_cpu_pct": idle,
        "idle_cpu_threads_pct": idle_threads,
        "idle_cpu_max_pct": max(idle.values()) if idle else 0.0,
    }


COLUMNS = ("connector", "shape", "mismatches", "first_pair_ms", "d_ttft_p50_ms",
           "d_ttft_p99_ms", "d_request_p50_ms", "d_request_p99_ms", "p_request_p50_ms",
           "p_request_p99_ms", "idle_cpu_max_pct")


def _print(row: dict[str, Any]) -> None:
    print("  ".join(f"{c}={row[c]}" for c in COLUMNS), flush=True)
    print("    idle CPU %: " + ", ".join(f"{k} {v}" for k, v in row["idle_cpu_pct"].items()),
          flush=True)
    for process, threads in row["idle_cpu_threads_pct"].items():
        print(f"      {process} by thread: "
              + ", ".join(f"{t} {u}" for t, u in threads.items()), flush=True)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hixl_bench.vllm.compare",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--python", help="the vLLM environment's python")
    parser.add_argument("--connectors", default="hixl,nixl")
    parser.add_argument("--big", action="store_true",
                        help="also the shape with about 19 MiB of KV per prompt")
    parser.add_argument("--prompts", type=int, default=24, help="timed prompts per row")
    parser.add_argument("--big-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--json-out", type=Path)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    stop_on_sigterm()
    python = args.python or ensure_vllm_python()
    connectors = without_missing_nixl(python, [c for c in args.connectors.split(",") if c])
    shapes = [("tiny", (), args.prompts)] + ([("big", BIG_MODEL, args.big_prompts)]
                                             if args.big else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="hixl-vllm-compare-") as tmp:
        work = Path(tmp)
        for shape, flags, count in shapes:
            model = work / shape
            make_model(python, model, *flags)
            prompts = seeded_prompts(count + 3, 300, 410, args.seed)
            for connector in connectors:
                row = measure(connector, shape, python, model, work, prompts, args.max_tokens,
                              args.idle_s, args.start_timeout)
                _print(row)
                rows.append(row)
                append_row(args.json_out, row)
    return 0 if all(row["mismatches"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
