"""KvCache: LLM-DataDist's legacy v1 cache type, exported for ported code."""

from __future__ import annotations

import pytest

import hixl_client
import hixl_client.sync
from hixl_client import CacheDesc, DataType, KvCache, LLMException, LLMStatusCode, Placement


def _host_desc(num_tensors: int = 2) -> CacheDesc:
    return CacheDesc(num_tensors, [4, 16], DataType.DT_FLOAT16, Placement.HOST)


def test_both_clients_export_it() -> None:
    assert hixl_client.sync.KvCache is KvCache
    assert "KvCache" in hixl_client.__all__ and "KvCache" in hixl_client.sync.__all__


def test_flat_addresses_are_one_device() -> None:
    cache = KvCache.create_cpu_cache(_host_desc(), [0x1000, 0x2000])
    assert cache.cache_id == -1
    assert cache.per_device_tensor_addrs == [[0x1000, 0x2000]]
    assert cache.tensor_addrs == [0x1000, 0x2000]
    assert cache.cache_desc.num_tensors == 2


def test_nested_addresses_are_one_list_per_device() -> None:
    cache = KvCache.create_cpu_cache(_host_desc(), [[1, 2], [3, 4]])
    assert cache.per_device_tensor_addrs == [[1, 2], [3, 4]]
    assert cache.tensor_addrs == [1, 2]


def test_mixed_addresses_are_refused() -> None:
    with pytest.raises(LLMException, match="should be consistent") as raised:
        KvCache.create_cpu_cache(_host_desc(), [1, [2, 3]])  # type: ignore[list-item]
    assert raised.value.status_code == LLMStatusCode.LLM_PARAM_INVALID


def test_each_device_needs_one_address_per_tensor() -> None:
    with pytest.raises(LLMException, match="num_tensors"):
        KvCache.create_cpu_cache(_host_desc(), [[1, 2], [3]])


def test_device_placement_is_refused() -> None:
    with pytest.raises(LLMException, match="HOST"):
        KvCache.create_cpu_cache(CacheDesc(1, [4], DataType.DT_INT8), [1])


def test_constructor_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="cache_id"):
        KvCache("1", _host_desc(), [[1, 2]])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cache_id"):
        KvCache(2**63, _host_desc(), [[1, 2]])
    with pytest.raises(TypeError, match="per_device_tensor_addrs"):
        KvCache(1, _host_desc(), [1, 2])  # type: ignore[list-item]
