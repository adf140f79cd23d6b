"""hixl_bench.vllm without vLLM: the HTTP helpers against a fake server, the
server lifecycle against a fake ``python``, the /proc helpers on real
processes.

The real thing (vLLM CPU servers with NixlConnector) runs in
``python -m hixl_bench.vllm.nixl_check``; it needs a 4 GB environment and
minutes, so it is not part of the suite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hixl_bench.vllm import api, procs, servers
from hixl_bench.vllm.nixl_check import nixl_specs, seeded_prompts

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

METRICS = """\
# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m, x",source="local_compute"} 12.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 700.0
vllm:prompt_tokens_by_source_total{engine="1",model_name="m",source="external_kv_transfer"} 5.0
vllm:prompt_tokens_by_source_created{engine="0",model_name="m",source="local_compute"} 1.7e+09
"""


class _Fake(BaseHTTPRequestHandler):
    """A vLLM look-alike: echoes the prompt's last ids as the completion."""

    bodies: list[dict[str, Any]]

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(200, METRICS.encode(), "text/plain")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        if body["max_tokens"] == 0:
            self._send(400, b'{"error": "max_tokens"}')
            return
        ids = isinstance(body["prompt"], list)  # a text prompt gets no ids, no params
        tokens = body["prompt"][-body["max_tokens"]:] if ids else []
        params = ({"remote_engine_id": "p", "remote_block_ids": [[3, 2]]}
                  if ids and (body.get("kv_transfer_params") or {}).get("do_remote_decode")
                  else None)
        if not body["stream"]:
            answer = {"choices": [{"text": "t", "token_ids": tokens}],
                      "usage": {"prompt_tokens": len(body["prompt"])},
                      "kv_transfer_params": params}
            self._send(200, json.dumps(answer).encode())
            return
        chunks: list[dict[str, Any]] = [{"choices": [{"text": "t", "token_ids": [t]}]}
                                        for t in tokens]
        chunks.append({"choices": [], "usage": {"completion_tokens": len(tokens)}})
        sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        self._send(200, sse.encode(), "text/event-stream")


@pytest.fixture
def fake() -> Iterator[tuple[int, list[dict[str, Any]]]]:
    bodies: list[dict[str, Any]] = []
    handler = type("Handler", (_Fake,), {"bodies": bodies})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], bodies
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_complete_sends_a_greedy_request_and_reads_token_ids(fake: tuple[int, list[dict[str, Any]]]) -> None:
    port, bodies = fake
    got = api.complete(port, [5, 6, 7, 8], 2)
    assert got.token_ids == (7, 8) and got.usage == {"prompt_tokens": 4}
    assert got.kv_transfer_params is None and got.ttft_s is None
    assert bodies[0]["temperature"] == 0.0 and bodies[0]["ignore_eos"] is True
    assert bodies[0]["return_token_ids"] is True


def test_a_streamed_completion_has_its_tokens_and_a_ttft(fake: tuple[int, list[dict[str, Any]]]) -> None:
    port, _ = fake
    got = api.complete(port, [1, 2, 3], 3, stream=True)
    assert got.token_ids == (1, 2, 3) and got.text == "ttt"
    assert got.usage == {"completion_tokens": 3}
    assert got.ttft_s is not None and 0 <= got.ttft_s <= got.elapsed_s


def test_pd_complete_is_the_toy_proxy_flow(fake: tuple[int, list[dict[str, Any]]]) -> None:
    port, bodies = fake
    got = api.pd_complete(port, port, [9, 8, 7, 6], 3)
    p_body, d_body = bodies
    assert p_body["max_tokens"] == 1 and p_body["kv_transfer_params"]["do_remote_decode"] is True
    assert d_body["max_tokens"] == 3
    assert d_body["kv_transfer_params"] == {"remote_engine_id": "p", "remote_block_ids": [[3, 2]]}
    assert got.decode.token_ids == (8, 7, 6) and got.prefill.token_ids == (6,)


def test_pd_complete_fails_when_p_returns_no_params(fake: tuple[int, list[dict[str, Any]]]) -> None:
    port, _ = fake
    with pytest.raises(api.ApiError, match="without kv_transfer_params"):
        api.pd_complete(port, port, "text, not ids", 3)


def test_http_errors_carry_the_answer(fake: tuple[int, list[dict[str, Any]]]) -> None:
    port, _ = fake
    with pytest.raises(api.ApiError, match="HTTP 400.*max_tokens"):
        api.complete(port, [1], 0)


def test_prompt_tokens_by_source_sums_engines_and_skips_other_series(
        fake: tuple[int, list[dict[str, Any]]]) -> None:
    port, _ = fake
    assert api.prompt_tokens_by_source(port) == {"local_compute": 12.0,
                                                 "external_kv_transfer": 705.0}


def test_seeded_prompts_are_deterministic_distinct_and_in_range() -> None:
    prompts = seeded_prompts(8, 300, 410, seed=0)
    assert prompts == seeded_prompts(8, 300, 410, seed=0)
    assert prompts != seeded_prompts(8, 300, 410, seed=1)
    assert len(prompts[0]) == 300 and len(prompts[-1]) == 410
    assert len({tuple(p) for p in prompts}) == 8
    assert all(2 <= t < 1024 for p in prompts for t in p)


def test_free_ports_are_distinct_and_never_handed_out_twice() -> None:
    first = servers.free_ports(4)
    second = servers.free_ports(4)
    assert len(set(first + second)) == 8


def test_nixl_specs_give_each_side_its_core_role_and_side_channel(tmp_path: Path) -> None:
    p, d = nixl_specs("py", tmp_path / "model", tmp_path)
    cpus = sorted(os.sched_getaffinity(0))
    assert (p.cpu, d.cpu) == (cpus[0], cpus[-1])
    assert p.kv_transfer_config is not None and d.kv_transfer_config is not None
    assert (p.kv_transfer_config["kv_role"], d.kv_transfer_config["kv_role"]) == (
        "kv_producer", "kv_consumer")
    argv = p.argv(1234)
    assert argv[argv.index("--port") + 1] == "1234" and "--no-enable-prefix-caching" in argv
    assert json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_buffer_device"] == "cpu"
    env = p.environ({"VLLM_NIXL_SIDE_CHANNEL_PORT": 5601})
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == str(cpus[0])
    assert env["UCX_TLS"] == "tcp,self,sm" and "PYTHONPATH" not in env
    assert env["TMPDIR"] == str(tmp_path / "prefill.log.tmp")


# A stand-in for the vLLM environment's python: "-m vllm..." is ignored, the
# mode comes from the environment that ServerSpec.env sets.
FAKE_PYTHON = """\
import http.server, os, signal, subprocess, sys, time
mode = os.environ["FAKE_MODE"]
port = int(sys.argv[sys.argv.index("--port") + 1])
if mode == "exit":
    print("it broke", flush=True)
    sys.exit(3)
if mode == "clash":
    print("OSError: [Errno 98] Address already in use", flush=True)
    time.sleep(600)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _fake_spec(tmp_path: Path, mode: str) -> servers.ServerSpec:
    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\n{FAKE_PYTHON}")
    python.chmod(0o755)
    return servers.ServerSpec(python=str(python), model_dir=tmp_path, cpu=None,
                              log_path=tmp_path / f"{mode}.log", env={"FAKE_MODE": mode},
                              port_envs=("SIDE_PORT",))


@pytest.mark.timeout(60)
def test_a_server_that_exits_fails_the_start_with_its_log(tmp_path: Path) -> None:
    with pytest.raises(servers.ServerStartError, match="exited with 3(.|\n)*it broke"):
        servers.start_server(_fake_spec(tmp_path, "exit"), timeout_s=30)


@pytest.mark.timeout(90)
def test_a_port_clash_is_retried_on_fresh_ports(tmp_path: Path) -> None:
    spec = _fake_spec(tmp_path, "clash")
    with pytest.raises(servers.ServerStartError, match="clashed on all 2 starts"):
        servers.start_server(spec, timeout_s=30, attempts=2)
    starts = [line for line in spec.log_path.read_text().splitlines()
              if line.startswith("--- hixl_bench: port")]
    assert len(starts) == 2 and starts[0] != starts[1]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["plain", "stubborn"])
def test_stop_ends_the_whole_group_even_past_sigterm(tmp_path: Path, mode: str) -> None:
    server = servers.start_server(_fake_spec(tmp_path, mode), timeout_s=30)
    try:
        assert len(server.processes()) == 2  # the server and its child
        assert set(server.ports) == {"SIDE_PORT"}
    finally:
        server.stop(grace_s=1.0)
    assert not procs.group_alive(server.pid)
    assert server.popen.returncode == (-signal.SIGKILL if mode == "stubborn" else -signal.SIGTERM)


SPINNER = """\
import threading, time
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
time.sleep(600)
"""


@pytest.mark.timeout(60)
def test_isolate_pins_every_thread_and_finds_the_poller(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", SPINNER], start_new_session=True)
    try:
        time.sleep(0.5)
        cpu = min(os.sched_getaffinity(0))
        polling = procs.isolate(child.pid, cpu, demote_pollers=True)
        threads = procs.group_threads(child.pid)
        assert len(threads) == 2 and all(t.cpus == frozenset({cpu}) for t in threads)
        assert [t.tid for t in polling] == [t.tid for t in threads if t.tid != child.pid]
        assert os.sched_getscheduler(polling[0].tid) == os.SCHED_IDLE
    finally:
        procs.end_group(child, grace_s=5.0)
    assert child.returncode is not None


def test_the_venv_script_is_there_and_says_its_interpreter_last() -> None:
    script = servers.VLLM_ENV_SCRIPT.read_text()
    assert script.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in script
    assert script.splitlines()[-1] == 'echo "$VENV/bin/python"'
