"""Turn a pull request into byte ranges, with LLM-DataDist's native checks.

Pure functions over offsets: the engine feeds them layouts of the source
(region offsets on the remote daemon, or pool offsets locally) and of the
destination (pool offsets), and gets back merged (src, dst, length) ranges
for the transport, as an ``(n, 3)`` uint64 array that goes to the native
layer as it is. Block tables are planned by one native loop
(``block_ranges``) and a run of tensors by another (``run_ranges``), so the
Python work of a request does not grow with its number of blocks or
tensors; a plan of a few ranges is built from plain tuples, which costs less
than numpy's per-call overhead.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hixl_native._core import block_ranges, range_bytes, run_ranges

from hixl_wire.status import param_invalid as _invalid

Range = tuple[int, int, int]  # (src_offset, dst_offset, length)
Ranges = Any  # numpy array of shape (n, 3), dtype uint64: src, dst, length
U64 = np.uint64
# Up to this many ranges a plan is built from Python tuples: numpy's fixed
# cost per call exceeds the per-item cost of plain Python below it.
SMALL_PLAN = 8


def as_ranges(ranges: Sequence[Range]) -> Ranges:
    """Ranges given as tuples, as the (n, 3) uint64 array the transports take."""
    return np.array(ranges, dtype=U64).reshape(-1, 3)


def total_bytes(ranges: Ranges) -> int:
    """The bytes ``ranges`` move: one native loop over a planner's array (a
    numpy reduction costs more), numpy for anything else."""
    try:
        return int(range_bytes(ranges))
    except (TypeError, ValueError):  # not a contiguous uint64 buffer of triples
        return int(np.asarray(ranges, dtype=U64).reshape(-1, 3)[:, 2].sum())


Blocks = Any  # block indices: a sequence of ints (see block_list) or a uint64 numpy array
# Up to this many block indices stay in the request's repeated field: the
# native planner reads them from it faster than numpy builds an array.
SMALL_BLOCKS = 64


def block_list(indices: Any) -> Blocks:
    """Block indices, e.g. a protobuf ``repeated uint64`` field, for the planners.

    A short list is the field itself: it holds its values packed (as the
    message does), and the native planner reads them without an array in
    between. A longer one becomes a uint64 array, which numpy copies from
    the field in one step where a Python list costs an int per block, which
    a daemon would hold for the whole transfer. An empty list (every
    pull_cache has two) gets a shared read-only array.
    """
    count = len(indices)
    if not count:
        return _NO_BLOCKS
    return indices if count <= SMALL_BLOCKS else np.array(indices, dtype=U64)


def block_array(indices: Any) -> Any:
    """Block indices as a uint64 array, whatever their number (see block_list)."""
    return np.array(indices, dtype=U64) if len(indices) else _NO_BLOCKS


_NO_BLOCKS = np.empty(0, dtype=U64)
_NO_BLOCKS.flags.writeable = False


@dataclass(frozen=True)
class Layout:
    """Where the tensors of one cache start, and the size of one batch slot."""

    tensor_offsets: Sequence[int]
    tensor_size: int
    batch_size: int
    # Derived once: the planners read them several times a request.
    num_tensors: int = field(init=False, repr=False, compare=False)
    stride: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_tensors", len(self.tensor_offsets))
        object.__setattr__(self, "stride",
                           self.tensor_size // self.batch_size if self.batch_size else 0)


Pairs = Any  # a TensorRun, an (n, 2) int64 array of (source, destination) tensor
# indices, or a sequence of such pairs: every planner takes any of them.


class TensorRun:
    """The tensor pairs ``(src_first + k, dst_first + k)`` for ``k < count``.

    What :func:`tensor_pairs` returns: the checked indices are contiguous on
    both sides, so three numbers describe any number of pairs. It iterates as
    ``(src, dst)`` tuples and converts to an ``(n, 2)`` int64 array.
    """

    __slots__ = ("count", "dst_first", "src_first")

    def __init__(self, src_first: int, dst_first: int, count: int) -> None:
        self.src_first, self.dst_first, self.count = src_first, dst_first, count

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return zip(range(self.src_first, self.src_first + self.count),
                   range(self.dst_first, self.dst_first + self.count), strict=True)

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        pairs = np.empty((self.count, 2), dtype=np.int64)
        pairs[:, 0] = np.arange(self.src_first, self.src_first + self.count)
        pairs[:, 1] = np.arange(self.dst_first, self.dst_first + self.count)
        return pairs if dtype is None else pairs.astype(dtype)

    def __repr__(self) -> str:
        return f"TensorRun({self.src_first}, {self.dst_first}, {self.count})"


def _run_start(name: str, indices: Sequence[int], num_tensors: int, per_layer: int) -> int:
    """The first of the checked, contiguous tensor indices of one side (0 when empty:
    all tensors)."""
    if not len(indices):
        return 0
    if num_tensors % per_layer:
        raise _invalid(f"num_tensors {num_tensors} is not a multiple of "
                       f"tensor_num_per_layer {per_layer}")
    first, last = indices[0], indices[-1]
    # Contiguous means exactly first, first + 1, ...: one comparison done in C.
    if last - first != len(indices) - 1 or \
            (len(indices) > 2 and list(indices) != list(range(first, last + 1))):
        raise _invalid(f"{name} tensor indices must be contiguous")
    if first < 0 or last >= num_tensors:
        raise _invalid(f"{name} tensor indices [{first}, {last}] are out of "
                       f"range for {num_tensors} tensors")
    return int(first)


def tensor_pairs(src: Layout, dst: Layout, src_indices: Sequence[int],
                 dst_indices: Sequence[int], per_layer: int) -> TensorRun:
    """Pair source and destination tensor indices; empty lists mean "all tensors"."""
    if per_layer < 1:
        raise _invalid("tensor_num_per_layer must be >= 1")
    src_first = _run_start("source", src_indices, src.num_tensors, per_layer)
    dst_first = _run_start("destination", dst_indices, dst.num_tensors, per_layer)
    src_count = len(src_indices) or src.num_tensors
    dst_count = len(dst_indices) or dst.num_tensors
    if src_count != dst_count:
        raise _invalid(f"{src_count} source tensors do not match "
                       f"{dst_count} destination tensors")
    return TensorRun(src_first, dst_first, src_count)


def _pair_array(pairs: Pairs) -> Any:
    return np.asarray(pairs, dtype=np.int64).reshape(-1, 2)


def _bases(layout: Layout, indices: Any) -> Any:
    """Offsets of the tensors at ``indices`` (int64 array) of ``layout``, as uint64."""
    return np.asarray(layout.tensor_offsets, dtype=U64)[indices]


def plan_cache_pull(src: Layout, src_batch: int, dst: Layout, dst_batch: int, size: int,
                    pairs: Pairs) -> tuple[Ranges, int]:
    """Ranges copying one batch slot per tensor pair; returns (ranges, bytes per tensor)."""
    if not 0 <= dst_batch < dst.batch_size:
        raise _invalid(f"batch_index {dst_batch} is out of range [0, {dst.batch_size})")
    if not 0 <= src_batch < src.batch_size:
        raise _invalid(f"source batch index {src_batch} is out of range [0, {src.batch_size})")
    src_stride, dst_stride = src.stride, dst.stride
    length = dst_stride if size == -1 else size
    if length > dst_stride:
        raise _invalid(f"size {length} exceeds the destination slot of {dst_stride} bytes")
    if length > src_stride:
        raise _invalid(f"size {length} exceeds the source slot of {src_stride} bytes")
    src_base, dst_base = src_batch * src_stride, dst_batch * dst_stride
    if len(pairs) <= SMALL_PLAN:
        src_offsets, dst_offsets = src.tensor_offsets, dst.tensor_offsets
        rows = [(src_offsets[s] + src_base, dst_offsets[d] + dst_base, length)
                for s, d in (pairs.tolist() if isinstance(pairs, np.ndarray) else pairs)]
        if len(rows) > 1:
            rows = _merge_rows(rows)
        elif length <= 0:
            rows = []
        return as_ranges(rows), length
    if isinstance(pairs, TensorRun):  # one C loop, whatever the number of tensors
        flat = run_ranges(src.tensor_offsets, pairs.src_first, src_base, dst.tensor_offsets,
                          pairs.dst_first, dst_base, pairs.count, length)
        return np.frombuffer(flat, dtype=U64).reshape(-1, 3), length
    index = _pair_array(pairs)
    ranges = np.empty((len(index), 3), dtype=U64)
    ranges[:, 0] = _bases(src, index[:, 0]) + U64(src_base)
    ranges[:, 1] = _bases(dst, index[:, 1]) + U64(dst_base)
    ranges[:, 2] = length
    return merge_ranges(ranges), length


def _merge_rows(rows: list[Range]) -> list[Range]:
    """merge_ranges for a few tuples, in plain Python."""
    merged: list[Range] = []
    for src, dst, length in rows:
        if length <= 0:
            continue
        if merged:
            last_src, last_dst, last_length = merged[-1]
            if last_src + last_length == src and last_dst + last_length == dst:
                merged[-1] = (last_src, last_dst, last_length + length)
                continue
        merged.append((src, dst, length))
    return merged


def merge_ranges(ranges: Ranges) -> Ranges:
    """Merge neighbours that are contiguous on both sides into one range; drop empty ones."""
    if not ranges[:, 2].all():
        ranges = ranges[ranges[:, 2] > 0]
    if len(ranges) < 2:
        return ranges
    src, dst, length = ranges[:, 0], ranges[:, 1], ranges[:, 2]
    follows = (src[1:] == src[:-1] + length[:-1]) & (dst[1:] == dst[:-1] + length[:-1])
    if not follows.any():
        return ranges
    starts = np.flatnonzero(np.concatenate(([True], ~follows)))
    merged = ranges[starts].copy()
    merged[:, 2] = np.add.reduceat(length, starts)
    return merged


def _u64_blocks(blocks: Blocks) -> Any:
    """Block indices as the native planner takes them: a contiguous uint64 array
    (read in place) or a short sequence of ints (copied natively)."""
    if type(blocks) is np.ndarray:
        return blocks if blocks.dtype == U64 and blocks.flags.c_contiguous else \
            np.ascontiguousarray(blocks, dtype=U64)
    return blocks if len(blocks) <= SMALL_BLOCKS else np.array(blocks, dtype=U64)


def _tensor_bases(src: Layout, dst: Layout, pairs: Pairs) -> tuple[Sequence[int], Sequence[int]]:
    """The offsets of the paired tensors on each side."""
    if isinstance(pairs, TensorRun):  # a slice, no per-tensor work in Python
        return (src.tensor_offsets[pairs.src_first:pairs.src_first + pairs.count],
                dst.tensor_offsets[pairs.dst_first:pairs.dst_first + pairs.count])
    index = _pair_array(pairs)
    return _bases(src, index[:, 0]).tolist(), _bases(dst, index[:, 1]).tolist()


def _block_plan(src: Layout, src_add: int, dst: Layout, pairs: Pairs, src_blocks: Blocks | None,
                dst_blocks: Blocks, block: int) -> Ranges:
    """Every (tensor pair, block) piece, merged, in one native loop; ``src_blocks``
    None: the source blocks follow each other from ``src_add``."""
    if len(dst_blocks) == 0:
        raise _invalid(f"{'dst_blocks' if src_blocks is None else 'src_blocks'} must not be empty")
    src_bases, dst_bases = _tensor_bases(src, dst, pairs)
    try:
        flat = block_ranges(src_bases, src_add, dst_bases, 0,
                            None if src_blocks is None else _u64_blocks(src_blocks),
                            _u64_blocks(dst_blocks), block,
                            src.batch_size if src_blocks is not None else 2**64 - 1,
                            dst.batch_size)
    except IndexError as error:  # a block out of range: the caller's mistake
        raise _invalid(str(error)) from None
    return np.frombuffer(flat, dtype=U64).reshape(-1, 3)


def plan_blocks(src: Layout, dst: Layout, pairs: Pairs,
                src_blocks: Blocks, dst_blocks: Blocks) -> Ranges:
    """Ranges copying block src_blocks[i] to block dst_blocks[i] of every tensor pair."""
    if len(src_blocks) != len(dst_blocks):
        raise _invalid(f"{len(src_blocks)} source blocks do not match "
                       f"{len(dst_blocks)} destination blocks")
    if src.stride != dst.stride:
        raise _invalid(f"block sizes differ: {src.stride} bytes at the source, "
                       f"{dst.stride} at the destination")
    return _block_plan(src, 0, dst, pairs, src_blocks, dst_blocks, src.stride)


def plan_slot_to_blocks(src: Layout, src_batch: int, dst: Layout,
                        pairs: Pairs,
                        dst_blocks: Blocks) -> Ranges:
    """Ranges scattering one continuous slot, block by block, into dst_blocks."""
    if not 0 <= src_batch < src.batch_size:
        raise _invalid(f"source batch index {src_batch} is out of range [0, {src.batch_size})")
    block = dst.stride
    if len(dst_blocks) * block > src.stride:
        raise _invalid(f"{len(dst_blocks)} blocks of {block} bytes exceed the source slot "
                       f"of {src.stride} bytes")
    return _block_plan(src, src_batch * src.stride, dst, pairs, None, dst_blocks, block)


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
