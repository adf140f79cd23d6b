"""Copies inside one cluster: copy_cache, copy_blocks, swap_blocks.

All of them are native copies of merged ranges through the daemon's
``Copier`` (GIL released); swap_blocks moves blocks between the HOST and
DEVICE pools.
"""

from __future__ import annotations

from dataclasses import dataclass

from hixl_wire.status import param_invalid as _invalid

from .cluster import Cluster
from .engine import Engine
from .memory.base import Memory
from .planning import Blocks, Layout, TensorRun, plan_blocks, plan_slot_copy, total_bytes


@dataclass(frozen=True)
class Operand:
    """A local cache by id, or (cache_id -1) tensors the client found in one of its pools."""

    cache_id: int
    pool_id: int = 0
    tensor_offsets: tuple[int, ...] = ()
    tensor_size: int = 0
    batch_size: int = 0
    buffer_id: int = 0


@dataclass(frozen=True)
class Resolved:
    layout: Layout
    memory: Memory
    blocks: bool


def _resolve(engine: Engine, cluster: Cluster, operand: Operand) -> Resolved:
    if operand.cache_id != -1:
        entry = cluster.registry.get(operand.cache_id)
        return Resolved(entry.layout, entry.memory, entry.blocks)
    memory: Memory | None
    if operand.buffer_id:
        memory = cluster.buffers.get(operand.buffer_id)
        if memory is not None and memory.dropped:
            memory = None
    else:
        memory = next((p for p in cluster.pools.values() if p.pool_id == operand.pool_id), None)
    if memory is None:
        raise _invalid(f"the CPU cache's memory is not a pool or buffer of cluster "
                       f"{cluster.cluster_id}")
    if operand.batch_size <= 0 or operand.tensor_size % operand.batch_size:
        raise _invalid(f"{operand.tensor_size} bytes do not split into "
                       f"{operand.batch_size} blocks")
    for offset in operand.tensor_offsets:
        if offset + operand.tensor_size > memory.size:
            raise _invalid(f"a tensor at offset {offset} runs past the end of its memory")
    return Resolved(Layout(operand.tensor_offsets, operand.tensor_size, operand.batch_size),
                    memory, blocks=True)


async def copy_cache(engine: Engine, cluster: Cluster, dst_id: int, src_id: int,
                     dst_batch: int, src_batch: int, offset: int, size: int) -> int:
    dst = cluster.registry.get(dst_id)
    src = cluster.registry.get(src_id)
    if dst.blocks or src.blocks:
        raise _invalid("copy_cache does not take blocks caches; use copy_blocks")
    ranges = plan_slot_copy(src.layout, src_batch, dst.layout, dst_batch,
                            offset, size)
    await engine.kit.copier.copy(dst.memory, src.memory, ranges)
    return total_bytes(ranges)


async def copy_blocks(engine: Engine, cluster: Cluster, cache_id: int,
                      src_blocks: Blocks, dst_blocks: Blocks) -> int:
    entry = cluster.registry.get(cache_id)
    if not entry.blocks:
        raise _invalid("copy_blocks needs a blocks cache")
    layout = entry.layout
    pairs = TensorRun(0, 0, entry.num_tensors)
    ranges = plan_blocks(layout, layout, pairs, src_blocks, dst_blocks)
    await engine.kit.copier.copy(entry.memory, entry.memory, ranges)
    return total_bytes(ranges)


async def swap_blocks(engine: Engine, cluster: Cluster, src_operand: Operand,
                      dst_operand: Operand, src_blocks: Blocks,
                      dst_blocks: Blocks) -> int:
    src = _resolve(engine, cluster, src_operand)
    dst = _resolve(engine, cluster, dst_operand)
    if not (src.blocks and dst.blocks):
        raise _invalid("swap_blocks needs two blocks caches")
    if src.memory.placement == dst.memory.placement:
        raise _invalid("swap_blocks moves blocks between the HOST and the DEVICE pool")
    if src.layout.num_tensors != dst.layout.num_tensors:
        raise _invalid(f"num_tensors differ: {src.layout.num_tensors} and "
                       f"{dst.layout.num_tensors}")
    pairs = TensorRun(0, 0, src.layout.num_tensors)
    ranges = plan_blocks(src.layout, dst.layout, pairs, src_blocks, dst_blocks)
    await engine.kit.copier.copy(dst.memory, src.memory, ranges)
    return total_bytes(ranges)
