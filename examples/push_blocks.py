"""Push paged KV blocks into the decoder's blocks cache, skipping a shared prefix.

Remote-cache-accessible mode with paged attention on both sides: the decoder
keeps one blocks cache per model under a ``BlocksCacheKey`` so that linked
prefill clusters can write into it, reserves blocks for each request in its
own allocator and sends the block table to the prefill side. Requests that
share a prompt prefix share its blocks (prefix caching) on both sides, so the
second request pushes only the blocks the decoder does not hold yet.

    python examples/push_blocks.py [--prompt-tokens 128] [--shared-tokens 64] [--num-blocks 64]
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
    DataType,
    LLMDataDist,
    LLMRole,
    LLMStatusCode,
)

MODEL_ID = 0


async def run(prompt_tokens: int, shared_tokens: int, layers: int, block_tokens: int,
              num_blocks: int, kv_heads: int, head_dim: int) -> None:
    per_request = -(-prompt_tokens // block_tokens)
    shared = min(shared_tokens // block_tokens, per_request)  # only full blocks are shared
    if 2 * per_request - shared > num_blocks:
        raise SystemExit(f"two requests of {per_request} blocks do not fit {num_blocks} blocks")
    desc = CacheDesc(2 * layers, [num_blocks, block_tokens * kv_heads * head_dim],
                     DataType.DT_FLOAT16)
    pool = desc.size * desc.num_tensors + (4 << 20)
    rng = np.random.default_rng(5)
    options = engine_options(pool, remote_cache_accessible=True)  # peers may write into our caches
    async with two_daemons(pool + (8 << 20)) as (prefill_daemon, decode_daemon), \
            LLMDataDist(LLMRole.PROMPT, PROMPT_CLUSTER,
                        daemon=prefill_daemon.client_target) as prompt, \
            LLMDataDist(LLMRole.DECODER, DECODE_CLUSTER,
                        daemon=decode_daemon.client_target) as decoder:
        await prompt.init(options)
        await decoder.init(options)
        # The key is how pushers find this cache: (decode cluster, model id).
        dst = await decoder.cache_manager.allocate_blocks_cache(
            desc, BlocksCacheKey(DECODE_CLUSTER, model_id=MODEL_ID))
        before = [blocks(dst, i).copy() for i in range(desc.num_tensors)]
        # The writer links to the cluster whose memory it writes.
        status, per_cluster = await prompt.link_clusters(
            [link_info(DECODE_CLUSTER, decode_daemon.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS, per_cluster

        src = await prompt.cache_manager.allocate_blocks_cache(desc)  # pushed from, no key
        fill_random(src, rng)  # "prefill" of both requests' blocks

        # Block tables: request 1 starts with request 0's prefix blocks on each side.
        prompt_free = [int(b) for b in rng.permutation(num_blocks)]
        decode_free = [int(b) for b in rng.permutation(num_blocks)]
        fresh = per_request - shared
        src_tables = [prompt_free[:per_request],
                      prompt_free[:shared] + prompt_free[per_request:per_request + fresh]]
        dst_tables = [decode_free[:per_request],
                      decode_free[:shared] + decode_free[per_request:per_request + fresh]]

        key = BlocksCacheKey(DECODE_CLUSTER, MODEL_ID)
        started = time.perf_counter()
        await prompt.cache_manager.push_blocks(key, src, src_tables[0], dst_tables[0])
        if fresh:  # the decoder already holds request 1's prefix: push the rest only
            await prompt.cache_manager.push_blocks(key, src, src_tables[1][shared:],
                                                   dst_tables[1][shared:])
        elapsed = time.perf_counter() - started

        touched = set(dst_tables[0]) | set(dst_tables[1])
        untouched = [b for b in range(num_blocks) if b not in touched]
        for i in range(desc.num_tensors):
            got = blocks(dst, i)
            for src_table, dst_table in zip(src_tables, dst_tables, strict=True):
                if not np.array_equal(got[dst_table], blocks(src, i)[src_table]):
                    raise SystemExit(f"tensor {i}: blocks {dst_table} differ after the push")
            if not np.array_equal(got[untouched], before[i][untouched]):
                raise SystemExit(f"tensor {i}: a block outside the tables changed")
        block_bytes = desc.size // num_blocks
        pushed = (per_request + fresh) * desc.num_tensors * block_bytes
        print(f"verified 2 requests x {per_request} blocks x {desc.num_tensors} tensors "
              f"byte-exact ({shared} shared prefix blocks); {len(untouched)} other blocks "
              f"untouched")
        print(f"push_blocks over tcp: {per_request + fresh} blocks of {block_bytes // 1024} KiB "
              f"({pushed / 2**20:.1f} MiB) in {elapsed * 1e3:.1f} ms")
        await prompt.cache_manager.deallocate_blocks_cache(src)
        await prompt.unlink_clusters([link_info(DECODE_CLUSTER, decode_daemon.peer_address)],
                                     timeout=5000)
        await decoder.cache_manager.deallocate_blocks_cache(dst)


def main() -> None:
    parser = example_parser(__doc__)
    parser.add_argument("--prompt-tokens", type=int, default=128, help="tokens per request")
    parser.add_argument("--shared-tokens", type=int, default=64,
                        help="prompt prefix the two requests share")
    parser.add_argument("--layers", type=int, default=4, help="model layers (K and V each)")
    parser.add_argument("--block-tokens", type=int, default=16, help="tokens per block")
    parser.add_argument("--num-blocks", type=int, default=64, help="blocks per tensor")
    add_head_args(parser, kv_heads=4)
    args = parser.parse_args()
    uvloop.run(run(args.prompt_tokens, args.shared_tokens, args.layers, args.block_tokens,
                   args.num_blocks, args.kv_heads, args.head_dim))


if __name__ == "__main__":
    main()
