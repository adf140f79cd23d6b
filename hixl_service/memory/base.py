"""Memory the daemon moves bytes in and out of, and the seam pools are made through.

``Memory`` is a pool or a client's buffer; ``Pool`` adds the extent
allocator of one cluster's pool. A ``MemoryBackend`` makes and frees pools
of one kind: ``memory.host`` (memfd mappings clients map too) and
``ascend.pools`` (device memory exported with ACL IPC). ``pools.PoolManager``
picks the backend of each pool by its placement and the daemon's backend.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import hixl_native

from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.types import Placement

if TYPE_CHECKING:
    from collections.abc import Callable

    from hixl_native._ascend import DeviceBuffer, DeviceMemory

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

    Host memory is a native ``Mapping`` (memcpy, TCP); device memory (the
    hccl backend) is an ACL ``DeviceMemory`` (ACL copies, HCCL). Native
    transfers in flight pin it: a native job cannot be interrupted, so the
    memory must outlive it even when its awaiter was cancelled, and pins are
    released from the job's completion.
    """

    def __init__(self, cluster_id: int, placement: Placement, size: int, *,
                 mapping: hixl_native.Mapping | None = None,
                 device: DeviceMemory | None = None,
                 process: hixl_native.ProcessMemory | None = None) -> None:
        kinds = [m for m in (mapping, device, process) if m is not None]
        assert len(kinds) == 1, "host, device or client-process memory, exactly one"
        self.cluster_id = cluster_id
        self.placement = placement
        self.size = size
        self.device = device
        self._mapping = mapping
        # Memory of a client process the daemon did not map (memory.process).
        self.process = process
        self.closed = False
        # Where the client mapped this memory (for addresses in TransferConfig).
        self.client_base: int | None = None
        self._pins = 0
        self._unpinned: asyncio.Event | None = None
        self._jobs: set[asyncio.Future[Any]] = set()  # the native jobs pinning it
        # Undoes what a backend attached to the memory (an aclrtHostRegister,
        # a one-sided HCCL registration) before it is unmapped or freed.
        self.before_release: Callable[[], None] | None = None

    @property
    def on_device(self) -> bool:
        return self.device is not None

    @property
    def native(self) -> hixl_native.Mapping:
        """The host mapping; device memory has none (native TCP and memcpy cannot reach it)."""
        if self.process is not None:
            raise LLMException("this memory lies in a client process, reached only by "
                               "cross-memory calls", status_code=LLMStatusCode.LLM_FAILED)
        if self._mapping is None:
            raise LLMException("this memory is on an Ascend device; host transports "
                               "cannot reach it", status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
        return self._mapping

    @property
    def data_handle(self) -> hixl_native.Mapping | hixl_native.ProcessMemory:
        """What the native data link moves host bytes of: the mapping, or the
        client-process span (staged through bounce buffers)."""
        return self.process if self.process is not None else self.native

    def pin_until(self, job: asyncio.Future[Any]) -> None:
        """Keep the memory alive until ``job`` completes, however it ends."""
        self._pins += 1
        self._jobs.add(job)
        job.add_done_callback(self._unpin)

    def _unpin(self, job: asyncio.Future[Any]) -> None:
        self._jobs.discard(job)
        self._pins -= 1
        if self._pins == 0 and self._unpinned is not None:
            self._unpinned.set()

    async def jobs_ended(self) -> None:
        """Return once the native jobs that pin the memory now have ended (later
        ones are not waited for, so a busy memory cannot starve the caller).
        Cancelling the wait leaves the jobs alone."""
        jobs = list(self._jobs)
        if jobs:
            await asyncio.wait(jobs)

    async def wait_unpinned(self) -> None:
        """Return once no native job uses the memory (jobs are bounded by their deadlines)."""
        while self._pins:
            self._unpinned = asyncio.Event()
            await self._unpinned.wait()

    def release(self) -> None:
        """Unmap host memory, or free/close device memory (blocking; call off the loop)."""
        if self.before_release is not None:
            undo, self.before_release = self.before_release, None
            undo()
        if self._mapping is not None:
            self._mapping.close()
        if self.device is not None:
            self.device.close()
        if self.process is not None:
            self.process.revoke()


class UserBuffer(Memory):
    """A client's buffer, mapped by the daemon for registered caches: a
    shareable host buffer (its fd), or device memory imported with ACL IPC.

    The memory is the user's: hixl unmaps (or closes its import) when the
    client closes it and no cache lies in it any more, or when the cluster
    ends; it never frees it.
    """

    def __init__(self, buffer_id: int, cluster_id: int, native: hixl_native.Mapping | None = None,
                 device: DeviceMemory | None = None) -> None:
        placement = Placement.DEVICE if device is not None else Placement.HOST
        size = native.size if native is not None else device.size if device is not None else 0
        super().__init__(cluster_id, placement, size, mapping=native, device=device)
        self.buffer_id = buffer_id
        # The client closed it: no new cache or copy may use it, and it is
        # unmapped once the caches registered over it (``caches``) are gone.
        self.dropped = False
        self.caches = 0


class Allocator(Protocol):
    """Extents of a pool: ``SharedPool`` (host) or ``ExtentAllocator`` (device)."""

    @property
    def page_size(self) -> int: ...
    @property
    def page_shift(self) -> int: ...
    @property
    def used_bytes(self) -> int: ...
    @property
    def free_bytes(self) -> int: ...
    def alloc(self, nbytes: int) -> int: ...
    def free(self, offset: int) -> None: ...
    def allocation_size(self, offset: int) -> int: ...


class Pool(Memory):
    """One cluster's pool for one placement."""

    def __init__(self, pool_id: int, cluster_id: int, placement: Placement,
                 allocator: Allocator, *, mapping: hixl_native.Mapping | None = None,
                 device: DeviceBuffer | None = None, size: int = 0) -> None:
        super().__init__(cluster_id, placement, mapping.size if mapping is not None else size,
                         mapping=mapping, device=device)
        self.pool_id = pool_id
        self.allocator = allocator
        self.device_buffer = device
        self.fd_token = secrets.token_bytes(16)

    @property
    def fd(self) -> int | None:
        """The memfd clients map (host pools only)."""
        return self.allocator.fd if isinstance(self.allocator, hixl_native.SharedPool) else None

    def alloc_cache(self, num_tensors: int, tensor_size: int) -> tuple[int, int, list[int]]:
        """Take one extent for all tensors; return (offset, size, tensor offsets)."""
        pitch = -(-tensor_size // TENSOR_ALIGN) * TENSOR_ALIGN
        try:
            offset = self.allocator.alloc(pitch * num_tensors)
        except hixl_native.PoolExhausted:
            status = (LLMStatusCode.LLM_DEVICE_OUT_OF_MEMORY if self.on_device
                      else LLMStatusCode.LLM_OUT_OF_MEMORY)
            raise LLMException(
                f"{self.placement.name} pool of cluster {self.cluster_id} cannot fit "
                f"{num_tensors} x {tensor_size} bytes ({self.allocator.free_bytes} bytes free)",
                status_code=status) from None
        size = self.allocator.allocation_size(offset)
        return offset, size, [offset + i * pitch for i in range(num_tensors)]


class MemoryBackend(Protocol):
    """Makes and frees the pools of one kind of memory."""

    @property
    def reserved_bytes(self) -> int:
        """Bytes its pools hold against the budget it keeps (for the admin status)."""

    def describe(self, pool: Pool) -> str:
        """Where a pool lives, for the log."""

    async def create(self, pool_id: int, cluster_id: int, placement: Placement,
                     spec: PoolSpec, device_id: int) -> Pool:
        """A new pool, or LLM_OUT_OF_MEMORY / LLM_DEVICE_OUT_OF_MEMORY past the budget."""

    async def release(self, pool: Pool) -> None:
        """Free a pool no transfer uses any more."""
