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

import argparse
import json
import time

import numpy as np
import uvloop

from hixl_client import (
    Cache,
    CacheDesc,
    CacheKeyByIdAndIndex,
    DataType,
    LayerSynchronizer,
    LLMClusterInfo,
    LLMConfig,
    LLMDataDist,
    LLMRole,
    LLMStatusCode,
    TransferWithCacheKeyConfig,
)
from hixl_service.testing import DaemonProcess, start_daemon

PROMPT_CLUSTER, DECODE_CLUSTER, SLOT = 1, 2, 1


def engine_options(pool_bytes: int) -> dict[str, str]:
    config = LLMConfig()
    config.enable_cache_manager = True
    config.enable_remote_cache_accessible = True  # layer-wise transfers write remote caches
    config.mem_pool_cfg = json.dumps({"memory_size": pool_bytes})
    config.sync_kv_timeout = 10000
    return config.generate_options()


def link_info(remote_cluster_id: int, remote: DaemonProcess) -> LLMClusterInfo:
    host, port = remote.peer_address.rsplit(":", 1)
    info = LLMClusterInfo()
    info.remote_cluster_id = remote_cluster_id
    info.append_local_ip_info("127.0.0.1", 0)
    info.append_remote_ip_info(host, int(port))
    return info


def slot_bytes(cache: Cache, tensor: int, slot: int) -> bytes:
    per_slot = cache.cache_desc.size // cache.cache_desc.shape[0]
    return bytes(cache.tensor_view(tensor)[slot * per_slot:(slot + 1) * per_slot])


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
        for tensor in (2 * layer_index, 2 * layer_index + 1):  # its K and V
            view = np.frombuffer(self.src.tensor_view(tensor), dtype=np.uint8)
            view[:] = self.rng.integers(0, 256, view.size, dtype=np.uint8)
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
    async with start_daemon(pool__max_bytes=pool + (8 << 20)) as prefill_daemon, \
            start_daemon(pool__max_bytes=pool + (8 << 20)) as decode_daemon, \
            LLMDataDist(LLMRole.PROMPT, PROMPT_CLUSTER,
                        daemon=prefill_daemon.client_target) as prompt, \
            LLMDataDist(LLMRole.DECODER, DECODE_CLUSTER,
                        daemon=decode_daemon.client_target) as decoder:
        await prompt.init(engine_options(pool))
        await decoder.init(engine_options(pool))
        dst = await decoder.cache_manager.allocate_cache(dst_desc)  # the decoder's batch
        status, per_cluster = await prompt.link_clusters(  # the sender links
            [link_info(DECODE_CLUSTER, decode_daemon)], timeout=5000)
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
        await prompt.unlink_clusters([link_info(DECODE_CLUSTER, decode_daemon)], timeout=5000)
        await decoder.cache_manager.deallocate_cache(dst)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8, help="model layers (K and V each)")
    parser.add_argument("--tokens", type=int, default=128, help="prompt length")
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--layer-ms", type=float, default=15.0,
                        help="simulated compute time per layer")
    args = parser.parse_args()
    uvloop.run(run(args.layers, args.tokens, args.kv_heads, args.head_dim, args.layer_ms))


if __name__ == "__main__":
    main()
