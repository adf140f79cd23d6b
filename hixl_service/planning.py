"""Turn a pull request into byte ranges, with LLM-DataDist's native checks.

Pure functions over offsets: the engine feeds them layouts of the source
(region offsets on the remote daemon, or pool offsets locally) and of the
destination (pool offsets), and gets back merged (src, dst, length) ranges
for the transport. Work is per tensor, never per byte or per block.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from hixl_client.status import LLMException, LLMStatusCode

Range = tuple[int, int, int]  # (src_offset, dst_offset, length)


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
                    pairs: Sequence[tuple[int, int]]) -> tuple[list[Range], int]:
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
    return merge_ranges(ranges), length


def merge_ranges(ranges: Sequence[Range]) -> list[Range]:
    """Merge neighbours that are contiguous on both sides into one range."""
    merged: list[Range] = []
    for src, dst, length in ranges:
        if merged:
            last_src, last_dst, last_len = merged[-1]
            if last_src + last_len == src and last_dst + last_len == dst:
                merged[-1] = (last_src, last_dst, last_len + length)
                continue
        if length:
            merged.append((src, dst, length))
    return merged
