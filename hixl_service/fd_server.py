"""Hands pool file descriptors to attached clients (SCM_RIGHTS).

gRPC cannot carry file descriptors, so clients fetch each pool's memfd here,
over a unix socket next to the client socket, in exchange for the one-time
token the Init reply gave them. Only a client that holds a session token can
map a pool; there is no name in any filesystem that would expose the memory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path

from hixl_client._compat import timeout

logger = logging.getLogger(__name__)

TOKEN_BYTES = 16
REQUEST_TIMEOUT_S = 5.0
GRANTED = b"\x00"
DENIED = b"\x01"


class FdServer:
    """A unix socket that answers a pool token with the pool's fd."""

    def __init__(self, path: Path, lookup: Callable[[bytes], int | None]) -> None:
        self.path = path
        self._lookup = lookup
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        if self.path.exists():
            self.path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.path))
        os.chmod(self.path, 0o660)
        sock.listen(64)
        sock.setblocking(False)
        self._sock = sock
        self._accepting = asyncio.get_running_loop().create_task(self._accept())

    async def _accept(self) -> None:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(self._sock)
            task = loop.create_task(self._serve(conn))
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        with conn:
            conn.setblocking(False)
            token = b""
            try:
                async with timeout(REQUEST_TIMEOUT_S):
                    while len(token) < TOKEN_BYTES:
                        chunk = await loop.sock_recv(conn, TOKEN_BYTES - len(token))
                        if not chunk:
                            return
                        token += chunk
            except asyncio.TimeoutError:
                logger.info("fd request timed out")
                return
            fd = self._lookup(token)
            # One byte (and maybe one fd) into an empty socket buffer cannot block.
            if fd is None:
                await loop.sock_sendall(conn, DENIED)
            else:
                socket.send_fds(conn, [GRANTED], [fd])

    async def close(self) -> None:
        tasks = [t for t in (self._accepting, *self._handlers) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self.path.unlink(missing_ok=True)
