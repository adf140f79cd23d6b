"""Device memory a hixl daemon can reach (its hccl backend): for registered DEVICE caches.

On the hccl backend the daemon moves device memory itself, so memory that a
cache registers must be importable by the daemon. ``alloc_device_shareable``
allocates it with ACL on one device of this process (``aclrtMalloc``, 2 MiB
aligned); on first registration hixl exports it to the daemon's process with
ACL IPC. Use it where you would have allocated the KV cache with torch_npu::

    buf = alloc_device_shareable(2 * desc.size, device_id=0)
    cache = await cm.register_cache(desc, [buf.address, buf.address + desc.size])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._memory import drop_buffer
from .shareable import Registry
from .status import LLMException, LLMStatusCode

if TYPE_CHECKING:
    from hixl_native._ascend import DeviceBuffer


class DeviceShareableBuffer:
    """Device memory of this process that a hixl daemon can import.

    Args:
        nbytes: the size in bytes (> 0; rounded up to ACL's 2 MiB).
        device_id: the device to allocate on (the cluster's ``ge.exec.deviceId``).
        cann_path: where CANN's libraries are; None uses the CANN environment
            (or the runtime already loaded in this process).

    Raises:
        ValueError: ``nbytes`` is not positive.
        LLMException: CANN cannot be loaded (``LLM_FEATURE_NOT_ENABLED``) or the
            device has no memory left (``LLM_DEVICE_OUT_OF_MEMORY``).
    """

    def __init__(self, nbytes: int, device_id: int = 0, cann_path: str | None = None) -> None:
        if nbytes <= 0:
            raise ValueError(f"nbytes must be > 0, got {nbytes}")
        from hixl_native import _ascend

        try:
            device = _ascend.load(cann_path).set_device(device_id)
            self.buffer: DeviceBuffer = device.malloc(nbytes, huge_only=False)
        except _ascend.AscendUnavailable as exc:
            raise LLMException(str(exc), status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED) \
                from None
        except _ascend.AscendError as exc:
            raise LLMException(f"cannot allocate {nbytes} bytes on device {device_id}: {exc}",
                               status_code=LLMStatusCode.LLM_DEVICE_OUT_OF_MEMORY) from None
        self.device_id = device_id
        # cluster upload token -> (its daemon's fd socket, the daemon's buffer id)
        self._imported: dict[bytes, tuple[str, int]] = {}
        _DEVICE_REGISTRY.add(self)

    @property
    def address(self) -> int:
        """The buffer's first byte (a device address valid in this process)."""
        return self.buffer.address

    @property
    def size(self) -> int:
        return self.buffer.size

    def export_for(self, daemon_tgid: int) -> str:
        """Export the buffer to a daemon's process; return the IPC key."""
        key = self.buffer.export_key(pid_validation=True)
        self.buffer.allow_import([daemon_tgid])
        return key

    def close(self) -> None:
        """Free the memory, once each daemon it was registered with closed its
        import (CANN frees shared memory in that order).

        Raises:
            BufferError: caches registered over it remain in a daemon;
                unregister them (or finalize) first. The buffer stays usable.
        """
        if self.buffer.closed:
            return
        for token, (fd_socket, buffer_id) in list(self._imported.items()):
            if drop_buffer(fd_socket, token, buffer_id):
                del self._imported[token]
        if self._imported:
            raise BufferError("a hixl daemon still holds this device buffer (caches "
                              "registered over it remain, or it did not answer): unregister "
                              "them (or finalize) before closing it")
        _DEVICE_REGISTRY.remove(self)
        try:
            self.buffer.unexport()
        finally:
            self.buffer.close()

    def __enter__(self) -> DeviceShareableBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def alloc_device_shareable(nbytes: int, device_id: int = 0,
                           cann_path: str | None = None) -> DeviceShareableBuffer:
    """Allocate ``nbytes`` of device memory that a hixl daemon (hccl backend) can import."""
    return DeviceShareableBuffer(nbytes, device_id, cann_path)


_DEVICE_REGISTRY: Registry[DeviceShareableBuffer] = Registry()


def locate_device(addrs: list[int], length: int) -> tuple[DeviceShareableBuffer, list[int]] | None:
    """The device buffer holding every tensor and their offsets, or None when the
    first address is in no device buffer (the memory is host memory then).

    Raises:
        LLMException: the addresses start in a device buffer but do not all
            lie in it (``LLM_PARAM_INVALID``).
    """
    if not addrs or _DEVICE_REGISTRY.find(addrs[0], length) is None:
        return None
    located = _DEVICE_REGISTRY.locate(addrs, length)
    if located is None:
        raise LLMException("every tensor of one registered cache must lie in one buffer from "
                           "hixl_client.alloc_device_shareable",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID)
    return located
