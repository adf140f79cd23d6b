"""Child processes started without fork(), for a process in which gRPC's threads run.

From the first daemon or channel on, gRPC has threads in this process. A
fork() copies the process with those threads stopped mid-flight: gRPC's
fork handlers warn ("fork_posix.cc ... skipping fork() handlers"), and
children forked that way have died before they ran. uvloop's subprocess
support forks (libuv's uv_spawn), so hixl-bench starts every child with
CPython's ``subprocess`` instead, from a worker thread: on Linux it uses
vfork (or posix_spawn), whose child runs no fork handlers and execs at once.
Reads of the child's pipes run in worker threads too, each bounded.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Mapping, Sequence

__all__ = ["DEVNULL", "PIPE", "Child", "start"]

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL


class Child:
    """One started child: bounded reads of its stdout, its stdin, its end."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    async def readline(self, timeout: float) -> bytes:
        """The next line of stdout (b"" at its end); TimeoutError after ``timeout`` s."""
        assert self.popen.stdout is not None
        return await asyncio.wait_for(asyncio.to_thread(self.popen.stdout.readline), timeout)

    async def write_and_close_stdin(self, data: bytes) -> None:
        assert self.popen.stdin is not None
        stdin = self.popen.stdin

        def write() -> None:
            try:
                stdin.write(data)
            finally:
                stdin.close()

        await asyncio.to_thread(write)

    async def communicate(self, timeout: float) -> tuple[bytes, bytes]:
        """Wait for the end, collecting stdout and stderr; kills the child after ``timeout``."""
        try:
            out, err = await asyncio.to_thread(self.popen.communicate, None, timeout)
        except subprocess.TimeoutExpired:
            await self.kill()
            raise TimeoutError(f"the child ran past {timeout:.0f} s") from None
        return out or b"", err or b""

    async def wait(self, timeout: float) -> int:
        """The exit status; the child is killed if it has not ended within ``timeout`` s."""
        try:
            return await asyncio.to_thread(self.popen.wait, timeout)
        except subprocess.TimeoutExpired:
            return await self.kill()

    async def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout`` s."""
        if self.popen.poll() is None:
            self.popen.terminate()
        return await self.wait(timeout)

    async def kill(self) -> int:
        if self.popen.poll() is None:
            self.popen.kill()
        return await asyncio.to_thread(self.popen.wait)


async def start(argv: Sequence[str], *, stdin: int = DEVNULL, stdout: int = DEVNULL,
                stderr: int = DEVNULL, env: Mapping[str, str] | None = None) -> Child:
    """Start ``argv`` (see the module docstring for why not asyncio's subprocesses)."""
    popen = await asyncio.to_thread(subprocess.Popen, list(argv), stdin=stdin, stdout=stdout,
                                    stderr=stderr, env=None if env is None else dict(env))
    return Child(popen)
