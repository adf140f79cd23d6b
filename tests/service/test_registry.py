"""LLM-DataDist's key and reference rules, on the registry alone."""

from __future__ import annotations

import pytest

from hixl_client.keys import PLACEHOLDER_ID
from hixl_client.status import LLMException, LLMStatusCode
from hixl_service.registry import CacheEntry, CacheRegistry, KeySpec


def make_entry(
    registry: CacheRegistry,
    batch_size: int = 4,
    num_tensors: int = 2,
    blocks_model_id: int | None = None,
    blocks: bool = False,
) -> CacheEntry:
    cache_id = registry.reserve_id()
    return CacheEntry(
        cache_id=cache_id,
        blocks=blocks,
        num_tensors=num_tensors,
        tensor_size=64 * batch_size,
        batch_size=batch_size,
        memory=None,
        extent_offset=0,
        extent_size=4096,
        tensor_offsets=[0, 1024][:num_tensors],
        region_id=cache_id,
        blocks_model_id=blocks_model_id,
    )


def add(registry: CacheRegistry, keys: list[KeySpec], **kwargs: int) -> CacheEntry:
    entry = make_entry(registry, **kwargs)
    registry.check_keys(keys, entry.batch_size)
    registry.add(entry, keys)
    return entry


def test_ids_start_at_one_and_increase() -> None:
    registry = CacheRegistry()
    assert [registry.reserve_id() for _ in range(3)] == [1, 2, 3]


def test_key_binds_its_batch_slot_and_placeholder_is_not_indexed() -> None:
    registry = CacheRegistry()
    placeholder = KeySpec(PLACEHOLDER_ID, 0)
    entry = add(registry, [placeholder, KeySpec(7, 0)])
    binding = registry.lookup_key(KeySpec(7, 0))
    assert binding.cache is entry and binding.batch_index == 1
    with pytest.raises(LLMException) as info:
        registry.lookup_key(placeholder)
    assert info.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    assert registry.key_count == 1


@pytest.mark.parametrize(
    "keys",
    [
        [KeySpec(1, 0), KeySpec(1, 0)],
        [KeySpec(PLACEHOLDER_ID, 3), KeySpec(PLACEHOLDER_ID, 3)],
        [KeySpec(i, 0) for i in range(5)],
    ],
)
def test_allocation_key_rules(keys: list[KeySpec]) -> None:
    registry = CacheRegistry()
    with pytest.raises(LLMException) as info:
        registry.check_keys(keys, batch_size=4)
    assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID


def test_key_bound_to_a_live_cache_is_rejected() -> None:
    registry = CacheRegistry()
    add(registry, [KeySpec(1, 0)])
    with pytest.raises(LLMException, match="already bound"):
        registry.check_keys([KeySpec(1, 0)], batch_size=4)
    registry.check_keys([KeySpec(1, 1)], batch_size=4)  # other model id is another key


def test_placeholder_conflicts_with_blocks_cache_of_same_model() -> None:
    registry = CacheRegistry()
    entry = make_entry(registry, blocks=True, blocks_model_id=5)
    registry.add(entry, [])
    with pytest.raises(LLMException):
        registry.check_keys([KeySpec(PLACEHOLDER_ID, 5)], batch_size=4)
    with pytest.raises(LLMException):
        registry.check_blocks_key(5)


def test_deallocate_with_keys_delays_free_until_last_key() -> None:
    registry = CacheRegistry()
    entry = add(registry, [KeySpec(1, 0), KeySpec(2, 0)])
    assert registry.release(entry.cache_id, blocks=False) is None
    with pytest.raises(LLMException):
        registry.get(entry.cache_id)  # no longer addressable by id
    assert registry.remove_key(KeySpec(1, 0)) is None
    assert registry.remove_key(KeySpec(2, 0)) is entry
    assert len(registry) == 0


def test_deallocate_without_keys_frees_and_unknown_ids_are_noops() -> None:
    registry = CacheRegistry()
    entry = add(registry, [])
    assert registry.release(entry.cache_id, blocks=False) is entry
    assert registry.release(entry.cache_id, blocks=False) is None
    assert registry.release(999, blocks=False) is None
    assert registry.remove_key(KeySpec(42, 0)) is None


def test_pull_by_key_drops_key_only_after_every_tensor() -> None:
    registry = CacheRegistry()
    entry = add(registry, [KeySpec(1, 0)], num_tensors=2)
    registry.release(entry.cache_id, blocks=False)
    assert registry.record_pull(KeySpec(1, 0), [0]) is None
    registry.lookup_key(KeySpec(1, 0))  # still bound: tensor 1 not pulled yet
    assert registry.record_pull(KeySpec(1, 0), [1]) is entry
    with pytest.raises(LLMException) as info:
        registry.lookup_key(KeySpec(1, 0))
    assert info.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST


def test_whole_pull_drops_key_but_prefix_keys_survive_pulls() -> None:
    registry = CacheRegistry()
    prefix = KeySpec(PLACEHOLDER_ID, 0, prefix_id=9)
    add(registry, [KeySpec(1, 0), prefix])
    registry.record_pull(KeySpec(1, 0), [])
    assert registry.record_pull(prefix, []) is None
    assert registry.lookup_key(prefix).batch_index == 1
    with pytest.raises(LLMException):
        registry.lookup_key(KeySpec(1, 0))


def test_kind_mismatch_on_release_is_rejected() -> None:
    registry = CacheRegistry()
    entry = add(registry, [])
    with pytest.raises(LLMException):
        registry.release(entry.cache_id, blocks=True)


def test_drain_returns_everything() -> None:
    registry = CacheRegistry()
    first = add(registry, [KeySpec(1, 0)])
    second = add(registry, [])
    assert {e.cache_id for e in registry.drain()} == {first.cache_id, second.cache_id}
    assert len(registry) == 0 and registry.key_count == 0
