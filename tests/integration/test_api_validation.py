"""The async API's own rules: raised before any RPC, with LLM-DataDist's types and codes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hixl_client import (
    BlocksCacheKey,
    Cache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    DataType,
    LLMClusterInfo,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
    Placement,
)
from hixl_client.keys import PLACEHOLDER_ID
from hixl_client.llm_datadist import normalize_options
from hixl_service.testing import DaemonProcess

from .conftest import Pair, cluster_info, daemon_status, options

pytestmark = pytest.mark.asyncio

INVALID = LLMStatusCode.LLM_PARAM_INVALID


@pytest.mark.parametrize("role,cluster_id,error", [
    ("PROMPT", 1, TypeError), (1, 1, TypeError), (LLMRole.PROMPT, -1, ValueError),
    (LLMRole.PROMPT, 2**64, ValueError), (LLMRole.PROMPT, "1", TypeError),
    (LLMRole.PROMPT, True, TypeError),
])
async def test_constructor_checks(role: Any, cluster_id: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        LLMDataDist(role, cluster_id)


async def test_uninitialized_instance() -> None:
    dd = LLMDataDist(LLMRole.DECODER, 3, daemon="unix:/nonexistent")
    assert dd.cluster_id == 3
    with pytest.raises(RuntimeError, match="llm datadist is not initialized"):
        _ = dd.cache_manager
    with pytest.raises(RuntimeError):
        await dd.link_clusters([LLMClusterInfo()])
    await dd.finalize()  # a no-op when not initialized


@pytest.mark.parametrize("opts,error,match", [
    ({"ge.flowGraphMemMaxSize": 1}, TypeError, "flowGraphMemMaxSize"),
    ({"ge.flowGraphMemMaxSize": "1,2"}, LLMException, "flowGraphMemMaxSize"),
    ({"ge.flowGraphMemMaxSize": "-1"}, LLMException, "flowGraphMemMaxSize"),
    ({"llm.LocalCommRes": "", "llm.EnableCacheManager": "0"}, LLMException, "EnableCacheManager"),
    ({"llm.TransferBackend": "hixl"}, LLMException, "EnableCacheManager"),
    ({"llm.TransferBackend": "hixl", "llm.EnableCacheManager": "1",
      "llm.EnableRemoteCacheAccessible": "0"}, LLMException, "EnableRemoteCacheAccessible"),
    ({"llm.TransferBackend": "hixl", "llm.EnableCacheManager": "1"}, LLMException,
     "listenIpInfo"),
    ({"llm.EnableCacheManager": "1", "llm.listenIpInfo": "1.2.3.4"}, LLMException, "ip:port"),
    ({"llm.EnableCacheManager": "1", "llm.listenIpInfo": "1.2.3.4:x"}, ValueError, "x"),
])
async def test_init_option_rules(opts: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        normalize_options(opts, LLMRole.PROMPT)


async def test_option_normalization() -> None:
    out = normalize_options({"llm.LocalCommRes": "", "llm.listenIpInfo": "10.0.0.1:26000"},
                            LLMRole.MIX)
    assert out["llm.Role"] == "Mix" and out["llm.EnableCacheManager"] == "1"
    assert out["llm.EnableRemoteCacheAccessible"] == "1"
    assert (out["llm.ListenIp"], out["llm.ListenPort"]) == ("10.0.0.1", "26000")


async def test_init_needs_cache_manager_mode_and_valid_pool(
        prefill_daemon: DaemonProcess, next_cluster_id: Callable[[], int]) -> None:
    dd = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill_daemon.client_target)
    with pytest.raises(ImportError):
        await dd.init({})
    with pytest.raises(TypeError):
        await dd.init([])  # type: ignore[arg-type]
    for bad in ('{"memory_size": 0}', '{"page_shift": 16}', '{"memory_size": 1, "page_shift": 9}',
                '{"memory_size": 1, "page_shift": 31}', "not json", '{"memory_size": -5}'):
        opts = options()
        opts["llm.MemPoolConfig"] = bad
        with pytest.raises(LLMException) as info:
            await dd.init(opts)
        assert info.value.status_code == INVALID, bad
    opts = options()
    opts["llm.SyncKvCacheWaitTime"] = "0"
    with pytest.raises(LLMException):
        await dd.init(opts)
    with pytest.raises(LLMException) as info:
        await dd.init(options(pool_bytes=64 * 2**30))  # beyond the daemon's budget
    assert info.value.status_code == LLMStatusCode.LLM_OUT_OF_MEMORY
    assert not dd.is_initialized


async def test_init_is_idempotent_and_finalize_expires_the_manager(
        prefill_daemon: DaemonProcess, next_cluster_id: Callable[[], int]) -> None:
    dd = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill_daemon.client_target)
    await dd.init(options(pool_bytes=2**20))
    manager = dd.cache_manager
    await dd.init({"ignored": "because already initialized"})
    assert dd.cache_manager is manager
    twin = LLMDataDist(LLMRole.PROMPT, dd.cluster_id, daemon=prefill_daemon.client_target)
    with pytest.raises(LLMException) as info:  # cluster ids are unique per daemon
        await twin.init(options(pool_bytes=2**20))
    assert info.value.status_code == INVALID
    await dd.finalize()
    await dd.finalize()
    with pytest.raises(LLMException) as info:
        await manager.allocate_cache(CacheDesc(1, [1], DataType.DT_UINT8))
    assert info.value.status_code == LLMStatusCode.LLM_ENGINE_FINALIZED
    await dd.init(options(pool_bytes=2**20))
    assert dd.cache_manager is not manager
    await dd.finalize()


@pytest.mark.parametrize("clusters,timeout,error", [
    ("not_list", 1000, TypeError), ([1], 1000, TypeError), ([], 0, LLMException),
    ([], -1, LLMException), ([], 2**31, ValueError), ([], "1", TypeError),
])
async def test_link_argument_checks(pair: Pair, clusters: Any, timeout: Any,
                                    error: type[Exception]) -> None:
    with pytest.raises(error):
        await pair.decoder.link_clusters(clusters, timeout)


async def test_link_cluster_info_checks(pair: Pair) -> None:
    no_local = LLMClusterInfo()
    no_local.remote_cluster_id = 1
    no_local.append_remote_ip_info("127.0.0.1", 1)
    with pytest.raises(LLMException, match="local_ip_info_list is empty"):
        await pair.decoder.link_clusters([no_local])
    no_id = LLMClusterInfo()
    no_id.append_local_ip_info("127.0.0.1", 0)
    with pytest.raises(TypeError):
        await pair.decoder.link_clusters([no_id])
    with pytest.raises(TypeError):
        await pair.decoder.unlink_clusters([], force="not_bool")  # type: ignore[arg-type]
    assert await pair.decoder.link_clusters([]) == (INVALID, [])


async def test_allocate_checks(pair: Pair) -> None:
    cm = pair.prompt.cache_manager
    with pytest.raises(TypeError):
        await cm.allocate_cache("desc")  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        await cm.allocate_cache(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await cm.allocate_cache(CacheDesc(1, [1], DataType.DT_UINT8), [1])  # type: ignore[list-item]
    with pytest.raises(LLMException) as info:
        await cm.allocate_cache(CacheDesc(0, [1], DataType.DT_UINT8))
    assert info.value.status_code == INVALID
    with pytest.raises(LLMException, match="memory pool"):  # no host_mem_pool_cfg was given
        await cm.allocate_cache(CacheDesc(1, [1], DataType.DT_UINT8, Placement.HOST))
    with pytest.raises(LLMException, match="Failed to calc tensor size"):
        await cm.allocate_cache(CacheDesc(1, [0, 4], DataType.DT_UINT8))
    with pytest.raises(LLMException) as info:  # rank above 32
        await cm.allocate_cache(CacheDesc(1, [1] * 33, DataType.DT_UINT8))
    assert info.value.status_code == INVALID


async def test_pull_cache_checks(pair: Pair) -> None:
    cm = pair.decoder.cache_manager
    dst = await cm.allocate_cache(CacheDesc(2, [2, 8], DataType.DT_UINT8))
    key = CacheKey(pair.prompt.cluster_id, 1)
    cases: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"cache_key": BlocksCacheKey(1)}, TypeError),
        ({"cache_key": None}, TypeError),
        ({"cache": "cache"}, TypeError),
        ({"batch_index": -1}, ValueError),
        ({"batch_index": 1.0}, TypeError),
        ({"size": 0}, LLMException),
        ({"size": -2}, LLMException),
        ({"size": 2**63}, ValueError),
        ({"tensor_num_per_layer": 0}, LLMException),
        ({"tensor_num_per_layer": -1}, ValueError),
        ({"tensor_num_per_layer": "2"}, TypeError),
        ({"src_layer_range": [0]}, TypeError),
        ({"src_layer_range": range(0, 4, 2)}, LLMException),
        ({"cache_key": CacheKey(1, PLACEHOLDER_ID)}, LLMException),
        ({"cache_key": CacheKey(1, 5, prefix_id=6)}, LLMException),
        ({"unknown": 1}, TypeError),
    ]
    for change, error in cases:
        args: dict[str, Any] = {"cache_key": key, "cache": dst, **change}
        with pytest.raises(error):
            await cm.pull_cache(**args)
    blocks = Cache(7, CacheDesc(1, [4, 8], DataType.DT_UINT8), [1], is_blocks_cache=True)
    with pytest.raises(LLMException) as info:
        await cm.pull_cache(CacheKeyByIdAndIndex(pair.prompt.cluster_id, 1), blocks)
    assert info.value.status_code == INVALID
    with pytest.raises(LLMException) as info:
        await cm.deallocate_cache(blocks)
    assert info.value.status_code == INVALID
    with pytest.raises(TypeError):
        await cm.remove_cache_key(CacheKeyByIdAndIndex(1, 1))  # type: ignore[arg-type]
    await cm.deallocate_cache(dst)
    assert repr(dst).startswith("Cache(cache_id = ") and dst.tensor_addrs == []
    with pytest.raises(LLMException):
        dst.tensor_view(0)


async def test_cache_handle(pair: Pair) -> None:
    desc = CacheDesc(3, [2, 16], DataType.DT_FLOAT)
    cache = await pair.prompt.cache_manager.allocate_cache(desc)
    assert cache.cache_id >= 1 and len(cache.tensor_addrs) == 3 and not cache.is_blocks_cache
    assert repr(cache) == f"Cache(cache_id = {cache.cache_id}, device_tensor_addrs = 3, " \
                          "is_blocks_cache = False)"
    array = cache.numpy(2)
    assert array.shape == (2, 16) and array.dtype.name == "float32"
    assert array.ctypes.data == cache.tensor_addrs[2]  # the address is real in this process
    with pytest.raises(IndexError):
        cache.tensor_view(3)
    cpu = Cache.create_cpu_cache(CacheDesc(1, [4], DataType.DT_UINT8, Placement.HOST), [1234])
    assert cpu.cache_id == -1 and cpu.is_blocks_cache
    await pair.prompt.cache_manager.deallocate_cache(cache)


async def test_switch_role_and_communicator_calls(pair: Pair) -> None:
    decoder = pair.decoder
    with pytest.raises(LLMException) as info:  # linked: unlink first
        await decoder.switch_role(LLMRole.PROMPT)
    assert info.value.status_code == LLMStatusCode.LLM_EXIST_LINK
    with pytest.raises(LLMException) as info:  # the prompt side has an inbound link
        await pair.prompt.switch_role(LLMRole.DECODER)
    assert info.value.status_code == LLMStatusCode.LLM_EXIST_LINK
    with pytest.raises(TypeError):
        await decoder.switch_role("PROMPT")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await decoder.switch_role(LLMRole.PROMPT, "opts")  # type: ignore[arg-type]
    with pytest.raises(LLMException):
        await decoder.switch_role(LLMRole.PROMPT, {"llm.listenIpInfo": "1.2.3.4"})
    info_ = cluster_info(pair.prompt.cluster_id, pair.prompt_daemon.peer_address)
    assert (await decoder.unlink_clusters([info_]))[0] == LLMStatusCode.LLM_SUCCESS
    await decoder.switch_role(LLMRole.MIX)
    assert decoder.role == LLMRole.MIX and LLMDataDist._role_to_str(LLMRole.MIX) == "Mix"
    status = await daemon_status(pair.decoder_daemon.client_target)
    assert [c.role for c in status.clusters if c.cluster_id == decoder.cluster_id] == ["MIX"]
    await decoder.switch_role(LLMRole.MIX)  # the same role again is allowed
    assert (await decoder.link_clusters([info_]))[0] == LLMStatusCode.LLM_SUCCESS
    bad_links: list[tuple[tuple[Any, ...], type[Exception]]] = [
        ((None, {1: 0, 2: 1}, ""), TypeError),
        (("", {1: 0, 2: 1}, ""), LLMException),
        (("x" * 128, {1: 0, 2: 1}, ""), LLMException),
        (("c", "not dict", ""), TypeError),
        (("c", {1: "0"}, ""), TypeError),
        (("c", {i: i for i in range(5)}, ""), LLMException),
        (("c", {1: 0}, ""), LLMException),
        (("c", {3: 1, 2: 0}, ""), LLMException),
        (("c", {1: 0, 2: 1}, 5), TypeError),
    ]
    for args, error in bad_links:
        with pytest.raises(error):
            await decoder.link(*args)
    with pytest.raises(LLMException) as info:
        await decoder.link("comm", {1: 0, 2: 1}, "{}")
    assert info.value.status_code == LLMStatusCode.LLM_FEATURE_NOT_ENABLED
    for call in (decoder.unlink, decoder.query_register_mem_status):
        with pytest.raises(TypeError):
            await call("1")  # type: ignore[arg-type]
        with pytest.raises(LLMException) as info:
            await call(1)
        assert info.value.status_code == LLMStatusCode.LLM_FEATURE_NOT_ENABLED
    with pytest.raises(LLMException):
        _ = decoder.kv_cache_manager
    with pytest.raises(LLMException):
        await decoder.check_link_status(1)


async def test_remap_registered_memory(pair: Pair) -> None:
    from hixl_client import MemInfo, Memtype
    cm = pair.prompt.cache_manager
    for bad in ("some val", [MemInfo(Memtype.MEM_TYPE_HOST, 1, 1)],
                [MemInfo(Memtype.MEM_TYPE_DEVICE, 0, 1)], [MemInfo(Memtype.MEM_TYPE_DEVICE, 1, 0)]):
        with pytest.raises(LLMException) as info:
            await cm.remap_registered_memory(bad)  # type: ignore[arg-type]
        assert info.value.status_code == INVALID
    with pytest.raises(LLMException) as info:
        await cm.remap_registered_memory(MemInfo(Memtype.MEM_TYPE_DEVICE, 1234, 1))
    assert info.value.status_code == LLMStatusCode.LLM_FEATURE_NOT_ENABLED
