"""Maps the daemon's pools into this process.

The daemon hands each pool's memfd over its fd socket (SCM_RIGHTS) in
exchange for the token of the Init reply; the client maps it with the native
``Mapping``, so a cache's ``tensor_addrs`` are addresses valid here and its
views are zero-copy.
"""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass

import hixl_native

from ._proto.hixl.v1 import client_pb2
from .status import LLMException, LLMStatusCode
from .types import Placement

FD_REQUEST_TIMEOUT_S = 5.0
_GRANTED = b"\x00"
# Operations of the daemon's fd socket (see hixl_service.fd_server).
_OP_FETCH = b"\x01"
_OP_UPLOAD = b"\x02"


@dataclass
class PoolMapping:
    """One pool of the cluster, mapped in this process."""

    pool_id: int
    placement: Placement
    mapping: hixl_native.Mapping

    def address(self, offset: int) -> int:
        return self.mapping.address + offset


def _fetch_fd(fd_socket: str, token: bytes) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(FD_REQUEST_TIMEOUT_S)
        sock.connect(fd_socket)
        sock.sendall(_OP_FETCH + token)
        message, fds, _flags, _addr = socket.recv_fds(sock, 1, 1)
    if message != _GRANTED or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise LLMException("the daemon refused to hand out a pool",
                           status_code=LLMStatusCode.LLM_FAILED)
    return fds[0]


def _map_pool(fd_socket: str, pool: client_pb2.PoolInfo) -> PoolMapping:
    try:
        fd = _fetch_fd(fd_socket, pool.fd_token)
    except OSError as exc:
        raise LLMException(f"cannot fetch pool {pool.pool_id} from {fd_socket}: {exc}",
                           status_code=LLMStatusCode.LLM_FAILED) from exc
    try:
        mapping = hixl_native.Mapping(fd, pool.size)
    finally:
        os.close(fd)  # the mapping keeps the memory; the fd is not needed any more
    return PoolMapping(pool.pool_id, Placement(pool.placement), mapping)


async def map_pools(fd_socket: str, pools: list[client_pb2.PoolInfo]) -> dict[int, PoolMapping]:
    """Fetch and map every pool of an Init reply, off the event loop."""
    mapped = await asyncio.gather(*(asyncio.to_thread(_map_pool, fd_socket, p) for p in pools))
    return {m.pool_id: m for m in mapped}


def _upload(fd_socket: str, token: bytes, fd: int) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(FD_REQUEST_TIMEOUT_S)
        sock.connect(fd_socket)
        socket.send_fds(sock, [_OP_UPLOAD + token], [fd])
        reply = b""
        while len(reply) < 9:
            chunk = sock.recv(9 - len(reply))
            if not chunk:
                break
            reply += chunk
    if len(reply) != 9 or reply[:1] != _GRANTED:
        raise LLMException("the daemon refused the shareable buffer",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID)
    return int.from_bytes(reply[1:], "little")


async def upload_buffer(fd_socket: str, token: bytes, fd: int) -> int:
    """Hand a shareable buffer's fd to the daemon; return the daemon's buffer id."""
    try:
        return await asyncio.to_thread(_upload, fd_socket, token, fd)
    except OSError as exc:
        raise LLMException(f"cannot hand a buffer to the daemon at {fd_socket}: {exc}",
                           status_code=LLMStatusCode.LLM_FAILED) from exc
