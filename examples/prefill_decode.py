"""The main job: a prefill-to-decode KV-cache transfer between two daemons.

Starts two real ``hixl-serviced`` daemons on this machine with the embedded
defaults (only the ports are ephemeral and the sockets private, so the demo
never collides with a daemon that is already running), fills a KV cache
shaped like a Llama-3-8B prompt on the prefill side, pulls it on the decode
side over the TCP data plane, verifies every byte and prints the throughput.

    python examples/prefill_decode.py [--layers 32] [--tokens 2048] [--no-uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import numpy as np
import uvloop

from hixl_client import (
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    DataType,
    LLMClusterInfo,
    LLMConfig,
    LLMDataDist,
    LLMRole,
    LLMStatusCode,
)
from hixl_service.testing import start_daemon

PROMPT_CLUSTER, DECODE_CLUSTER = 1, 2


def engine_options(pool_bytes: int) -> dict[str, str]:
    config = LLMConfig()
    config.device_id = 0
    config.enable_cache_manager = True
    config.mem_pool_cfg = json.dumps({"memory_size": pool_bytes})
    config.sync_kv_timeout = 30000
    return dict(config.generate_options())


async def run(layers: int, tokens: int, kv_heads: int, head_dim: int, repeats: int) -> None:
    desc = CacheDesc(2 * layers, [1, tokens, kv_heads, head_dim], DataType.DT_FLOAT16)
    total = desc.size * desc.num_tensors
    pool_bytes = total + (64 << 20)
    print(f"KV cache: {layers} layers x (K, V) of {[1, tokens, kv_heads, head_dim]} fp16 "
          f"= {total / 2**20:.0f} MiB")
    async with start_daemon() as prefill_daemon, start_daemon() as decode_daemon:
        print(f"prefill daemon {prefill_daemon.daemon_id} peers at {prefill_daemon.peer_address}")
        print(f"decode daemon  {decode_daemon.daemon_id} peers at {decode_daemon.peer_address}")
        async with LLMDataDist(LLMRole.PROMPT, PROMPT_CLUSTER,
                               daemon=prefill_daemon.client_target) as prompt, \
                LLMDataDist(LLMRole.DECODER, DECODE_CLUSTER,
                            daemon=decode_daemon.client_target) as decoder:
            await prompt.init(engine_options(pool_bytes))
            await decoder.init(engine_options(pool_bytes))

            key = CacheKey(PROMPT_CLUSTER, req_id=1)
            src = await prompt.cache_manager.allocate_cache(desc, [key])
            rng = np.random.default_rng(7)
            for i in range(desc.num_tensors):  # "prefill": write K/V straight into the pool
                view = np.frombuffer(src.tensor_view(i), dtype=np.uint64)
                view[:] = rng.integers(0, 2**63, view.size, dtype=np.uint64)
            dst = await decoder.cache_manager.allocate_cache(desc)

            info = LLMClusterInfo()
            info.remote_cluster_id = PROMPT_CLUSTER
            host, port = prefill_daemon.peer_address.rsplit(":", 1)
            info.append_local_ip_info("127.0.0.1", 0)
            info.append_remote_ip_info(host, int(port))
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
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
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
