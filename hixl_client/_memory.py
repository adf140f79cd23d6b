"""Maps the daemon's pools into this process.

Host pools: the daemon hands each pool's memfd over its fd socket
(SCM_RIGHTS) in exchange for the token of the Init reply; the client maps it
with the native ``Mapping``, so a cache's ``tensor_addrs`` are addresses
valid here and its views are zero-copy.

Device pools (the daemon's hccl backend): the client loads CANN from where
the daemon did, asks the daemon to let its process import the pools
(``ShareDevicePools`` with its ACL process id) and imports them with ACL IPC,
so ``tensor_addrs`` are device addresses valid in this process.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import hixl_native

from hixl_wire._proto.hixl.v1 import client_pb2

from .status import LLMException, LLMStatusCode
from .types import Placement

if TYPE_CHECKING:
    from hixl_native._ascend import AscendRuntime, DeviceMemory, ImportedBuffer

FD_REQUEST_TIMEOUT_S = 5.0
_GRANTED = b"\x00"
_BUSY = b"\x02"
# Operations of the daemon's fd socket (see hixl_service.fd_server).
_OP_FETCH = b"\x01"
_OP_UPLOAD = b"\x02"
_OP_BIND = b"\x03"
_OP_DROP = b"\x04"
_YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
_PR_SET_PTRACER = 0x59616D61


@dataclass
class PoolMapping:
    """One pool of the cluster (or a shareable buffer), mapped in this process."""

    pool_id: int
    placement: Placement
    mapping: hixl_native.Mapping | None = None
    # A device pool imported with ACL IPC (or a registered device buffer of this process).
    device: DeviceMemory | None = None

    @property
    def base(self) -> int:
        return self.mapping.address if self.mapping is not None else self._device().address

    @property
    def size(self) -> int:
        return self.mapping.size if self.mapping is not None else self._device().size

    def address(self, offset: int) -> int:
        return self.base + offset

    def view(self, offset: int, length: int) -> memoryview:
        """A zero-copy host view; device memory has none."""
        if self.mapping is None:
            raise LLMException(
                "this cache is in Ascend device memory, which has no host view; copy it with "
                "ACL (aclrtMemcpy) or torch_npu at its tensor_addrs",
                status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
        return self.mapping.view(offset, length)

    def close(self) -> None:
        """Close an imported device pool (before the daemon frees it); host
        mappings stay until the last view is gone."""
        if self.device is not None:
            self.device.close()

    def _device(self) -> DeviceMemory:
        assert self.device is not None
        return self.device


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


ShareDevicePools = Callable[[int], Awaitable[client_pb2.ShareDevicePoolsReply]]


async def map_pools(reply: client_pb2.InitReply,
                    share: ShareDevicePools) -> dict[int, PoolMapping]:
    """Map every pool of an Init reply into this process, off the event loop.

    ``share`` asks the daemon to let this process (by ACL process id) import
    the device pools; it is called only when there are some.
    """
    host = [p for p in reply.pools if not p.on_device]
    device = [p for p in reply.pools if p.on_device]
    mapped = list(await asyncio.gather(
        *(asyncio.to_thread(_map_pool, reply.fd_socket, p) for p in host)))
    if device:
        try:
            mapped.extend(await _import_device_pools(reply.cann_path, device, share))
        except BaseException:
            for pool in mapped:
                pool.close()
            raise
    return {m.pool_id: m for m in mapped}


def _import(runtime: AscendRuntime, device_id: int, key: str, size: int) -> ImportedBuffer:
    return runtime.set_device(device_id).import_ipc(key, size)


async def _import_device_pools(cann_path: str, pools: list[client_pb2.PoolInfo],
                               share: ShareDevicePools) -> list[PoolMapping]:
    from hixl_native import _ascend

    def load() -> tuple[_ascend.AscendRuntime, int]:
        runtime = _ascend.load(cann_path or None)
        return runtime, runtime.bare_tgid()

    try:
        runtime, tgid = await asyncio.to_thread(load)
    except (_ascend.AscendUnavailable, _ascend.AscendError) as exc:
        raise LLMException(f"the daemon's pools are in Ascend device memory, but this process "
                           f"cannot use CANN: {exc}",
                           status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED) from exc
    keys = {k.pool_id: k.ipc_key for k in (await share(tgid)).pools}
    imported: list[PoolMapping] = []
    try:
        for pool in pools:
            if pool.pool_id not in keys:
                raise LLMException(f"the daemon did not share device pool {pool.pool_id}",
                                   status_code=LLMStatusCode.LLM_FAILED)
            buffer = await asyncio.to_thread(_import, runtime, pool.device_id,
                                             keys[pool.pool_id], pool.size)
            imported.append(PoolMapping(pool.pool_id, Placement(pool.placement), device=buffer))
    except _ascend.AscendError as exc:
        for done in imported:
            done.close()
        raise LLMException(f"cannot import the daemon's device pool: {exc}",
                           status_code=LLMStatusCode.LLM_FAILED) from exc
    except BaseException:
        for done in imported:
            done.close()
        raise
    return imported


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


def drop_buffer(fd_socket: str, token: bytes, buffer_id: int) -> bool:
    """Tell the daemon this process is closing a buffer it handed over (blocking,
    bounded; the daemon answers before it unmaps a host buffer, and after it
    closed its import of device memory, which this process may then free).

    Returns False when the daemon may still hold the buffer: it answered BUSY
    (device memory that caches lie in) or did not answer in time, so device
    memory must not be freed yet. A daemon that refuses (its cluster ended)
    or is gone (nothing listens on its socket) holds the buffer no more.
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(FD_REQUEST_TIMEOUT_S)
            sock.connect(fd_socket)
            sock.sendall(_OP_DROP + token + buffer_id.to_bytes(8, "little"))
            reply = sock.recv(1)
    except (ConnectionRefusedError, FileNotFoundError):
        return True
    except OSError:  # a timeout, or the daemon went away mid-answer
        return False
    return reply not in (_BUSY, b"")


async def upload_buffer(fd_socket: str, token: bytes, fd: int) -> int:
    """Hand a shareable buffer's fd to the daemon; return the daemon's buffer id."""
    try:
        return await asyncio.to_thread(_upload, fd_socket, token, fd)
    except OSError as exc:
        raise LLMException(f"cannot hand a buffer to the daemon at {fd_socket}: {exc}",
                           status_code=LLMStatusCode.LLM_FAILED) from exc


def _allow_daemon(daemon_pid: int) -> None:
    """Under Yama ptrace_scope 1 only a process's ancestors, or the one it names,
    may read its memory: name the daemon (the peer of the fd socket, as the
    kernel reports it). Other scopes need nothing, or cannot be helped here."""
    try:
        with open(_YAMA_SCOPE) as scope:
            if scope.read().strip() != "1":
                return
    except OSError:
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PTRACER, daemon_pid, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PTRACER) failed")


def _bind(fd_socket: str, token: bytes) -> None:
    import struct

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(FD_REQUEST_TIMEOUT_S)
        sock.connect(fd_socket)
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _allow_daemon(struct.unpack("3i", creds)[0])
        sock.sendall(_OP_BIND + token)
        reply = sock.recv(1)
    if reply != _GRANTED:
        raise LLMException("the daemon could not bind this process to the cluster, so it "
                           "cannot reach memory the engine allocated itself; register memory "
                           "from hixl_client.alloc_shareable instead",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID)


async def bind_process(fd_socket: str, token: bytes) -> None:
    """Bind this process to the cluster on the daemon's fd socket, where the
    kernel tells the daemon who connected (a pid is never claimed): the
    daemon then reaches memory this process registers with cross-memory calls."""
    try:
        await asyncio.to_thread(_bind, fd_socket, token)
    except OSError as exc:
        raise LLMException(f"cannot bind this process to the daemon at {fd_socket}: {exc}",
                           status_code=LLMStatusCode.LLM_FAILED) from exc
