"""Ceilings measured in the same run as hixl: cold memcpy, raw loopback TCP, a bare gRPC call.

memcpy and TCP are the native pair in ``hixl_bench._ceiling`` (C, GIL
released, buffers rotating through ``cold_bytes``). The gRPC ceiling is a
unary call with an empty message to a tiny grpc.aio server in another process
over a unix socket: what one client-to-daemon call costs at the least.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from hixl_bench import spawn
from hixl_bench.model import CEILING, Budget, Row, Timing, drive, drive_sync

MEMCPY, TCP_C, GRPC_RTT = "memcpy", "tcp-c", "grpc-rtt"
_ECHO_METHOD = "/hixl.bench.Echo/Ping"


_SOCKBUF = 4 << 20
# Tries at starting the gRPC echo server (see echo_server).
ECHO_START_ATTEMPTS = 3


def sockbuf() -> int:
    """hixl's data plane's rule: fixed 4 MiB socket buffers where the host allows
    them (``net.core.[rw]mem_max``), else the kernel's autotuning (0)."""
    for name in ("rmem_max", "wmem_max"):
        try:
            with open(f"/proc/sys/net/core/{name}", encoding="ascii") as f:
                if int(f.read().strip() or 0) < _SOCKBUF:
                    return 0
        except (OSError, ValueError):
            return 0
    return _SOCKBUF


def tcp_name(streams: int) -> str:
    return TCP_C if streams == 1 else f"{TCP_C}x{streams}"


class _Ceiling(Protocol):
    def run(self, block: int, nblocks: int, iters: int) -> list[float]: ...
    def close(self) -> None: ...


def _runner(ceiling: _Ceiling, shape: tuple[int, int]) -> Callable[[int], list[float]]:
    def run(iters: int) -> list[float]:
        return ceiling.run(shape[0], shape[1], iters)
    return run


class NativeCeilings:
    """The native ceilings, open for the whole run so each shape is measured next to hixl's.

    Measuring a shape's ceilings right before hixl's rows of that shape keeps
    the drift of a shared, noisy host out of their ratio.

    Args:
        cold_bytes: each side's rotating buffer.
        tcp_streams: a TCP ceiling per stream count (none: no TCP ceiling).
        memcpy: whether to open the memcpy ceiling.
        budget: time per row.
        progress: called with each row.
    """

    def __init__(self, cold_bytes: int, tcp_streams: list[int], memcpy: bool, budget: Budget,
                 progress: Callable[[Row], None]) -> None:
        self._cold, self._streams, self._want_memcpy = cold_bytes, tcp_streams, memcpy
        self._budget, self._progress = budget, progress
        self._open: dict[str, tuple[str, _Ceiling]] = {}
        self._done: set[tuple[str, tuple[int, int]]] = set()
        self._broken: dict[str, str] = {}

    async def open(self) -> None:
        from hixl_bench._ceiling import MemcpyCeiling, TcpCeiling

        if self._want_memcpy:
            self._open[MEMCPY] = ("local", await asyncio.to_thread(MemcpyCeiling, self._cold))
        for streams in self._streams:
            ceiling = await asyncio.to_thread(TcpCeiling, self._cold, streams, sockbuf())
            self._open[tcp_name(streams)] = ("tcp", ceiling)

    async def close(self) -> None:
        for _, ceiling in self._open.values():
            await asyncio.to_thread(ceiling.close)
        self._open.clear()

    def pending(self, shape: tuple[int, int], paths: set[str]) -> list[CeilingSlices]:
        """The open ceilings serving ``paths`` not yet measured at ``shape``, to be
        timed in slices beside other rows (``serve_group``); each counts as
        measured from now on."""
        pending = []
        for name, (path, ceiling) in self._open.items():
            if path not in paths or (name, shape) in self._done:
                continue
            self._done.add((name, shape))
            pending.append(CeilingSlices(name, path, shape, ceiling, self._broken))
        return pending

    async def measure(self, shape: tuple[int, int], paths: set[str]) -> list[Row]:
        """Rows of every open ceiling serving ``paths`` not yet measured at ``shape``,
        each timed whole."""
        rows = []
        for pending in self.pending(shape, paths):
            try:
                pending.row.fill(await pending.slice(self._budget), pending.request_bytes)
            except (ValueError, MemoryError, OSError) as exc:  # OSError: its TCP pair is gone
                pending.row.status = f"error: {exc}"
            self._progress(pending.row)
            rows.append(pending.row)
        return rows


class CeilingSlices:
    """One ceiling at one shape, timed a slice at a time beside other rows;
    the caller fills ``row`` with the pooled slices. A TCP ceiling whose
    connection broke fails its later slices (``broken``, shared by the run)."""

    def __init__(self, name: str, path: str, shape: tuple[int, int], ceiling: _Ceiling,
                 broken: dict[str, str]) -> None:
        self.name, self.shape, self._ceiling, self._broken = name, shape, ceiling, broken
        self.row = Row(CEILING, name, "ceiling", "copy", path, shape[0], shape[1])
        self.request_bytes = shape[0] * shape[1]

    async def slice(self, budget: Budget) -> Timing:
        if self.name in self._broken:
            raise OSError(self._broken[self.name])
        try:
            return await asyncio.to_thread(drive_sync, _runner(self._ceiling, self.shape), budget)
        except OSError as exc:
            self._broken[self.name] = str(exc)
            raise


@contextlib.asynccontextmanager
async def echo_server() -> AsyncIterator[str]:
    """A bare grpc.aio echo server in a child process; yields its gRPC target."""
    tmpdir = tempfile.mkdtemp(prefix="hixl-bench-", dir="/tmp")
    socket_path = os.path.join(tmpdir, "echo.sock")
    proc = None
    try:
        # Started without fork (``spawn``); a child that still exits before it
        # listens (exit status in the message) is tried again.
        for attempt in range(1, ECHO_START_ATTEMPTS + 1):
            proc = await spawn.start([sys.executable, "-m", "hixl_bench.grpc_echo", socket_path],
                                     stdout=spawn.PIPE)
            line = await proc.readline(20)
            if line.strip() == b"ready":
                break
            code = await proc.wait(10)
            if attempt == ECHO_START_ATTEMPTS:
                raise RuntimeError(f"the gRPC echo server did not start: {line!r}, "
                                   f"exit status {code}")
        yield f"unix:{socket_path}"
    finally:
        if proc is not None:
            await proc.terminate()
        await asyncio.to_thread(shutil.rmtree, tmpdir, True)


Ping = Callable[[int], Awaitable[None]]


@contextlib.asynccontextmanager
async def echo_ping() -> AsyncIterator[Ping]:
    """An empty unary grpc.aio call to the bare echo server (another process), as a
    request function: the gRPC ceiling, also interleaved with hixl's small rows."""
    import grpc.aio

    async with echo_server() as target, grpc.aio.insecure_channel(target) as channel:
        ping: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            _ECHO_METHOD)

        async def request(_index: int) -> None:
            await ping(b"", timeout=10)

        yield request


async def grpc_row(budget: Budget, ping: Ping | None = None) -> Row:
    """p50/p99 of an empty unary grpc.aio call to another process (one in flight)."""
    if ping is None:
        async with echo_ping() as own:
            timing = await drive(own, 1, budget)
    else:
        timing = await drive(ping, 1, budget)
    return Row(CEILING, GRPC_RTT, "ceiling", "rpc", "unix").fill(timing, 0)
