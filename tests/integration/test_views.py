"""Zero-copy views of pool caches for integrators: numpy (bf16 included), DLPack, torch."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hixl_client import (
    Cache,
    CacheDesc,
    DataType,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
)
from hixl_service.testing import DaemonProcess

from .conftest import options

pytestmark = pytest.mark.asyncio


async def _cache(daemon: DaemonProcess, cluster_id: int, desc: CacheDesc) -> tuple[LLMDataDist,
                                                                                   Cache]:
    dd = LLMDataDist(LLMRole.PROMPT, cluster_id, daemon=daemon.client_target)
    await dd.init(options(pool_bytes=8 * 2**20))
    return dd, await dd.cache_manager.allocate_cache(desc)


async def test_bf16_tensors_read_as_bfloat16(prefill_daemon: DaemonProcess,
                                            next_cluster_id) -> None:  # type: ignore[no-untyped-def]
    dd, cache = await _cache(prefill_daemon, next_cluster_id(),
                             CacheDesc(2, [4, 8], DataType.DT_BF16))
    try:
        # exact in bfloat16, so its bytes are the top half of each float32
        values = (np.arange(-16, 16, dtype=np.float32) * 0.25).reshape(4, 8)
        view = cache.numpy(1)
        assert view.dtype == np.dtype(ml_dtypes.bfloat16) and view.shape == (4, 8)
        view[...] = values.astype(ml_dtypes.bfloat16)
        raw = np.frombuffer(cache.tensor_view(1), dtype=np.uint16).reshape(4, 8)
        assert (raw == (values.view(np.uint32) >> 16).astype(np.uint16)).all()
        assert (cache.numpy(1).astype(np.float32) == values).all()
    finally:
        await dd.finalize()


async def test_dlpack_exports_every_tensor_zero_copy(prefill_daemon: DaemonProcess,
                                                    next_cluster_id) -> None:  # type: ignore[no-untyped-def]
    dd, cache = await _cache(prefill_daemon, next_cluster_id(),
                             CacheDesc(3, [2, 5], DataType.DT_FLOAT))
    try:
        assert cache.__dlpack_device__() == (1, 0)
        stacked = np.from_dlpack(cache)
        assert stacked.shape == (3, 2, 5) and stacked.dtype == np.float32
        for i in range(3):
            cache.numpy(i)[...] = i + 0.5
        assert [float(stacked[i, 1, 4]) for i in range(3)] == [0.5, 1.5, 2.5]
        await dd.cache_manager.deallocate_cache(cache)
        with pytest.raises(BufferError, match="no host memory"):
            np.from_dlpack(cache)
    finally:
        await dd.finalize()


async def test_bf16_and_string_caches_are_refused_by_dlpack(prefill_daemon: DaemonProcess,
                                                           next_cluster_id) -> None:  # type: ignore[no-untyped-def]
    dd, cache = await _cache(prefill_daemon, next_cluster_id(),
                             CacheDesc(1, [16], DataType.DT_BF16))
    try:
        with pytest.raises(BufferError, match=r"Cache\.torch"):
            np.from_dlpack(cache)
    finally:
        await dd.finalize()


async def test_torch_views_share_the_pool(prefill_daemon: DaemonProcess,
                                         next_cluster_id) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    dd, cache = await _cache(prefill_daemon, next_cluster_id(),
                             CacheDesc(2, [3, 4], DataType.DT_BF16))
    try:
        tensor = cache.torch(0)
        assert tensor.dtype == torch.bfloat16 and tuple(tensor.shape) == (3, 4)
        tensor.fill_(1.5)
        assert float(cache.numpy(0)[2, 3]) == 1.5  # same bytes
        floats = await dd.cache_manager.allocate_cache(CacheDesc(2, [3, 4], DataType.DT_INT32))
        floats.numpy(0)[...] = 0
        stacked = torch.from_dlpack(floats)
        assert stacked.dtype == torch.int32 and tuple(stacked.shape) == (2, 3, 4)
        stacked[1].fill_(7)
        assert int(floats.numpy(1)[0, 0]) == 7 and int(floats.torch(0)[0, 0]) == 0
    finally:
        await dd.finalize()


async def test_bf16_view_needs_ml_dtypes(prefill_daemon: DaemonProcess, next_cluster_id,  # type: ignore[no-untyped-def]
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    dd, cache = await _cache(prefill_daemon, next_cluster_id(),
                             CacheDesc(1, [8], DataType.DT_BF16))
    try:
        monkeypatch.setitem(__import__("sys").modules, "ml_dtypes", None)  # as if not installed
        with pytest.raises(LLMException, match="ml_dtypes") as raised:
            cache.numpy(0)
        assert raised.value.status_code == LLMStatusCode.LLM_FEATURE_NOT_ENABLED
    finally:
        await dd.finalize()
