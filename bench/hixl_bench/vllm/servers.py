"""Real vLLM (CPU build) OpenAI servers as child processes, for P/D checks and benchmarks.

This module runs in hixl's environment and needs only the standard library;
the servers run under the python of the vLLM environment that
``scripts/vllm_env.sh`` makes (see :func:`ensure_vllm_python`). Each server
is a process group of its own (API server, EngineCore, worker) with one
core (``VLLM_CPU_OMP_THREADS_BIND``), logging to one file. Once it is up,
all its threads are pinned to that core, and on request the threads that
poll while it is idle are moved to ``SCHED_IDLE``
(:func:`hixl_bench.vllm.procs.isolate` says why NixlConnector needs this).

Ports: a port picked by binding to port 0 can be taken by someone else
before vLLM binds it, and vLLM picks a few ports of its own the same way.
So a start whose log says "Address already in use" is stopped and tried
again on fresh ports; the NIXL side channel needs this most, because a
failed bind there leaves vLLM waiting forever rather than exiting.

The HTTP helpers (``complete``, ``pd_complete``, ``prompt_tokens_by_source``)
live in :mod:`hixl_bench.vllm.api`.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hixl_bench.vllm import procs
from hixl_service.testing import unused_port

__all__ = [
    "ServerSpec",
    "ServerStartError",
    "VllmServer",
    "ensure_vllm_python",
    "free_ports",
    "start_server",
    "start_servers",
]

_REPO = Path(__file__).resolve().parents[3]
VLLM_ENV_SCRIPT = _REPO / "scripts" / "vllm_env.sh"
_BIND_CLASH = "Address already in use"
_TAIL_LINES = 40
# Child variables of hixl's environment that would send vLLM's python into it.
_DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")


class ServerStartError(RuntimeError):
    """A vLLM server exited or did not answer /health in time; carries its log tail."""


class _Cancelled(ServerStartError):
    """Given up because a sibling start failed (so the sibling's error is the one raised)."""


class _PortClash(Exception):
    """A bind of this start failed: the same spec is tried again on fresh ports."""


def ensure_vllm_python(timeout_s: float = 2400.0) -> str:
    """The python of a vLLM environment, made by ``scripts/vllm_env.sh`` when needed.

    ``HIXL_VLLM_PYTHON``, when set, is taken as it is. The script's progress
    goes to this process's stderr.

    Args:
        timeout_s: bound on the whole script (a first install takes minutes).

    Returns:
        The interpreter's path (the script's last line of stdout).

    Raises:
        RuntimeError: the script failed, ran past ``timeout_s`` or is missing.
    """
    given = os.environ.get("HIXL_VLLM_PYTHON")
    if given:
        return given
    if not VLLM_ENV_SCRIPT.is_file():
        raise RuntimeError(f"{VLLM_ENV_SCRIPT} is missing: set HIXL_VLLM_PYTHON instead")
    try:
        done = subprocess.run(["bash", str(VLLM_ENV_SCRIPT)], stdout=subprocess.PIPE,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"vllm_env.sh ran past {timeout_s:.0f} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"vllm_env.sh failed (exit {done.returncode}); see its messages above")
    return lines[-1]


@dataclass(frozen=True)
class ServerSpec:
    """One vLLM server to start.

    Attributes:
        python: the vLLM environment's interpreter.
        model_dir: a model directory (``tiny_model.py`` writes one).
        log_path: the file that gets the server's stdout and stderr (appended).
        cpu: the core for ``VLLM_CPU_OMP_THREADS_BIND``; None lets vLLM choose.
        kv_transfer_config: ``--kv-transfer-config`` as a mapping, or None.
        env: extra environment for the server (wins over the defaults here).
        port_envs: variables that each get a fresh free port per start attempt
            (``VLLM_NIXL_SIDE_CHANNEL_PORT`` for NixlConnector).
        max_model_len: ``--max-model-len``.
        block_size: ``--block-size`` (CPU attention wants multiples of 32).
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache).
        prefix_caching: vLLM's prefix cache; off so every prompt token is
            either computed or transferred, as the P/D counters assume.
        served_name: ``--served-model-name`` (requests leave the model out).
        extra_args: more ``api_server`` arguments.
        pin: once up, pin every thread of the server to ``cpu``
            (NixlConnector moves the model's thread elsewhere; see
            :mod:`hixl_bench.vllm.procs`).
        demote_pollers: also move threads that poll while the server is idle
            (NIXL's UCX progress thread) to SCHED_IDLE.
        nice: the server's niceness (``nice -n``): a server whose workers spin
            on every core (tensor parallelism on a two-core host) leaves the
            daemons their share of the cores.
    """

    python: str
    model_dir: Path
    log_path: Path
    cpu: int | None = 0
    kv_transfer_config: Mapping[str, Any] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    port_envs: tuple[str, ...] = ()
    max_model_len: int = 512
    block_size: int = 32
    kv_cache_gib: int = 1
    prefix_caching: bool = False
    served_name: str = "hixl-tiny"
    extra_args: tuple[str, ...] = ()
    pin: bool = True
    demote_pollers: bool = False
    nice: int = 0

    def argv(self, port: int) -> list[str]:
        args = ["nice", "-n", str(self.nice)] if self.nice else []
        args += [self.python, "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(self.model_dir), "--served-model-name", self.served_name,
                "--host", "127.0.0.1", "--port", str(port),
                "--dtype", "bfloat16", "--max-model-len", str(self.max_model_len),
                "--enforce-eager", "--block-size", str(self.block_size),
                "--enable-prefix-caching" if self.prefix_caching
                else "--no-enable-prefix-caching"]
        if self.kv_transfer_config is not None:
            args += ["--kv-transfer-config", json.dumps(dict(self.kv_transfer_config))]
        return args + list(self.extra_args)

    @property
    def tmp_dir(self) -> Path:
        """The server's temporary folder (``TMPDIR``), beside its log."""
        return self.log_path.with_name(self.log_path.name + ".tmp")

    def environ(self, ports: Mapping[str, int]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
        env.update({
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "PATH": f"{Path(self.python).parent}{os.pathsep}{env.get('PATH', '')}",
        })
        if self.cpu is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(self.cpu)
        # vLLM leaves a file:// rendezvous file (vllm_dist_*) in the temporary
        # folder at every start: keep it next to the log, not in /tmp.
        env["TMPDIR"] = str(self.tmp_dir)
        env.update(self.env)
        env.update({name: str(port) for name, port in ports.items()})
        return env


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports, none handed out before by this
    process, from below the kernel's ephemeral range (``unused_port``); a clash
    with another program that can still follow is caught by the retry."""
    return [unused_port() for _ in range(count)]


class VllmServer:
    """A started vLLM server: its ports, its process group, its log; ``stop`` ends it."""

    def __init__(self, spec: ServerSpec, port: int, ports: Mapping[str, int],
                 popen: subprocess.Popen[bytes], log: IO[bytes]) -> None:
        self.spec = spec
        self.port = port
        self.ports = dict(ports)
        self.popen = popen
        self.startup_s = 0.0
        self.pollers: list[procs.ThreadInfo] = []
        self._log = log
        self._stopped = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def processes(self) -> list[tuple[int, str, int]]:
        """(pid, name, resident bytes) of each live process of the server's group."""
        return procs.group_members(self.popen.pid)

    def log_tail(self, lines: int = _TAIL_LINES) -> str:
        return _tail(self.spec.log_path, lines)

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the whole group, SIGKILL after ``grace_s``; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        try:
            procs.end_group(self.popen, grace_s)
        finally:
            self._log.close()

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2.0) as r:
            return int(r.status) == 200
    except OSError:
        return False


def _log_has(path: Path, offset: int, needle: str) -> bool:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return needle.encode() in f.read()
    except OSError:
        return False


def _wait_ready(server: VllmServer, offset: int, deadline: float,
                cancel: threading.Event | None) -> None:
    """Until /health answers 200; _PortClash or ServerStartError otherwise."""
    log_path = server.spec.log_path
    while True:
        if cancel is not None and cancel.is_set():
            raise _Cancelled("start cancelled")
        code = server.popen.poll()
        if _log_has(log_path, offset, _BIND_CLASH):
            raise _PortClash()
        if code is not None:
            raise ServerStartError(f"vLLM server exited with {code} while starting; "
                                   f"log {log_path}:\n{server.log_tail()}")
        if _healthy(server.port):
            return
        if time.monotonic() > deadline:
            raise ServerStartError(f"vLLM server did not answer /health in time; "
                                   f"log {log_path}:\n{server.log_tail()}")
        time.sleep(0.5)


def _launch(spec: ServerSpec) -> tuple[VllmServer, int]:
    port, *others = free_ports(1 + len(spec.port_envs))
    ports = dict(zip(spec.port_envs, others, strict=True))
    spec.tmp_dir.mkdir(parents=True, exist_ok=True)
    log = spec.log_path.open("ab")
    offset = log.seek(0, os.SEEK_END)
    log.write(f"--- hixl_bench: port {port}, {ports}\n".encode())
    log.flush()
    try:
        popen = subprocess.Popen(spec.argv(port), stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, env=spec.environ(ports),
                                 cwd=spec.log_path.parent, start_new_session=True)
    except OSError:
        log.close()
        raise
    return VllmServer(spec, port, ports, popen, log), offset


def start_server(spec: ServerSpec, timeout_s: float = 600.0, attempts: int = 3,
                 cancel: threading.Event | None = None) -> VllmServer:
    """Start one vLLM server and wait until it answers /health.

    Args:
        spec: what to start.
        timeout_s: bound on each attempt, from launch to a healthy /health.
        attempts: starts tried when a bind fails ("Address already in use").
        cancel: when set (from another thread), the start is given up.

    Returns:
        The running server; the caller stops it (or uses it as a context manager).

    Raises:
        ServerStartError: it exited, timed out or clashed on ports every time.
    """
    for attempt in range(1, attempts + 1):
        started = time.monotonic()
        server, offset = _launch(spec)
        try:
            _wait_ready(server, offset, started + timeout_s, cancel)
            server.startup_s = time.monotonic() - started
            if spec.pin and spec.cpu is not None:
                server.pollers = procs.isolate(server.pid, spec.cpu, spec.demote_pollers)
        except _PortClash:
            server.stop(grace_s=10.0)
            if attempt == attempts:
                raise ServerStartError(f"ports clashed on all {attempts} starts; "
                                       f"log {spec.log_path}") from None
            continue
        except BaseException:
            server.stop(grace_s=10.0)
            raise
        return server
    raise AssertionError("unreachable")


def start_servers(specs: Sequence[ServerSpec], timeout_s: float = 600.0) -> list[VllmServer]:
    """Start servers side by side (start-up is mostly imports, one core each).

    If one fails, or this thread is interrupted, the others are given up and
    every server that came up is stopped.

    Raises:
        ServerStartError: the first failure.
    """
    cancel = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(max(1, len(specs)),
                                                 thread_name_prefix="vllm-start")
    futures = [pool.submit(start_server, spec, timeout_s, 3, cancel) for spec in specs]
    errors: list[BaseException] = []
    try:
        concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
    except BaseException as exc:  # an interrupt: stop what came up, then pass it on
        errors.append(exc)
    if errors or any(f.done() and f.exception() is not None for f in futures):
        cancel.set()
    pool.shutdown(wait=True)
    started = [f.result() for f in futures if f.exception() is None]
    errors += [e for e in (f.exception() for f in futures) if e is not None]
    errors.sort(key=lambda e: isinstance(e, _Cancelled))
    if errors:
        for server in started:
            server.stop()
        raise errors[0]
    return started
