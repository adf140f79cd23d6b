"""Time to the first decoded token: push mode, pull mode and NixlConnector.

``python -m hixl_bench.vllm.ttft`` makes a model whose prefill takes well over
100 ms on one core, then for each way of serving it starts P (core 0) and D
(core 1) and, per prompt length, sends the same prompts end to end, one at
a time:

* ``hixl-push``: HixlConnector with ``"mode": "push"`` on both, through its
  proxy in push mode: P and D get their requests at once, D asks for the KV
  as soon as it has blocks, and P pushes each layer as vLLM computes it;
* ``hixl-pull``: HixlConnector's default, as vLLM's toy proxy sends it: P's
  request, then D's with P's params, and D pulls;
* ``nixl``: NixlConnector (UCX over loopback), the same flow as hixl-pull.

The figure is the time from the first byte sent for a prompt to D's first
streamed token (P's request, the transfer and D's first step), p50 per
length. The pull rows also give P's request and D's own time to first token
after P answered (its load and first step): the part push can hide behind
P's prefill. Each push row says how much it saved against pull in the same
run, as milliseconds and as a share of that part. Every completion is
checked against D computing the prompt alone.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
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
from .proxy_process import running_proxy
from .runs import append_row, stop_on_sigterm, without_missing_nixl
from .servers import ServerSpec, VllmServer, ensure_vllm_python, start_servers

__all__ = ["main"]

# 12 layers, 8 KV heads of 128: 48 KiB of KV per token; a 1k-token prefill
# takes several hundred ms on one core here.
MODEL = ("--layers", "12", "--hidden", "256", "--heads", "8", "--kv-heads", "8",
         "--head-dim", "128", "--intermediate", "512")
MAX_MODEL_LEN = 2048  # the model's positions
WAYS = ("hixl-push", "hixl-pull", "nixl")


@contextlib.contextmanager
def _servers(way: str, python: str, model: Path, work: Path,
             timeout_s: float) -> Iterator[tuple[VllmServer, VllmServer]]:
    with contextlib.ExitStack() as stack:
        specs: list[ServerSpec]
        if way == "nixl":
            specs = list(nixl_specs(python, model, work))
        else:
            extra = {"mode": "push"} if way == "hixl-push" else {}
            daemons = [stack.enter_context(DaemonProcess(pool__max_bytes="256MiB"))
                       for _ in range(2)]
            specs = [hixl_spec(python, model, work / f"{way}-{name}.log", cpu,
                               daemon.client_target, extra)
                     for name, cpu, daemon in (("prefill", 0, daemons[0]),
                                               ("decode", 1, daemons[1]))]
        specs = [dataclasses.replace(spec, max_model_len=MAX_MODEL_LEN) for spec in specs]
        servers = start_servers(specs, timeout_s)
        for server in servers:
            stack.callback(server.stop)
        yield servers[0], servers[1]


def measure(way: str, python: str, model: Path, work: Path, prompts: dict[int, list[list[int]]],
            max_tokens: int, timeout_s: float) -> list[dict[str, Any]]:
    """One way's rows: one per prompt length."""
    rows = []
    with _servers(way, python, model, work, timeout_s) as (p, d), contextlib.ExitStack() as stack:
        port = stack.enter_context(running_proxy(python, [p.port], [d.port], "push",
                                                 work / "proxy.log")) \
            if way == "hixl-push" else 0
        warm = seeded_prompts(2, 300, 400, seed=99)
        for prompt in warm:  # start-up costs (links, first kernels) stay out of the rows
            _end_to_end(way, p, d, port, prompt, max_tokens)
        for length, group in prompts.items():
            e2e, d_ttft, prefill, mismatches = [], [], [], 0
            for prompt in group:
                tokens, total_s, d_s, p_s = _end_to_end(way, p, d, port, prompt, max_tokens)
                e2e.append(total_s)
                d_ttft.append(d_s)
                prefill.append(p_s)
                mismatches += tokens != complete(d.port, prompt, max_tokens).token_ids
            rows.append({"way": way, "tokens": length, "prompts": len(group),
                         "mismatches": mismatches,
                         "e2e_ttft_p50_ms": round(1000 * statistics.median(e2e), 1),
                         "e2e_ttft_max_ms": round(1000 * max(e2e), 1),
                         "d_ttft_p50_ms": round(1000 * statistics.median(d_ttft), 1),
                         "p_request_p50_ms": round(1000 * statistics.median(prefill), 1)})
    return rows


def _end_to_end(way: str, p: VllmServer, d: VllmServer, proxy_port: int,
                prompt: list[int], max_tokens: int) -> tuple[tuple[int, ...], float, float,
                                                              float]:
    """(tokens, seconds to D's first token from the start, D's own time to first
    token, P's request) of one prompt."""
    started = time.perf_counter()
    if way == "hixl-push":
        answer = complete(proxy_port, prompt, max_tokens, stream=True)
        total = time.perf_counter() - started
        return answer.token_ids, total, answer.ttft_s or total, 0.0
    pair = pd_complete(p.port, d.port, prompt, max_tokens, stream_decode=True)
    d_ttft = pair.decode.ttft_s or 0.0
    return pair.decode.token_ids, pair.prefill.elapsed_s + d_ttft, d_ttft, \
        pair.prefill.elapsed_s


def overlap(rows: list[dict[str, Any]]) -> None:
    """Add to each push row its time against the pull and NIXL rows of the same
    length, and what it saved against pull: in ms, and as a share of pull's
    time after P answered (D's load and first step, which push overlaps with
    P's prefill)."""
    by = {(r["way"], r["tokens"]): r for r in rows}
    for row in rows:
        if row["way"] != "hixl-push":
            continue
        pull = by.get(("hixl-pull", row["tokens"]))
        if pull is not None:
            saved = pull["e2e_ttft_p50_ms"] - row["e2e_ttft_p50_ms"]
            row["vs_pull"] = round(row["e2e_ttft_p50_ms"] / pull["e2e_ttft_p50_ms"], 3)
            row["saved_ms"] = round(saved, 1)
            row["saved_of_pull_wait"] = round(saved / pull["d_ttft_p50_ms"], 2) \
                if pull["d_ttft_p50_ms"] else None
        nixl = by.get(("nixl", row["tokens"]))
        if nixl is not None:
            row["vs_nixl"] = round(row["e2e_ttft_p50_ms"] / nixl["e2e_ttft_p50_ms"], 3)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hixl_bench.vllm.ttft",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--python", help="the vLLM environment's python")
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--tokens", default="512,1024,2000", help="prompt lengths")
    parser.add_argument("--prompts", type=int, default=5, help="prompts per length")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-timeout", type=float, default=900.0)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    stop_on_sigterm()
    python = args.python or ensure_vllm_python()
    ways = without_missing_nixl(python, [w for w in args.ways.split(",") if w])
    lengths = [int(t) for t in args.tokens.split(",")]
    prompts = {n: seeded_prompts(args.prompts, n, n, args.seed + n) for n in lengths}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hixl-vllm-ttft-") as tmp:
        work = Path(tmp)
        make_model(python, work / "model", *MODEL)
        for way in ways:
            rows += measure(way, python, work / "model", work, prompts, args.max_tokens,
                            args.start_timeout)
    overlap(rows)
    for row in rows:
        print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        append_row(args.json_out, row)
    return 0 if all(row["mismatches"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
