"""Ceilings measured in the same run as hixl: cold memcpy, raw loopback TCP, a bare gRPC call.

memcpy and TCP are the native pair in ``hixl_native._bench`` (C, GIL
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
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from hixl_service.bench.model import CEILING, Budget, Row, Timing, drive, drive_sync

MEMCPY, TCP_C, GRPC_RTT = "memcpy", "tcp-c", "grpc-rtt"
_ECHO_METHOD = "/hixl.bench.Echo/Ping"


_SOCKBUF = 4 << 20


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


def _row(name: str, path: str, shape: tuple[int, int], timing: Timing) -> Row:
    block, nblocks = shape
    return Row(CEILING, name, "ceiling", "copy", path, block, nblocks).fill(timing, block * nblocks)


def _error_row(name: str, path: str, shape: tuple[int, int], exc: BaseException) -> Row:
    return Row(CEILING, name, "ceiling", "copy", path, shape[0], shape[1],
               status=f"error: {exc}")


class _Ceiling(Protocol):
    def run(self, block: int, nblocks: int, iters: int) -> list[float]: ...


def _runner(ceiling: _Ceiling, shape: tuple[int, int]) -> Callable[[int], list[float]]:
    def run(iters: int) -> list[float]:
        return ceiling.run(shape[0], shape[1], iters)
    return run


async def memcpy_rows(shapes: list[tuple[int, int]], cold_bytes: int, budget: Budget,
                      progress: Callable[[Row], None]) -> list[Row]:
    """Single-thread cold memcpy, one call per block, for every shape."""
    from hixl_native._bench import MemcpyCeiling

    rows = []
    ceiling = await asyncio.to_thread(MemcpyCeiling, cold_bytes)
    try:
        for shape in shapes:
            try:
                timing = await asyncio.to_thread(drive_sync, _runner(ceiling, shape), budget)
                row = _row(MEMCPY, "local", shape, timing)
            except (OSError, ValueError, MemoryError) as exc:
                row = _error_row(MEMCPY, "local", shape, exc)
            progress(row)
            rows.append(row)
    finally:
        await asyncio.to_thread(ceiling.close)
    return rows


async def tcp_rows(shapes: list[tuple[int, int]], cold_bytes: int, streams: int, budget: Budget,
                   progress: Callable[[Row], None]) -> list[Row]:
    """Raw loopback TCP pulls in C (``streams`` connections) for every shape."""
    from hixl_native._bench import TcpCeiling

    rows = []
    name = tcp_name(streams)
    ceiling = await asyncio.to_thread(TcpCeiling, cold_bytes, streams, sockbuf())
    try:
        for shape in shapes:
            try:
                timing = await asyncio.to_thread(drive_sync, _runner(ceiling, shape), budget)
                row = _row(name, "tcp", shape, timing)
            except (ValueError, MemoryError) as exc:
                row = _error_row(name, "tcp", shape, exc)
            except OSError as exc:  # the connection is gone: the rest cannot run
                row = _error_row(name, "tcp", shape, exc)
                progress(row)
                rows.append(row)
                break
            progress(row)
            rows.append(row)
    finally:
        await asyncio.to_thread(ceiling.close)
    return rows


@contextlib.asynccontextmanager
async def echo_server() -> AsyncIterator[str]:
    """A bare grpc.aio echo server in a child process; yields its gRPC target."""
    tmpdir = tempfile.mkdtemp(prefix="hixl-bench-", dir="/tmp")
    socket_path = os.path.join(tmpdir, "echo.sock")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hixl_service.bench.grpc_echo", socket_path,
        stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        if line.strip() != b"ready":
            raise RuntimeError(f"the gRPC echo server did not start: {line!r}")
        yield f"unix:{socket_path}"
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
        await asyncio.to_thread(shutil.rmtree, tmpdir, True)


async def grpc_row(budget: Budget) -> Row:
    """p50/p99 of an empty unary grpc.aio call to another process (one in flight)."""
    import grpc.aio

    async with echo_server() as target, grpc.aio.insecure_channel(target) as channel:
        ping: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            _ECHO_METHOD)

        async def request(_index: int) -> None:
            await ping(b"", timeout=10)

        timing = await drive(request, 1, budget)
    return Row(CEILING, GRPC_RTT, "ceiling", "rpc", "unix").fill(timing, 0)
