"""Host memory the daemon maps: memfd pools within the daemon's ``pool.max_bytes``
and clients' shareable buffers, page-locked for ACL copies on the hccl backend.

Clients map the same memory through a file descriptor passed over the fd
socket, never through a name in a filesystem, so a cache's addresses are
valid in the client's own process and its views are zero-copy. Native
memcpy (``copier``) and the TCP data plane reach it directly.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

import hixl_native

from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.types import Placement

from .base import Memory, Pool, PoolSpec, UserBuffer

if TYPE_CHECKING:
    from collections.abc import Callable


class Unpinnable(Protocol):
    """Page-locked memory that can be unlocked again (``_ascend.PinnedHost``)."""

    def close(self) -> None: ...


class HostMemory(Memory):
    """A host mapping of the daemon's (a pool, a client's shareable buffer, scratch
    memory): native memcpy and the TCP data plane reach it directly."""

    def __init__(self, cluster_id: int, placement: Placement,
                 mapping: hixl_native.Mapping) -> None:
        super().__init__(cluster_id, placement, mapping.size)
        self._mapping = mapping

    @property
    def native(self) -> hixl_native.Mapping:
        return self._mapping

    @property
    def data_handle(self) -> hixl_native.Mapping:
        return self._mapping

    def expose(self, server: hixl_native.DataServer, region_id: int, offset: int, size: int,
               cluster_id: int, writable: bool) -> bool:
        server.register_region(region_id, self._mapping, offset, size, cluster_id, writable)
        return True

    def _close(self) -> None:
        self._mapping.close()


class HostPool(Pool, HostMemory):
    """A host pool: a memfd mapping carved by its own extent allocator."""

    def __init__(self, pool_id: int, cluster_id: int, placement: Placement,
                 shared: hixl_native.SharedPool) -> None:
        HostMemory.__init__(self, cluster_id, placement, shared)
        self._take_pool(pool_id, shared)
        self._shared = shared

    @property
    def fd(self) -> int:
        """The memfd clients map."""
        return self._shared.fd


class SharedBuffer(UserBuffer, HostMemory):
    """A client's shareable host buffer (``alloc_shareable``), mapped from its fd."""

    def __init__(self, buffer_id: int, cluster_id: int, mapping: hixl_native.Mapping) -> None:
        HostMemory.__init__(self, cluster_id, Placement.HOST, mapping)
        self._take_buffer(buffer_id)


class HostBackend:
    """The memfd pool backend, with the daemon's host budget; it maps clients'
    shareable buffers too, and page-locks both with ``pin`` (the hccl backend's)."""

    def __init__(self, budget_bytes: int, populate: bool,
                 pin: Callable[[hixl_native.Mapping], Unpinnable | None] | None = None) -> None:
        self.budget_bytes = budget_bytes
        self._populate = populate
        # The hccl backend page-locks host memory (aclrtHostRegister) for ACL copies.
        self._pin = pin
        self._held = 0  # bytes of live pools
        self._pending = 0  # bytes of pools being created, already counted against the budget

    @property
    def reserved_bytes(self) -> int:
        return self._held + self._pending

    def describe(self, pool: Pool) -> str:
        return ""

    async def create(self, pool_id: int, cluster_id: int, placement: Placement,
                     spec: PoolSpec, device_id: int) -> Pool:
        page = 1 << spec.page_shift
        size = -(-spec.memory_size // page) * page
        if self.reserved_bytes + size > self.budget_bytes:
            raise LLMException(
                f"a {size}-byte pool exceeds the daemon's pool budget "
                f"({self.budget_bytes - self.reserved_bytes} of {self.budget_bytes} bytes left; "
                f"see pool.max_bytes)", status_code=LLMStatusCode.LLM_OUT_OF_MEMORY)
        # Pre-faulting a large pool takes a while: do it off the event loop,
        # with its bytes held against the budget meanwhile.
        self._pending += size
        try:
            shared = await asyncio.to_thread(
                hixl_native.SharedPool, f"c{cluster_id}-{placement.name.lower()}", size,
                spec.page_shift, self._populate)
        finally:
            self._pending -= size
        self._held += shared.size
        pool = HostPool(pool_id, cluster_id, placement, shared)
        await self._page_lock(pool)
        return pool

    async def release(self, pool: Pool) -> None:
        self._held -= pool.size
        await asyncio.to_thread(pool.release)  # unmapping a large pool takes a while

    async def map_buffer(self, buffer_id: int, cluster_id: int, fd: int,
                         size: int) -> SharedBuffer:
        """Map a client's shareable buffer (its fd from the fd socket), page-locked
        where this backend pins host memory."""
        buffer = SharedBuffer(buffer_id, cluster_id, hixl_native.Mapping(fd, size))
        await self._page_lock(buffer)
        return buffer

    async def import_buffer(self, buffer_id: int, cluster_id: int, cluster_device: int,
                            key: str, size: int, buffer_device: int) -> UserBuffer:
        raise LLMException("device buffers need the daemon's hccl backend",
                           status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)

    async def _page_lock(self, memory: HostMemory) -> None:
        """Page-lock host memory for ACL copies, undone before it is unmapped."""
        if self._pin is None:
            return
        # aclrtHostRegister of a large buffer takes long: off the event loop.
        pinned = await asyncio.to_thread(self._pin, memory.native)
        if pinned is not None:
            memory.before_release = pinned.close
