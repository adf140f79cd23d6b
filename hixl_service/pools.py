"""The daemon's pools: each made by the memory backend of its placement.

Each initialized cluster gets its pools from LLM-DataDist's ``mem_pool_cfg``
(placement DEVICE) and ``host_mem_pool_cfg`` (placement HOST). HOST pools,
and DEVICE pools on the host backend, are memfd mappings (``memory.host``);
on the hccl backend DEVICE pools are device memory (``memory.device``).
Clients' buffers are made by the same backends: shareable host buffers by
the host one, exported device buffers by the DEVICE placement's.
"""

from __future__ import annotations

import itertools
import logging
import secrets

from hixl_wire.types import Placement

from .memory.base import MemoryBackend, Pool, PoolSpec, UserBuffer
from .memory.host import HostBackend

logger = logging.getLogger(__name__)


class PoolManager:
    """Creates pools through their backends and hands out their fds."""

    def __init__(self, host: HostBackend, device: MemoryBackend | None = None) -> None:
        self._host = host
        # DEVICE pools: device memory on the hccl backend, else host memory too.
        self._backends: dict[Placement, MemoryBackend] = {
            Placement.HOST: host, Placement.DEVICE: device if device is not None else host}
        self._ids = itertools.count(1)
        self._pools: dict[int, Pool] = {}
        self._backend_of: dict[int, MemoryBackend] = {}

    @property
    def budget_bytes(self) -> int:
        return self._host.budget_bytes

    @property
    def reserved_bytes(self) -> int:
        """Host memory held by pools (device pools count against their device's budget)."""
        return self._host.reserved_bytes

    def pools(self) -> list[Pool]:
        return list(self._pools.values())

    async def create(self, cluster_id: int, placement: Placement, spec: PoolSpec,
                     device_id: int = 0) -> Pool:
        """Create a pool, or raise LLM_OUT_OF_MEMORY when the budget cannot hold it."""
        backend = self._backends[placement]
        pool = await backend.create(next(self._ids), cluster_id, placement, spec, device_id)
        self._pools[pool.pool_id] = pool
        self._backend_of[pool.pool_id] = backend
        logger.info("pool %d for cluster %d: %s%s, %d bytes, page %d", pool.pool_id, cluster_id,
                    placement.name, backend.describe(pool), pool.size, pool.allocator.page_size)
        return pool

    async def map_buffer(self, buffer_id: int, cluster_id: int, fd: int,
                         size: int) -> UserBuffer:
        """Map a client's shareable host buffer (page-locked where host memory is)."""
        return await self._host.map_buffer(buffer_id, cluster_id, fd, size)

    async def import_buffer(self, buffer_id: int, cluster_id: int, cluster_device: int,
                            key: str, size: int, buffer_device: int) -> UserBuffer:
        """Import a client's exported device buffer, or LLM_FEATURE_NOT_ENABLED
        where DEVICE memory is host memory (the host backend)."""
        return await self._backends[Placement.DEVICE].import_buffer(
            buffer_id, cluster_id, cluster_device, key, size, buffer_device)

    def get(self, pool_id: int) -> Pool:
        return self._pools[pool_id]

    def take_fd(self, token: bytes) -> int | None:
        """Return the fd of the host pool a token names, or None for an unknown token.

        Tokens stay valid for the pool's life: a client may map a pool again
        (for example after a fork-free restart of its mapping code).
        """
        for pool in self._pools.values():
            if secrets.compare_digest(pool.fd_token, token):
                return pool.fd
        return None

    async def destroy(self, pool: Pool) -> None:
        """Free a pool once no transfer uses it; clients keep their own mapping of host pools."""
        self._pools.pop(pool.pool_id, None)
        backend = self._backend_of.pop(pool.pool_id, None)
        pool.closed = True
        await pool.wait_unpinned()
        if backend is not None:
            await backend.release(pool)
        logger.info("pool %d of cluster %d freed", pool.pool_id, pool.cluster_id)
