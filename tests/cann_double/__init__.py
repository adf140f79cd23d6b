"""A TEST DOUBLE of CANN: ``libascendcl.so`` and ``libhccl.so`` for machines without Ascend.

This is not CANN and drives no accelerator. ``build.py`` compiles C sources
(next to this file) into the two libraries, which export the subset of ACL
runtime and HCCL entry points that hixl's shim (``hixl_native._ascend``)
loads, with CANN's C signatures and public error codes. The product never
imports or special-cases the double; tests point the shim at the directory
``build()`` returns.

What is simulated:

* Devices ``0 .. N-1`` (``HIXL_DOUBLE_DEVICE_COUNT``, default 2); a call
  for another id fails with 107001 (``ACL_ERROR_RT_INVALID_DEVICEID``). ACL
  contexts are per thread: device calls on a thread that did not
  ``aclrtSetDevice`` fail with 107002 (``ACL_ERROR_RT_CONTEXT_NULL``).
* Device memory: a memfd mapped at a 2 MiB aligned address, charged in whole
  2 MiB pages against a per-device limit (``HIXL_DOUBLE_DEVICE_MEM_BYTES``,
  default 1 GiB); over it ``aclrtMalloc`` fails with 207001
  (``ACL_ERROR_RT_MEMORY_ALLOCATION``). ``aclrtMemcpy`` checks that the kind
  matches the addresses (device ranges must lie in device memory).
  ``aclrtMemcpyAsync`` refuses ``ACL_MEMCPY_HOST_TO_HOST`` with 207000
  (``ACL_ERROR_RT_FEATURE_NOT_SUPPORT``), as CANN does, and copies host
  memory that is not page-locked synchronously (below).
* IPC: keys ``cann-double:<pid>:<n>``; the exporter serves the memfd over an
  abstract unix socket, so another process maps the same bytes. The pid
  whitelist of ``aclrtIpcMemSetImportPid`` is checked (207006 otherwise).
* Streams: one worker thread each, tasks in order; a failed task fails the
  next synchronize (once) and drops the tasks behind it.
  ``aclrtSynchronizeStreamWithTimeout`` fails with 507046
  (``ACL_ERROR_RT_STREAM_SYNC_TIMEOUT``).
* HCCL: two ranks per communicator over abstract unix sockets (see
  ``hccl_double.c``); a send completes when the receiver has the bytes. A
  rank that never joins fails ``HcclCommInitRootInfo`` with ``HCCL_E_TIMEOUT``
  after ``HIXL_DOUBLE_CONNECT_TIMEOUT_MS`` (else ``HCCL_CONNECT_TIMEOUT``
  seconds, else 120 s). Links are set up lazily, as HCCL does: the first
  Send, Recv or BatchSendRecv host call on a communicator blocks until the
  peer makes its own first call (``HCCL_E_TIMEOUT`` after the same bound). A peer lost in
  mid-transfer fails the stream with 507057 (``ACL_ERROR_RT_SUSPECT_REMOTE_ERROR``).
* One-sided HCCL (``hccl_double_onesided.c``; left out by ``build(...,
  one_sided=False)``, a libhccl.so without those symbols): registration,
  binding, ``HcclCommPrepare`` (each rank passes its bound memory's memfds to
  the other, which maps them) and ``HcclBatchGet`` / ``HcclBatchPut`` as
  stream tasks copying to or from the peer's memory, the peer doing nothing.
  ``HIXL_DOUBLE_ONE_SIDED=0`` makes every one-sided entry point answer
  ``HCCL_E_NOT_SUPPORT`` (a product whose HCCL exports the API without it).
* CANN's rules, with the codes CANN uses (each cites its page or source file
  in the C source): two sends (or receives) for one rank in one
  ``HcclBatchSendRecv``; ``aclrtMemcpyAsync`` of addresses not 64-byte aligned
  (107000), and of host memory that is not page-locked, which is copied
  synchronously (`DoubleControl.sync_copies` counts those): only
  ``aclrtMallocHost`` and ``aclrtHostRegisterV2`` with ``ACL_HOST_REG_PINNED``
  lock, ``aclrtHostRegister`` only maps; more than 256 descriptors per
  one-sided call or a wrong remote rank (``HCCL_E_PARA`` when queued), while
  the ranges of a one-sided call are checked when its task runs (the stream
  fails); binding after preparing and preparing twice succeed (the peer
  never sees memory bound late); registering a range again answers the same
  handle; deregistering bound memory and destroying a communicator with
  memory bound are ``HCCL_E_PARA``; unbinding leaves the peer's mapping.

Fault injection, by `DoubleControl` (ctypes) or the environment variable
``HIXL_DOUBLE_FAULTS="point=action[:arg[:count[:skip]]];..."`` (read once, for
child processes). A *point* is an entry point name (``"aclrtMalloc"``,
``"HcclSend"``: the call itself) or ``"exec:<name>"`` for a task running on a
stream (``"exec:HcclSend"``, ``"exec:HcclRecv"``, ``"exec:HcclBatchSendRecv"``,
``"exec:aclrtMemcpyAsync"``, ``"exec:HcclBatchGet"``, ``"exec:HcclBatchPut"``). After ``skip`` calls pass, the next ``count``
(-1: all) get the *action*:

* ``fail``: return (or fail the task with) the code ``arg``;
* ``delay``: sleep ``arg`` ms, then proceed;
* ``hang``: block; a call until `DoubleControl.release`/``reset``, a task until
  its stream or communicator is destroyed;
* ``sever`` (HCCL send tasks): move half of the payload, cut the link, fail
  the task with ``arg``; the peer sees the link drop.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

__all__ = ["DELAY", "FAIL", "HANG", "SEVER", "DoubleControl"]

FAIL, DELAY, HANG, SEVER = 1, 2, 3, 4
_LIVE_KINDS = ("device_memory", "host_memory", "imports", "streams", "comms",
               "host_registrations", "global_memory")


class DoubleControl:
    """The double's control functions, from its ``libascendcl.so``.

    Loading the file the shim loaded gives the same library instance, so
    faults armed here hit the shim's calls.

    Args:
        lib_dir: The directory `tests.cann_double.build.build` returned.
    """

    def __init__(self, lib_dir: str | Path) -> None:
        self._lib = ctypes.CDLL(str(Path(lib_dir) / "libascendcl.so"))
        self._lib.hixl_double_inject.argtypes = [
            ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int
        ]
        self._lib.hixl_double_inject.restype = ctypes.c_int
        self._lib.hixl_double_configure.argtypes = [ctypes.c_int, ctypes.c_uint64]
        self._lib.hixl_double_live.argtypes = [ctypes.c_int]
        self._lib.hixl_double_live.restype = ctypes.c_long
        self._lib.hixl_double_sync_copies.restype = ctypes.c_long

    def inject(self, point: str, action: int, arg: int = 0, count: int = 1, skip: int = 0) -> None:
        """Arm ``point`` with ``action`` (see the module docstring); count 0 disarms."""
        if self._lib.hixl_double_inject(point.encode(), action, arg, count, skip) != 0:
            raise ValueError(f"cannot arm {point!r}")

    def fail(self, point: str, code: int, count: int = 1, skip: int = 0) -> None:
        """Make the next ``count`` calls (after ``skip``) of ``point`` fail with ``code``."""
        self.inject(point, FAIL, code, count, skip)

    def delay(self, point: str, ms: int, count: int = 1) -> None:
        """Make the next ``count`` calls of ``point`` sleep ``ms`` first."""
        self.inject(point, DELAY, ms, count)

    def hang(self, point: str, count: int = 1) -> None:
        """Make the next ``count`` calls of ``point`` block (see the module docstring)."""
        self.inject(point, HANG, 0, count)

    def sever(self, point: str, code: int, count: int = 1) -> None:
        """Cut the link half-way through the next send task(s) of ``point``."""
        self.inject(point, SEVER, code, count)

    def configure(self, device_count: int = -1, mem_limit: int = 0) -> None:
        """Override the device count and per-device memory limit (-1 / 0 keep)."""
        self._lib.hixl_double_configure(device_count, mem_limit)

    def release(self) -> None:
        """Release calls blocked by a ``hang`` fault."""
        self._lib.hixl_double_release()

    def reset(self) -> None:
        """Disarm every fault and release hung calls."""
        self._lib.hixl_double_reset()

    def sync_copies(self) -> int:
        """``aclrtMemcpyAsync`` calls copied synchronously (their host memory was not
        page-locked), since the library was loaded."""
        return int(self._lib.hixl_double_sync_copies())

    def live(self) -> dict[str, int]:
        """Objects the double holds: device/host allocations, imports, streams, comms."""
        return {name: int(self._lib.hixl_double_live(i)) for i, name in enumerate(_LIVE_KINDS)}
