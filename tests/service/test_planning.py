"""Byte-range planning of pulls, with LLM-DataDist's native checks."""

from __future__ import annotations

import numpy as np
import pytest

from hixl_client.status import LLMException, LLMStatusCode
from hixl_service.planning import (
    SMALL_BLOCKS,
    Layout,
    as_ranges,
    block_list,
    merge_ranges,
    plan_blocks,
    plan_cache_pull,
    plan_slot_to_blocks,
    tensor_pairs,
    total_bytes,
)
from hixl_wire._proto.hixl.v1 import client_pb2


def layout(num_tensors: int, tensor_size: int, batch_size: int, base: int = 0) -> Layout:
    return Layout([base + i * tensor_size for i in range(num_tensors)], tensor_size, batch_size)


def test_block_lists_come_from_the_request_as_uint64_arrays() -> None:
    long = [*range(SMALL_BLOCKS), 2**64 - 1]
    request = client_pb2.PullCacheRequest(dst_blocks=long)
    blocks = block_list(request.dst_blocks)
    assert blocks.dtype == np.uint64 and blocks.tolist() == long
    blocks[0] = 7  # a copy: the request is untouched
    assert list(request.dst_blocks) == long
    empty = block_list(request.src_blocks)
    assert empty.dtype == np.uint64 and len(empty) == 0
    assert not empty.flags.writeable  # shared by every empty list


def test_short_block_lists_stay_in_the_request_and_plan_alike() -> None:
    request = client_pb2.PullCacheRequest(src_blocks=[3, 0, 2**20 - 1],
                                          dst_blocks=[1, 2, 0])
    src_blocks, dst_blocks = block_list(request.src_blocks), block_list(request.dst_blocks)
    assert list(src_blocks) == [3, 0, 2**20 - 1]  # the field itself: no copy made
    src, dst = layout(2, 4096 << 20, 1 << 20), layout(2, 4096 << 20, 1 << 20, base=1 << 40)
    pairs = tensor_pairs(src, dst, [], [], 2)
    planned = plan_blocks(src, dst, pairs, src_blocks, dst_blocks)
    assert planned.tolist() == plan_blocks(src, dst, pairs, np.array([3, 0, 2**20 - 1],
                                                                     dtype=np.uint64),
                                           np.array([1, 2, 0], dtype=np.uint64)).tolist()
    assert total_bytes(planned) == 2 * 3 * 4096
    assert total_bytes(planned.tolist()) == 2 * 3 * 4096  # not a native array: numpy sums
    with pytest.raises(LLMException) as err:  # out of range, read from the field
        plan_blocks(src, dst, pairs, block_list(client_pb2.PullCacheRequest(
            src_blocks=[2**20]).src_blocks), block_list(request.dst_blocks)[:1])
    assert err.value.status_code == LLMStatusCode.LLM_PARAM_INVALID


def test_whole_cache_pull_merges_into_one_range() -> None:
    src, dst = layout(4, 1024, 1), layout(4, 1024, 1, base=1 << 20)
    pairs = tensor_pairs(src, dst, [], [], 2)
    ranges, length = plan_cache_pull(src, 0, dst, 0, -1, pairs)
    assert ranges.tolist() == [[0, 1 << 20, 4096]] and length == 1024


def test_batch_slots_and_size_select_part_of_each_tensor() -> None:
    src, dst = layout(2, 1024, 4), layout(2, 2048, 8)
    pairs = tensor_pairs(src, dst, [], [], 2)
    ranges, length = plan_cache_pull(src, 1, dst, 3, 100, pairs)
    assert length == 100
    assert ranges.tolist() == [[256, 3 * 256, 100], [1024 + 256, 2048 + 3 * 256, 100]]


def test_layer_indices_pair_source_and_destination_tensors() -> None:
    src, dst = layout(8, 64, 1), layout(4, 64, 1, base=4096)
    pairs = tensor_pairs(src, dst, [4, 5, 6, 7], [0, 1, 2, 3], 2)
    assert [tuple(pair) for pair in pairs] == [(4, 0), (5, 1), (6, 2), (7, 3)]
    ranges, _ = plan_cache_pull(src, 0, dst, 0, -1, pairs)
    assert ranges.tolist() == [[4 * 64, 4096, 256]]


@pytest.mark.parametrize(
    "src_idx,dst_idx,per_layer",
    [
        ([0, 1], [0, 1], 2),  # one tensor per cache cannot hold a 2-tensor layer (spec example)
        ([0, 2], [], 1),  # not contiguous
        ([], [0, 1, 2], 1),  # count mismatch against the one source tensor
    ],
)
def test_invalid_tensor_selections(src_idx: list[int], dst_idx: list[int], per_layer: int) -> None:
    one = layout(1, 64, 1)
    with pytest.raises(LLMException) as info:
        tensor_pairs(one, one, src_idx, dst_idx, per_layer)
    assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID


@pytest.mark.parametrize("src_batch,dst_batch,size", [(0, 4, -1), (4, 0, -1), (0, 0, 257)])
def test_invalid_slots_and_sizes(src_batch: int, dst_batch: int, size: int) -> None:
    cache = layout(2, 1024, 4)
    with pytest.raises(LLMException) as info:
        plan_cache_pull(cache, src_batch, cache, dst_batch, size, [(0, 0), (1, 1)])
    assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID


def test_merge_keeps_gaps_apart() -> None:
    merged = merge_ranges(as_ranges([(0, 0, 4), (4, 4, 4), (16, 8, 4), (20, 12, 0)]))
    assert merged.tolist() == [[0, 0, 8], [16, 8, 4]]


def test_block_pairs_merge_where_both_sides_advance_by_one() -> None:
    one = layout(1, 32 * 8, 32)
    ranges = plan_blocks(one, one, [(0, 0)], [0, 1, 2, 10, 20, 21, 5], [5, 6, 7, 0, 30, 31, 1])
    assert (ranges // 8).tolist() == [[0, 5, 3], [10, 0, 1], [20, 30, 2], [5, 1, 1]]


def _naive_block_plan(src_bases: list[int], dst_bases: list[int], src_blocks: list[int],
                      dst_blocks: list[int], block: int) -> list[list[int]]:
    pieces = [(s + sb * block, d + db * block, block) for s, d in zip(src_bases, dst_bases,
                                                                       strict=True)
              for sb, db in zip(src_blocks, dst_blocks, strict=True)]
    return merge_ranges(as_ranges(pieces)).tolist()


@pytest.mark.parametrize("seed", range(6))
def test_the_native_block_planner_agrees_with_a_plain_reference(seed: int) -> None:
    """Random tensor layouts (some tensors adjacent) and block tables (some runs)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    blocks, block, tensors = 16, 64, int(rng.integers(1, 6))
    tensor_size = blocks * block
    src_offsets = np.cumsum(rng.choice([tensor_size, tensor_size + 64], tensors)).tolist()
    dst_offsets = np.cumsum(rng.choice([tensor_size, 2 * tensor_size], tensors)).tolist()
    src, dst = Layout(src_offsets, tensor_size, blocks), Layout(dst_offsets, tensor_size, blocks)
    count = int(rng.integers(1, blocks + 1))
    start = int(rng.integers(0, blocks - count + 1))
    src_blocks = rng.permutation(blocks)[:count].tolist() if seed % 2 else \
        list(range(start, start + count))
    dst_blocks = rng.permutation(blocks)[:count].tolist()
    pairs = tensor_pairs(src, dst, [], [], 1)
    expected = _naive_block_plan(src_offsets, dst_offsets, src_blocks, dst_blocks, block)
    for form in (pairs, np.asarray(pairs), list(pairs)):
        assert plan_blocks(src, dst, form, src_blocks, dst_blocks).tolist() == expected
        assert plan_blocks(src, dst, form, np.array(src_blocks, dtype=np.uint64),
                           np.array(dst_blocks, dtype=np.int64)).tolist() == expected


def test_block_indices_out_of_range_name_the_list() -> None:
    cache = layout(1, 4 * 64, 4)
    for src_blocks, dst_blocks, name in (([4], [0], "src_blocks"), ([0], [9], "dst_blocks")):
        with pytest.raises(LLMException) as info:
            plan_blocks(cache, cache, [(0, 0)], src_blocks, dst_blocks)
        assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
        assert name in str(info.value) and "out of range [0, 4)" in str(info.value)
    with pytest.raises(LLMException, match="src_blocks must not be empty"):
        plan_blocks(cache, cache, [(0, 0)], [], [])


def test_plan_blocks_spreads_runs_over_tensors_and_merges_them() -> None:
    src, dst = layout(2, 8 * 64, 8), layout(2, 8 * 64, 8, base=1 << 16)
    ranges = plan_blocks(src, dst, [(0, 0), (1, 1)], [0, 1, 6], [2, 3, 0])
    assert ranges.tolist() == [[0, (1 << 16) + 128, 128], [384, 1 << 16, 64],
                               [512, (1 << 16) + 512 + 128, 128], [512 + 384, (1 << 16) + 512, 64]]
    whole = plan_blocks(src, dst, [(0, 0), (1, 1)], list(range(8)), list(range(8)))
    assert whole.tolist() == [[0, 1 << 16, 1024]]  # both tensors are contiguous too


def test_plan_slot_to_blocks() -> None:
    src, dst = layout(1, 4 * 256, 1), layout(1, 8 * 128, 8, base=4096)
    ranges = plan_slot_to_blocks(src, 0, dst, [(0, 0)], [3, 4, 0])
    assert ranges.tolist() == [[0, 4096 + 3 * 128, 256], [256, 4096, 128]]
    with pytest.raises(LLMException):
        plan_slot_to_blocks(src, 0, dst, [(0, 0)], [*range(8), 0])  # beyond the slot


@pytest.mark.parametrize("count", [1, 3, 8, 9, 64])
def test_every_form_of_pairs_plans_the_same_ranges(count: int) -> None:
    """A TensorRun (native loop or tuples), an index array and a list of tuples agree."""
    import numpy as np

    rng = np.random.default_rng(count)
    # tensors of 4 slots of 64 bytes; some neighbours adjacent, some not
    src_offsets = np.cumsum(rng.choice([256, 256, 512], count + 4)).tolist()
    dst_offsets = np.cumsum(rng.choice([256, 768], count + 4)).tolist()
    src, dst = Layout(src_offsets, 256, 4), Layout(dst_offsets, 256, 4)
    src_idx, dst_idx = list(range(2, 2 + count)), list(range(1, 1 + count))
    run = tensor_pairs(src, dst, src_idx, dst_idx, 1)
    assert len(run) == count and [tuple(p) for p in run] == list(zip(src_idx, dst_idx, strict=True))
    assert np.asarray(run).tolist() == [list(p) for p in zip(src_idx, dst_idx, strict=True)]
    expected, _ = plan_cache_pull(src, 2, dst, 1, 48, list(zip(src_idx, dst_idx, strict=True)))
    for pairs in (run, np.asarray(run)):
        ranges, length = plan_cache_pull(src, 2, dst, 1, 48, pairs)
        assert length == 48 and ranges.tolist() == expected.tolist()
    naive = merge_ranges(as_ranges([(src_offsets[s] + 128, dst_offsets[d] + 64, 48)
                                    for s, d in zip(src_idx, dst_idx, strict=True)]))
    assert expected.tolist() == naive.tolist()


def test_pairs_of_all_tensors_and_mismatched_counts() -> None:
    src, dst = layout(12, 64, 1), layout(12, 64, 1, base=4096)
    run = tensor_pairs(src, dst, [], [], 2)
    assert (run.src_first, run.dst_first, run.count) == (0, 0, 12)
    ranges, _ = plan_cache_pull(src, 0, dst, 0, -1, run)
    assert ranges.tolist() == [[0, 4096, 12 * 64]]
    with pytest.raises(LLMException, match="do not match"):
        tensor_pairs(src, layout(10, 64, 1), [], [], 2)
    with pytest.raises(LLMException, match="contiguous"):
        tensor_pairs(src, dst, [*range(9), 10], list(range(10)), 1)


def test_a_large_block_plan_matches_the_reference_too() -> None:
    """Past the size where the native planner lets go of the GIL."""
    import numpy as np

    rng = np.random.default_rng(7)
    tensors, blocks, block = 64, 256, 64
    src = Layout([t * blocks * block for t in range(tensors)], blocks * block, blocks)
    dst = Layout([(2 * t + 1) * blocks * block for t in range(tensors)], blocks * block, blocks)
    src_blocks = rng.permutation(blocks)[:128].tolist()
    dst_blocks = sorted(rng.permutation(blocks)[:128].tolist())
    expected = _naive_block_plan(src.tensor_offsets, dst.tensor_offsets, src_blocks, dst_blocks,
                                 block)
    pairs = tensor_pairs(src, dst, [], [], 2)
    assert plan_blocks(src, dst, pairs, src_blocks, dst_blocks).tolist() == expected
    sliced = plan_slot_to_blocks(Layout(src.tensor_offsets, blocks * block, 1), 0, dst, pairs,
                                 dst_blocks)
    assert sliced.tolist() == _naive_block_plan(src.tensor_offsets, dst.tensor_offsets,
                                                list(range(128)), dst_blocks, block)
