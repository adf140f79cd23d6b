"""Host memory a hixl daemon maps: the zero-copy way to register caches.

On the host backend the daemon moves bytes itself. ``alloc_shareable``
allocates memory it maps too (an anonymous memfd, mapped here; the daemon
receives its fd over the session's private socket, never through a name),
so transfers read and write it directly. ``register_cache`` also accepts
memory the engine allocated itself (numpy, torch, mmap, malloc), which the
daemon reaches with cross-memory calls and stages through bounce buffers on
the network: prefer this module where you allocate the KV cache anyway::

    buf = alloc_shareable(2 * 64 * 1024 * 1024)
    k = buf.numpy(np.float16, (32, 1024, 8, 128))            # or torch.frombuffer(buf.view(), ...)
    cache = await cm.register_cache(desc, [buf.address, buf.address + desc.size])
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import hixl_native

from ._memory import drop_buffer
from .status import LLMException, LLMStatusCode

_ALIGN = 4096
# adopt_shareable moves whole pages, so a range must not share its first or
# last page with another allocation that a thread could write meanwhile.
# Allocations this large are a mapping of their own with every common
# allocator (glibc's mmap threshold never exceeds 32 MiB; jemalloc and
# tcmalloc give large allocations whole pages); smaller ones may sit inside
# an arena's mapping beside other objects, even outside the brk heap.
MIN_ADOPT_BYTES = 32 << 20


class ShareableBuffer:
    """A page-aligned, zero-filled host buffer that hixl daemons can map.

    Args:
        nbytes: the size in bytes (> 0).

    Raises:
        ValueError: ``nbytes`` is not positive.
    """

    def __init__(self, nbytes: int) -> None:
        if nbytes <= 0:
            raise ValueError(f"nbytes must be > 0, got {nbytes}")
        self._open(nbytes, lambda fd: hixl_native.Mapping(fd, nbytes))

    @classmethod
    def _adopting(cls, address: int, nbytes: int) -> ShareableBuffer:
        """The pages ``[address, address + nbytes)``, moved onto a memfd in place."""
        buffer = cls.__new__(cls)
        buffer._open(nbytes, lambda fd: hixl_native.AdoptedMapping(fd, address, nbytes))
        return buffer

    def _open(self, nbytes: int, map_fd: Callable[[int], hixl_native.Mapping]) -> None:
        self._fd = os.memfd_create("hixl-shareable", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self._fd, nbytes)
            self._mapping = map_fd(self._fd)
        except BaseException:
            os.close(self._fd)
            raise
        # cluster upload token -> (its daemon's fd socket, the daemon's buffer id)
        self._uploaded: dict[bytes, tuple[str, int]] = {}
        _REGISTRY.add(self)

    @property
    def address(self) -> int:
        """The buffer's first byte in this process."""
        return self._mapping.address

    @property
    def size(self) -> int:
        return self._mapping.size

    @property
    def fd(self) -> int:
        return self._fd

    def view(self, offset: int = 0, length: int | None = None) -> memoryview:
        """A writable zero-copy view (``torch.frombuffer`` accepts it)."""
        return self._mapping.view(offset, self.size - offset if length is None else length)

    def numpy(self, dtype: Any, shape: tuple[int, ...], offset: int = 0) -> Any:
        """A zero-copy numpy array over the buffer."""
        import numpy as np

        count = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return np.frombuffer(self.view(offset, count), dtype=dtype).reshape(shape)

    def close(self) -> None:
        """Unmap the buffer here and tell each daemon it was handed to: a daemon
        unmaps it once the caches registered over it are unregistered (their
        bytes stay valid until then), and no new cache or copy may use it.

        Raises:
            BufferError: views of the buffer are still alive.
        """
        if self._mapping.closed:
            return
        self._mapping.close()
        _REGISTRY.remove(self)
        os.close(self._fd)
        uploaded, self._uploaded = self._uploaded, {}
        for token, (fd_socket, buffer_id) in uploaded.items():
            drop_buffer(fd_socket, token, buffer_id)

    def __enter__(self) -> ShareableBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def alloc_shareable(nbytes: int) -> ShareableBuffer:
    """Allocate ``nbytes`` of host memory that hixl daemons can map."""
    return ShareableBuffer(-(-nbytes // _ALIGN) * _ALIGN)


def adopt_shareable(address: int, nbytes: int) -> ShareableBuffer:
    """Make memory this process already allocated shareable, where it lies.

    For memory an engine allocates itself (vLLM's KV cache, a torch tensor):
    the whole pages holding ``[address, address + nbytes)`` move onto a memfd
    at the same address, bytes kept, so every pointer into them stays valid
    and caches registered there take the zero-copy path of ``alloc_shareable``
    memory. The move copies the bytes once, a piece at a time.

    The memory still belongs to its allocator, which frees it as before, after
    the caches over it are unregistered and the buffer closed. Move it before
    other threads use it: a write into those pages while they move may be lost.

    Raises:
        ValueError: ``nbytes`` is not positive.
        LLMException: the memory cannot move safely (``LLM_PARAM_INVALID``): it is
            smaller than ``MIN_ADOPT_BYTES`` (32 MiB; smaller allocations may
            share their edge pages with other objects), or its pages are not
            this process's private anonymous memory (a file, a stack, the brk
            heap). Such memory can still be registered as it is, on the slower
            engine-memory path.
    """
    if nbytes <= 0:
        raise ValueError(f"nbytes must be > 0, got {nbytes}")
    start = address - address % _ALIGN
    end = -(-(address + nbytes) // _ALIGN) * _ALIGN
    if nbytes < MIN_ADOPT_BYTES or not _private_anonymous(start, end):
        raise LLMException(
            f"cannot adopt {nbytes} bytes at {address:#x}: only a large allocation "
            f"(at least {MIN_ADOPT_BYTES >> 20} MiB) of private anonymous memory can move "
            "onto shared memory in place; register it as it is, or allocate it with "
            "alloc_shareable", status_code=LLMStatusCode.LLM_PARAM_INVALID)
    return ShareableBuffer._adopting(start, end - start)


def _private_anonymous(start: int, end: int) -> bool:
    """Whether this process's mappings cover ``[start, end)`` with private,
    writable anonymous memory that is not the brk heap or a stack."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            low, high = (int(bound, 16) for bound in fields[0].split("-"))
            if high <= start:
                continue
            name = fields[5].strip() if len(fields) > 5 else ""
            if (low > start or not fields[1].startswith("rw") or fields[1][3] != "p"
                    or fields[4] != "0" or (name and not name.startswith("[anon"))):
                return False
            start = high
            if start >= end:
                return True
    return False


class _Addressed(Protocol):
    @property
    def address(self) -> int: ...
    @property
    def size(self) -> int: ...


BufferT = TypeVar("BufferT", bound=_Addressed)


class Registry(Generic[BufferT]):
    """Live buffers of this process, sorted by address, to translate addresses."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._buffers: list[BufferT] = []

    def add(self, buffer: BufferT) -> None:
        with self._lock:
            index = bisect.bisect(self._starts, buffer.address)
            self._starts.insert(index, buffer.address)
            self._buffers.insert(index, buffer)

    def remove(self, buffer: BufferT) -> None:
        with self._lock:
            index = self._buffers.index(buffer)
            del self._starts[index], self._buffers[index]

    def find(self, address: int, length: int) -> BufferT | None:
        with self._lock:
            index = bisect.bisect(self._starts, address) - 1
            if index < 0:
                return None
            buffer = self._buffers[index]
            return buffer if address + length <= buffer.address + buffer.size else None

    def locate(self, addrs: list[int], length: int) -> tuple[BufferT, list[int]] | None:
        """The one buffer holding every ``[addr, addr + length)`` and the offsets, or
        None when the addresses are not all inside one of these buffers."""
        found = [self.find(a, length) for a in addrs]
        first = found[0] if found else None
        if first is None or any(b is not first for b in found):
            return None
        return first, [a - first.address for a in addrs]


_REGISTRY: Registry[ShareableBuffer] = Registry()


def find(addrs: list[int], length: int) -> tuple[ShareableBuffer, list[int]] | None:
    """The one shareable buffer holding every ``[addr, addr + length)`` and the
    offsets, or None."""
    return _REGISTRY.locate(addrs, length)


def locate(addrs: list[int], length: int) -> tuple[ShareableBuffer, list[int]]:
    """Find the one shareable buffer holding every ``[addr, addr + length)``; return offsets.

    Raises:
        LLMException: an address is not inside a shareable buffer, or the
            addresses span several buffers (``LLM_PARAM_INVALID``).
    """
    located = _REGISTRY.locate(addrs, length)
    if located is None:
        raise LLMException(
            "the hixl daemon can only reach host memory allocated with "
            "hixl_client.alloc_shareable(nbytes), and every tensor of one cache must lie in "
            "one such buffer; allocate the cache's memory there (numpy: buf.numpy(...), "
            "torch: torch.frombuffer(buf.view(), dtype=...))",
            status_code=LLMStatusCode.LLM_PARAM_INVALID)
    return located
