"""Host memory pools: creation within the daemon's budget, fd hand-out, freeing.

Each initialized cluster gets its pools from LLM-DataDist's ``mem_pool_cfg``
(placement DEVICE) and ``host_mem_pool_cfg`` (placement HOST). On the host
backend both are memfd mappings owned by the daemon; clients map the same
memory through a file descriptor passed over the fd socket, never through a
name in a filesystem.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import secrets
from dataclasses import dataclass
from typing import Any

import hixl_native

from hixl_client.status import LLMException, LLMStatusCode
from hixl_client.types import Placement

logger = logging.getLogger(__name__)

DEFAULT_PAGE_SHIFT = 16
MIN_PAGE_SHIFT = 10
MAX_PAGE_SHIFT = 31  # exclusive
# Tensors inside a cache start on a cache line so that views are aligned.
TENSOR_ALIGN = 64


@dataclass(frozen=True)
class PoolSpec:
    """A parsed ``mem_pool_cfg`` JSON."""

    memory_size: int
    page_shift: int = DEFAULT_PAGE_SHIFT

    @classmethod
    def parse(cls, option: str, text: str) -> PoolSpec:
        """Parse and check a pool JSON, raising LLM_PARAM_INVALID as LLM-DataDist's init does."""

        def invalid(why: str) -> LLMException:
            return LLMException(f"{option} is invalid: {why}; got {text!r}",
                                status_code=LLMStatusCode.LLM_PARAM_INVALID)

        try:
            cfg = json.loads(text)
        except json.JSONDecodeError as exc:
            raise invalid(f"not JSON ({exc.msg})") from None
        if not isinstance(cfg, dict):
            raise invalid("expected a JSON object")
        unknown = set(cfg) - {"memory_size", "page_shift"}
        if unknown:
            raise invalid(f"unknown field(s) {sorted(unknown)}")
        size = cfg.get("memory_size")
        shift = cfg.get("page_shift", DEFAULT_PAGE_SHIFT)
        for name, value in (("memory_size", size), ("page_shift", shift)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise invalid(f"{name} must be an unsigned integer")
        assert isinstance(size, int) and isinstance(shift, int)
        if size == 0:
            raise invalid("memory_size must be > 0")
        if not MIN_PAGE_SHIFT <= shift < MAX_PAGE_SHIFT:
            raise invalid(f"page_shift must be in [{MIN_PAGE_SHIFT}, {MAX_PAGE_SHIFT})")
        if (size >> shift) >= 2**32 - 1:
            raise invalid("memory_size >> page_shift must be below 2**32-1")
        return cls(size, shift)


class Memory:
    """Memory the daemon moves bytes in and out of: a pool, or a client's buffer.

    Native transfers in flight pin it: a native job cannot be interrupted, so
    the mapping must outlive it even when its awaiter was cancelled, and pins
    are released from the job's completion.
    """

    def __init__(self, cluster_id: int, placement: Placement,
                 native: hixl_native.Mapping) -> None:
        self.cluster_id = cluster_id
        self.placement = placement
        self.native = native
        self.closed = False
        # Where the client mapped this memory (for addresses in TransferConfig).
        self.client_base: int | None = None
        self._pins = 0
        self._unpinned: asyncio.Event | None = None

    def pin_until(self, job: asyncio.Future[Any]) -> None:
        """Keep the mapping alive until ``job`` completes, however it ends."""
        self._pins += 1
        job.add_done_callback(self._unpin)

    def _unpin(self, _job: asyncio.Future[Any]) -> None:
        self._pins -= 1
        if self._pins == 0 and self._unpinned is not None:
            self._unpinned.set()

    async def wait_unpinned(self) -> None:
        """Return once no native job uses the memory (jobs are bounded by their deadlines)."""
        while self._pins:
            self._unpinned = asyncio.Event()
            await self._unpinned.wait()

    @property
    def size(self) -> int:
        return self.native.size


class UserBuffer(Memory):
    """A client's shareable buffer, mapped by the daemon for registered caches.

    The memory is the user's: hixl unmaps it when the cluster ends, never frees it.
    """

    def __init__(self, buffer_id: int, cluster_id: int, native: hixl_native.Mapping) -> None:
        super().__init__(cluster_id, Placement.HOST, native)
        self.buffer_id = buffer_id


class Pool(Memory):
    """One cluster's pool for one placement."""

    def __init__(self, pool_id: int, cluster_id: int, placement: Placement,
                 native: hixl_native.SharedPool) -> None:
        super().__init__(cluster_id, placement, native)
        self.pool_id = pool_id
        self.pool: hixl_native.SharedPool = native
        self.fd_token = secrets.token_bytes(16)

    def alloc_cache(self, num_tensors: int, tensor_size: int) -> tuple[int, int, list[int]]:
        """Take one extent for all tensors; return (offset, size, tensor offsets)."""
        pitch = -(-tensor_size // TENSOR_ALIGN) * TENSOR_ALIGN
        try:
            offset = self.pool.alloc(pitch * num_tensors)
        except hixl_native.PoolExhausted:
            raise LLMException(
                f"{self.placement.name} pool of cluster {self.cluster_id} cannot fit "
                f"{num_tensors} x {tensor_size} bytes ({self.pool.free_bytes} bytes free)",
                status_code=LLMStatusCode.LLM_OUT_OF_MEMORY) from None
        size = self.pool.allocation_size(offset)
        return offset, size, [offset + i * pitch for i in range(num_tensors)]


class PoolManager:
    """Creates pools within the daemon-wide budget and hands out their fds."""

    def __init__(self, budget_bytes: int, populate: bool) -> None:
        self.budget_bytes = budget_bytes
        self._populate = populate
        self._ids = itertools.count(1)
        self._pools: dict[int, Pool] = {}
        self._pending = 0  # bytes of pools being created, already counted against the budget

    @property
    def reserved_bytes(self) -> int:
        return sum(p.size for p in self._pools.values()) + self._pending

    def pools(self) -> list[Pool]:
        return list(self._pools.values())

    async def create(self, cluster_id: int, placement: Placement, spec: PoolSpec) -> Pool:
        """Create a pool, or raise LLM_OUT_OF_MEMORY when the budget cannot hold it."""
        page = 1 << spec.page_shift
        size = -(-spec.memory_size // page) * page
        if self.reserved_bytes + size > self.budget_bytes:
            raise LLMException(
                f"a {size}-byte pool exceeds the daemon's pool budget "
                f"({self.budget_bytes - self.reserved_bytes} of {self.budget_bytes} bytes left; "
                f"see pool.max_bytes)", status_code=LLMStatusCode.LLM_OUT_OF_MEMORY)
        pool_id = next(self._ids)
        # Pre-faulting a large pool takes a while: do it off the event loop,
        # with its bytes held against the budget meanwhile.
        self._pending += size
        try:
            native = await asyncio.to_thread(
                hixl_native.SharedPool, f"c{cluster_id}-{placement.name.lower()}", size,
                spec.page_shift, self._populate)
        finally:
            self._pending -= size
        pool = Pool(pool_id, cluster_id, placement, native)
        self._pools[pool_id] = pool
        logger.info("pool %d for cluster %d: %s, %d bytes, page %d",
                    pool_id, cluster_id, placement.name, size, page)
        return pool

    def get(self, pool_id: int) -> Pool:
        return self._pools[pool_id]

    def take_fd(self, token: bytes) -> int | None:
        """Return the fd of the pool a token names, or None for an unknown token.

        Tokens stay valid for the pool's life: a client may map a pool again
        (for example after a fork-free restart of its mapping code).
        """
        for pool in self._pools.values():
            if secrets.compare_digest(pool.fd_token, token):
                return pool.pool.fd
        return None

    async def destroy(self, pool: Pool) -> None:
        """Unmap and close a pool once no transfer uses it; clients keep their own mapping."""
        self._pools.pop(pool.pool_id, None)
        pool.closed = True
        await pool.wait_unpinned()
        await asyncio.to_thread(pool.native.close)  # unmapping a large pool takes a while
        logger.info("pool %d of cluster %d freed", pool.pool_id, pool.cluster_id)
