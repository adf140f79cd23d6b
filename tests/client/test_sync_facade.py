"""The blocking facade without a daemon: names, signatures, validation, refusals.

These tests never open a gRPC channel (grpc.aio supports one loop per process
and the suite's loop is the one). Everything that needs a call to succeed
(the singleton, calls forwarded to the loop thread, errors crossing, tasks
waited from threads) runs against real daemons in subprocesses, in
tests/integration/test_sync_facade.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

import hixl_client
from hixl_client import _sync_loop, sync
from hixl_client import transfer_config as transfer_config_module
from hixl_client.sync import (
    CacheManager,
    CacheTask,
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
# hixl's keyword-only extensions, the async client's too: a call written for
# LLM-DataDist passes none of them and means the same.
HIXL_KEYWORD_ONLY = {(CacheManager, name): "checksum=None"
                     for name in ("pull_cache", "pull_blocks", "push_cache", "push_blocks")}


def parameter_list(function: Callable[..., Any], keyword_only: bool = False) -> str:
    """The parameters but self, as written in a def: LLM-DataDist's, or with
    ``keyword_only`` those after the ``*``."""
    parts = []
    for param in list(inspect.signature(function).parameters.values())[1:]:
        if (param.kind is param.KEYWORD_ONLY) != keyword_only:
            continue
        if param.kind is param.VAR_KEYWORD:
            parts.append(f"**{param.name}")
        elif param.default is param.empty:
            parts.append(param.name)
        else:
            parts.append(f"{param.name}={param.default!r}")
    return ", ".join(parts)


@pytest.fixture(autouse=True)
def no_engine_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LLMDataDist, "llm_engine_instance", None)
    monkeypatch.setattr(sync, "_daemon_target", None)


def test_exports_are_llm_datadists() -> None:
    # NotifyDesc: for the facade's send_notify and get_notifies (hixl extensions)
    assert set(sync.__all__) == SPEC_EXPORTS | {"CacheManager", "NotifyDesc", "set_daemon"}
    for name in SPEC_EXPORTS - FACADE_CLASSES:
        expected = getattr(hixl_client, name, None) or getattr(transfer_config_module, name)
        assert getattr(sync, name) is expected, name
    assert sync.LLMConfig is sync.LlmConfig
    for name in FACADE_CLASSES:
        assert getattr(sync, name) is not getattr(hixl_client, name, None), name


@pytest.mark.parametrize(("cls", "name"), list(SIGNATURES))
def test_signatures_are_llm_datadists(cls: type, name: str) -> None:
    assert parameter_list(getattr(cls, name)) == SIGNATURES[(cls, name)]
    assert parameter_list(getattr(cls, name), keyword_only=True) == \
        HIXL_KEYWORD_ONLY.get((cls, name), "")


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


def test_the_exit_hook_without_an_instance_does_nothing() -> None:
    sync._shutdown_handler()
    assert LLMDataDist.llm_engine_instance is None


def test_a_blocking_call_on_the_facade_loop_raises() -> None:
    async def nested() -> None:
        LLMDataDist(LLMRole.PROMPT, 1).init({})

    with pytest.raises(RuntimeError, match="async API"):
        _sync_loop.run(nested)


@pytest.mark.asyncio
async def test_blocking_calls_inside_a_running_loop_raise() -> None:
    """The facade's own calls; those of its CacheManager and CacheTask are checked
    against a real daemon (tests/integration/test_sync_facade.py)."""
    dd = LLMDataDist(LLMRole.PROMPT, 1)
    calls: list[Callable[[], object]] = [
        lambda: dd.init({}), dd.finalize, lambda: dd.link_clusters([]),
        lambda: dd.unlink_clusters([]),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="use the async API"):
            call()
