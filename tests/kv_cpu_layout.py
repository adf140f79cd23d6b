"""vLLM's CPU KV layout written with numpy, for tests: ``python -m tests.kv_cpu_layout``
run by vLLM's interpreter checks it against vLLM's own kernel."""

from __future__ import annotations

import numpy as np

from hixl_client.vllm._kv_map import KvShape


def cpu_layout(shape: KvShape, num_blocks: int, keys: np.ndarray, values: np.ndarray,
               table: list[int], first_token: int = 0) -> np.ndarray:
    """A layer's KV, ``[num_blocks, heads, block_size, 2 * head_size]`` of uint16,
    with tokens ``first_token + i`` (``keys[i]`` and ``values[i]``, each
    ``[heads, head_size]``) in blocks ``table``, the first starting at
    ``first_token``: per (block, head) K transposed, then V, as vLLM's CPU
    attention kernels write them."""
    bs, heads, head_size = shape.block_size, shape.num_kv_heads, shape.head_size
    kv = np.zeros((num_blocks, heads, 2 * bs * head_size), dtype=np.uint16)
    for i in range(len(keys)):
        token = first_token + i
        block, slot = table[(token - first_token) // bs], token % bs
        kv[block, :, : bs * head_size].reshape(heads, head_size, bs)[:, :, slot] = keys[i]
        kv[block, :, bs * head_size:].reshape(heads, bs, head_size)[:, slot, :] = values[i]
    return kv.reshape(num_blocks, heads, bs, 2 * head_size)


def _check_against_vllm() -> None:
    """Write random tokens with vLLM's ``cpu_attn_reshape_and_cache`` (each ISA
    kernel whose layout the run view assumes) and with :func:`cpu_layout`, for
    two block sizes, and compare the bytes."""
    import torch
    from vllm import _custom_ops as ops

    heads, head_size, count = 2, 32, 200
    generator = torch.Generator().manual_seed(3)
    keys = torch.randn(count, heads, head_size, generator=generator).to(torch.bfloat16)
    values = torch.randn(count, heads, head_size, generator=generator).to(torch.bfloat16)
    for isa in ("vec", "vec16"):
        for block_size in (32, 64):
            num_blocks = 8
            table = [5, 2, 7, 0, 3, 1, 6][: -(-count // block_size)]
            kv = torch.zeros(num_blocks, heads, block_size, 2 * head_size, dtype=torch.bfloat16)
            key_cache, value_cache = kv.view(num_blocks, heads, 2 * block_size,
                                             head_size).chunk(2, dim=2)
            slots = torch.tensor([table[t // block_size] * block_size + t % block_size
                                  for t in range(count)], dtype=torch.int64)
            ops.cpu_attn_reshape_and_cache(keys, values, key_cache, value_cache, slots, isa,
                                           k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")
            ours = cpu_layout(KvShape(block_size, heads, head_size, 2), num_blocks,
                              keys.view(torch.uint16).numpy(), values.view(torch.uint16).numpy(),
                              table)
            assert np.array_equal(kv.view(torch.uint16).numpy(), ours), (isa, block_size)
    print("cpu_layout matches vLLM's kernels")


if __name__ == "__main__":
    _check_against_vllm()
