"""vLLM P -> D on hixl (HixlConnector), on this machine's CPUs, checked against D alone.

``python -m hixl_bench.vllm.pd`` makes (or reuses) the vLLM environment
(``scripts/vllm_env.sh``), writes the tiny random Llama into a temporary
folder, starts hixl daemons (two: P's and D's, the TCP data plane between
them; or one both share, ``--placement one-daemon``), then a prefill server
P on core 0 and a decode server D on core 1, both with HixlConnector, and
sends seeded prompts of 300-410 token ids through P -> D as vLLM's toy proxy
does. D then computes every prompt alone. It passes when every P -> D
completion equals D's own, token for token, D's counters say the prompts'
KV came from P, and D's daemon moved exactly those blocks' bytes.

The vLLM servers import hixl from this checkout (``PYTHONPATH``): the vLLM
environment needs nothing of hixl installed. Everything is bounded in time,
and daemons and servers are stopped on every way out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import grpc

from hixl_service.testing import DaemonProcess
from hixl_wire._proto.hixl.v1 import admin_pb2, admin_pb2_grpc

from .api import complete, pd_complete, prompt_tokens_by_source
from .nixl_check import TINY_MODEL, seeded_prompts
from .servers import ServerSpec, VllmServer, ensure_vllm_python, start_servers

__all__ = ["HIXL_CONFIG", "PdSetup", "daemon_pulled_bytes", "daemon_status", "hixl_spec",
           "main", "make_model", "pd_setup"]

ROOT = Path(__file__).resolve().parents[3]
HIXL_CONFIG = {"kv_connector": "HixlConnector", "kv_connector_module_path": "hixl_client.vllm",
               "kv_role": "kv_both"}
# The tiny model's KV: 2 layers of 32-token blocks, 2 KV heads of 32 dims, bf16, K and V.
TINY_BLOCK_BYTES = 2 * 32 * 2 * 32 * 2
TINY_LAYERS = 2
BLOCK_TOKENS = 32


def make_model(python: str, out: Path, *args: str, timeout_s: float = 600.0) -> None:
    """Write a model made in code (``tiny_model.py``, its flags in ``args``) into ``out``."""
    done = subprocess.run([python, str(TINY_MODEL), str(out), *args], capture_output=True,
                          text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"tiny_model.py failed ({done.returncode}):\n{done.stderr[-3000:]}")


def hixl_spec(python: str, model_dir: Path, log_path: Path, cpu: int | None, daemon: str,
              extra: Mapping[str, Any] | None = None,
              transfer: Mapping[str, Any] | None = None, kv_cache_gib: int = 1) -> ServerSpec:
    """A vLLM server with HixlConnector on the daemon ``daemon`` (a client target)."""
    config = {**HIXL_CONFIG, **(transfer or {}),
              "kv_connector_extra_config": {"daemon": daemon, **(extra or {})}}
    return ServerSpec(python=python, model_dir=model_dir, log_path=log_path, cpu=cpu,
                      kv_transfer_config=config, kv_cache_gib=kv_cache_gib,
                      env={"PYTHONPATH": f"{ROOT}:{ROOT / 'native'}"})


def daemon_status(daemon: DaemonProcess) -> admin_pb2.DaemonStatus:
    """The daemon's Admin/GetStatus (from a thread that runs no event loop)."""
    async def ask() -> admin_pb2.DaemonStatus:
        async with grpc.aio.insecure_channel(daemon.client_target) as channel:
            reply: admin_pb2.DaemonStatus = await admin_pb2_grpc.AdminStub(channel).GetStatus(
                admin_pb2.GetStatusRequest(), timeout=10)
            return reply
    return asyncio.run(ask())


def daemon_pulled_bytes(daemon: DaemonProcess) -> int:
    """Bytes the daemon's successful ``pull_blocks`` calls moved (Admin/GetStatus)."""
    return sum(t.bytes for t in daemon_status(daemon).transfers
               if t.op == "pull_blocks" and t.status == "LLM_SUCCESS")


@dataclass
class PdSetup:
    """Running daemons and servers: P on ``daemons[0]``, D on the last daemon."""

    python: str
    work: Path
    daemons: list[DaemonProcess]
    prefill: VllmServer
    decode: VllmServer


@contextlib.contextmanager
def pd_setup(placement: str = "two-daemons", extra: Mapping[str, Any] | None = None,
             decode_transfer: Mapping[str, Any] | None = None,
             start_timeout_s: float = 600.0, python: str | None = None,
             work: Path | None = None) -> Iterator[PdSetup]:
    """Start the daemons and both servers; stop them all on the way out."""
    python = python or ensure_vllm_python()
    work = work or Path(tempfile.mkdtemp(prefix="hixl-vllm-pd-"))
    model = work / "model"
    if not (model / "config.json").exists():
        make_model(python, model)
    with contextlib.ExitStack() as stack:
        count = 1 if placement == "one-daemon" else 2
        daemons = [stack.enter_context(DaemonProcess(pool__max_bytes="256MiB"))
                   for _ in range(count)]
        servers = start_servers([
            hixl_spec(python, model, work / "prefill.log", 0, daemons[0].client_target, extra),
            hixl_spec(python, model, work / "decode.log", 1, daemons[-1].client_target, extra,
                      decode_transfer)], start_timeout_s)
        for server in servers:
            stack.callback(server.stop)
        yield PdSetup(python, work, daemons, servers[0], servers[1])


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def check(setup: PdSetup, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[str]:
    """P -> D then D alone for each prompt; the failures (none: passed)."""
    p, d = setup.prefill, setup.decode
    counts = prompt_tokens_by_source(d.port)
    pulled = daemon_pulled_bytes(setup.daemons[-1])
    pd = [pd_complete(p.port, d.port, prompt, max_tokens, stream_decode=True)
          for prompt in prompts]
    after = prompt_tokens_by_source(d.port)
    pulled = daemon_pulled_bytes(setup.daemons[-1]) - pulled
    alone = [complete(d.port, prompt, max_tokens, stream=True) for prompt in prompts]
    print(f"{'prompt':>6} {'P ms':>7} {'D ttft ms':>9} {'D ms':>7}  same")
    failures = []
    for i, (prompt, one, own) in enumerate(zip(prompts, pd, alone, strict=True)):
        same = one.decode.token_ids == own.token_ids
        print(f"{len(prompt):6d} {one.prefill.elapsed_s * 1e3:7.1f} "
              f"{(one.decode.ttft_s or 0) * 1e3:9.1f} {one.decode.elapsed_s * 1e3:7.1f}  "
              f"{'yes' if same else 'NO'}")
        if not same:
            failures.append(f"prompt {i}: P->D {list(one.decode.token_ids)} != D alone "
                            f"{list(own.token_ids)}")
    external = after.get("external_kv_transfer", 0) - counts.get("external_kv_transfer", 0)
    local = after.get("local_compute", 0) - counts.get("local_compute", 0)
    tokens = sum(len(x) for x in prompts)
    blocks = sum(-(-len(x) // BLOCK_TOKENS) for x in prompts)
    print(f"D: {external:.0f} prompt tokens transferred, {local:.0f} computed, of {tokens}; "
          f"D's daemon pulled {pulled} bytes ({blocks} blocks)")
    if external != tokens or local != 0:
        failures.append(f"D counted {external:.0f} tokens transferred and {local:.0f} computed "
                        f"of {tokens}: the KV did not all come from P")
    if pulled != blocks * TINY_LAYERS * TINY_BLOCK_BYTES:
        failures.append(f"D's daemon pulled {pulled} bytes, not the prompts' "
                        f"{blocks * TINY_LAYERS * TINY_BLOCK_BYTES}")
    return failures


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hixl_bench.vllm.pd",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--placement", choices=("two-daemons", "one-daemon"),
                        default="two-daemons")
    parser.add_argument("--python", help="the vLLM environment's python (default: "
                        "HIXL_VLLM_PYTHON, else what scripts/vllm_env.sh makes)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens D generates")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the check; 0 when it passed, 1 when it failed."""
    args = _parse(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    work = Path(tempfile.mkdtemp(prefix="hixl-vllm-pd-"))
    failures = ["did not run"]
    try:
        started = time.perf_counter()
        with pd_setup(args.placement, python=args.python, work=work) as setup:
            print(f"{args.placement}: P on port {setup.prefill.port}, D on port "
                  f"{setup.decode.port}, up in {time.perf_counter() - started:.0f} s")
            prompts = seeded_prompts(args.prompts, 300, 410, args.seed)
            failures = check(setup, prompts, args.max_tokens)
        for line in failures:
            print("FAIL", line)
        print("PASS" if not failures else f"FAILED (logs in {work})")
        return 0 if not failures else 1
    finally:
        if not failures and not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
