"""Layer-wise KV transfer that overlaps the prefill's compute (transfer_cache_async).

A prefill forward pass produces the KV cache one layer at a time. Instead of
pushing the whole cache after the last layer, ``transfer_cache_async`` asks a
``LayerSynchronizer`` when each layer is ready and sends it at once, while the
model computes the next layer: only the last layer's transfer remains after
the forward pass. Here the synchronizer simulates the forward pass (a sleep
per layer, then the layer's K/V written into the cache) and notes which
layers had already reached the decoder while a later one was being computed.

    python examples/layerwise_transfer.py [--layers 8] [--tokens 128] [--layer-ms 15]
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
    Cache,
    CacheDesc,
    CacheKeyByIdAndIndex,
    DataType,
    LayerSynchronizer,
    LLMDataDist,
    LLMRole,
    LLMStatusCode,
    TransferWithCacheKeyConfig,
)

SLOT = 1


class ForwardPass(LayerSynchronizer):
    """Stands in for the model: "computes" layer after layer into the source cache.

    A blocking ``synchronize_layer`` runs in a worker thread: the loop keeps sending.
    """

    def __init__(self, src: Cache, dst: Cache, layer_ms: float) -> None:
        self.src, self.dst, self.layer_s = src, dst, layer_ms / 1000
        self.rng = np.random.default_rng(6)
        self.landed_during_compute = 0
        self.finished_at = 0.0  # perf_counter() when the last layer was ready

    def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
        time.sleep(self.layer_s)  # the layer's attention and MLP
        # Its K and V land in the source cache once the layer is computed.
        fill_random(self.src, self.rng, tensors=(2 * layer_index, 2 * layer_index + 1))
        # Both clusters live in this process, so we can peek at the decoder's
        # memory: did the previous layer arrive while this one was computed?
        previous = 2 * layer_index - 1
        if layer_index and slot_bytes(self.dst, previous, SLOT) == bytes(
                self.src.tensor_view(previous)):
            self.landed_during_compute += 1
        self.finished_at = time.perf_counter()
        return True  # False would stop the task: the model failed


async def run(layers: int, tokens: int, kv_heads: int, head_dim: int, layer_ms: float) -> None:
    src_desc = CacheDesc(2 * layers, [1, tokens, kv_heads, head_dim], DataType.DT_FLOAT16)
    dst_desc = CacheDesc(2 * layers, [2, tokens, kv_heads, head_dim], DataType.DT_FLOAT16)
    pool = dst_desc.size * dst_desc.num_tensors + (4 << 20)
    # Layer-wise transfers write remote caches.
    options = engine_options(pool, remote_cache_accessible=True)
    async with two_daemons(pool + (8 << 20)) as (prefill_daemon, decode_daemon), \
            LLMDataDist(LLMRole.PROMPT, PROMPT_CLUSTER,
                        daemon=prefill_daemon.client_target) as prompt, \
            LLMDataDist(LLMRole.DECODER, DECODE_CLUSTER,
                        daemon=decode_daemon.client_target) as decoder:
        await prompt.init(options)
        await decoder.init(options)
        dst = await decoder.cache_manager.allocate_cache(dst_desc)  # the decoder's batch
        status, per_cluster = await prompt.link_clusters(  # the sender links
            [link_info(DECODE_CLUSTER, decode_daemon.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS, per_cluster
        src = await prompt.cache_manager.allocate_cache(src_desc)

        # One config per destination; every layer of the prompt into slot SLOT.
        key = CacheKeyByIdAndIndex(DECODE_CLUSTER, dst.cache_id, batch_index=SLOT)
        config = TransferWithCacheKeyConfig(key, src_layer_range=range(layers),
                                            dst_layer_range=range(layers))
        forward = ForwardPass(src, dst, layer_ms)
        started = time.perf_counter()
        task = prompt.cache_manager.transfer_cache_async(src, forward, [config])
        # A timeout only stops waiting, never the task: layer 0 is still computing.
        early = await task.synchronize(0)
        done = await task.synchronize(30000)  # ms, or None to wait however long it takes
        ended = time.perf_counter()
        results = await task  # one status per config, like task.get_results()
        if done != LLMStatusCode.LLM_SUCCESS or results != [LLMStatusCode.LLM_SUCCESS]:
            raise SystemExit(f"the transfer failed: {done}, {results}")

        for i in range(src_desc.num_tensors):
            if slot_bytes(dst, i, SLOT) != bytes(src.tensor_view(i)):
                raise SystemExit(f"tensor {i} differs after the layer-wise transfer")
        # For comparison: compute everything first, then push the whole cache.
        pushed = time.perf_counter()
        await prompt.cache_manager.push_cache(key, src)
        push_s = time.perf_counter() - pushed
        total = src_desc.size * src_desc.num_tensors
        forward_ms = (forward.finished_at - started) * 1e3
        print(f"verified {layers} layers x (K, V), {total / 2**20:.1f} MiB, byte-exact; "
              f"synchronize(0) while computing: {early.name}")
        print(f"layer-wise over tcp: {forward.landed_during_compute} of {layers - 1} layers "
              f"landed while the next was computing; forward pass {forward_ms:.0f} ms, "
              f"then {(ended - forward.finished_at) * 1e3:.1f} ms until the last layer "
              f"landed (pushing the whole cache after the pass: {push_s * 1e3:.1f} ms)")
        await prompt.cache_manager.deallocate_cache(src)
        await prompt.unlink_clusters([link_info(DECODE_CLUSTER, decode_daemon.peer_address)],
                                     timeout=5000)
        await decoder.cache_manager.deallocate_cache(dst)


def main() -> None:
    parser = example_parser(__doc__)
    parser.add_argument("--layers", type=int, default=8, help="model layers (K and V each)")
    parser.add_argument("--tokens", type=int, default=128, help="prompt length")
    add_head_args(parser, kv_heads=8)
    parser.add_argument("--layer-ms", type=float, default=15.0,
                        help="simulated compute time per layer")
    args = parser.parse_args()
    uvloop.run(run(args.layers, args.tokens, args.kv_heads, args.head_dim, args.layer_ms))


if __name__ == "__main__":
    main()
