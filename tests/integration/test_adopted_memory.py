"""adopt_shareable: memory the engine allocated itself, moved onto a memfd
where it lies, so the daemons map it (the zero-copy path) while the engine's
pointers stay valid: contents kept, transfers byte-exact over TCP, the memory
still the engine's after close, and the refusals."""

from __future__ import annotations

import mmap
import tempfile

import numpy as np
import pytest

from hixl_client import (
    BlocksCacheKey,
    CacheDesc,
    DataType,
    LLMException,
    LLMStatusCode,
    adopt_shareable,
)
from hixl_client.shareable import MIN_ADOPT_BYTES
from hixl_service.testing import shareable_bytes_mapped

from .conftest import Pair

RNG = np.random.default_rng(29)
LAYERS, BLOCKS, BLOCK_BYTES = 4, 96, 48 << 10  # 36 MiB: over MIN_ADOPT_BYTES


def engine_kv() -> np.ndarray:
    """A KV cache as an engine allocates it: one large numpy allocation
    (malloc's own mmap, not page-aligned), already holding bytes."""
    return RNG.integers(0, 256, (2 * LAYERS, BLOCKS, BLOCK_BYTES), dtype=np.uint8)


@pytest.mark.asyncio
async def test_adopted_engine_memory_moves_zero_copy_over_tcp(accessible: Pair) -> None:
    prompt, decoder = accessible.prompt, accessible.decoder
    desc = CacheDesc(2 * LAYERS, [BLOCKS, BLOCK_BYTES], DataType.DT_UINT8)
    kv, dst_kv = engine_kv(), np.zeros((2 * LAYERS, BLOCKS, BLOCK_BYTES), dtype=np.uint8)
    before = kv.copy()
    src_buffer = adopt_shareable(kv.ctypes.data, kv.nbytes)
    dst_buffer = adopt_shareable(dst_kv.ctypes.data, dst_kv.nbytes)
    # Whole pages around the arrays, their bytes kept where they were.
    assert src_buffer.address <= kv.ctypes.data
    assert kv.ctypes.data + kv.nbytes <= src_buffer.address + src_buffer.size
    np.testing.assert_array_equal(kv, before)
    mapped_before = shareable_bytes_mapped(accessible.prompt_daemon.pid)

    key = BlocksCacheKey(prompt.cluster_id, 1)
    src = await prompt.cache_manager.register_blocks_cache(
        desc, [kv[i].ctypes.data for i in range(2 * LAYERS)], key, remote_accessible=True)
    dst = await decoder.cache_manager.register_blocks_cache(
        desc, [dst_kv[i].ctypes.data for i in range(2 * LAYERS)])
    # Registration handed each daemon the memfd: it maps the engine's memory itself.
    assert shareable_bytes_mapped(accessible.prompt_daemon.pid) - mapped_before >= kv.nbytes
    assert shareable_bytes_mapped(accessible.decoder_daemon.pid) >= dst_kv.nbytes

    src_blocks = [int(b) for b in RNG.permutation(BLOCKS)[:50]]
    dst_blocks = [int(b) for b in RNG.permutation(BLOCKS)[:50]]
    await decoder.cache_manager.pull_blocks(key, dst, src_blocks, dst_blocks)
    np.testing.assert_array_equal(dst_kv[:, dst_blocks], kv[:, src_blocks])
    untouched = [int(b) for b in np.setdiff1d(np.arange(BLOCKS), dst_blocks)]
    assert not dst_kv[:, untouched].any()
    # The engine writes its memory as before; the next pull sees the new bytes.
    kv[:, src_blocks[0]] = 7
    await decoder.cache_manager.pull_blocks(key, dst, src_blocks[:1], [untouched[0]])
    assert (dst_kv[:, untouched[0]] == 7).all()

    await decoder.cache_manager.unregister_cache(dst.cache_id)
    await prompt.cache_manager.unregister_cache(src.cache_id)
    src_buffer.close()
    dst_buffer.close()
    # Still the engine's memory, bytes and all, written and read as before.
    expected = before.copy()
    expected[:, src_blocks[0]] = 7
    kv[:, 0] = expected[:, 0] = 3
    np.testing.assert_array_equal(kv, expected)


def test_refuses_memory_that_cannot_move() -> None:
    # Small: inside an arena of malloc (the brk heap, or a thread's arena, an
    # anonymous mapping too), its pages shared with other objects.
    for small in (np.zeros(64, dtype=np.uint8), np.zeros(MIN_ADOPT_BYTES - 4096, np.uint8)):
        with pytest.raises(LLMException) as refused:
            adopt_shareable(small.ctypes.data, small.nbytes)
        assert refused.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    with tempfile.TemporaryFile() as file:  # a file's pages are the file's
        file.truncate(MIN_ADOPT_BYTES)
        mapped = mmap.mmap(file.fileno(), MIN_ADOPT_BYTES)
        view = np.frombuffer(mapped, dtype=np.uint8)
        with pytest.raises(LLMException) as refused:
            adopt_shareable(view.ctypes.data, view.nbytes)
        assert refused.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
        del view
        mapped.close()
    with pytest.raises(ValueError):
        adopt_shareable(small.ctypes.data, 0)
