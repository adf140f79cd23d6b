"""Daemons on either backend for end-to-end tests, and tensor I/O that works on both.

A "hccl" daemon runs the Ascend backend against the CANN test double (its
device memory is host memory in the double, but nothing here relies on that:
tensors are written and read with ACL copies, as a user would with torch_npu).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hixl_client import Cache
from hixl_service.testing import DaemonProcess
from tests.clusters import cluster_info, cluster_options

from .conftest import DOUBLE_ENV

__all__ = ["BACKENDS", "TensorIO", "cluster_info", "daemon_process", "options"]

BACKENDS = ("host", "hccl")
POOL_BYTES = 16 << 20


def daemon_process(backend: str, double_dir: Path, env: dict[str, str] | None = None,
                   **overrides: Any) -> DaemonProcess:
    """A daemon (not started) on ``backend``; the hccl one loads the double."""
    settings: dict[str, Any] = {"pool__max_bytes": "256MiB"}
    extra = dict(DOUBLE_ENV)
    if backend == "hccl":
        # 1 MB HCCL buffers: each link's communicator takes 2 MiB of the budget
        settings.update(pool__backend="hccl", ascend__cann_path=str(double_dir),
                        ascend__devices=[0, 1], ascend__device_pool_max_bytes="48MiB",
                        ascend__hccl_buffer_mb=1)
    extra.update(env or {})
    settings.update(overrides)
    return DaemonProcess(env=extra, **settings)


def options(device_id: int = 0, pool_bytes: int = POOL_BYTES, host_pool_bytes: int = 0,
            sync_kv_timeout: int | None = None,
            remote_accessible: bool | None = None) -> dict[str, str]:
    return cluster_options(pool_bytes, device_id=device_id, host_pool_bytes=host_pool_bytes,
                           sync_kv_timeout=sync_kv_timeout, remote_accessible=remote_accessible)


class TensorIO:
    """Writes and reads cache tensors on either backend.

    Host caches through their zero-copy views; device caches through ACL
    copies at their ``tensor_addrs`` (``unsafe_memcpy`` from a page-locked
    staging buffer), which is what a torch_npu user does.
    """

    def write(self, cache: Cache, index: int, data: bytes, offset: int = 0) -> None:
        if not self._on_device(cache):
            cache.tensor_view(index)[offset:offset + len(data)] = data
            return
        from hixl_native import _ascend

        device = self._device(cache)
        with device.malloc_host(len(data)) as staging:
            memoryview(staging)[:] = data
            _ascend.unsafe_memcpy(device, cache.tensor_addrs[index] + offset, staging.address,
                                  len(data), _ascend.MemcpyKind.HOST_TO_DEVICE)

    def read(self, cache: Cache, index: int, nbytes: int | None = None,
             offset: int = 0) -> bytes:
        size = cache.cache_desc.size - offset if nbytes is None else nbytes
        if not self._on_device(cache):
            return bytes(cache.tensor_view(index)[offset:offset + size])
        from hixl_native import _ascend

        device = self._device(cache)
        with device.malloc_host(size) as staging:
            _ascend.unsafe_memcpy(device, staging.address, cache.tensor_addrs[index] + offset,
                                  size, _ascend.MemcpyKind.DEVICE_TO_HOST)
            return bytes(memoryview(staging))

    @staticmethod
    def _on_device(cache: Cache) -> bool:
        pool = cache._pool
        return pool is not None and pool.device is not None

    @staticmethod
    def _device(cache: Cache) -> Any:
        assert cache._pool is not None and cache._pool.device is not None
        return cache._pool.device.device  # the Device the pool was imported on
