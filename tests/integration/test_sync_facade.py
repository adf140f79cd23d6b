"""The blocking facade against real daemons, one client process per scenario.

grpc.aio supports one event loop per process, and this test process already
runs the suite's loop, so every facade client runs as a subprocess (as
LLM-DataDist code would: one initialized LLMDataDist per process) and the
tests assert on its output and exit code.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

import hixl_client
from hixl_service.testing import DaemonProcess

from .conftest import daemon_status

SCRIPT_TIMEOUT_S = 30

PRELUDE = textwrap.dedent("""
    import inspect, json, sys, threading
    import hixl_client
    from hixl_client.sync import (CacheDesc, CacheKey, DataType, LLMClusterInfo, LLMConfig,
                                  LLMDataDist, LLMException, LLMRole, LLMStatusCode, set_daemon)

    DESC = CacheDesc(2, [1, 64 * 1024], DataType.DT_UINT8)

    def options():
        config = LLMConfig()
        config.enable_cache_manager = True
        config.mem_pool_cfg = json.dumps({"memory_size": 64 * 2**20})
        return config.generate_options()

    def pattern(req_id, tensor):
        return (req_id * 31 + tensor * 7 + 1) % 256
""")

PREFILL = PRELUDE + textwrap.dedent("""
    set_daemon(sys.argv[1])
    dd = LLMDataDist(LLMRole.PROMPT, int(sys.argv[2]))
    dd.init(options())
    for req_id in range(int(sys.argv[3])):
        cache = dd.cache_manager.allocate_cache(DESC, [CacheKey(dd.cluster_id, req_id=req_id)])
        for tensor in range(DESC.num_tensors):
            cache.numpy(tensor)[...] = pattern(req_id, tensor)
        dd.cache_manager.deallocate_cache(cache)  # the key keeps it until it is pulled
    print("ready", flush=True)
    sys.stdin.readline()
    # The decode client said "done" (a hixl extension): take it, bounded.
    import time
    notes, deadline = [], time.monotonic() + 10
    while not notes and time.monotonic() < deadline:
        notes = dd.get_notifies()
        time.sleep(0.05)
    print("notified", [(n.remote_cluster_id, n.name, n.notify_msg.decode()) for n in notes],
          flush=True)
    dd.finalize()
    print("finalized", LLMDataDist.llm_engine_instance, flush=True)
""")

# argv: prefill cluster, prefill peer address, own cluster, first req id, threads.
DECODE = PRELUDE + textwrap.dedent("""
    prefill = int(sys.argv[1])
    dd = LLMDataDist(LLMRole.DECODER, int(sys.argv[3]))  # daemon from $HIXL_DAEMON
    dd.init(options())
    host, port = sys.argv[2].rsplit(":", 1)
    info = LLMClusterInfo()
    info.remote_cluster_id = prefill
    info.append_local_ip_info("127.0.0.1", 0)
    info.append_remote_ip_info(host, int(port))
    status, per_cluster = dd.link_clusters([info], timeout=5000)
    assert status == LLMStatusCode.LLM_SUCCESS, per_cluster
    states = dd.query_link_states()  # a hixl extension, blocking here too
    assert [(s.direction, s.remote_cluster_id, s.state.value, s.streams_up == s.streams)
            for s in states] == [("outbound", prefill, "up", True)], states
    cm = dd.cache_manager

    def pull_and_check(req_id):
        dst = cm.allocate_cache(DESC)
        assert type(dst) is hixl_client.Cache
        cm.pull_cache(CacheKey(prefill, req_id=req_id), dst)
        for tensor in range(DESC.num_tensors):
            got = dst.numpy(tensor)
            assert (got == pattern(req_id, tensor)).all(), (req_id, tensor, got[0, :8])
        cm.deallocate_cache(dst)

    first, threads = int(sys.argv[4]), int(sys.argv[5])
    if threads == 0:
        pull_and_check(first)
        pulled = [first]
    else:
        barrier = threading.Barrier(threads)
        errors, pulled = [], []
        def worker(req_id):
            try:
                barrier.wait()
                pull_and_check(req_id)
                pulled.append(req_id)
            except BaseException as err:
                errors.append(repr(err))
        workers = [threading.Thread(target=worker, args=(first + i,)) for i in range(threads)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        assert not errors, errors
    # A key drops once pulled: the daemon's error reaches this thread unchanged.
    try:
        pull_and_check(pulled[0])
    except LLMException as err:
        assert type(err) is hixl_client.LLMException
        assert err.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST, err
    else:
        raise AssertionError("a pulled key was pulled again")
    names = [t.name for t in threading.enumerate()]
    assert names.count("hixl-sync-loop") == 1, names
    # Every call ran on that one loop thread, on uvloop where it is installed.
    from hixl_client import _sync_loop
    assert _sync_loop.loop_thread().thread.daemon
    try:
        import uvloop
    except ImportError:
        pass
    else:
        assert isinstance(_sync_loop.loop_thread().loop(), uvloop.Loop)
    # The async layer's checks cross unchanged, TypeError included.
    try:
        cm.pull_cache(None, None)
    except TypeError as err:
        assert "cache_key" in str(err), err
    else:
        raise AssertionError("pull_cache(None, None)")
    # Inside a running loop the blocking calls refuse: the async API is the one there.
    import asyncio
    async def inside():
        try:
            cm.allocate_cache(DESC)
        except RuntimeError as err:
            return "use the async API" in str(err)
        return False
    assert asyncio.run(inside())
    from hixl_client.sync import NotifyDesc
    dd.send_notify(prefill, NotifyDesc("done", f"pulled {len(pulled)}"))
    status, per_cluster = dd.unlink_clusters([info], timeout=5000)
    assert status == LLMStatusCode.LLM_SUCCESS, per_cluster
    dd.finalize()
    print("pulled", sorted(pulled), flush=True)
""")

SINGLETON = PRELUDE + textwrap.dedent("""
    set_daemon(sys.argv[1])
    first = LLMDataDist(LLMRole.PROMPT, int(sys.argv[2]))
    second = LLMDataDist(LLMRole.DECODER, int(sys.argv[3]))
    try:
        second.cache_manager
    except RuntimeError as err:
        assert str(err) == "llm datadist is not initialized", err
    else:
        raise AssertionError("cache_manager before init")
    first.init(options())
    assert LLMDataDist.llm_engine_instance is first
    first.init({"not": "looked at"})  # already initialized: returns at once
    try:
        second.init(options())
    except LLMException as err:
        assert str(err) == "Cannot init multiple LLMDataDists", err
        assert err.status_code == LLMStatusCode.LLM_FAILED
    else:
        raise AssertionError("two initialized LLMDataDists")

    def call_with_nones(method):
        params = inspect.signature(method).parameters.values()
        method(*[None for p in params if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD])

    unbuilt = []
    for owner, obj, names in [
            (hixl_client.LLMDataDist, first, ["switch_role", "link", "unlink",
                                              "query_register_mem_status", "check_link_status"]),
            (hixl_client.CacheManager, first.cache_manager, [
                "allocate_blocks_cache", "register_cache", "register_blocks_cache",
                "unregister_cache", "deallocate_blocks_cache", "copy_cache", "copy_blocks",
                "swap_blocks", "pull_blocks", "push_cache", "push_blocks",
                "transfer_cache_async", "remap_registered_memory"])]:
        for name in names:
            if hasattr(owner, name):
                continue
            try:
                call_with_nones(getattr(obj, name))
            except LLMException as err:
                assert err.status_code == LLMStatusCode.LLM_FEATURE_NOT_ENABLED, (name, err)
            else:
                raise AssertionError(f"{name} is not built but returned")
            unbuilt.append(name)
    if hasattr(hixl_client.CacheManager, "transfer_cache_async"):
        try:  # the async layer validates before anything starts
            first.cache_manager.transfer_cache_async(None, None, [])
        except TypeError as err:
            assert "src_cache" in str(err), err
        else:
            raise AssertionError("transfer_cache_async(None, ...)")
    if not hasattr(hixl_client.LLMDataDist, "kv_cache_manager"):
        try:
            first.kv_cache_manager
        except LLMException as err:
            assert err.status_code == LLMStatusCode.LLM_FEATURE_NOT_ENABLED, err
        else:
            raise AssertionError("kv_cache_manager")
    first.finalize()
    assert LLMDataDist.llm_engine_instance is None
    first.finalize()  # not initialized: a no-op
    second.init(options())
    assert LLMDataDist.llm_engine_instance is second
    second.finalize()
    print("unbuilt", len(unbuilt), "ok", flush=True)
""")

# The check runs after the facade's atexit hook because atexit runs hooks in
# reverse order and this one is registered before hixl_client.sync is imported.
AT_EXIT = "import atexit\n" + textwrap.dedent("""
    def after_facade_hook():
        from hixl_client.sync import LLMDataDist
        print("after exit:", LLMDataDist.llm_engine_instance, flush=True)
    atexit.register(after_facade_hook)
""") + PRELUDE + textwrap.dedent("""
    import hixl_client.llm_datadist as async_api
    original_finalize = async_api.LLMDataDist.finalize
    async def traced_finalize(self):
        await original_finalize(self)
        print("finalized by the daemon", flush=True)
    async_api.LLMDataDist.finalize = traced_finalize

    set_daemon(sys.argv[1])
    dd = LLMDataDist(LLMRole.PROMPT, int(sys.argv[2]))
    dd.init(options())
    dd.cache_manager.allocate_cache(DESC, [CacheKey(dd.cluster_id, req_id=1)])
    print("ready", flush=True)
""")

# Layer-wise transfer in remote-cache-accessible mode: the decode side holds a
# destination cache; the prefill side sends into it and waits from plain threads.
LAYERWISE_DST = PRELUDE + textwrap.dedent("""
    config = LLMConfig()
    config.enable_cache_manager = True
    config.enable_remote_cache_accessible = True
    config.mem_pool_cfg = json.dumps({"memory_size": 64 * 2**20})
    dd = LLMDataDist(LLMRole.DECODER, int(sys.argv[1]))  # daemon from $HIXL_DAEMON
    dd.init(config.generate_options())
    dst = dd.cache_manager.allocate_cache(CacheDesc(4, [1, 4096], DataType.DT_UINT8))
    print(dst.cache_id, flush=True)
    sys.stdin.readline()
    print("received", [int(dst.numpy(i)[0, 0]) for i in range(4)], flush=True)
    dd.finalize()
""")

LAYERWISE_SRC = PRELUDE + textwrap.dedent("""
    import time
    from hixl_client.sync import CacheKeyByIdAndIndex, LayerSynchronizer, TransferWithCacheKeyConfig
    config = LLMConfig()
    config.enable_cache_manager = True
    config.enable_remote_cache_accessible = True
    config.mem_pool_cfg = json.dumps({"memory_size": 64 * 2**20})
    set_daemon(sys.argv[1])
    dd = LLMDataDist(LLMRole.PROMPT, int(sys.argv[2]))
    dd.init(config.generate_options())
    src = dd.cache_manager.allocate_cache(CacheDesc(4, [1, 4096], DataType.DT_UINT8))
    for i in range(4):
        src.numpy(i)[...] = 10 + i
    decode, host_port = int(sys.argv[3]), sys.argv[4]
    host, port = host_port.rsplit(":", 1)
    info = LLMClusterInfo()
    info.remote_cluster_id = decode
    info.append_local_ip_info("127.0.0.1", 0)
    info.append_remote_ip_info(host, int(port))
    status, per_cluster = dd.link_clusters([info], timeout=5000)
    assert status == LLMStatusCode.LLM_SUCCESS, per_cluster

    class SlowLayers(LayerSynchronizer):
        def synchronize_layer(self, layer_index, timeout_in_millis):
            time.sleep(0.2)
            return True

    transfer = TransferWithCacheKeyConfig(CacheKeyByIdAndIndex(decode, int(sys.argv[5])),
                                          range(0, 2), range(0, 2))
    task = dd.cache_manager.transfer_cache_async(src, SlowLayers(), [transfer])
    assert task.synchronize(0) == LLMStatusCode.LLM_TIMEOUT  # still running: keeps going
    results = []
    waiters = [threading.Thread(target=lambda: results.append(task.get_results()))
               for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    for waiter in waiters:
        waiter.join()
    assert results == [[LLMStatusCode.LLM_SUCCESS]] * 3, results
    assert task.synchronize() == LLMStatusCode.LLM_SUCCESS
    import asyncio
    async def inside():
        try:
            task.synchronize()
        except RuntimeError as err:
            return "use the async API" in str(err)
        return False
    assert asyncio.run(inside())
    dd.unlink_clusters([info], timeout=5000)
    dd.finalize()
    print("sent", flush=True)
""")


def run_script(script: str, *args: object, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done


@contextmanager
def prefill_process(daemon: DaemonProcess, cluster_id: int, keys: int) -> Iterator[list[str]]:
    """A facade prefill client holding ``keys`` keyed caches until the block ends;
    its output lines come in the yielded list when it has ended."""
    with subprocess.Popen([sys.executable, "-c", PREFILL, daemon.client_target,
                           str(cluster_id), str(keys)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            assert proc.stdout.readline().strip() == "ready", proc.communicate(timeout=5)
            lines: list[str] = []
            yield lines
            out, err = proc.communicate("\n", timeout=SCRIPT_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0 and "finalized None" in out, out + err
        lines += out.splitlines()


def decode_env(daemon: DaemonProcess) -> dict[str, str]:
    return {**os.environ, "HIXL_DAEMON": daemon.client_target}


def test_prefill_to_decode_pull(prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
                                next_cluster_id: Callable[[], int]) -> None:
    prefill, decode = next_cluster_id(), next_cluster_id()
    with prefill_process(prefill_daemon, prefill, keys=1) as prefill_lines:
        done = run_script(DECODE, prefill, prefill_daemon.peer_address, decode, 0, 0,
                          env=decode_env(decode_daemon))
    assert "pulled [0]" in done.stdout
    # The facade's send_notify and get_notifies, across the two daemons.
    assert f"notified [({decode}, 'done', 'pulled 1')]" in prefill_lines


def test_pulls_from_several_threads(prefill_daemon: DaemonProcess,
                                    decode_daemon: DaemonProcess,
                                    next_cluster_id: Callable[[], int]) -> None:
    prefill = next_cluster_id()
    with prefill_process(prefill_daemon, prefill, keys=4):
        done = run_script(DECODE, prefill, prefill_daemon.peer_address, next_cluster_id(), 0, 4,
                          env=decode_env(decode_daemon))
    assert "pulled [0, 1, 2, 3]" in done.stdout


def test_one_initialized_instance_per_process(prefill_daemon: DaemonProcess,
                                              next_cluster_id: Callable[[], int]) -> None:
    done = run_script(SINGLETON, prefill_daemon.client_target, next_cluster_id(),
                      next_cluster_id())
    assert done.stdout.rstrip().endswith("ok")


@pytest.mark.asyncio
async def test_atexit_finalizes_a_forgotten_instance(prefill_daemon: DaemonProcess,
                                                     next_cluster_id: Callable[[], int]) -> None:
    cluster_id = next_cluster_id()
    done = await asyncio.to_thread(run_script, AT_EXIT, prefill_daemon.client_target,
                                   cluster_id)
    assert done.stdout.splitlines() == ["ready", "finalized by the daemon", "after exit: None"]
    status = await daemon_status(prefill_daemon.client_target)
    assert cluster_id not in {c.cluster_id for c in status.clusters}
    assert cluster_id not in {p.cluster_id for p in status.pools}


def test_layerwise_transfer_waited_from_plain_threads(
        prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
        next_cluster_id: Callable[[], int]) -> None:
    if not hasattr(hixl_client.CacheManager, "transfer_cache_async"):
        pytest.skip("the async client has no transfer_cache_async yet")
    decode = next_cluster_id()
    with subprocess.Popen([sys.executable, "-c", LAYERWISE_DST, str(decode)],
                          env=decode_env(decode_daemon), stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as dst:
        assert dst.stdout is not None
        try:
            cache_id = dst.stdout.readline().strip()
            assert cache_id.isdigit(), dst.communicate(timeout=5)
            done = run_script(LAYERWISE_SRC, prefill_daemon.client_target, next_cluster_id(),
                              decode, decode_daemon.peer_address, cache_id)
            out, err = dst.communicate("\n", timeout=SCRIPT_TIMEOUT_S)
        finally:
            if dst.poll() is None:
                dst.kill()
    assert done.stdout.strip() == "sent"
    assert dst.returncode == 0 and "received [10, 11, 12, 13]" in out, out + err
