"""Transfer KV caches that live in the inference framework's own memory (register_cache).

Frameworks usually allocate their KV cache themselves, as one big tensor.
Instead of copying it into a hixl pool, each side describes that memory as a
cache with ``register_cache``. On the host backend the daemon must be able to
map the memory, so the framework allocates it with
``hixl_client.alloc_shareable`` and builds its arrays over it
(``buf.numpy(...)``, or ``torch.frombuffer(buf.view(), ...)``). hixl never
frees registered memory: ``unregister_cache`` only stops sharing it.

    python examples/register_memory.py [--requests 2] [--layers 4] [--tokens 128]
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
    ShareableBuffer,
    alloc_shareable,
)


def tensor_addrs(buffer: ShareableBuffer, desc: CacheDesc) -> list[int]:
    """Where each K/V tensor starts: the framework's [tensor, batch, ...] layout."""
    return [buffer.address + i * desc.size for i in range(desc.num_tensors)]


async def run(requests: int, layers: int, tokens: int, kv_heads: int, head_dim: int) -> None:
    desc = CacheDesc(2 * layers, [requests, tokens, kv_heads, head_dim], DataType.DT_FLOAT16)
    layout = (desc.num_tensors, requests, tokens, kv_heads, head_dim)
    # The frameworks' KV memory, one buffer per side (normally in two processes).
    prompt_buffer = alloc_shareable(desc.size * desc.num_tensors)
    decode_buffer = alloc_shareable(desc.size * desc.num_tensors)
    prompt_kv = prompt_buffer.numpy(np.uint16, layout)  # fp16 bits: compared exactly
    decode_kv = decode_buffer.numpy(np.uint16, layout)
    prompt_kv[...] = np.random.default_rng(9).integers(0, 2**16, layout, dtype=np.uint16)
    # Registered caches take no pool memory; the pool only needs to exist.
    options = engine_options(1 << 20)
    async with two_daemons(16 << 20) as (prefill_daemon, decode_daemon), \
            LLMDataDist(LLMRole.PROMPT, PROMPT_CLUSTER,
                        daemon=prefill_daemon.client_target) as prompt, \
            LLMDataDist(LLMRole.DECODER, DECODE_CLUSTER,
                        daemon=decode_daemon.client_target) as decoder:
        await prompt.init(options)
        await decoder.init(options)
        keys = [CacheKey(PROMPT_CLUSTER, req_id=500 + r) for r in range(requests)]
        src = await prompt.cache_manager.register_cache(
            desc, tensor_addrs(prompt_buffer, desc), keys)
        # Register before linking, as LLM-DataDist's documentation asks (its
        # device transports exchange registered memory when a link is built).
        # hixl looks caches up per transfer and accepts either order.
        dst = await decoder.cache_manager.register_cache(desc, tensor_addrs(decode_buffer, desc))
        status, per_cluster = await decoder.link_clusters(
            [link_info(PROMPT_CLUSTER, prefill_daemon.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS, per_cluster

        started = time.perf_counter()
        for request, key in enumerate(keys):  # straight into the decoder's own arrays
            await decoder.cache_manager.pull_cache(key, dst, batch_index=request)
        elapsed = time.perf_counter() - started
        if not np.array_equal(decode_kv, prompt_kv):
            raise SystemExit("the decoder's memory differs from the prefill's")

        # A registered cache keeps its keys after a pull: the framework, not hixl,
        # decides when the memory is reused. Pull request 0 again into slot 1.
        await decoder.cache_manager.pull_cache(keys[0], dst, batch_index=min(1, requests - 1))
        if not np.array_equal(decode_kv[:, min(1, requests - 1)], prompt_kv[:, 0]):
            raise SystemExit("the second pull of request 0 differs")
        # Unregistering stops sharing; the keys go with it, the memory stays ours.
        await prompt.cache_manager.unregister_cache(src.cache_id)
        try:
            await decoder.cache_manager.pull_cache(keys[0], dst)
            raise SystemExit("an unregistered cache could still be pulled")
        except LLMException as err:
            assert err.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST, err
            after = err.status_code.name
        await decoder.cache_manager.unregister_cache(dst.cache_id)
        prompt_kv[0, 0, 0, 0, 0] = 1  # still the framework's memory, writable

    total = desc.size * desc.num_tensors
    print(f"verified {requests} requests x {desc.num_tensors} tensors, "
          f"{total / 2**20:.1f} MiB, byte-exact in the decoder's own buffer")
    print(f"pull_cache between registered buffers over tcp in {elapsed * 1e3:.1f} ms; keys "
          f"survived the pull; after unregister_cache: {after}")
    del prompt_kv, decode_kv  # views must go before their buffer is unmapped
    prompt_buffer.close()
    decode_buffer.close()


def main() -> None:
    parser = example_parser(__doc__)
    parser.add_argument("--requests", type=int, default=2, help="prompts in the batch")
    parser.add_argument("--layers", type=int, default=4, help="model layers (K and V each)")
    parser.add_argument("--tokens", type=int, default=128, help="prompt length")
    add_head_args(parser, kv_heads=8)
    args = parser.parse_args()
    uvloop.run(run(args.requests, args.layers, args.tokens, args.kv_heads, args.head_dim))


if __name__ == "__main__":
    main()
