"""KV between blocks of different sizes as runs (``hixl_client.vllm._kv_map``),
in vLLM's CPU layout, with real arrays: first as plain copies of the runs, then
pulled between two real daemons through the run views, registered over the
same memory as the block views (as HixlConnector registers them).

``tests.kv_cpu_layout.cpu_layout`` writes tokens the way vLLM's CPU attention
kernels do (K transposed, then V, per (block, head));
tests/vllm/test_vllm_connector.py checks it against vLLM's own kernel.
"""

from __future__ import annotations

import numpy as np
import pytest

from hixl_client import BlocksCacheKey, CacheDesc, DataType
from hixl_client.vllm._kv_map import (
    RUN_TOKENS,
    KvShape,
    blocks_needed,
    head_sources,
    run_ids,
)
from tests.kv_cpu_layout import cpu_layout

from .conftest import Pair

HEADS, HEAD_SIZE = 2, 32
RNG = np.random.default_rng(33)


def tokens(count: int) -> tuple[np.ndarray, np.ndarray]:
    return (RNG.integers(1, 2**16, (count, HEADS, HEAD_SIZE), dtype=np.uint16),
            RNG.integers(1, 2**16, (count, HEADS, HEAD_SIZE), dtype=np.uint16))


def copy_runs(src: np.ndarray, dst: np.ndarray, src_ids: list[int], dst_ids: list[int]) -> None:
    src_runs = src.reshape(-1, RUN_TOKENS)
    dst_runs = dst.reshape(-1, RUN_TOKENS)
    dst_runs[dst_ids] = src_runs[src_ids]


@pytest.mark.parametrize("sizes", [(32, 64), (64, 32), (32, 128), (128, 64)],
                         ids=lambda s: f"{s[0]}-to-{s[1]}")
@pytest.mark.parametrize("first_token", [0, 128], ids=["whole-prompt", "prefix-cached"])
def test_runs_carry_every_token_into_blocks_of_another_size(
        sizes: tuple[int, int], first_token: int) -> None:
    src_shape, dst_shape = (KvShape(bs, HEADS, HEAD_SIZE, 2) for bs in sizes)
    num_tokens = 301  # a partial last block and a partial last run
    keys, values = tokens(num_tokens)
    src_table = [int(b) for b in RNG.permutation(24)[:blocks_needed(src_shape, 0, num_tokens)]]
    dst_table = [int(b) for b in RNG.permutation(24)[
        :blocks_needed(dst_shape, first_token, num_tokens)]]
    src = cpu_layout(src_shape, 24, keys, values, src_table)
    expected = cpu_layout(dst_shape, 24, keys[first_token:], values[first_token:], dst_table,
                          first_token)
    dst = np.zeros_like(expected)
    src_ids, dst_ids = run_ids(src_shape, dst_shape, src_table, dst_table, first_token,
                               num_tokens)
    assert len(src_ids) == len(dst_ids) == len(set(dst_ids))
    copy_runs(src, dst, src_ids, dst_ids)
    # Runs move whole: the tail of the last one carries what the source block
    # held past the prompt (zeros here), where the destination keeps nothing yet.
    np.testing.assert_array_equal(dst, expected)


def test_shapes_that_cannot_trade_runs_are_refused() -> None:
    small, large = KvShape(32, HEADS, HEAD_SIZE, 2), KvShape(64, HEADS, HEAD_SIZE, 2)
    with pytest.raises(ValueError, match="head size"):
        run_ids(small, KvShape(64, HEADS, 64, 2), [0], [0], 0, 32)
    with pytest.raises(ValueError, match="name them"):
        run_ids(small, KvShape(64, 1, HEAD_SIZE, 2), [0], [0], 0, 32)
    with pytest.raises(ValueError, match="not heads of"):
        run_ids(small, large, [0], [0], 0, 32, heads=[(0, 2)])
    with pytest.raises(ValueError, match="multiple of 32"):
        run_ids(KvShape(16, HEADS, HEAD_SIZE, 2), large, [0], [0], 0, 16)
    with pytest.raises(ValueError, match="do not start a block"):
        run_ids(small, large, [0, 1], [0], 32, 64)
    with pytest.raises(ValueError, match="cannot hold"):
        run_ids(small, large, [0], [0], 0, 64)
    with pytest.raises(ValueError, match="not a KV shape"):
        KvShape.from_list([32, 2, "32", 2])


@pytest.mark.parametrize("ranks", [(2, 1), (1, 2), (2, 2)], ids=lambda r: f"tp{r[0]}-to-tp{r[1]}")
@pytest.mark.parametrize("sizes", [(32, 32), (32, 64), (64, 32)],
                         ids=lambda s: f"{s[0]}-to-{s[1]}")
def test_each_rank_gets_its_heads_from_the_ranks_of_another_split_that_hold_them(
        ranks: tuple[int, int], sizes: tuple[int, int]) -> None:
    """A model of HEADS KV heads, split over ``ranks`` workers on each side (vLLM
    gives each rank consecutive heads): every destination rank's KV, moved run
    by run from the source ranks head_sources names, is what that rank would
    have computed itself."""
    src_ranks, dst_ranks = ranks
    num_tokens, num_blocks = 230, 16
    keys, values = tokens(num_tokens)

    def rank_shape(block_size: int, rank_count: int) -> KvShape:
        return KvShape(block_size, HEADS // rank_count, HEAD_SIZE, 2)

    def heads_of(array: np.ndarray, shape: KvShape, rank: int) -> np.ndarray:
        return array[:, rank * shape.num_kv_heads:(rank + 1) * shape.num_kv_heads]

    src_shape, dst_shape = rank_shape(sizes[0], src_ranks), rank_shape(sizes[1], dst_ranks)
    src_table = [int(b) for b in RNG.permutation(num_blocks)[
        :blocks_needed(src_shape, 0, num_tokens)]]
    dst_table = [int(b) for b in RNG.permutation(num_blocks)[
        :blocks_needed(dst_shape, 0, num_tokens)]]
    sources = [cpu_layout(src_shape, num_blocks, heads_of(keys, src_shape, rank),
                          heads_of(values, src_shape, rank), src_table)
               for rank in range(src_ranks)]
    for rank in range(dst_ranks):
        expected = cpu_layout(dst_shape, num_blocks, heads_of(keys, dst_shape, rank),
                              heads_of(values, dst_shape, rank), dst_table)
        dst = np.zeros_like(expected)
        held = head_sources(src_shape.num_kv_heads, src_ranks, dst_shape.num_kv_heads, rank)
        assert sorted(ours for pairs in held.values() for _, ours in pairs) == list(
            range(dst_shape.num_kv_heads))
        for src_rank, pairs in held.items():
            src_ids, dst_ids = run_ids(src_shape, dst_shape, src_table, dst_table, 0,
                                       num_tokens, heads=pairs)
            copy_runs(sources[src_rank], dst, src_ids, dst_ids)
        np.testing.assert_array_equal(dst, expected)


def test_splits_that_replicate_heads_are_refused() -> None:
    # One KV head on two ranks: vLLM gives each rank a copy of it.
    with pytest.raises(ValueError, match="replicated"):
        head_sources(1, 1, 1, 1)
    assert head_sources(1, 2, 2, 0) == {0: [(0, 0)], 1: [(0, 1)]}
    assert head_sources(2, 1, 1, 1) == {0: [(1, 0)]}


@pytest.mark.asyncio
@pytest.mark.parametrize("sizes", [(32, 64), (64, 32)], ids=lambda s: f"{s[0]}-to-{s[1]}")
async def test_a_pull_through_the_run_views_fills_blocks_of_another_size(
        accessible: Pair, sizes: tuple[int, int]) -> None:
    """Each side registers its layers as blocks and, over the same memory, as
    runs; the decoder pulls a prompt's runs between two daemons over TCP."""
    prompt, decoder = accessible.prompt, accessible.decoder
    layers, num_blocks, num_tokens = 2, 24, 333
    src_shape, dst_shape = (KvShape(bs, HEADS, HEAD_SIZE, 2) for bs in sizes)
    src_table = [int(b) for b in RNG.permutation(num_blocks)[
        :blocks_needed(src_shape, 0, num_tokens)]]
    dst_table = [int(b) for b in RNG.permutation(num_blocks)[
        :blocks_needed(dst_shape, 0, num_tokens)]]
    layer_tokens = [tokens(num_tokens) for _ in range(layers)]
    src = np.stack([cpu_layout(src_shape, num_blocks, k, v, src_table) for k, v in layer_tokens])
    expected = np.stack([cpu_layout(dst_shape, num_blocks, k, v, dst_table)
                         for k, v in layer_tokens])
    dst = np.zeros_like(expected)

    def views(shape: KvShape, array: np.ndarray) -> tuple[CacheDesc, CacheDesc, list[int]]:
        addresses = [array.ctypes.data + layer * array[0].nbytes for layer in range(layers)]
        runs = shape.block_bytes // shape.run_bytes * num_blocks
        return (CacheDesc(layers, [num_blocks, shape.block_bytes], DataType.DT_UINT8),
                CacheDesc(layers, [runs, shape.run_bytes], DataType.DT_UINT8), addresses)

    src_blocks_desc, src_runs_desc, src_addresses = views(src_shape, src)
    dst_blocks_desc, dst_runs_desc, dst_addresses = views(dst_shape, dst)
    caches = [
        (prompt, await prompt.cache_manager.register_blocks_cache(
            src_blocks_desc, src_addresses, BlocksCacheKey(prompt.cluster_id, 0),
            remote_accessible=True)),
        (prompt, await prompt.cache_manager.register_blocks_cache(
            src_runs_desc, src_addresses, BlocksCacheKey(prompt.cluster_id, 1),
            remote_accessible=True)),
        (decoder, await decoder.cache_manager.register_blocks_cache(
            dst_blocks_desc, dst_addresses)),
    ]
    dst_runs = await decoder.cache_manager.register_blocks_cache(dst_runs_desc, dst_addresses)
    caches.append((decoder, dst_runs))
    src_ids, dst_ids = run_ids(src_shape, dst_shape, src_table, dst_table, 0, num_tokens)
    await decoder.cache_manager.pull_blocks(BlocksCacheKey(prompt.cluster_id, 1), dst_runs,
                                            src_ids, dst_ids)
    np.testing.assert_array_equal(dst, expected)
    for side, cache in reversed(caches):
        await side.cache_manager.unregister_cache(cache.cache_id)
