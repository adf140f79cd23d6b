"""Push KV caches from prefill into slots the decoder reserved (remote-cache-accessible mode).

In push mode the decoder owns the destination: it allocates its running
batch once, and the scheduler tells the prefill side which cache id and slot
each request goes to. The prefill side writes straight into that slot as soon
as the prompt is computed, so the decoder never issues a request of its own.
Both clusters run with ``enable_remote_cache_accessible``; the pushing side
links to the receiving one, and addresses caches by id (``CacheKeyByIdAndIndex``).

    python examples/push_cache.py [--requests 3] [--layers 4] [--tokens 128]
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
    slot_bytes,
    two_daemons,
)

from hixl_client import (
    CacheDesc,
    CacheKeyByIdAndIndex,
    DataType,
    LLMDataDist,
    LLMRole,
    LLMStatusCode,
)


async def run(requests: int, layers: int, tokens: int, kv_heads: int, head_dim: int) -> None:
    prompt_desc = CacheDesc(2 * layers, [requests, tokens, kv_heads, head_dim],
                            DataType.DT_FLOAT16)
    # The decoder's running batch has one slot more than this prefill batch fills.
    decode_desc = CacheDesc(2 * layers, [requests + 1, tokens, kv_heads, head_dim],
                            DataType.DT_FLOAT16)
    pool = decode_desc.size * decode_desc.num_tensors + (4 << 20)
    # Lets linked peers write into this cluster's caches; keys then go by cache id.
    options = engine_options(pool, remote_cache_accessible=True)
    async with two_daemons(pool + (8 << 20)) as (prefill_daemon, decode_daemon), \
            LLMDataDist(LLMRole.PROMPT, PROMPT_CLUSTER,
                        daemon=prefill_daemon.client_target) as prompt, \
            LLMDataDist(LLMRole.DECODER, DECODE_CLUSTER,
                        daemon=decode_daemon.client_target) as decoder:
        await prompt.init(options)
        await decoder.init(options)
        dst = await decoder.cache_manager.allocate_cache(decode_desc)
        before = [slot_bytes(dst, i, 0) for i in range(decode_desc.num_tensors)]
        # The scheduler's message to the prefill side: "request r goes to slot s
        # of cache dst.cache_id on cluster DECODE_CLUSTER" (slot 0 stays busy).
        slots = [requests - r for r in range(requests)]

        # The pushing side links: links are one-sided, and a push needs the link
        # from the writer to the cluster whose memory it writes.
        status, per_cluster = await prompt.link_clusters(
            [link_info(DECODE_CLUSTER, decode_daemon.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS, per_cluster

        src = await prompt.cache_manager.allocate_cache(prompt_desc)
        fill_random(src, np.random.default_rng(4), np.uint16)  # "prefill": K/V of every prompt

        started = time.perf_counter()
        split = layers // 2 or layers
        parts = [p for p in (range(split), range(split, layers)) if p]
        for request, slot in enumerate(slots):
            key = CacheKeyByIdAndIndex(DECODE_CLUSTER, dst.cache_id, batch_index=slot)
            if request == 0:
                # A request can go in layer ranges, e.g. the layers computed so far.
                for part in parts:
                    await prompt.cache_manager.push_cache(key, src, request, part, part)
            else:  # both ranges default to every layer of the source
                await prompt.cache_manager.push_cache(key, src, src_batch_index=request)
        elapsed = time.perf_counter() - started

        for i in range(prompt_desc.num_tensors):
            for request, slot in enumerate(slots):
                if slot_bytes(dst, i, slot) != slot_bytes(src, i, request):
                    raise SystemExit(f"request {request} tensor {i} differs after the push")
            if slot_bytes(dst, i, 0) != before[i]:
                raise SystemExit(f"tensor {i}: the busy slot 0 was overwritten")
        total = prompt_desc.size * prompt_desc.num_tensors
        print(f"verified {requests} requests x {prompt_desc.num_tensors} tensors, "
              f"{total / 2**20:.1f} MiB, byte-exact; decoder slot 0 untouched")
        print(f"push_cache over tcp into decoder slots {slots} in {elapsed * 1e3:.1f} ms "
              f"({total / elapsed / 1e9:.2f} GB/s); request 0 in {len(parts)} layer range(s)")
        # Pushed slots belong to the decoder: it reuses them when requests finish.
        await prompt.cache_manager.deallocate_cache(src)
        await prompt.unlink_clusters([link_info(DECODE_CLUSTER, decode_daemon.peer_address)],
                                     timeout=5000)
        await decoder.cache_manager.deallocate_cache(dst)


def main() -> None:
    parser = example_parser(__doc__)
    parser.add_argument("--requests", type=int, default=3, help="prompts in the prefill batch")
    parser.add_argument("--layers", type=int, default=4, help="model layers (K and V each)")
    parser.add_argument("--tokens", type=int, default=128, help="prompt length")
    add_head_args(parser, kv_heads=8)
    args = parser.parse_args()
    uvloop.run(run(args.requests, args.layers, args.tokens, args.kv_heads, args.head_dim))


if __name__ == "__main__":
    main()
