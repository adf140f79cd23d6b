"""Memory of a client process that the daemon did not map: the engine's own
tensors (numpy, torch CPU tensors, anonymous mmap, malloc), reached with
process_vm_readv / process_vm_writev (``hixl_native.ProcessSpan``).

* A client binds its process to its cluster on the fd socket (BIND): the
  daemon takes the process from the kernel (``SO_PEERPIDFD``, or
  ``SO_PEERCRED`` and ``pidfd_open``), never from a pid the client names, and
  keeps its pidfd, which the native calls check around every call so that a
  pid the kernel gave to another process after the client exited is never
  read or written (``csrc/xmem.h``).
* The kernel allows the calls to a process of the same user or with
  ``CAP_SYS_PTRACE``, as far as Yama's ``ptrace_scope`` lets it:
  `cross_memory_policy` says at start-up (in the log and the admin status)
  whether it can work here; a registration that cannot is refused with
  ``LLM_PARAM_INVALID``, as memory the daemon cannot reach always was.
* A registration is probed (the first and last byte of every tensor) and
  checked against the process's writable mappings, so a bad address fails
  there, not in a later transfer.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import hixl_native

from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.types import Placement

from ..native_errors import process_copy_error
from .base import Memory

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

logger = logging.getLogger(__name__)

YAMA_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")
CAP_SYS_PTRACE = 19
# SO_PEERPIDFD (Linux 6.5): a pidfd of the socket's peer, with no pid race.
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)
_ADVICE = ("register memory from hixl_client.alloc_shareable(nbytes) instead, which the "
           "daemon maps itself")


def _refused(message: str) -> LLMException:
    return LLMException(message, status_code=LLMStatusCode.LLM_PARAM_INVALID)


def _has_cap_sys_ptrace() -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    except OSError:
        pass
    return False


@dataclass(frozen=True)
class CrossMemoryPolicy:
    """What the kernel lets this daemon do to its clients' memory."""

    yama_scope: int | None  # None: no Yama
    cap_sys_ptrace: bool

    @property
    def refusal(self) -> str | None:
        """Why no client's engine memory can be registered here, or None."""
        if self.yama_scope == 3:
            return ("Yama's ptrace_scope is 3 (no process may attach to another), so the "
                    "daemon cannot reach engine-allocated memory")
        if self.yama_scope == 2 and not self.cap_sys_ptrace:
            return ("Yama's ptrace_scope is 2 (admin-only attach) and the daemon lacks "
                    "CAP_SYS_PTRACE, so it cannot reach engine-allocated memory")
        return None

    def summary(self) -> str:
        """One line for the start-up log and the admin status."""
        if self.refusal is not None:
            return f"refused: {self.refusal}; {_ADVICE}"
        scope = "no Yama" if self.yama_scope is None else f"Yama ptrace_scope {self.yama_scope}"
        who = ("CAP_SYS_PTRACE" if self.cap_sys_ptrace
               else "clients of the daemon's own user")
        extra = (" (each client names the daemon with PR_SET_PTRACER)"
                 if self.yama_scope == 1 and not self.cap_sys_ptrace else "")
        return f"ok: process_vm_readv/writev, {scope}, {who}{extra}"


def cross_memory_policy() -> CrossMemoryPolicy:
    try:
        scope: int | None = int(YAMA_SCOPE.read_text().strip())
    except (OSError, ValueError):
        scope = None
    return CrossMemoryPolicy(scope, _has_cap_sys_ptrace())


class ClientProcess:
    """A client process bound to its cluster: its pid and a pidfd of it."""

    def __init__(self, pid: int, uid: int, pidfd: int) -> None:
        self.pid = pid
        self.uid = uid
        self.pidfd = pidfd

    @classmethod
    def of_peer(cls, conn: socket.socket) -> ClientProcess:
        """The process at the other end of a unix socket, as the kernel knows it.

        Raises:
            OSError: the kernel cannot name it, or it went away meanwhile.
        """
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)
        try:
            pidfd = struct.unpack("i", conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4))[0]
        except OSError as exc:
            if exc.errno not in (errno.ENOPROTOOPT, errno.EINVAL):
                raise
            # An older kernel: the pid was the peer's at connect. If that
            # process had exited its pid could name another by now, but its
            # end of this connection would then be closed: checked after.
            pidfd = os.pidfd_open(pid)
            if _peer_hung_up(conn):
                os.close(pidfd)
                raise OSError(errno.ESRCH, "the client went away while binding") from None
        return cls(pid, uid, pidfd)

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


def _peer_hung_up(conn: socket.socket) -> bool:
    import select

    poller = select.poll()
    poller.register(conn, select.POLLRDHUP | select.POLLHUP)
    return bool(poller.poll(0))


def _writable_maps(pid: int) -> list[tuple[int, int]]:
    """The process's readable and writable mappings, merged, sorted."""
    spans: list[tuple[int, int]] = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=2)
            if len(fields) < 2 or not fields[1].startswith("rw"):
                continue
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if spans and spans[-1][1] == low:
                spans[-1] = (spans[-1][0], high)
            else:
                spans.append((low, high))
    return spans


def _inside(spans: list[tuple[int, int]], start: int, length: int) -> bool:
    import bisect

    index = bisect.bisect_right(spans, (start, 1 << 64)) - 1
    return index >= 0 and spans[index][0] <= start and start + length <= spans[index][1]


class ProcessMemory(Memory):
    """One registered cache's span of a client process's memory.

    Its native span is revoked (every later access fails) when the cache is
    unregistered or its cluster ends, after the transfers that pinned it.
    Copies touching it are cross-memory calls; the data server stages peers'
    requests of it through bounce buffers.
    """

    copy_rank: ClassVar[int] = 1
    copies_inline: ClassVar[bool] = True  # process_vm_* hold no lock and wait for nothing

    def __init__(self, cluster_id: int, span: hixl_native.ProcessSpan) -> None:
        super().__init__(cluster_id, Placement.HOST, span.size)
        self.span = span
        self.client_base = span.base

    @property
    def native(self) -> hixl_native.Mapping:
        raise LLMException("this memory lies in a client process, reached only by "
                           "cross-memory calls", status_code=LLMStatusCode.LLM_FAILED)

    @property
    def data_handle(self) -> hixl_native.ProcessSpan:
        return self.span

    def expose(self, server: hixl_native.DataServer, region_id: int, offset: int, size: int,
               cluster_id: int, writable: bool) -> bool:
        # Peers' requests of client-process memory go through bounce buffers.
        server.register_process_region(region_id, self.span, offset, size, cluster_id,
                                       writable)
        return True

    def copy_job(self, dst: Memory, src: Memory, triples: np.ndarray) -> Callable[[], None]:
        return _ProcessCopy(dst.data_handle, src.data_handle, triples)

    def revoke(self) -> bool:
        self.closed = True
        self.release()  # revoked first: nothing new starts on it
        return True

    def _close(self) -> None:
        self.span.revoke()


class _ProcessCopy:
    """A copy with a client process's memory on one side or both
    (process_vm_readv / process_vm_writev, GIL released)."""

    __slots__ = ("_dst", "_src", "_triples")

    def __init__(self, dst: hixl_native.Mapping | hixl_native.ProcessSpan,
                 src: hixl_native.Mapping | hixl_native.ProcessSpan, triples: np.ndarray) -> None:
        self._dst = dst
        self._src = src
        self._triples = triples

    def __call__(self) -> None:
        try:
            status = hixl_native.copy_process(self._dst, self._src, self._triples)
        except hixl_native.NativeError as exc:  # revoked before the copy began
            raise process_copy_error(exc.code) from None
        if status != hixl_native.OK:
            raise process_copy_error(status)


class ProcessBackend:
    """Reaches the memory of clients' own processes: the kernel's policy and the
    bounce buffers that stage it on the data plane (made on first use, then
    shared by all).

    Where the daemon's copies need host memory page-locked (``page_locked``:
    the hccl backend's ACL copies), none is reached: another process's
    memory cannot be page-locked by the daemon.
    """

    def __init__(self, policy: CrossMemoryPolicy | None = None, bounce_buffers: int = 16,
                 bounce_buffer_bytes: int = 1 << 20, page_locked: bool = False) -> None:
        self.policy = policy if policy is not None else CrossMemoryPolicy(None, False)
        self._bounce_shape = (bounce_buffers, bounce_buffer_bytes)
        # (inbound: the data server's requests, outbound: this daemon's own).
        self._bounce: tuple[hixl_native.BouncePool, hixl_native.BouncePool] | None = None
        self._page_locked = page_locked

    def summary(self) -> str:
        """One line for the admin status."""
        if self._page_locked:
            return ("refused: the hccl backend registers memory from alloc_shareable and "
                    "alloc_device_shareable only")
        return self.policy.summary()

    def check(self, process: ClientProcess | None) -> ClientProcess:
        """The bound process a registration may reach into, or LLM_PARAM_INVALID."""
        if self._page_locked:
            raise _refused(
                "the hixl daemon reaches engine-allocated memory only on its host backend; "
                "with the hccl backend register memory from hixl_client.alloc_shareable (host) "
                "or alloc_device_shareable (device)")
        if process is None:
            raise _refused("the client did not bind its process on the fd socket")
        return process

    def reach(self, process: ClientProcess, cluster_id: int, addrs: list[int],
              tensor_size: int) -> ProcessMemory:
        """``reach`` with this daemon's policy and bounce buffers (blocking: it
        reads the client's memory and its /proc maps)."""
        if self._bounce is None:
            count, size = self._bounce_shape
            self._bounce = (hixl_native.BouncePool(count, size),
                            hixl_native.BouncePool(count, size))
        return reach(process, cluster_id, addrs, tensor_size, self._bounce, self.policy)


def reach(process: ClientProcess, cluster_id: int, addrs: list[int], tensor_size: int,
          bounce: tuple[hixl_native.BouncePool, hixl_native.BouncePool],
          policy: CrossMemoryPolicy) -> ProcessMemory:
    """The span of a client's memory holding every ``[addr, addr + tensor_size)``,
    probed and checked against its writable mappings.

    Raises:
        LLMException: LLM_PARAM_INVALID when the kernel's policy, the process's
            user or its mappings do not allow it, with the reason.
    """
    if policy.refusal is not None:
        raise _refused(f"{policy.refusal}; {_ADVICE}")
    if any(a <= 0 or a + tensor_size > 1 << 64 for a in addrs):
        raise _refused("an address of the cache lies outside the address space")
    base = min(addrs)
    span = max(addrs) + tensor_size - base
    native = hixl_native.ProcessSpan(process.pidfd, process.pid, base, span, *bounce)
    try:
        native.probe(sorted({a for a in addrs} | {a + tensor_size - 1 for a in addrs}))
    except hixl_native.NativeError as exc:
        native.revoke()
        raise _probe_refusal(process, exc) from None
    try:
        spans = _writable_maps(process.pid)
    except OSError as exc:
        native.revoke()
        raise _refused(f"cannot read the mappings of client process {process.pid}: "
                       f"{exc}; {_ADVICE}") from None
    bad = next((a for a in addrs if not _inside(spans, a, tensor_size)), None)
    if bad is not None:
        native.revoke()
        raise _refused(f"[{bad:#x}, +{tensor_size}) is not inside one readable and writable "
                       f"mapping of client process {process.pid}")
    return ProcessMemory(cluster_id, native)


def _probe_refusal(process: ClientProcess, exc: hixl_native.NativeError) -> LLMException:
    if exc.errno == errno.EPERM:
        scope = cross_memory_policy().yama_scope
        why = (f"the kernel does not let the daemon (uid {os.geteuid()}) read client "
               f"process {process.pid} (uid {process.uid}): process_vm_readv needs the same "
               f"user or CAP_SYS_PTRACE")
        if scope == 1:
            why += ", and under Yama ptrace_scope 1 the client must name the daemon with " \
                   "PR_SET_PTRACER (hixl_client does so when it can)"
        return _refused(f"{why}; {_ADVICE}")
    if exc.code == hixl_native.E_GONE:
        return _refused(f"client process {process.pid} exited")
    return _refused(f"an address of the cache is not mapped in client process "
                    f"{process.pid} ({exc})")
