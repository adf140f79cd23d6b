"""The main job: a prefill-to-decode KV-cache transfer between two daemons.

Starts two real ``hixl-serviced`` daemons on this machine with the embedded
defaults (only the ports are ephemeral and the sockets private, so the demo
never collides with a daemon that is already running), fills a KV cache
shaped like a Llama-3-8B prompt on the prefill side, pulls it on the decode
side over the TCP data plane, verifies every byte and prints the throughput.

    python examples/prefill_decode.py [--layers 32] [--tokens 2048] [--no-uvloop]
"""

from __future__ import annotations

import asyncio
import statistics
import time

import numpy as np
import uvloop
from _common import (
    DECODE_CLUSTER,
    PROMPT_CLUSTER,
    add_head_args,
    engine_options,
    example_parser,
    link_info,
    two_daemons,
)

from hixl_client import (
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    DataType,
    LLMDataDist,
    LLMRole,
    LLMStatusCode,
)

EMBEDDED_POOL_BUDGET = 1 << 30  # the daemon's default pool.max_bytes


async def run(layers: int, tokens: int, kv_heads: int, head_dim: int, repeats: int) -> None:
    desc = CacheDesc(2 * layers, [1, tokens, kv_heads, head_dim], DataType.DT_FLOAT16)
    total = desc.size * desc.num_tensors
    pool_bytes = total + (64 << 20)
    print(f"KV cache: {layers} layers x (K, V) of {[1, tokens, kv_heads, head_dim]} fp16 "
          f"= {total / 2**20:.0f} MiB")
    options = engine_options(pool_bytes, device_id=0, sync_kv_timeout=30000)
    # The embedded defaults, but for a pool budget large enough for long prompts.
    budget = pool_bytes if pool_bytes > EMBEDDED_POOL_BUDGET else None
    async with two_daemons(budget) as (prefill_daemon, decode_daemon):
        print(f"prefill daemon {prefill_daemon.daemon_id} peers at {prefill_daemon.peer_address}")
        print(f"decode daemon  {decode_daemon.daemon_id} peers at {decode_daemon.peer_address}")
        async with LLMDataDist(LLMRole.PROMPT, PROMPT_CLUSTER,
                               daemon=prefill_daemon.client_target) as prompt, \
                LLMDataDist(LLMRole.DECODER, DECODE_CLUSTER,
                            daemon=decode_daemon.client_target) as decoder:
            await prompt.init(options)
            await decoder.init(options)

            key = CacheKey(PROMPT_CLUSTER, req_id=1)
            src = await prompt.cache_manager.allocate_cache(desc, [key])
            rng = np.random.default_rng(7)
            for i in range(desc.num_tensors):  # "prefill": write K/V straight into the pool
                view = np.frombuffer(src.tensor_view(i), dtype=np.uint64)
                view[:] = rng.integers(0, 2**63, view.size, dtype=np.uint64)
            dst = await decoder.cache_manager.allocate_cache(desc)

            info = link_info(PROMPT_CLUSTER, prefill_daemon.peer_address)
            status, _ = await decoder.link_clusters([info], timeout=5000)
            assert status == LLMStatusCode.LLM_SUCCESS, status

            seconds = []
            by_id = CacheKeyByIdAndIndex(PROMPT_CLUSTER, src.cache_id, 0)
            for _ in range(repeats):  # pulls by id leave the prompt cache in place
                started = time.perf_counter()
                await decoder.cache_manager.pull_cache(by_id, dst)
                seconds.append(time.perf_counter() - started)
            started = time.perf_counter()
            await decoder.cache_manager.pull_cache(key, dst)  # by key: drops the key after
            seconds.append(time.perf_counter() - started)

            for i in range(desc.num_tensors):
                if bytes(src.tensor_view(i)) != bytes(dst.tensor_view(i)):
                    raise SystemExit(f"tensor {i} differs after the pull")
            median = statistics.median(seconds)
            print(f"verified {desc.num_tensors} tensors, {total / 2**20:.0f} MiB, byte-exact")
            print(f"pull: median {median * 1e3:.1f} ms over {len(seconds)} pulls = "
                  f"{total / median / 1e9:.2f} GB/s (best {total / min(seconds) / 1e9:.2f} GB/s)")
            await prompt.cache_manager.deallocate_cache(src)
            await decoder.cache_manager.deallocate_cache(dst)


def main() -> None:
    parser = example_parser(__doc__)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=2048)
    add_head_args(parser, kv_heads=8)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--no-uvloop", action="store_true", help="use asyncio's default loop")
    args = parser.parse_args()
    job = run(args.layers, args.tokens, args.kv_heads, args.head_dim, args.repeats)
    if args.no_uvloop:
        asyncio.run(job)
    else:
        uvloop.run(job)


if __name__ == "__main__":
    main()
