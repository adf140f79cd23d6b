# Device, IPC-imported and page-locked host memory, host memory of other
# objects; synchronous copies; reading range lists.

cdef inline bint _on_host(_Memory m) noexcept:
    return m._kind == _HOST or m._kind == _HOST_REGION


cdef int _live_slot(int kind) noexcept:
    if kind == _DEVICE_OWNED:
        return _LIVE_DEVBUF
    if kind == _DEVICE_IMPORTED:
        return _LIVE_IMPORT
    return _LIVE_HOSTBUF if kind == _HOST else _LIVE_HOSTREGION


cdef int _release_memory(_Memory m) noexcept:
    """Frees what m holds and marks it closed; returns the native error of the
    free (else of withdrawing its export key), with the status recorded."""
    cdef int rc = 0, rc2 = 0
    cdef int32_t dev = m._dev._id
    if m._kind == _HOST_REGION:
        # the owner's memory: only our export of it goes
        PyBuffer_Release(&(<HostRegion>m)._view)
    else:
        with nogil:
            if m._kind == _DEVICE_OWNED:
                if m._exported:
                    rc = hixl_acl_ipc_close(dev, m._key)
                rc2 = hixl_acl_free(dev, m._ptr)
            elif m._kind == _DEVICE_IMPORTED:
                rc2 = hixl_acl_ipc_close(dev, m._key)
            else:
                rc2 = hixl_acl_free_host(dev, m._ptr)
    m._closed = True
    m._exported = False
    m._dev._release()
    _live[_live_slot(m._kind)] -= 1
    return rc2 if rc2 else rc


cdef int _bounds(_Memory m, object offset, object nbytes, uint64_t *off, uint64_t *n) except -1:
    m._check_open()
    off[0] = _int_in(offset, 0, m._size, "offset")
    n[0] = _int_in(nbytes, 0, m._size - off[0], "nbytes")
    return 0


cdef class _Memory:
    """Common part of device and host memory objects."""

    def __cinit__(self, *args, **kwargs):
        self._closed = True
        self._key[0] = 0

    def __init__(self, *args, **kwargs):
        raise TypeError(f"{type(self).__name__} objects come from Device methods")

    def __dealloc__(self):
        if not self._closed and self._dev is not None:
            _release_memory(self)

    cdef int _check_open(self) except -1:
        if self._closed:
            raise ValueError(f"{self!r} is closed")
        return 0

    @property
    def size(self):
        """Usable bytes."""
        return self._size

    @property
    def address(self):
        """The address in this process, as an opaque int (see `unsafe_memcpy`)."""
        return <uintptr_t>self._ptr

    @property
    def device(self):
        """The owning `Device`."""
        return self._dev

    @property
    def closed(self):
        """Whether the memory was released."""
        return self._closed

    @property
    def pins(self):
        """Queued stream operations using this memory, not yet synchronized."""
        return self._pins

    def close(self):
        """Release the memory; idempotent.

        Raises:
            BufferError: Queued stream work, a copy in progress or a buffer
                view still uses it.
            AclError: CANN refused (the object is closed all the same).
        """
        if self._closed:
            return
        if self._pins:
            raise BufferError(f"{self!r} is in use ({self._pins} queued stream operations, "
                              "copies in progress or buffer views)")
        _check(_release_memory(self))

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self):
        state = "closed" if self._closed else f"{self._size} bytes"
        dev = self._dev._id if self._dev is not None else "?"
        return f"<{type(self).__name__} device {dev}, {state}>"


cdef Device _copy_device(_Memory dst, _Memory src, Stream stream):
    """The device a copy between dst and src runs on (that of the device side;
    src's for host to host), checking that the memory and stream agree."""
    cdef _Memory dev_side = src if _on_host(dst) else dst
    if not _on_host(dst) and not _on_host(src) and dst._dev is not src._dev:
        raise ValueError("device-to-device copies need both buffers on one device")
    if stream is not None and stream._dev is not dev_side._dev:
        raise ValueError(f"the stream belongs to device {stream._dev._id}, "
                         f"the memory to device {dev_side._dev._id}")
    return dev_side._dev


cdef int _copy_kind(_Memory dst, _Memory src) noexcept:
    if _on_host(dst):
        return ACL_MEMCPY_HOST_TO_HOST if _on_host(src) else ACL_MEMCPY_DEVICE_TO_HOST
    return ACL_MEMCPY_HOST_TO_DEVICE if _on_host(src) else ACL_MEMCPY_DEVICE_TO_DEVICE


cdef int _copy(_Memory dst, uint64_t doff, _Memory src, uint64_t soff, uint64_t n,
               Stream stream) except -1:
    """Sync or (with a stream) queued copy between two memory objects."""
    cdef int32_t dev = _copy_device(dst, src, stream)._id
    cdef int kind = _copy_kind(dst, src)
    if n == 0:
        return 0
    cdef char *d = dst._ptr + doff
    cdef const char *s = src._ptr + soff
    cdef int rc
    dst._pins += 1
    src._pins += 1
    try:
        if stream is None:
            with nogil:
                rc = hixl_acl_memcpy(dev, d, n, s, n, kind)
        else:
            stream._check_open()
            with nogil:
                rc = hixl_acl_memcpy_async(dev, d, n, s, n, kind, stream._s)
            if rc == 0:
                stream._pin(dst)
                stream._pin(src)
    finally:
        dst._pins -= 1
        src._pins -= 1
    return _check(rc)


def memcpy(_Memory dst not None, dst_offset, _Memory src not None, src_offset, nbytes):
    """Copy ``nbytes`` between two memory objects and wait (``aclrtMemcpy``).

    The kind (host/device to host/device) follows from the objects; device
    memory on both sides must belong to one device.

    Raises:
        ValueError: A range lies outside its object, or devices differ.
        AclError: CANN refused the copy.
    """
    cdef uint64_t doff, soff, n, n2
    _bounds(dst, dst_offset, nbytes, &doff, &n)
    _bounds(src, src_offset, nbytes, &soff, &n2)
    _copy(dst, doff, src, soff, n, None)


cdef class DeviceMemory(_Memory):
    """Device memory usable in this process (owned or IPC-imported)."""

    def write(self, offset, data):
        """Copy a host buffer-protocol object to ``offset`` and wait (host to device)."""
        cdef uint64_t off, n
        cdef Py_buffer view
        cdef int rc
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            _bounds(self, offset, view.len, &off, &n)
            if n:
                self._pins += 1
                with nogil:
                    rc = hixl_acl_memcpy(self._dev._id, self._ptr + off, n, view.buf, n,
                                         ACL_MEMCPY_HOST_TO_DEVICE)
                self._pins -= 1
                _check(rc)
        finally:
            PyBuffer_Release(&view)

    def read_into(self, offset, out):
        """Fill a writable host buffer from ``offset`` and wait (device to host)."""
        cdef uint64_t off, n
        cdef Py_buffer view
        cdef int rc
        PyObject_GetBuffer(out, &view, PyBUF_WRITABLE)
        try:
            _bounds(self, offset, view.len, &off, &n)
            if n:
                self._pins += 1
                with nogil:
                    rc = hixl_acl_memcpy(self._dev._id, view.buf, n, self._ptr + off, n,
                                         ACL_MEMCPY_DEVICE_TO_HOST)
                self._pins -= 1
                _check(rc)
        finally:
            PyBuffer_Release(&view)

    def read(self, offset, nbytes):
        """Return ``nbytes`` from ``offset`` as bytes (device to host)."""
        cdef uint64_t off, n
        _bounds(self, offset, nbytes, &off, &n)
        out = bytearray(n)
        self.read_into(offset, out)
        return bytes(out)


cdef class DeviceBuffer(DeviceMemory):
    """Device memory from ``aclrtMalloc``, 2 MiB aligned and sized."""

    @property
    def key(self):
        """The IPC export key, or None when not exported."""
        return self._key.decode("ascii") if self._exported else None

    def export_key(self, *, pid_validation=True):
        """Export the buffer for other processes (``aclrtIpcMemGetExportKey``).

        Args:
            pid_validation: When true (CANN's default) only processes named
                with `allow_import` may import it; when false, any may.

        Returns:
            The key for `Device.import_ipc` (the same key on later calls).
        """
        self._check_open()
        cdef int rc
        cdef int validate = 1 if pid_validation else 0
        if not self._exported:
            with nogil:
                rc = hixl_acl_ipc_export(self._dev._id, self._ptr, self._size, validate,
                                         self._key)
            _check(rc)
            self._exported = True
        return self._key.decode("ascii")

    def allow_import(self, pids):
        """Let processes import the exported buffer (``aclrtIpcMemSetImportPid``).

        Args:
            pids: Their `AscendRuntime.bare_tgid` values.
        """
        self._check_open()
        if not self._exported:
            raise ValueError("export_key() first")
        values = [_int_in(p, 1, _I32_MAX, "pid") for p in pids]
        if not values:
            return
        cdef int32_t *arr = <int32_t *>malloc(len(values) * sizeof(int32_t))
        cdef size_t i, n = len(values)
        cdef int rc
        if arr == NULL:
            raise MemoryError()
        for i in range(n):
            arr[i] = values[i]
        with nogil:
            rc = hixl_acl_ipc_allow(self._dev._id, self._key, arr, n)
        free(arr)
        _check(rc)

    def unexport(self):
        """Withdraw the export key (``aclrtIpcMemClose``); importers should close first."""
        cdef int rc
        if self._closed or not self._exported:
            return
        with nogil:
            rc = hixl_acl_ipc_close(self._dev._id, self._key)
        self._exported = False
        _check(rc)


cdef class ImportedBuffer(DeviceMemory):
    """Device memory of another process, mapped by `Device.import_ipc`."""

    @property
    def key(self):
        """The key it was imported with."""
        return self._key.decode("ascii")


cdef class HostBuffer(_Memory):
    """Page-locked host memory from ``aclrtMallocHost``; a writable buffer."""

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        self._check_open()
        PyBuffer_FillInfo(buffer, self, self._ptr, self._size, 0, flags)
        self._exports += 1
        self._pins += 1

    def __releasebuffer__(self, Py_buffer *buffer):
        self._exports -= 1
        self._pins -= 1


cdef class HostRegion(_Memory):
    """Host memory of another object (e.g. a `hixl_native.Mapping`), usable
    wherever a `HostBuffer` is as a copy operand.

    The region holds a writable buffer export of ``owner`` until it is closed,
    so the owner can neither go nor release the memory meanwhile (a
    ``Mapping`` refuses to close while exported). `close` drops the export
    and frees nothing.

    The memory is not page-locked: CANN 8.5 and later document that a queued
    copy of such memory (``aclrtMemcpyAsync``) returns only once it is done.

    Args:
        device: The device made current for its copies, as for a `HostBuffer`
            (host to device copies run on the device side's device anyway).
        owner: An object exporting the memory as a writable contiguous buffer.
        address: Start of the region in this process, e.g. ``owner.address +
            offset``; ``[address, address + size)`` must lie in owner's buffer.
        size: Bytes, > 0.

    Raises:
        TypeError: ``owner`` exports no buffer.
        BufferError: Its buffer is read-only or not contiguous.
        ValueError: The range lies outside it.
    """

    def __init__(self, Device device not None, owner, address, size):
        device._check_open()
        if self._dev is not None:
            raise RuntimeError("HostRegion is already initialized")
        cdef uint64_t start = _int_in(address, 1, _U64_MAX, "address")
        cdef uint64_t n = _int_in(size, 1, _U64_MAX, "size")
        PyObject_GetBuffer(owner, &self._view, PyBUF_WRITABLE)
        cdef uint64_t base = <uintptr_t>self._view.buf
        cdef uint64_t length = self._view.len
        if start < base or n > length or start - base > length - n:
            PyBuffer_Release(&self._view)
            raise ValueError(f"[{start:#x}, {start:#x} + {n}) is not inside the owner's "
                             f"{length} bytes at {base:#x}")
        _adopt_memory(self, device, <void *><uintptr_t>start, n, _HOST_REGION)


def unsafe_memcpy(Device device not None, dst_addr, src_addr, nbytes, kind, Stream stream=None):
    """Copy between raw addresses: the one entry point taking them from Python.

    Nothing is checked beyond what CANN checks: the caller guarantees both
    ranges stay valid until the copy (or, with a stream, its synchronize) ends.

    Args:
        device: The device made current for the call.
        dst_addr: Destination address in this process.
        src_addr: Source address in this process.
        nbytes: Bytes to copy.
        kind: A `MemcpyKind`.
        stream: Queue the copy on this stream instead of waiting.
    """
    device._check_open()
    cdef uintptr_t d = _int_in(dst_addr, 1, _U64_MAX, "dst_addr")
    cdef uintptr_t s = _int_in(src_addr, 1, _U64_MAX, "src_addr")
    cdef size_t n = _int_in(nbytes, 0, _U64_MAX, "nbytes")
    cdef int k = MemcpyKind(kind)
    cdef int rc
    if stream is None:
        with nogil:
            rc = hixl_acl_memcpy(device._id, <void *>d, n, <const void *>s, n, k)
    else:
        stream._check_open()
        with nogil:
            rc = hixl_acl_memcpy_async(device._id, <void *>d, n, <const void *>s, n, k, stream._s)
    _check(rc)


# Unsigned 64-bit integers in native (little-endian here) order; "L" is
# 64 bits wide on the LP64 platforms CANN supports.
cdef frozenset _U64_FORMATS = frozenset((b"Q", b"@Q", b"=Q", b"<Q", b"L", b"@L"))


cdef uint64_t *_u64_tuples(object obj, size_t group, str what, size_t *count) except NULL:
    """Copies a C-contiguous buffer of uint64 `group`-tuples into a malloc'd
    array (the caller frees it) and sets *count to the number of tuples.

    Ranges are checked on the copy and queued from it: the caller's array
    could change under another thread once the GIL is released, which must
    not turn checked ranges into unchecked ones.
    """
    cdef Py_buffer view
    cdef uint64_t *copy = NULL
    PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    try:
        fmt = b"B" if view.format == NULL else <bytes>view.format
        if view.itemsize != 8 or fmt not in _U64_FORMATS:
            raise TypeError(f"{what} must be a buffer of native uint64, not format "
                            f"{fmt.decode('ascii', 'replace')!r}")
        if view.len % (8 * group):
            raise ValueError(f"{what} must hold whole {group}-tuples of uint64, "
                             f"got {view.len // 8} values")
        copy = <uint64_t *>malloc(<size_t>view.len if view.len else 1)
        if copy == NULL:
            raise MemoryError()
        c_memcpy(copy, view.buf, <size_t>view.len)
        count[0] = <size_t>view.len // (8 * group)
    finally:
        PyBuffer_Release(&view)
    return copy


cdef inline bint _range_in(uint64_t offset, uint64_t n, uint64_t size) noexcept:
    return offset <= size and n <= size - offset
