"""Device pools (the hccl backend): ACL device memory on the cluster's device,
within that device's budget, exported to attached clients with ACL IPC."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hixl_wire.types import Placement

from ..memory.base import Pool, PoolSpec

if TYPE_CHECKING:
    from .backend import AscendBackend


class AscendMemory:
    """The device pool backend; device budgets are kept per device by CANN's side."""

    reserved_bytes = 0  # device pools count against their device's budget, not the host's

    def __init__(self, ascend: AscendBackend) -> None:
        self._ascend = ascend

    def describe(self, pool: Pool) -> str:
        assert pool.device_buffer is not None
        return f" on device {pool.device_buffer.device.id}"

    async def create(self, pool_id: int, cluster_id: int, placement: Placement,
                     spec: PoolSpec, device_id: int) -> Pool:
        buffer, allocator = await self._ascend.create_pool(device_id, spec.memory_size,
                                                           spec.page_shift, cluster_id)
        return Pool(pool_id, cluster_id, placement, allocator, device=buffer, size=buffer.size)

    async def release(self, pool: Pool) -> None:
        await self._ascend.release_pool(pool)
