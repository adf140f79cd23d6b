"""Memory the daemon moves bytes in and out of, and the seam pools are made through.

``Memory`` has one subtype per kind, each carrying its own copies, regions
and release: ``host.HostMemory``, ``device.AscendMemory`` and
``process.ProcessMemory``. ``Pool`` (the extent allocator of one cluster's
pool) and ``UserBuffer`` (a client's buffer) are roles that a host or a
device kind takes. A ``MemoryBackend`` makes and frees pools of one kind:
``host.HostBackend`` (memfd mappings clients map too, page-locked on the
hccl backend) and ``device.DeviceBackend`` (device memory exported with ACL
IPC). ``pools.PoolManager`` picks the backend of each pool by its placement
and the daemon's backend.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import hixl_native

from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.types import Placement

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np
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
    """Memory the daemon moves bytes in and out of: a pool, a client's buffer,
    or a span of a client process. One subtype per kind, each with its own
    copies, regions and release: ``host.HostMemory`` (a mapping: memcpy, the
    TCP data plane), ``device.AscendMemory`` (ACL copies, HCCL) and
    ``process.ProcessMemory`` (cross-memory calls). Nothing outside them asks
    which kind it holds.

    Native transfers in flight pin it: a native job cannot be interrupted, so
    the memory must outlive it even when its awaiter was cancelled, and pins
    are released from the job's completion.
    """

    # Device memory (told to clients in the pool list; HCCL reads ``device``).
    on_device: ClassVar[bool] = False
    device: DeviceMemory | None = None
    # How a copy reaches it. 0: native memcpy, the copier's own threads; above
    # 0: the kind's ``copy_job``. A copy between two memories goes the way of
    # the end with the higher rank (device memory, then a client process's).
    copy_rank: ClassVar[int] = 0
    # Whether a ``copy_job`` of this kind may run on the loop's thread when the
    # daemon is idle and the copy small (it holds no lock and waits for nothing).
    copies_inline: ClassVar[bool] = False
    # Host copies (memcpy, cross-memory calls) reach it without a device runtime.
    host_copies: ClassVar[bool] = True
    # The pool that cannot fit a cache says so with this code.
    out_of_memory: ClassVar[LLMStatusCode] = LLMStatusCode.LLM_OUT_OF_MEMORY

    def __init__(self, cluster_id: int, placement: Placement, size: int) -> None:
        self.cluster_id = cluster_id
        self.placement = placement
        self.size = size
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
    def native(self) -> hixl_native.Mapping:
        """The host mapping memcpy and native TCP reach; LLMException for a kind without one."""
        raise NotImplementedError

    @property
    def data_handle(self) -> hixl_native.Mapping | hixl_native.ProcessSpan:
        """What the native data link moves host bytes of: the mapping, or the
        client-process span (staged through bounce buffers)."""
        raise NotImplementedError

    def expose(self, server: hixl_native.DataServer, region_id: int, offset: int, size: int,
               cluster_id: int, writable: bool) -> bool:
        """Register ``[offset, offset + size)`` as a region of the native data server,
        which checks peers' requests against it; False when the data server
        cannot reach this memory (the caller keeps the region itself)."""
        raise NotImplementedError

    def copy_job(self, dst: Memory, src: Memory, triples: np.ndarray) -> Callable[[], object]:
        """A blocking copy of (dst, src, length) ``triples`` between ``dst`` and
        ``src``, made this memory's way (for a memory of ``copy_rank`` above 0);
        it raises LLMException when it fails."""
        raise NotImplementedError

    def revoke(self) -> bool:
        """End every access to the memory of one cache alone at once (later native
        calls on it fail); False, and nothing done, for memory that caches share
        (a pool, a buffer), which fencing the cache's extent frees instead."""
        return False

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
        """Unmap host memory, free or close device memory, revoke a client span
        (blocking; call off the loop)."""
        if self.before_release is not None:
            undo, self.before_release = self.before_release, None
            undo()
        self._close()

    def _close(self) -> None:
        raise NotImplementedError


class UserBuffer(Memory):
    """A client's buffer, mapped by the daemon for registered caches: a
    shareable host buffer (``host.SharedBuffer``, its fd), or device memory
    imported with ACL IPC (``device.AscendBuffer``).

    The memory is the user's: hixl unmaps (or closes its import) when the
    client closes it and no cache lies in it any more, or when the cluster
    ends; it never frees it.
    """

    # Closed while the client waits when it drops the buffer, since the client
    # may free it only afterwards (CANN's order for an imported device buffer);
    # else unmapped once its caches are gone, off the answer's path.
    close_on_drop: ClassVar[bool] = False

    def _take_buffer(self, buffer_id: int) -> None:
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
    """One cluster's pool for one placement: ``host.HostPool`` (a memfd the
    client maps) or ``device.AscendPool`` (device memory exported with ACL IPC)."""

    # The device pool's exported buffer (the hccl backend's code reads it).
    device_buffer: DeviceBuffer | None = None

    def _take_pool(self, pool_id: int, allocator: Allocator) -> None:
        self.pool_id = pool_id
        self.allocator = allocator
        self.fd_token = secrets.token_bytes(16)

    @property
    def fd(self) -> int | None:
        """The memfd clients map; None where they import the pool instead."""
        return None

    async def share_with(self, tgid: int) -> str | None:
        """Let a client process import the pool: its export key, or None when
        clients map it through ``fd`` instead."""
        return None

    def alloc_cache(self, num_tensors: int, tensor_size: int) -> tuple[int, int, list[int]]:
        """Take one extent for all tensors; return (offset, size, tensor offsets)."""
        pitch = -(-tensor_size // TENSOR_ALIGN) * TENSOR_ALIGN
        try:
            offset = self.allocator.alloc(pitch * num_tensors)
        except hixl_native.PoolExhausted:
            raise LLMException(
                f"{self.placement.name} pool of cluster {self.cluster_id} cannot fit "
                f"{num_tensors} x {tensor_size} bytes ({self.allocator.free_bytes} bytes free)",
                status_code=self.out_of_memory) from None
        size = self.allocator.allocation_size(offset)
        return offset, size, [offset + i * pitch for i in range(num_tensors)]


class MemoryBackend(Protocol):
    """Makes and frees the pools of one kind of memory, and the client buffers
    of that kind: ``host.HostBackend`` and ``device.DeviceBackend``."""

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

    async def import_buffer(self, buffer_id: int, cluster_id: int, cluster_device: int,
                            key: str, size: int, buffer_device: int) -> UserBuffer:
        """Import device memory a client exported (``alloc_device_shareable``) on
        ``buffer_device``; LLM_PARAM_INVALID unless that is the cluster's device,
        LLM_FEATURE_NOT_ENABLED where this backend has no device memory."""
