"""Pull KV caches by request key: LLM-DataDist's default prefill -> decode flow.

The prefill cluster computes a batch of prompts into one cache whose batch
slots are bound to request keys. The decode cluster links to it and pulls each
request into a free slot of its own running batch, in whatever order its
scheduler admits them. A pull by key drops that key on the prefill side, so the
prefill cache is freed by the last pull: the prefill side never tracks its
decoders. One request is pulled in two layer ranges, as a decoder that starts
on the first layers early would do.

    python examples/pull_cache.py [--requests 4] [--layers 4] [--tokens 128]
"""

from __future__ import annotations

import time

import numpy as np
import uvloop
from _common import (
    DECODE_CLUSTER,
    PROMPT_CLUSTER,
    add_head_args,
    engine_options,
    example_parser,
    fill_random,
    link_info,
    two_daemons,
)

from hixl_client import (
    CacheDesc,
    CacheKey,
    DataType,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
)


async def run(requests: int, layers: int, tokens: int, kv_heads: int, head_dim: int) -> None:
    # One tensor per (layer, K|V); shape[0] is the batch: one slot per request.
    desc = CacheDesc(2 * layers, [requests, tokens, kv_heads, head_dim], DataType.DT_FLOAT16)
    total = desc.size * desc.num_tensors
    pool = total * 3 // 2  # room for one batch, not two
    # 1 KiB pages: the pool holds what the example sizes it for, give or take a page
    options = engine_options(pool, page_shift=10)
    async with two_daemons(pool + (8 << 20)) as (prefill_daemon, decode_daemon), \
            LLMDataDist(LLMRole.PROMPT, PROMPT_CLUSTER,
                        daemon=prefill_daemon.client_target) as prompt, \
            LLMDataDist(LLMRole.DECODER, DECODE_CLUSTER,
                        daemon=decode_daemon.client_target) as decoder:
        await prompt.init(options)
        await decoder.init(options)

        # The i-th key binds batch slot i; req ids are whatever the router uses.
        keys = [CacheKey(PROMPT_CLUSTER, req_id=1000 + i) for i in range(requests)]
        src = await prompt.cache_manager.allocate_cache(desc, keys)
        # "prefill": the model writes K/V into the pool
        fill_random(src, np.random.default_rng(1), np.uint16)
        expected = [src.numpy(i).copy() for i in range(desc.num_tensors)]
        # The prefill side is done with the batch. Deallocating drops only its own
        # reference: each key keeps the memory alive until its request is pulled.
        await prompt.cache_manager.deallocate_cache(src)
        try:  # the keys still hold the memory: no room for the next batch yet
            await prompt.cache_manager.allocate_cache(desc)
            raise SystemExit("the keyed cache was freed before it was pulled")
        except LLMException as err:
            assert err.status_code == LLMStatusCode.LLM_OUT_OF_MEMORY, err

        # Linking is one-sided: the side that pulls links to the side that holds.
        status, per_cluster = await decoder.link_clusters(
            [link_info(PROMPT_CLUSTER, prefill_daemon.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS, per_cluster

        dst = await decoder.cache_manager.allocate_cache(desc)
        slots = list(reversed(range(requests)))  # the decoder's scheduler picks the slots
        started = time.perf_counter()
        # Request 0 arrives in two layer ranges; its key drops only once every
        # tensor of the slot has been pulled, so the second pull still finds it.
        split = layers // 2 or layers
        parts = [p for p in (range(split), range(split, layers)) if p]  # empty means "all"
        for part in parts:
            await decoder.cache_manager.pull_cache(keys[0], dst, slots[0],
                                                   src_layer_range=part, dst_layer_range=part)
        for key, slot in zip(keys[1:], slots[1:], strict=True):
            await decoder.cache_manager.pull_cache(key, dst, batch_index=slot)
        elapsed = time.perf_counter() - started

        try:  # every key is gone now, and with it the prefill cache
            await decoder.cache_manager.pull_cache(keys[0], dst, slots[0])
            raise SystemExit("a pulled key could be pulled again")
        except LLMException as again:
            assert again.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST, again
            gone = again.status_code.name
        # ... and the prefill pool has room for its next batch again.
        await prompt.cache_manager.deallocate_cache(
            await prompt.cache_manager.allocate_cache(desc))

        for i in range(desc.num_tensors):
            got = dst.numpy(i)
            for request, slot in enumerate(slots):
                if got[slot].tobytes() != expected[i][request].tobytes():  # NaN-safe
                    raise SystemExit(f"request {request} tensor {i} differs after the pull")
        print(f"verified {requests} requests x {desc.num_tensors} tensors, "
              f"{total / 2**20:.1f} MiB, byte-exact")
        print(f"pulled by CacheKey over tcp in {elapsed * 1e3:.1f} ms "
              f"({total / elapsed / 1e9:.2f} GB/s); request 0 in {len(parts)} layer range(s); "
              f"pulling a key again: {gone}; the prefill pool was freed by the pulls")
        await decoder.cache_manager.deallocate_cache(dst)
        await decoder.unlink_clusters([link_info(PROMPT_CLUSTER, prefill_daemon.peer_address)],
                                      timeout=5000)


def main() -> None:
    parser = example_parser(__doc__)
    parser.add_argument("--requests", type=int, default=4, help="prompts in the prefill batch")
    parser.add_argument("--layers", type=int, default=4, help="model layers (K and V each)")
    parser.add_argument("--tokens", type=int, default=128, help="prompt length")
    add_head_args(parser, kv_heads=8)
    args = parser.parse_args()
    if args.requests * args.tokens * args.kv_heads * args.head_dim < 2048:
        parser.error("each K/V tensor should hold at least 4 KiB (2048 fp16 values)")
    uvloop.run(run(args.requests, args.layers, args.tokens, args.kv_heads, args.head_dim))


if __name__ == "__main__":
    main()
