"""Host pools: anonymous memfd mappings within the daemon's ``pool.max_bytes``,
page-locked for ACL copies on the hccl backend.

Clients map the same memory through a file descriptor passed over the fd
socket, never through a name in a filesystem, so a cache's addresses are
valid in the client's own process and its views are zero-copy.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

import hixl_native

from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.types import Placement

from .base import Pool, PoolSpec

if TYPE_CHECKING:
    from collections.abc import Callable


class Unpinnable(Protocol):
    """Page-locked memory that can be unlocked again (``_ascend.PinnedHost``)."""

    def close(self) -> None: ...


class HostMemory:
    """The memfd pool backend, with the daemon's host budget."""

    def __init__(self, budget_bytes: int, populate: bool,
                 pin: Callable[[hixl_native.Mapping], Unpinnable | None] | None = None) -> None:
        self.budget_bytes = budget_bytes
        self._populate = populate
        # The hccl backend page-locks host pools (aclrtHostRegister) for ACL copies.
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
        pool = Pool(pool_id, cluster_id, placement, shared, mapping=shared)
        if self._pin is not None:
            pinned = await asyncio.to_thread(self._pin, shared)
            if pinned is not None:
                pool.before_release = pinned.close
        return pool

    async def release(self, pool: Pool) -> None:
        self._held -= pool.size
        await asyncio.to_thread(pool.release)  # unmapping a large pool takes a while
