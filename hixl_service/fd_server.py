"""Hands file descriptors between the daemon and attached clients (SCM_RIGHTS).

gRPC cannot carry file descriptors, so they travel over a unix socket next
to the client socket. A request is one byte of operation and a 16-byte token
that only a client holding a session has (from its Init reply):

* FETCH, with a pool's token: the answer is one status byte and the pool's
  memfd, which the client maps;
* UPLOAD, with the cluster's upload token and a shareable buffer's fd
  attached: the daemon maps the buffer (for registered caches) and answers a
  status byte and the buffer id (8 bytes, little endian);
* DROP, with the cluster's upload token and a buffer id (8 bytes, little
  endian): the client is closing that buffer; the daemon unmaps a shareable
  buffer once no registered cache lies in it (after its answer), and closes
  its import of device memory at once (before its answer), or answers BUSY
  while caches lie in it (the client must not free it then); one status
  byte;
* BIND, with the cluster's upload token: the daemon binds the process at the
  other end of this connection, as the kernel names it (``SO_PEERPIDFD`` /
  ``SO_PEERCRED``), to the cluster, whose engine-allocated memory it then
  reaches with cross-memory calls (``memory.process``); one status byte.

There is no name in any filesystem that would expose the memory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

from hixl_wire.status import LLMException

from .memory.process import ClientProcess

logger = logging.getLogger(__name__)

TOKEN_BYTES = 16
REQUEST_BYTES = 1 + TOKEN_BYTES
REQUEST_TIMEOUT_S = 5.0
OP_FETCH = 1
OP_UPLOAD = 2
OP_BIND = 3
OP_DROP = 4
BUFFER_ID_BYTES = 8
GRANTED = b"\x00"
DENIED = b"\x01"
BUSY = b"\x02"


def _receive(conn: socket.socket) -> tuple[bytes, list[int]]:
    """Read one request and any fds sent with it (blocking, bounded; runs in a thread)."""
    conn.settimeout(REQUEST_TIMEOUT_S)
    data, fds = b"", []
    while len(data) < _request_bytes(data):
        chunk, more, _flags, _addr = socket.recv_fds(conn, _request_bytes(data) - len(data), 1)
        fds.extend(more)
        if not chunk:
            break
        data += chunk
    return data, fds


def _request_bytes(head: bytes) -> int:
    """A request's length, known from its first byte."""
    return REQUEST_BYTES + (BUFFER_ID_BYTES if head[:1] == bytes([OP_DROP]) else 0)


class FdServer:
    """A unix socket that trades tokens for fds, and fds for buffer ids."""

    def __init__(self, path: Path, lookup_pool: Callable[[bytes], int | None],
                 add_buffer: Callable[[bytes, int], Awaitable[int]],
                 bind_process: Callable[[bytes, ClientProcess], None] | None = None,
                 drop_buffer: Callable[[bytes, int], Awaitable[bool]] | None = None) -> None:
        self.path = path
        self._lookup_pool = lookup_pool
        self._add_buffer = add_buffer
        self._drop_buffer = drop_buffer
        self._bind_process = bind_process
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
        with conn:
            try:
                data, fds = await asyncio.to_thread(_receive, conn)
            except OSError as exc:
                logger.info("fd request failed: %s", exc)
                return
            try:
                reply, send_fd = await self._answer(data, fds, conn)
            finally:
                for fd in fds:
                    os.close(fd)  # the daemon keeps mappings, never the client's fds
            # A few bytes (and maybe one fd) into an empty socket buffer cannot block.
            conn.setblocking(False)
            try:
                if send_fd is None:
                    await asyncio.get_running_loop().sock_sendall(conn, reply)
                else:
                    socket.send_fds(conn, [reply], [send_fd])
            except OSError as exc:  # the client left without its answer
                logger.debug("fd reply not delivered: %s", exc)

    async def _answer(self, data: bytes, fds: list[int],
                conn: socket.socket) -> tuple[bytes, int | None]:
        if len(data) != _request_bytes(data):
            return DENIED, None
        op, token = data[0], data[1:REQUEST_BYTES]
        if op == OP_DROP and not fds and self._drop_buffer is not None:
            (buffer_id,) = struct.unpack("<Q", data[REQUEST_BYTES:])
            try:
                dropped = await self._drop_buffer(token, buffer_id)
            except LLMException as exc:
                logger.info("buffer drop refused: %s", exc)
                return DENIED, None
            return (GRANTED if dropped else BUSY), None
        if op == OP_BIND and not fds and self._bind_process is not None:
            try:
                process = ClientProcess.of_peer(conn)
            except OSError as exc:
                logger.info("process bind refused: %s", exc)
                return DENIED, None
            try:
                self._bind_process(token, process)
            except LLMException as exc:
                process.close()
                logger.info("process bind refused: %s", exc)
                return DENIED, None
            return GRANTED, None
        if op == OP_FETCH:
            fd = self._lookup_pool(token)
            return (DENIED, None) if fd is None else (GRANTED, fd)
        if op == OP_UPLOAD and len(fds) == 1:
            try:
                buffer_id = await self._add_buffer(token, fds[0])
            except (LLMException, OSError) as exc:
                logger.info("buffer upload refused: %s", exc)
                return DENIED, None
            return GRANTED + struct.pack("<Q", buffer_id), None
        return DENIED, None

    async def close(self) -> None:
        tasks = [t for t in (self._accepting, *self._handlers) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self.path.unlink(missing_ok=True)
