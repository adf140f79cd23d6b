"""Turn a pull request into byte ranges, with LLM-DataDist's native checks.

Pure functions over offsets: the engine feeds them layouts of the source
(region offsets on the remote daemon, or pool offsets locally) and of the
destination (pool offsets), and gets back merged (src, dst, length) ranges
for the transport, as an ``(n, 3)`` uint64 array that goes to the native
layer as it is. Block lists are handled with numpy, so the Python work of a
request does not grow with its number of blocks.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hixl_client.status import LLMException, LLMStatusCode

Range = tuple[int, int, int]  # (src_offset, dst_offset, length)
Ranges = Any  # numpy array of shape (n, 3), dtype uint64: src, dst, length
U64 = np.uint64


def as_ranges(ranges: Sequence[Range]) -> Ranges:
    """Ranges given as tuples, as the (n, 3) uint64 array the transports take."""
    return np.array(ranges, dtype=U64).reshape(-1, 3)


def total_bytes(ranges: Ranges) -> int:
    return int(ranges[:, 2].sum())


def _invalid(message: str) -> LLMException:
    return LLMException(message, status_code=LLMStatusCode.LLM_PARAM_INVALID)


@dataclass(frozen=True)
class Layout:
    """Where the tensors of one cache start, and the size of one batch slot."""

    tensor_offsets: Sequence[int]
    tensor_size: int
    batch_size: int

    @property
    def num_tensors(self) -> int:
        return len(self.tensor_offsets)

    @property
    def stride(self) -> int:
        return self.tensor_size // self.batch_size


def _check_indices(name: str, indices: Sequence[int], num_tensors: int, per_layer: int) -> None:
    if num_tensors % per_layer:
        raise _invalid(f"num_tensors {num_tensors} is not a multiple of "
                       f"tensor_num_per_layer {per_layer}")
    if any(b != a + 1 for a, b in itertools.pairwise(indices)):
        raise _invalid(f"{name} tensor indices must be contiguous")
    if indices[0] < 0 or indices[-1] >= num_tensors:
        raise _invalid(f"{name} tensor indices [{indices[0]}, {indices[-1]}] are out of "
                       f"range for {num_tensors} tensors")


def tensor_pairs(src: Layout, dst: Layout, src_indices: Sequence[int],
                 dst_indices: Sequence[int], per_layer: int) -> list[tuple[int, int]]:
    """Pair source and destination tensor indices; empty lists mean "all tensors"."""
    if per_layer < 1:
        raise _invalid("tensor_num_per_layer must be >= 1")
    if src_indices:
        _check_indices("source", src_indices, src.num_tensors, per_layer)
    if dst_indices:
        _check_indices("destination", dst_indices, dst.num_tensors, per_layer)
    src_list = list(src_indices) or list(range(src.num_tensors))
    dst_list = list(dst_indices) or list(range(dst.num_tensors))
    if len(src_list) != len(dst_list):
        raise _invalid(f"{len(src_list)} source tensors do not match "
                       f"{len(dst_list)} destination tensors")
    return list(zip(src_list, dst_list, strict=True))


def plan_cache_pull(src: Layout, src_batch: int, dst: Layout, dst_batch: int, size: int,
                    pairs: Sequence[tuple[int, int]]) -> tuple[Ranges, int]:
    """Ranges copying one batch slot per tensor pair; returns (ranges, bytes per tensor)."""
    if not 0 <= dst_batch < dst.batch_size:
        raise _invalid(f"batch_index {dst_batch} is out of range [0, {dst.batch_size})")
    if not 0 <= src_batch < src.batch_size:
        raise _invalid(f"source batch index {src_batch} is out of range [0, {src.batch_size})")
    length = dst.stride if size == -1 else size
    if length > dst.stride:
        raise _invalid(f"size {length} exceeds the destination slot of {dst.stride} bytes")
    if length > src.stride:
        raise _invalid(f"size {length} exceeds the source slot of {src.stride} bytes")
    ranges = [(src.tensor_offsets[s] + src_batch * src.stride,
               dst.tensor_offsets[d] + dst_batch * dst.stride, length) for s, d in pairs]
    return merge_ranges(as_ranges(ranges)), length


def merge_ranges(ranges: Ranges) -> Ranges:
    """Merge neighbours that are contiguous on both sides into one range; drop empty ones."""
    ranges = ranges[ranges[:, 2] > 0]
    if len(ranges) < 2:
        return ranges
    src, dst, length = ranges[:, 0], ranges[:, 1], ranges[:, 2]
    follows = (src[1:] == src[:-1] + length[:-1]) & (dst[1:] == dst[:-1] + length[:-1])
    starts = np.flatnonzero(np.concatenate(([True], ~follows)))
    merged = ranges[starts].copy()
    merged[:, 2] = np.add.reduceat(length, starts)
    return merged


def block_runs(src_blocks: Sequence[int] | Ranges, dst_blocks: Sequence[int]) -> Ranges:
    """Merge block pairs into runs (src, dst, count) where both sides advance by one.

    Contiguous runs become single ranges before they reach the data plane, so
    a request of 128 neighbouring blocks costs one range per tensor, not 128.
    """
    runs = np.empty((len(src_blocks), 3), dtype=U64)
    runs[:, 0], runs[:, 1], runs[:, 2] = src_blocks, dst_blocks, 1
    return merge_ranges(runs)


def _check_blocks(name: str, blocks: Sequence[int], num_blocks: int) -> None:
    if len(blocks) == 0:
        raise _invalid(f"{name} must not be empty")
    largest = int(np.max(blocks))
    if largest >= num_blocks:
        raise _invalid(f"{name} holds block {largest}, out of range [0, {num_blocks})")


def _spread(bases: Sequence[tuple[int, int]], pieces: Ranges) -> Ranges:
    """Pieces (src, dst, length) repeated at every pair of tensor bases, then merged."""
    base = np.asarray(bases, dtype=U64).reshape(-1, 2)
    out = np.empty((len(base), len(pieces), 3), dtype=U64)
    out[:, :, 0] = base[:, 0:1] + pieces[:, 0]
    out[:, :, 1] = base[:, 1:2] + pieces[:, 1]
    out[:, :, 2] = pieces[:, 2]
    return merge_ranges(out.reshape(-1, 3))


def plan_blocks(src: Layout, dst: Layout, pairs: Sequence[tuple[int, int]],
                src_blocks: Sequence[int], dst_blocks: Sequence[int]) -> Ranges:
    """Ranges copying block src_blocks[i] to block dst_blocks[i] of every tensor pair."""
    if len(src_blocks) != len(dst_blocks):
        raise _invalid(f"{len(src_blocks)} source blocks do not match "
                       f"{len(dst_blocks)} destination blocks")
    _check_blocks("src_blocks", src_blocks, src.batch_size)
    _check_blocks("dst_blocks", dst_blocks, dst.batch_size)
    if src.stride != dst.stride:
        raise _invalid(f"block sizes differ: {src.stride} bytes at the source, "
                       f"{dst.stride} at the destination")
    runs = block_runs(src_blocks, dst_blocks) * U64(src.stride)
    return _spread([(src.tensor_offsets[s], dst.tensor_offsets[d]) for s, d in pairs], runs)


def plan_slot_to_blocks(src: Layout, src_batch: int, dst: Layout,
                        pairs: Sequence[tuple[int, int]],
                        dst_blocks: Sequence[int]) -> Ranges:
    """Ranges scattering one continuous slot, block by block, into dst_blocks."""
    if not 0 <= src_batch < src.batch_size:
        raise _invalid(f"source batch index {src_batch} is out of range [0, {src.batch_size})")
    _check_blocks("dst_blocks", dst_blocks, dst.batch_size)
    block = dst.stride
    if len(dst_blocks) * block > src.stride:
        raise _invalid(f"{len(dst_blocks)} blocks of {block} bytes exceed the source slot "
                       f"of {src.stride} bytes")
    runs = block_runs(np.arange(len(dst_blocks), dtype=U64), dst_blocks) * U64(block)
    return _spread([(src.tensor_offsets[s] + src_batch * src.stride, dst.tensor_offsets[d])
                    for s, d in pairs], runs)


def plan_slot_copy(src: Layout, src_batch: int, dst: Layout, dst_batch: int, offset: int,
                   size: int) -> Ranges:
    """copy_cache's ranges: ``size`` bytes at ``offset`` of one slot, tensor i to tensor i."""
    if src.num_tensors != dst.num_tensors:
        raise _invalid(f"num_tensors differ: {src.num_tensors} and {dst.num_tensors}")
    for name, layout, batch in (("src", src, src_batch), ("dst", dst, dst_batch)):
        if not 0 <= batch < layout.batch_size:
            raise _invalid(f"{name}_batch_index {batch} is out of range [0, {layout.batch_size})")
        if offset and offset >= layout.stride:
            raise _invalid(f"offset {offset} is not inside the {name} slot of "
                           f"{layout.stride} bytes")
    length = size if size != -1 else min(src.stride, dst.stride) - offset
    for name, layout in (("src", src), ("dst", dst)):
        if offset + length > layout.stride:
            raise _invalid(f"{length} bytes at offset {offset} exceed the {name} slot of "
                           f"{layout.stride} bytes")
    return merge_ranges(as_ranges([(src.tensor_offsets[i] + src_batch * src.stride + offset,
                                    dst.tensor_offsets[i] + dst_batch * dst.stride + offset,
                                    length) for i in range(src.num_tensors)]))
