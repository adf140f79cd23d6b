"""How a paged pull's control work grows with its block count (the ``scale`` suite).

One request pulls every block of a blocks cache of two tensors of ``n``
64-byte blocks over TCP, with both block tables shuffled, so the daemon
plans ``2n`` separate ranges. The daemon reports its control time (everything
but data movement: resolving, planning, checking) per request; the row's
``ctrl_us_per_block`` divides it by ``n``, and the largest row also reports
the slope between the smallest and the largest count
(``ctrl_us_per_added_block``), which issue 4 wants below 1 us.
"""

from __future__ import annotations

import random

from hixl_bench.env import Clusters
from hixl_bench.model import HIXL, Budget, Row, drive
from hixl_bench.runner import measured_split
from hixl_client import BlocksCacheKey, CacheDesc, DataType, capture_timings

BLOCK = 64
TENSORS = 2
FULL_COUNTS = (1_000, 10_000, 100_000)
QUICK_COUNTS = (1_000, 10_000)
MODEL_ID = 0x5CA1E


async def scale_row(env: Clusters, blocks: int, budget: Budget) -> Row:
    """One row: pull all ``blocks`` blocks of both tensors, shuffled, over TCP."""
    row = Row(HIXL, "hixl pull_blocks", "scale", "pull", "tcp", BLOCK, TENSORS * blocks)
    desc = CacheDesc(TENSORS, [blocks, BLOCK], DataType.DT_UINT8)
    target = env.target_cm("tcp")
    key = BlocksCacheKey(env.target_id("tcp"), model_id=MODEL_ID)
    order = random.Random(blocks)
    src_blocks, dst_blocks = list(range(blocks)), list(range(blocks))
    order.shuffle(src_blocks)
    order.shuffle(dst_blocks)
    try:
        src = await target.allocate_blocks_cache(desc, key)
    except Exception as exc:  # reported, not raised: one failed shape must not end the run
        row.status = f"error: allocate: {exc}"
        return row
    try:
        dst = await env.cm.allocate_blocks_cache(desc)
        try:
            async def request(_index: int) -> None:
                await env.cm.pull_blocks(key, dst, src_blocks, dst_blocks)

            with capture_timings() as measured:
                timing = await drive(request, 1, budget)
            row.fill(timing, TENSORS * blocks * BLOCK)
            measured_split(row, measured)
            if row.control_us is not None:
                row.extra["ctrl_us_per_block"] = row.control_us / blocks
        finally:
            await env.cm.deallocate_blocks_cache(dst)
    except Exception as exc:
        row.status = f"error: {type(exc).__name__}: {exc}"
    finally:
        await target.deallocate_blocks_cache(src)
    return row


async def scale_rows(env: Clusters, counts: tuple[int, ...], budget: Budget) -> list[Row]:
    """A row per block count; the last one also carries the slope over the counts."""
    rows = [await scale_row(env, n, budget) for n in counts]
    first, last = rows[0], rows[-1]
    if len(rows) > 1 and first.control_us is not None and last.control_us is not None:
        added = (last.nblocks - first.nblocks) // TENSORS
        last.extra["ctrl_us_per_added_block"] = (last.control_us - first.control_us) / added
    return rows
