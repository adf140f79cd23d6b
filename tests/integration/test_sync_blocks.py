"""Block transfers of the blocking facade: checked and sent on the calling thread.

The facade runs pull_blocks and push_blocks on the calling thread, over a lane
connection of that thread (``hixl_client._blocking_lane``). These run the
engines' call (paged caches keyed by ``BlocksCacheKey``, fragmented block
tables, layer ranges) from several threads of a facade client process, and
check the bytes, the lane connections the daemon counts, the errors and the
close at finalize.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from hixl_service.testing import DaemonProcess

from .conftest import daemon_status

SCRIPT_TIMEOUT_S = 60
THREADS = 3
PULLS_PER_THREAD = 4

PRELUDE = textwrap.dedent("""
    import json, random, sys, threading
    import numpy as np
    from hixl_client.sync import (BlocksCacheKey, CacheDesc, DataType, LLMClusterInfo, LLMConfig,
                                  LLMDataDist, LLMException, LLMRole, LLMStatusCode, set_daemon)

    LAYERS, BLOCKS, BLOCK_BYTES = 4, 64, 4096
    DESC = CacheDesc(2 * LAYERS, [BLOCKS, BLOCK_BYTES], DataType.DT_UINT8)

    def options(remote_accessible=False):
        config = LLMConfig()
        config.enable_cache_manager = True
        config.enable_remote_cache_accessible = remote_accessible
        config.mem_pool_cfg = json.dumps({"memory_size": 64 * 2**20})
        return config.generate_options()

    def pattern(tensor, block):
        return (tensor * 37 + block * 11 + 5) % 251
""")

PREFILL = PRELUDE + textwrap.dedent("""
    set_daemon(sys.argv[1])
    dd = LLMDataDist(LLMRole.PROMPT, int(sys.argv[2]))
    dd.init(options(remote_accessible=sys.argv[3] == "push"))
    cache = dd.cache_manager.allocate_blocks_cache(DESC, BlocksCacheKey(dd.cluster_id, 0))
    for tensor in range(DESC.num_tensors):
        for block in range(BLOCKS):
            cache.numpy(tensor)[block] = pattern(tensor, block)
    print("ready", cache.cache_id, flush=True)
    sys.stdin.readline()
    # after the pushes: blocks the decode side wrote carry its pattern, + 100
    pushed = json.loads(sys.stdin.readline() or "[]")
    for tensor in range(DESC.num_tensors):
        for block in pushed:
            assert (cache.numpy(tensor)[block] == (pattern(tensor, block) + 100) % 251).all()
    dd.finalize()
    print("finalized", len(pushed), flush=True)
""")

# argv: prefill cluster, prefill peer address, own cluster, "pull" or "push".
DECODE = PRELUDE + textwrap.dedent(f"""
    prefill, push = int(sys.argv[1]), sys.argv[4] == "push"
    dd = LLMDataDist(LLMRole.DECODER, int(sys.argv[3]))  # daemon from $HIXL_DAEMON
    dd.init(options(remote_accessible=push))
    host, port = sys.argv[2].rsplit(":", 1)
    info = LLMClusterInfo()
    info.remote_cluster_id = prefill
    info.append_local_ip_info("127.0.0.1", 0)
    info.append_remote_ip_info(host, int(port))
    status, per_cluster = dd.link_clusters([info], timeout=5000)
    assert status == LLMStatusCode.LLM_SUCCESS, per_cluster
    cm = dd.cache_manager
    dst = cm.allocate_blocks_cache(DESC)
    key = BlocksCacheKey(prefill, 0)

    def pull_and_check(rng, layers, own_blocks):
        count = rng.randrange(1, len(own_blocks))
        src_blocks = rng.sample(range(BLOCKS), count)
        dst_blocks = rng.sample(own_blocks, count)  # threads land in blocks of their own
        cm.pull_blocks(key, dst, src_blocks, dst_blocks, checksum=rng.choice([None, True]),
                       src_layer_range=layers, dst_layer_range=layers)
        for tensor in range(layers.start * 2, layers.stop * 2):
            for s, d in zip(src_blocks, dst_blocks):
                got = dst.numpy(tensor)[d]
                assert (got == pattern(tensor, s)).all(), (tensor, s, d, got[:4])

    def push_some(rng):
        blocks = rng.sample(range(BLOCKS), 5)
        for tensor in range(DESC.num_tensors):
            for block in blocks:
                dst.numpy(tensor)[block] = (pattern(tensor, block) + 100) % 251
        cm.push_blocks(key, dst, blocks, blocks, checksum=True)
        return blocks

    errors, pushed = [], []
    finished, release = threading.Barrier({THREADS} + 1), threading.Event()
    def worker(seed):
        rng = random.Random(seed)
        try:
            if push:
                pushed.extend(push_some(rng))
            else:
                for i in range({PULLS_PER_THREAD}):
                    first = rng.randrange(0, LAYERS)
                    pull_and_check(rng, range(first, rng.randrange(first + 1, LAYERS + 1)),
                                   range(seed * 16, seed * 16 + 16))
        except BaseException as err:
            errors.append(repr(err))
        finished.wait()
        release.wait(timeout=30)  # the thread, and so its lane, lives until then
    workers = [threading.Thread(target=worker, args=(seed,)) for seed in range({THREADS})]
    for thread in workers:
        thread.start()
    finished.wait(timeout=30)
    assert not errors, errors
    # The daemon's own checks still answer on this path, with their status.
    try:
        cm.pull_blocks(key, dst, [BLOCKS], [0])
    except LLMException as err:
        assert err.status_code == LLMStatusCode.LLM_PARAM_INVALID, err
    else:
        raise AssertionError("a block out of range was pulled")
    try:  # checksum= is checked as the async client checks it, before any call
        cm.pull_blocks(key, dst, [0], [0], checksum="yes")
    except TypeError as err:
        assert "checksum" in str(err), err
    else:
        raise AssertionError("checksum='yes' was taken")
    print("done", json.dumps(sorted(set(pushed))), flush=True)
    sys.stdin.readline()  # the test reads the daemon's counts meanwhile
    lanes = list(cm._lanes._all)
    release.set()
    for thread in workers:
        thread.join()
    dd.finalize()
    assert len(lanes) == {THREADS} + 1 and not any(lane.is_open for lane in lanes), lanes
    try:
        cm.pull_blocks(key, dst, [0], [0])
    except LLMException as err:
        assert err.status_code == LLMStatusCode.LLM_ENGINE_FINALIZED, err
    else:
        raise AssertionError("pull_blocks after finalize")
    print("closed", len(lanes), flush=True)
""")


@contextmanager
def _process(script: str, *args: object, env: dict[str, str] | None = None
             ) -> Iterator[subprocess.Popen[str]]:
    with subprocess.Popen([sys.executable, "-c", script, *map(str, args)], env=env, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        out, err = proc.communicate(timeout=SCRIPT_TIMEOUT_S)
        raise AssertionError(f"the client ended early: {out}{err}")
    return line.strip()


def _finish(proc: subprocess.Popen[str], send: str = "\n") -> str:
    out, err = proc.communicate(send, timeout=SCRIPT_TIMEOUT_S)
    assert proc.returncode == 0 and "Traceback" not in err, out + err
    return out


@pytest.mark.asyncio
@pytest.mark.parametrize("op", ["pull", "push"])
async def test_block_transfers_from_several_threads_go_on_their_own_lanes(
        prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
        next_cluster_id: Callable[[], int], op: str) -> None:
    prefill, decode = next_cluster_id(), next_cluster_id()
    env = {**os.environ, "HIXL_DAEMON": decode_daemon.client_target}
    with _process(PREFILL, prefill_daemon.client_target, prefill, op) as prompt:
        assert _line(prompt).startswith("ready")
        with _process(DECODE, prefill, prefill_daemon.peer_address, decode, op,
                      env=env) as client:
            done_line = _line(client)
            assert done_line.startswith("done"), done_line
            status = await daemon_status(decode_daemon.client_target)
            session = next(s for s in status.sessions if s.cluster_id == decode)
            # the loop thread's lane, and one per thread that made a block transfer
            assert session.lane_connections == 1 + THREADS + 1, session
            expected_calls = THREADS * (PULLS_PER_THREAD if op == "pull" else 1)
            assert session.lane_calls >= expected_calls, session
            out = _finish(client)
            assert f"closed {THREADS + 1}" in out, out
        pushed = done_line.removeprefix("done").strip()
        done = _finish(prompt, "\n" + (pushed if op == "push" else "[]") + "\n")
    count = len(json.loads(pushed)) if op == "push" else 0
    assert f"finalized {count}" in done, done
