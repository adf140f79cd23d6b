"""Preempt a decoding request: swap its KV blocks out to host memory and back in.

A decoder short of device blocks preempts a request instead of dropping it:
``swap_blocks`` copies the request's blocks from the DEVICE pool to the HOST
pool (swap out), its device blocks go to another request, and when the
request resumes its blocks come back (swap in), to whichever device blocks
are free then. The decoder first pulls both requests from a prefill cluster,
so the resumed request is checked against the prefill's original blocks.

    python examples/swap_blocks.py [--prompt-tokens 96] [--num-blocks 32] [--host-blocks 16]
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
    Cache,
    CacheDesc,
    DataType,
    LLMDataDist,
    LLMRole,
    LLMStatusCode,
    Placement,
)

MODEL_ID = 0


def same_blocks(a: Cache, a_blocks: list[int], b: Cache, b_blocks: list[int]) -> bool:
    return all(np.array_equal(blocks(a, i)[a_blocks], blocks(b, i)[b_blocks])
               for i in range(a.cache_desc.num_tensors))


async def run(prompt_tokens: int, layers: int, block_tokens: int, num_blocks: int,
              host_blocks: int, kv_heads: int, head_dim: int) -> None:
    per_request = -(-prompt_tokens // block_tokens)
    if 2 * per_request > num_blocks or per_request > host_blocks:
        raise SystemExit("the pools are too small for two requests")
    shape = [num_blocks, block_tokens * kv_heads * head_dim]
    desc = CacheDesc(2 * layers, shape, DataType.DT_FLOAT16)
    # Same block size and tensor count on the host side: swaps copy whole blocks.
    host_desc = CacheDesc(2 * layers, [host_blocks, shape[1]], DataType.DT_FLOAT16,
                          Placement.HOST)
    pool = desc.size * desc.num_tensors + (4 << 20)
    host_pool = host_desc.size * host_desc.num_tensors + (4 << 20)
    decode_budget = pool + host_pool + (8 << 20)  # the decode daemon holds the HOST pool too
    async with two_daemons(pool + (8 << 20), decode_budget) as (prefill_daemon, decode_daemon), \
            LLMDataDist(LLMRole.PROMPT, PROMPT_CLUSTER,
                        daemon=prefill_daemon.client_target) as prompt, \
            LLMDataDist(LLMRole.DECODER, DECODE_CLUSTER,
                        daemon=decode_daemon.client_target) as decoder:
        await prompt.init(engine_options(pool))
        # The decoder also has the HOST pool that swapped-out blocks live in.
        await decoder.init(engine_options(pool, host_pool_bytes=host_pool))
        src = await prompt.cache_manager.allocate_blocks_cache(
            desc, BlocksCacheKey(PROMPT_CLUSTER, MODEL_ID))
        rng = np.random.default_rng(8)
        fill_random(src, rng)  # "prefill" of two requests
        status, per_cluster = await decoder.link_clusters(
            [link_info(PROMPT_CLUSTER, prefill_daemon.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS, per_cluster

        cm = decoder.cache_manager
        device = await cm.allocate_blocks_cache(desc)
        host = await cm.allocate_blocks_cache(host_desc)  # placement HOST: the host pool
        prompt_a = list(range(per_request))  # the two requests' blocks on the prefill
        prompt_b = list(range(per_request, 2 * per_request))
        device_free = [int(b) for b in rng.permutation(num_blocks)]
        table_a = device_free[:per_request]
        await cm.pull_blocks(BlocksCacheKey(PROMPT_CLUSTER, MODEL_ID), device, prompt_a, table_a)

        # Preempt request A: its blocks go to host blocks, in the order of its table.
        host_table = [int(b) for b in rng.choice(host_blocks, per_request, replace=False)]
        started = time.perf_counter()
        await cm.swap_blocks(device, host, dict(zip(table_a, host_table, strict=True)))
        swap_out = time.perf_counter() - started
        # A's device blocks now serve request B, which overwrites them.
        await cm.pull_blocks(BlocksCacheKey(PROMPT_CLUSTER, MODEL_ID), device, prompt_b, table_a)
        if not same_blocks(device, table_a, src, prompt_b):
            raise SystemExit("request B differs on the device")

        # Resume A into the device blocks that are free now.
        resumed = device_free[per_request:2 * per_request]
        started = time.perf_counter()
        await cm.swap_blocks(host, device, dict(zip(host_table, resumed, strict=True)))
        swap_in = time.perf_counter() - started
        if not same_blocks(device, resumed, src, prompt_a):
            raise SystemExit("request A differs after swapping out and in")
        if not same_blocks(device, table_a, src, prompt_b):
            raise SystemExit("swapping in overwrote request B")
        moved = per_request * desc.num_tensors * (desc.size // num_blocks)
        print(f"verified request A after swap out + swap in ({per_request} blocks x "
              f"{desc.num_tensors} tensors, {moved / 2**20:.1f} MiB) and request B in its "
              f"old blocks, byte-exact")
        print(f"swap_blocks in the decode daemon: DEVICE -> HOST {swap_out * 1e3:.1f} ms, "
              f"HOST -> DEVICE {swap_in * 1e3:.1f} ms; both requests pulled over tcp")
        await cm.deallocate_blocks_cache(host)
        await cm.deallocate_blocks_cache(device)
        await prompt.cache_manager.deallocate_blocks_cache(src)


def main() -> None:
    parser = example_parser(__doc__)
    parser.add_argument("--prompt-tokens", type=int, default=96, help="tokens per request")
    parser.add_argument("--layers", type=int, default=4, help="model layers (K and V each)")
    parser.add_argument("--block-tokens", type=int, default=16, help="tokens per block")
    parser.add_argument("--num-blocks", type=int, default=32, help="device blocks per tensor")
    parser.add_argument("--host-blocks", type=int, default=16, help="host blocks per tensor")
    add_head_args(parser, kv_heads=4)
    args = parser.parse_args()
    uvloop.run(run(args.prompt_tokens, args.layers, args.block_tokens, args.num_blocks,
                   args.host_blocks, args.kv_heads, args.head_dim))


if __name__ == "__main__":
    main()
