"""HixlConnector's proxy (``hixl_client.vllm.proxy``) as a process of vLLM's
environment, for the tests and the benchmark."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from hixl_service.testing import unused_port

ROOT = Path(__file__).resolve().parents[3]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthcheck", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def running_proxy(python: str, prefill_ports: Sequence[int], decode_ports: Sequence[int],
                  mode: str, log_path: Path, timeout_s: float = 60.0) -> Iterator[int]:
    """Start the proxy in ``mode`` over local instances; yields its port.

    Raises:
        RuntimeError: it did not answer its health check within ``timeout_s``.
    """
    port = unused_port()
    argv = [python, "-m", "hixl_client.vllm.proxy", "--port", str(port), "--mode", mode,
            "--prefiller-hosts", *["127.0.0.1"] * len(prefill_ports),
            "--prefiller-ports", *map(str, prefill_ports),
            "--decoder-hosts", *["127.0.0.1"] * len(decode_ports),
            "--decoder-ports", *map(str, decode_ports)]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'native'}"}
    with log_path.open("ab") as log:
        popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + timeout_s
        while not _healthy(port):
            if popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the proxy did not start (exit {popen.poll()}); log "
                                   f"{log_path}:\n{log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
        yield port
    finally:
        popen.terminate()
        try:
            popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
