"""vLLM's own NixlConnector, P -> D on this machine's CPUs, checked against D alone.

``python -m hixl_bench.vllm.nixl_check`` makes (or reuses) the vLLM
environment (``scripts/vllm_env.sh``), writes the tiny random Llama into a
temporary folder and starts a prefill server P on core 0 and a decode server
D on core 1 (every thread of each pinned there), both with NixlConnector
(UCX over loopback). It sends each of a few seeded prompts of 300-410 token
ids through P -> D (vLLM's toy proxy flow,
:func:`hixl_bench.vllm.api.pd_complete`), then lets D compute every prompt
alone. It passes when every P -> D completion equals D's own, token for
token, and D's ``prompt_tokens_by_source`` counters say that during P -> D
the prompts' KV came from P (``external_kv_transfer``), not from D's compute.

Everything is bounded in time, and the servers are stopped on every way out
(SIGTERM included). The logs stay in the temporary folder when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from hixl_bench.vllm.api import (
    ApiError,
    Completion,
    complete,
    pd_complete,
    prompt_tokens_by_source,
)
from hixl_bench.vllm.servers import (
    ServerSpec,
    ServerStartError,
    VllmServer,
    ensure_vllm_python,
    start_servers,
)

__all__ = ["NIXL_CONFIG", "NIXL_ENV", "main", "nixl_specs", "seeded_prompts"]

TINY_MODEL = Path(__file__).with_name("tiny_model.py")
# kv_both still works in 0.32 but is deprecated: P produces, D consumes.
NIXL_CONFIG = {"kv_connector": "NixlConnector", "kv_buffer_device": "cpu"}
# UCX over loopback TCP, shared memory and self only: no IB or GPU transports to probe.
NIXL_ENV = {"UCX_TLS": "tcp,self,sm", "UCX_NET_DEVICES": "lo"}
_VOCAB_FIRST = 2  # ids 0 and 1 are <s> and </s>
_EXPIRED = "Releasing expired KV blocks"


@dataclass(frozen=True)
class Row:
    """One prompt's figures."""

    length: int
    pd: Completion
    pd_prefill_s: float
    pd_total_s: float
    alone: Completion

    @property
    def same(self) -> bool:
        return self.pd.token_ids == self.alone.token_ids


def seeded_prompts(count: int, shortest: int, longest: int, seed: int,
                   vocab: int = 1024) -> list[list[int]]:
    """``count`` distinct prompts of token ids, lengths spread over [shortest, longest]."""
    rng = random.Random(seed)
    step = (longest - shortest) / max(1, count - 1)
    return [[rng.randrange(_VOCAB_FIRST, vocab) for _ in range(round(shortest + i * step))]
            for i in range(count)]


def nixl_specs(python: str, model_dir: Path, logs: Path, kv_cache_gib: int = 1,
               pin: bool = True, demote_pollers: bool = False,
               ) -> tuple[ServerSpec, ServerSpec]:
    """P and D, both with NixlConnector on a side channel port of its own.

    P gets the first core this process may use and D the last (cores 0
    and 1 on a 2-core machine; one core shared on a 1-core one).
    """
    cpus = sorted(os.sched_getaffinity(0))

    def spec(name: str, cpu: int, role: str) -> ServerSpec:
        return ServerSpec(python=python, model_dir=model_dir, log_path=logs / f"{name}.log",
                          cpu=cpu, kv_transfer_config={**NIXL_CONFIG, "kv_role": role},
                          env=NIXL_ENV, port_envs=("VLLM_NIXL_SIDE_CHANNEL_PORT",),
                          kv_cache_gib=kv_cache_gib, pin=pin,
                          demote_pollers=demote_pollers)
    return spec("prefill", cpus[0], "kv_producer"), spec("decode", cpus[-1], "kv_consumer")


def _make_model(python: str, out: Path, timeout_s: float) -> None:
    done = subprocess.run([python, str(TINY_MODEL), str(out)], capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"tiny_model.py failed ({done.returncode}):\n{done.stderr[-3000:]}")


def nixl_missing(python: str) -> str | None:
    done = subprocess.run([python, "-c", "import nixl._api"], capture_output=True, text=True,
                          timeout=180, check=False)
    return None if done.returncode == 0 else done.stderr.strip()[-1000:]


def _run_prompts(p: VllmServer, d: VllmServer, prompts: Sequence[Sequence[int]],
                 max_tokens: int) -> tuple[list[Row], dict[str, float], dict[str, float]]:
    """Both passes; with D's counter deltas of the P -> D pass and of the D-alone pass."""
    counts = [prompt_tokens_by_source(d.port)]
    pd = [pd_complete(p.port, d.port, prompt, max_tokens, stream_decode=True)
          for prompt in prompts]
    counts.append(prompt_tokens_by_source(d.port))
    alone = [complete(d.port, prompt, max_tokens, stream=True) for prompt in prompts]
    counts.append(prompt_tokens_by_source(d.port))
    rows = [Row(len(prompt), r.decode, r.prefill.elapsed_s, r.elapsed_s, a)
            for prompt, r, a in zip(prompts, pd, alone, strict=True)]
    return rows, _delta(counts[1], counts[0]), _delta(counts[2], counts[1])


def _print_rows(rows: Sequence[Row]) -> None:
    print(f"{'prompt':>6} {'P s':>6} {'D ttft':>7} {'D s':>6} {'P->D s':>7} "
          f"{'alone ttft':>10} {'alone s':>8}  same")
    for r in rows:
        print(f"{r.length:6d} {r.pd_prefill_s:6.3f} {r.pd.ttft_s or 0:7.3f} "
              f"{r.pd.elapsed_s:6.3f} {r.pd_total_s:7.3f} {r.alone.ttft_s or 0:10.3f} "
              f"{r.alone.elapsed_s:8.3f}  {'yes' if r.same else 'NO'}")


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(set(after) | set(before))}


def _check(p: VllmServer, d: VllmServer, args: argparse.Namespace) -> list[str]:
    """Runs the prompts; returns the failures (none: passed)."""
    prompts = seeded_prompts(args.prompts, args.shortest, args.longest, args.seed)
    rows, pd_counts, alone_counts = _run_prompts(p, d, prompts, args.max_tokens)
    _print_rows(rows)
    total = sum(len(x) for x in prompts)
    print(f"prompt tokens: {total}; D's prompt_tokens_by_source during P->D: "
          f"{json.dumps(pd_counts)}, during D alone: {json.dumps(alone_counts)}")
    failures = [f"prompt {i} ({r.length} tokens): P->D {list(r.pd.token_ids)} != "
                f"D alone {list(r.alone.token_ids)}" for i, r in enumerate(rows) if not r.same]
    failures += [f"prompt {i}: {len(r.pd.token_ids)} tokens, wanted {args.max_tokens}"
                 for i, r in enumerate(rows) if len(r.pd.token_ids) != args.max_tokens]
    external = pd_counts.get("external_kv_transfer", 0.0)
    local = pd_counts.get("local_compute", 0.0)
    # D may recompute the last token of a transferred prompt, no more.
    if external < total - len(prompts) or local > len(prompts):
        failures.append(f"during P->D D counted {external:.0f} prompt tokens transferred and "
                        f"{local:.0f} computed, of {total}: the KV did not come from P")
    return failures


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hixl_bench.vllm.nixl_check",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--python", help="the vLLM environment's python "
                        "(default: HIXL_VLLM_PYTHON, else what scripts/vllm_env.sh makes)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--shortest", type=int, default=300)
    parser.add_argument("--longest", type=int, default=410)
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens D generates")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-timeout", type=float, default=600.0,
                        help="seconds for both servers to answer /health")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--no-pin", dest="pin", action="store_false",
                        help="leave vLLM's and NIXL's thread placement as it is")
    parser.add_argument("--demote-pollers", action="store_true",
                        help="move NIXL's polling progress threads to SCHED_IDLE")
    return parser.parse_args(argv)


def _run(python: str, work: Path, args: argparse.Namespace, servers: list[VllmServer]) -> bool:
    started = time.perf_counter()
    _make_model(python, work / "model", timeout_s=600)
    print(f"tiny model written in {time.perf_counter() - started:.1f} s")
    specs = nixl_specs(python, work / "model", work, pin=args.pin,
                       demote_pollers=args.demote_pollers)
    servers += start_servers(specs, args.start_timeout)
    p, d = servers
    for name, s in (("P", p), ("D", d)):
        polling = ", ".join(f"{t.process}/{t.tid}" for t in s.pollers) or "none"
        print(f"{name}: port {s.port}, {s.ports}, up in {s.startup_s:.1f} s; "
              f"threads polling while idle: {polling}")
    failures = _check(p, d, args)
    expired = p.spec.log_path.read_text(errors="replace").count(_EXPIRED)
    if expired:
        # P lets go of blocks D has not read in kv_lease_duration (30 s): on a
        # machine that busy, D may have read blocks already given to another request.
        print(f"WARN P released {expired} requests' KV blocks before D read them")
    for s in servers:
        print(" ".join(f"{name}[{pid}] {rss / 2**20:.0f} MiB" for pid, name, rss in s.processes()))
    for line in failures:
        print("FAIL", line)
    return not failures


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the check; 0 when it passed, 1 when it failed, 2 when it could not run."""
    args = _parse(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        python = args.python or ensure_vllm_python()
    except RuntimeError as exc:
        print(f"no vLLM environment: {exc}", file=sys.stderr)
        return 2
    missing = nixl_missing(python)
    if missing is not None:
        print(f"nixl does not import under {python}:\n{missing}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="hixl-vllm-nixl-"))
    servers: list[VllmServer] = []
    ok = False
    try:
        ok = _run(python, work, args, servers)
    except (ApiError, OSError) as exc:  # ApiError first: it is a RuntimeError too
        print(f"FAIL a request failed: {exc}")
        return 1
    except (ServerStartError, RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"could not run: {exc}", file=sys.stderr)
        return 2
    finally:
        for s in servers:
            s.stop()
        if ok and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"logs and model: {work}", file=sys.stderr)
    print("PASS" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
