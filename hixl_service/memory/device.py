"""Device memory (the hccl backend): pools of ACL device memory on a cluster's
device, within that device's budget and exported to attached clients with ACL
IPC, and device buffers clients exported to the daemon.

Copies that touch device memory are ACL copies and its regions are reached
over HCCL only: the native data server and memcpy never see it. CANN itself
is ``ascend.backend.AscendBackend``, reached here through ``DeviceRuntime``
so that memory never imports the Ascend package.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, ClassVar, Protocol

import hixl_native

from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.types import Placement

from .base import Memory, Pool, PoolSpec, UserBuffer

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np
    from hixl_native._ascend import DeviceBuffer, DeviceMemory, ImportedBuffer


class DeviceRuntime(Protocol):
    """What device memory needs of CANN (``ascend.backend.AscendBackend``)."""

    async def create_pool(self, device_id: int, memory_size: int, page_shift: int,
                          cluster_id: int = 0) -> tuple[DeviceBuffer,
                                                        hixl_native.ExtentAllocator]: ...
    async def release_pool(self, pool: Pool) -> None: ...
    @staticmethod
    def share(pool: Pool, tgid: int) -> str: ...
    async def import_buffer(self, device_id: int, key: str, size: int,
                            cluster_id: int = 0) -> ImportedBuffer: ...
    def forget(self, memory: DeviceMemory) -> None: ...
    def copy_job(self, dst: Memory, src: Memory, triples: np.ndarray) -> Callable[[], None]: ...


class AscendMemory(Memory):
    """Memory on an Ascend device: ACL copies, HCCL transfers; host transports
    cannot reach it."""

    on_device: ClassVar[bool] = True
    copy_rank: ClassVar[int] = 2
    host_copies: ClassVar[bool] = False
    out_of_memory: ClassVar[LLMStatusCode] = LLMStatusCode.LLM_DEVICE_OUT_OF_MEMORY

    def __init__(self, cluster_id: int, placement: Placement, device: DeviceMemory,
                 runtime: DeviceRuntime) -> None:
        super().__init__(cluster_id, placement, device.size)
        self.device: DeviceMemory = device
        self._runtime = runtime

    @property
    def native(self) -> hixl_native.Mapping:
        raise LLMException("this memory is on an Ascend device; host transports "
                           "cannot reach it", status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)

    @property
    def data_handle(self) -> hixl_native.Mapping:
        return self.native

    def expose(self, server: hixl_native.DataServer, region_id: int, offset: int, size: int,
               cluster_id: int, writable: bool) -> bool:
        return False  # out of the data server's sight: HCCL's peer calls check it

    def copy_job(self, dst: Memory, src: Memory, triples: np.ndarray) -> Callable[[], object]:
        # The runtime checks alignment and devices before anything is queued.
        return self._runtime.copy_job(dst, src, triples.ravel())

    def _close(self) -> None:
        self.device.close()


class AscendPool(Pool, AscendMemory):
    """A device pool: exported device memory carved by an offset-only allocator."""

    def __init__(self, pool_id: int, cluster_id: int, placement: Placement,
                 buffer: DeviceBuffer, allocator: hixl_native.ExtentAllocator,
                 runtime: DeviceRuntime) -> None:
        AscendMemory.__init__(self, cluster_id, placement, buffer, runtime)
        self._take_pool(pool_id, allocator)
        self.device_buffer: DeviceBuffer = buffer

    async def share_with(self, tgid: int) -> str:
        return await asyncio.to_thread(self._runtime.share, self, tgid)


class AscendBuffer(UserBuffer, AscendMemory):
    """Device memory a client exported to the daemon, imported with ACL IPC and
    registered for one-sided HCCL (undone before the import is closed)."""

    close_on_drop: ClassVar[bool] = True

    def __init__(self, buffer_id: int, cluster_id: int, imported: ImportedBuffer,
                 runtime: DeviceRuntime) -> None:
        AscendMemory.__init__(self, cluster_id, Placement.DEVICE, imported, runtime)
        self._take_buffer(buffer_id)
        self.before_release = lambda: runtime.forget(imported)


class DeviceBackend:
    """The device pool backend; device budgets are kept per device by CANN's side."""

    reserved_bytes = 0  # device pools count against their device's budget, not the host's

    def __init__(self, runtime: DeviceRuntime) -> None:
        self._runtime = runtime

    def describe(self, pool: Pool) -> str:
        assert pool.device_buffer is not None
        return f" on device {pool.device_buffer.device.id}"

    async def create(self, pool_id: int, cluster_id: int, placement: Placement,
                     spec: PoolSpec, device_id: int) -> Pool:
        buffer, allocator = await self._runtime.create_pool(device_id, spec.memory_size,
                                                            spec.page_shift, cluster_id)
        return AscendPool(pool_id, cluster_id, placement, buffer, allocator, self._runtime)

    async def release(self, pool: Pool) -> None:
        await self._runtime.release_pool(pool)

    async def import_buffer(self, buffer_id: int, cluster_id: int, cluster_device: int,
                            key: str, size: int, buffer_device: int) -> UserBuffer:
        if buffer_device != cluster_device:
            raise LLMException(f"the buffer is on device {buffer_device}, the cluster on "
                               f"{cluster_device}", status_code=LLMStatusCode.LLM_PARAM_INVALID)
        imported = await self._runtime.import_buffer(buffer_device, key, size, cluster_id)
        return AscendBuffer(buffer_id, cluster_id, imported, self._runtime)
