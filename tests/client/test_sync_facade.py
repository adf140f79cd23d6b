"""The blocking facade without a daemon: names, signatures, singleton, loop thread.

These tests never open a gRPC channel (grpc.aio supports one loop per process
and the suite's loop is the one); the async objects behind the facade are
fakes where a call must succeed. Daemon-backed scenarios run in subprocesses
in tests/integration/test_sync_facade.py.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import hixl_client
from hixl_client import _sync_loop, sync
from hixl_client import transfer_config as transfer_config_module
from hixl_client.sync import (
    Cache,
    CacheDesc,
    CacheKey,
    CacheManager,
    CacheTask,
    DataType,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
)

# LLM-DataDist's exports (spec 2.1).
SPEC_EXPORTS = {
    "KvCache",
    "LLMClusterInfo", "LLMStatusCode", "LLMException", "LLMRole", "LlmConfig", "LLMConfig",
    "DataType", "Status", "CacheDesc", "CacheKey", "CacheKeyByIdAndIndex", "Cache",
    "BlocksCacheKey", "LLMDataDist", "Placement", "RegisterMemStatus", "LayerSynchronizer",
    "TransferConfig", "CacheTask", "TransferWithCacheKeyConfig", "Memtype", "MemInfo",
}
FACADE_CLASSES = {"LLMDataDist", "CacheManager", "CacheTask"}

# Parameter lists of LLM-DataDist's methods (spec 2.7, 2.8, 4.5), self omitted.
SIGNATURES = {
    (LLMDataDist, "__init__"): "role, cluster_id",
    (LLMDataDist, "init"): "options",
    (LLMDataDist, "finalize"): "",
    (LLMDataDist, "link_clusters"): "clusters, timeout=3000",
    (LLMDataDist, "unlink_clusters"): "clusters, timeout=3000, force=False",
    (LLMDataDist, "switch_role"): "role, switch_options=None",
    (LLMDataDist, "link"): "comm_name, cluster_rank_info, rank_table",
    (LLMDataDist, "unlink"): "comm_id",
    (LLMDataDist, "query_register_mem_status"): "comm_id",
    (LLMDataDist, "check_link_status"): "remote_cluster_id",
    (CacheManager, "allocate_cache"): "cache_desc, cache_keys=()",
    (CacheManager, "allocate_blocks_cache"): "cache_desc, blocks_cache_key=None",
    (CacheManager, "register_cache"): "cache_desc, addrs, cache_keys=(), remote_accessible=None",
    (CacheManager, "register_blocks_cache"):
        "cache_desc, addrs, blocks_cache_key=None, remote_accessible=None",
    (CacheManager, "unregister_cache"): "cache_id",
    (CacheManager, "deallocate_cache"): "cache",
    (CacheManager, "deallocate_blocks_cache"): "cache",
    (CacheManager, "remove_cache_key"): "cache_key",
    (CacheManager, "copy_cache"):
        "dst, src, dst_batch_index=0, src_batch_index=0, offset=0, size=-1, req_id=None",
    (CacheManager, "copy_blocks"): "cache, copy_block_info",
    (CacheManager, "swap_blocks"): "src_cache, dst_cache, src_to_dst",
    (CacheManager, "pull_cache"): "cache_key, cache, batch_index=0, size=-1, **kwargs",
    (CacheManager, "pull_blocks"): "src_cache_key, dst_cache, src_blocks=(), dst_blocks=(), **kwargs",
    (CacheManager, "push_cache"): "dst_cache_key, src_cache, src_batch_index=0, src_layer_range=None, "
                                  "dst_layer_range=None, size=-1, tensor_num_per_layer=2",
    (CacheManager, "push_blocks"): "dst_cache_key, src_cache, src_blocks=(), dst_blocks=(), "
                                   "src_layer_range=None, dst_layer_range=None, tensor_num_per_layer=2",
    (CacheManager, "transfer_cache_async"):
        "src_cache, layer_synchronizer, transfer_configs, src_block_indices=None, "
        "dst_block_indices=None, dst_block_memory_size=None",
    (CacheManager, "remap_registered_memory"): "mem_infos",
    (CacheTask, "__init__"): "transfer_async_task",
    (CacheTask, "synchronize"): "timeout_in_millis=None",
    (CacheTask, "get_results"): "timeout_in_millis=None",
}
CACHE_MANAGER_METHODS = sorted(name for cls, name in SIGNATURES if cls is CacheManager)
DESC = CacheDesc(2, [1, 16], DataType.DT_UINT8)


def parameter_list(function: Callable[..., Any]) -> str:
    parts = []
    for param in list(inspect.signature(function).parameters.values())[1:]:
        if param.kind is param.VAR_KEYWORD:
            parts.append(f"**{param.name}")
        elif param.default is param.empty:
            parts.append(param.name)
        else:
            parts.append(f"{param.name}={param.default!r}")
    return ", ".join(parts)


class FakeAsyncCacheManager:
    """An async CacheManager with a few coroutines; the rest are 'not built'."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.error: BaseException | None = None

    def _record(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs, threading.current_thread().name))

    async def allocate_cache(self, cache_desc: CacheDesc, cache_keys: Any = ()) -> Cache:
        self._record("allocate_cache", cache_desc, cache_keys)
        return Cache(7, cache_desc, [0x1000, 0x2000])

    async def pull_cache(self, cache_key: Any, cache: Any, batch_index: int = 0, size: int = -1,
                         **kwargs: Any) -> None:
        self._record("pull_cache", cache_key, cache, batch_index, size, **kwargs)
        if self.error is not None:
            raise self.error
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.1)
        finally:
            self.in_flight -= 1

    def transfer_cache_async(self, *args: Any) -> FakeAsyncTask:
        # Like the async client's: a plain method, called in the running loop,
        # that returns an awaitable task (which the facade must not await).
        asyncio.get_running_loop()
        self._record("transfer_cache_async", *args)
        return FakeAsyncTask(0.2)


class FakeAsyncTask:
    """The async CacheTask interface: done after ``seconds``; awaiting it gives results."""

    def __init__(self, seconds: float) -> None:
        self._done_at = time.monotonic() + seconds
        self.threads: set[str] = set()

    def __await__(self) -> Any:
        return self.get_results(None).__await__()

    async def synchronize(self, timeout_in_millis: int | None) -> LLMStatusCode:
        self.threads.add(threading.current_thread().name)
        wait = self._done_at - time.monotonic()
        if timeout_in_millis is not None and wait > timeout_in_millis / 1000:
            await asyncio.sleep(timeout_in_millis / 1000)
            return LLMStatusCode.LLM_TIMEOUT
        await asyncio.sleep(max(wait, 0))
        return LLMStatusCode.LLM_SUCCESS

    async def get_results(self, timeout_in_millis: int | None) -> list[LLMStatusCode | None]:
        status = await self.synchronize(timeout_in_millis)
        return [status, None]


class FakeAsyncLLMDataDist:
    """Enough of the async LLMDataDist for init/finalize bookkeeping."""

    def __init__(self, finalize_error: LLMException | None = None) -> None:
        self.is_initialized = False
        self.cluster_id = 9
        self.finalize_error = finalize_error
        self.manager = FakeAsyncCacheManager()

    @property
    def cache_manager(self) -> FakeAsyncCacheManager:
        if not self.is_initialized:
            raise RuntimeError("llm datadist is not initialized")
        return self.manager

    async def init(self, options: dict[str, str]) -> None:
        self.is_initialized = True

    async def finalize(self) -> None:
        self.is_initialized = False
        if self.finalize_error is not None:
            raise self.finalize_error


@pytest.fixture(autouse=True)
def no_engine_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LLMDataDist, "llm_engine_instance", None)
    monkeypatch.setattr(sync, "_daemon_target", None)


def faked(fake: FakeAsyncLLMDataDist | None = None) -> LLMDataDist:
    dd = LLMDataDist(LLMRole.PROMPT, 9)
    dd._async = fake or FakeAsyncLLMDataDist()  # type: ignore[assignment]
    return dd


def test_exports_are_llm_datadists() -> None:
    assert set(sync.__all__) == SPEC_EXPORTS | {"CacheManager", "set_daemon"}
    for name in SPEC_EXPORTS - FACADE_CLASSES:
        expected = getattr(hixl_client, name, None) or getattr(transfer_config_module, name)
        assert getattr(sync, name) is expected, name
    assert sync.LLMConfig is sync.LlmConfig
    for name in FACADE_CLASSES:
        assert getattr(sync, name) is not getattr(hixl_client, name, None), name


@pytest.mark.parametrize(("cls", "name"), list(SIGNATURES))
def test_signatures_are_llm_datadists(cls: type, name: str) -> None:
    assert parameter_list(getattr(cls, name)) == SIGNATURES[(cls, name)]


def test_every_spec_cache_manager_method_is_explicit() -> None:
    assert len(CACHE_MANAGER_METHODS) == 17
    for name in CACHE_MANAGER_METHODS:
        assert name in vars(CacheManager), name


def test_properties_and_class_attributes() -> None:
    for name in ("cluster_id", "cache_manager", "kv_cache_manager"):
        assert isinstance(vars(LLMDataDist)[name], property), name
    assert "llm_engine_instance" in vars(LLMDataDist)
    assert isinstance(vars(LLMDataDist)["_role_to_str"], staticmethod)
    assert list(inspect.signature(sync.set_daemon).parameters) == ["target"]


def test_constructor_validates_like_llm_datadist() -> None:
    with pytest.raises(TypeError, match="role"):
        LLMDataDist("PROMPT", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cluster_id"):
        LLMDataDist(LLMRole.PROMPT, -1)
    with pytest.raises(TypeError):
        LLMDataDist(LLMRole.PROMPT, 1, "unix:/x")  # type: ignore[call-arg]
    assert LLMDataDist(LLMRole.DECODER, 3).cluster_id == 3
    assert LLMDataDist.llm_engine_instance is None


def test_role_to_str() -> None:
    assert [LLMDataDist._role_to_str(r) for r in LLMRole] == ["Prompt", "Decoder", "Mix"]


def test_daemon_target_from_set_daemon_then_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIXL_DAEMON", "unix:/from/env.sock")
    assert LLMDataDist(LLMRole.PROMPT, 1)._async.daemon == "unix:/from/env.sock"
    sync.set_daemon("127.0.0.1:7000")
    assert LLMDataDist(LLMRole.PROMPT, 1)._async.daemon == "127.0.0.1:7000"
    with pytest.raises(TypeError, match="target"):
        sync.set_daemon(7000)  # type: ignore[arg-type]
    with pytest.raises(LLMException, match="target") as info:
        sync.set_daemon("")
    assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID


def test_cache_manager_before_init_is_a_runtime_error() -> None:
    with pytest.raises(RuntimeError, match="^llm datadist is not initialized$"):
        _ = LLMDataDist(LLMRole.PROMPT, 1).cache_manager


def test_init_sets_and_finalize_clears_the_singleton() -> None:
    first, second = faked(), faked()
    first.init({})
    assert LLMDataDist.llm_engine_instance is first
    first.init({})  # already initialized: returns at once
    with pytest.raises(LLMException, match="^Cannot init multiple LLMDataDists$") as info:
        second.init({})
    assert info.value.status_code == LLMStatusCode.LLM_FAILED
    manager = first.cache_manager
    assert isinstance(manager, CacheManager) and first.cache_manager is manager
    first.finalize()
    assert LLMDataDist.llm_engine_instance is None
    first.finalize()  # not initialized: a no-op
    second.init({})
    assert LLMDataDist.llm_engine_instance is second


def test_shutdown_handler_finalizes_and_swallows_llm_exceptions(
        caplog: pytest.LogCaptureFixture) -> None:
    sync._shutdown_handler()  # no instance: nothing to do
    clean = faked()
    clean.init({})
    sync._shutdown_handler()
    assert LLMDataDist.llm_engine_instance is None and not clean._async.is_initialized
    failing = faked(FakeAsyncLLMDataDist(LLMException(
        "daemon gone", status_code=LLMStatusCode.LLM_FAILED)))
    failing.init({})
    with caplog.at_level(logging.WARNING, logger="hixl_client.sync"):
        sync._shutdown_handler()
    assert LLMDataDist.llm_engine_instance is None
    assert "daemon gone" in caplog.text


def test_unbuilt_methods_raise_feature_not_enabled() -> None:
    dd = faked()
    calls: list[Callable[[], object]] = [
        lambda: dd.switch_role(LLMRole.DECODER), lambda: dd.link("comm", {1: 0, 2: 1}, "{}"),
        lambda: dd.unlink(1), lambda: dd.query_register_mem_status(1),
        lambda: dd.check_link_status(1), lambda: dd.kv_cache_manager,
        lambda: CacheManager(FakeAsyncCacheManager()).push_cache(None, None),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(LLMException, match="not") as info:
            call()
        assert info.value.status_code == LLMStatusCode.LLM_FEATURE_NOT_ENABLED


def test_calls_are_forwarded_and_run_on_the_loop_thread() -> None:
    fake = FakeAsyncCacheManager()
    manager = CacheManager(fake)
    cache = manager.allocate_cache(DESC, [CacheKey(1, 2)])
    assert type(cache) is hixl_client.Cache and cache.cache_id == 7
    manager.pull_cache(CacheKey(1, 2), cache, 0, 8, src_layer_range=range(1))
    name, args, kwargs, _ = fake.calls[1]
    assert (name, args[1:], kwargs) == ("pull_cache", (cache, 0, 8), {"src_layer_range": range(1)})
    assert args[0].req_id == 2
    assert {call[3] for call in fake.calls} == {_sync_loop.THREAD_NAME}
    thread = _sync_loop.loop_thread().thread
    assert thread is not None and thread.daemon and thread.name == "hixl-sync-loop"
    loop = _sync_loop.loop_thread().loop()
    try:
        import uvloop
    except ImportError:
        assert isinstance(loop, asyncio.AbstractEventLoop)
    else:
        assert isinstance(loop, uvloop.Loop)


def test_exceptions_cross_unchanged() -> None:
    fake = FakeAsyncCacheManager()
    error = LLMException("no such key", status_code=LLMStatusCode.LLM_KV_CACHE_NOT_EXIST)
    fake.error = error
    with pytest.raises(LLMException) as info:
        CacheManager(fake).pull_cache(CacheKey(1, 2), Cache(1, DESC, [0, 0]))
    assert info.value is error
    fake.error = TypeError("cache_key only support ...")
    with pytest.raises(TypeError, match="cache_key only support"):
        CacheManager(fake).pull_cache(None, None)  # type: ignore[arg-type]


def test_plain_threads_share_the_loop_concurrently() -> None:
    fake = FakeAsyncCacheManager()
    manager = CacheManager(fake)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def worker(req_id: int) -> None:
        try:
            barrier.wait()
            manager.pull_cache(CacheKey(1, req_id), Cache(1, DESC, [0, 0]))
        except BaseException as err:
            errors.append(err)

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert fake.most_in_flight == 4  # four 0.1 s pulls overlapped on one loop
    assert time.monotonic() - started < 0.35
    assert sorted(call[1][0].req_id for call in fake.calls) == [0, 1, 2, 3]
    assert [t.name for t in threading.enumerate()].count(_sync_loop.THREAD_NAME) == 1


def test_cache_task_waits_from_any_thread() -> None:
    fake = FakeAsyncCacheManager()
    task = CacheManager(fake).transfer_cache_async(Cache(1, DESC, [0, 0]), None, [])  # type: ignore[arg-type]
    assert isinstance(task, CacheTask)
    assert isinstance(task._task, FakeAsyncTask)
    assert task.synchronize(0) == LLMStatusCode.LLM_TIMEOUT
    assert task.get_results(0) == [LLMStatusCode.LLM_TIMEOUT, None]
    results: list[LLMStatusCode] = []
    waiters = [threading.Thread(target=lambda: results.append(task.synchronize()))
               for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    for waiter in waiters:
        waiter.join()
    assert results == [LLMStatusCode.LLM_SUCCESS] * 3
    assert task.get_results(1000) == [LLMStatusCode.LLM_SUCCESS, None]
    assert task._task.threads == {_sync_loop.THREAD_NAME}


def test_a_blocking_call_on_the_facade_loop_raises() -> None:
    manager = CacheManager(FakeAsyncCacheManager())

    async def nested() -> Cache:
        return manager.allocate_cache(DESC)

    with pytest.raises(RuntimeError, match="async API"):
        _sync_loop.run(nested)


@pytest.mark.asyncio
async def test_blocking_calls_inside_a_running_loop_raise() -> None:
    dd = LLMDataDist(LLMRole.PROMPT, 1)
    task = CacheTask(FakeAsyncTask(0))
    manager = CacheManager(FakeAsyncCacheManager())
    calls: list[Callable[[], object]] = [
        lambda: dd.init({}), dd.finalize, lambda: dd.link_clusters([]),
        lambda: dd.unlink_clusters([]), lambda: manager.allocate_cache(DESC),
        lambda: manager.push_cache(None, None),  # type: ignore[arg-type]
        task.synchronize, task.get_results,
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="use the async API"):
            call()
