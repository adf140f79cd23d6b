"""Pull paged KV caches: blocks to blocks, and a continuous slot into blocks.

Both sides run paged attention: each keeps one blocks cache per model (every
tensor is ``num_blocks`` blocks of ``block_tokens`` tokens) and hands blocks
to requests from its own block allocator, so a request's blocks sit at
different indices on each side. The decoder pulls a request by naming the
prefill blocks and, in the same order, the blocks it reserved for it. A
prefill engine without paging keeps a request in a continuous keyed slot
instead: the decoder scatters that slot into its blocks with the same call.

    python examples/pull_blocks.py [--requests 3] [--prompt-tokens 100] [--num-blocks 64]
"""

from __future__ import annotations

import time

import numpy as np
import uvloop
from _common import (
    DECODE_CLUSTER,
    PROMPT_CLUSTER,
    add_head_args,
    blocks,
    engine_options,
    example_parser,
    fill_random,
    link_info,
    two_daemons,
)

from hixl_client import (
    BlocksCacheKey,
    CacheDesc,
    CacheKey,
    DataType,
    LLMDataDist,
    LLMRole,
    LLMStatusCode,
)

MODEL_ID = 0


async def run(requests: int, prompt_tokens: int, layers: int, block_tokens: int,
              num_blocks: int, kv_heads: int, head_dim: int) -> None:
    per_request = -(-prompt_tokens // block_tokens)  # the last block is partly used
    if per_request * (requests + 1) > num_blocks:
        raise SystemExit(f"{requests + 1} requests of {per_request} blocks "
                         f"do not fit {num_blocks} blocks")
    desc = CacheDesc(2 * layers, [num_blocks, block_tokens * kv_heads * head_dim],
                     DataType.DT_FLOAT16)
    slot_desc = CacheDesc(2 * layers, [1, per_request * block_tokens, kv_heads, head_dim],
                          DataType.DT_FLOAT16)  # one continuous slot of the same length
    pool = (desc.size + slot_desc.size) * desc.num_tensors + (4 << 20)
    rng = np.random.default_rng(3)
    async with two_daemons(pool + (8 << 20)) as (prefill_daemon, decode_daemon), \
            LLMDataDist(LLMRole.PROMPT, PROMPT_CLUSTER,
                        daemon=prefill_daemon.client_target) as prompt, \
            LLMDataDist(LLMRole.DECODER, DECODE_CLUSTER,
                        daemon=decode_daemon.client_target) as decoder:
        await prompt.init(engine_options(pool))
        await decoder.init(engine_options(pool))
        # The BlocksCacheKey names the prefill blocks cache of this model for pulls.
        src = await prompt.cache_manager.allocate_blocks_cache(
            desc, BlocksCacheKey(PROMPT_CLUSTER, model_id=MODEL_ID))
        unpaged_key = CacheKey(PROMPT_CLUSTER, req_id=77)
        unpaged = await prompt.cache_manager.allocate_cache(slot_desc, [unpaged_key])
        fill_random(src, rng)  # "prefill"
        fill_random(unpaged, rng)

        dst = await decoder.cache_manager.allocate_blocks_cache(desc)  # no key: pulled into
        before = [blocks(dst, i).copy() for i in range(desc.num_tensors)]
        status, per_cluster = await decoder.link_clusters(
            [link_info(PROMPT_CLUSTER, prefill_daemon.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS, per_cluster

        # Each side's block allocator hands out blocks in its own order.
        prompt_free = [int(b) for b in rng.permutation(num_blocks)]
        decode_free = [int(b) for b in rng.permutation(num_blocks)]
        tables = [(prompt_free[r * per_request:(r + 1) * per_request],
                   decode_free[r * per_request:(r + 1) * per_request]) for r in range(requests)]
        started = time.perf_counter()
        for src_table, dst_table in tables:
            await decoder.cache_manager.pull_blocks(
                BlocksCacheKey(PROMPT_CLUSTER, MODEL_ID), dst, src_table, dst_table)
        # A continuous slot is cut into blocks of the destination's size; the
        # source block list stays empty. Pulling by CacheKey drops the key.
        unpaged_table = decode_free[requests * per_request:(requests + 1) * per_request]
        await decoder.cache_manager.pull_blocks(unpaged_key, dst, dst_blocks=unpaged_table)
        elapsed = time.perf_counter() - started

        touched = {b for _, table in tables for b in table} | set(unpaged_table)
        untouched = [b for b in range(num_blocks) if b not in touched]
        for i in range(desc.num_tensors):
            got = blocks(dst, i)
            for src_table, dst_table in tables:
                if not np.array_equal(got[dst_table], blocks(src, i)[src_table]):
                    raise SystemExit(f"tensor {i}: blocks {dst_table} differ")
            slot = blocks(unpaged, i)[0].reshape(per_request, -1)
            if not np.array_equal(got[unpaged_table], slot):
                raise SystemExit(f"tensor {i}: the unpaged request differs")
            if not np.array_equal(got[untouched], before[i][untouched]):
                raise SystemExit(f"tensor {i}: a block outside the tables changed")
        moved = len(touched) * desc.num_tensors * (desc.size // num_blocks)
        print(f"verified {requests + 1} requests x {per_request} blocks x "
              f"{desc.num_tensors} tensors, {moved / 2**20:.1f} MiB, byte-exact; "
              f"{len(untouched)} other blocks untouched")
        print(f"pull_blocks over tcp: {requests} block tables + 1 continuous slot in "
              f"{elapsed * 1e3:.1f} ms, blocks of {desc.size // num_blocks // 1024} KiB")
        # Blocks have no per-request keys: each side frees a request's blocks in
        # its own allocator, and the blocks cache lives until deallocated.
        await decoder.cache_manager.deallocate_blocks_cache(dst)
        await prompt.cache_manager.deallocate_blocks_cache(src)
        await prompt.cache_manager.deallocate_cache(unpaged)


def main() -> None:
    parser = example_parser(__doc__)
    parser.add_argument("--requests", type=int, default=3, help="paged requests to pull")
    parser.add_argument("--prompt-tokens", type=int, default=100, help="tokens per request")
    parser.add_argument("--layers", type=int, default=4, help="model layers (K and V each)")
    parser.add_argument("--block-tokens", type=int, default=16, help="tokens per block")
    parser.add_argument("--num-blocks", type=int, default=64, help="blocks per tensor")
    add_head_args(parser, kv_heads=4)
    args = parser.parse_args()
    uvloop.run(run(args.requests, args.prompt_tokens, args.layers, args.block_tokens,
                   args.num_blocks, args.kv_heads, args.head_dim))


if __name__ == "__main__":
    main()
