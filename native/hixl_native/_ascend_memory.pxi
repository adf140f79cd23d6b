# Device, IPC-imported and page-locked host memory; synchronous copies.

cdef int _release_memory(_Memory m) noexcept:
    """Frees what m holds and marks it closed; returns the native error of the
    free (else of withdrawing its export key), with the status recorded."""
    cdef int rc = 0, rc2 = 0
    cdef int32_t dev = m._dev._id
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
    _live[_LIVE_HOSTBUF if m._kind == _HOST else (_LIVE_IMPORT if m._kind == _DEVICE_IMPORTED
                                                   else _LIVE_DEVBUF)] -= 1
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


cdef int _copy(_Memory dst, uint64_t doff, _Memory src, uint64_t soff, uint64_t n,
               Stream stream) except -1:
    """Sync or (with a stream) queued copy between two memory objects."""
    cdef _Memory dev_side = dst if dst._kind != _HOST else src
    cdef int kind = ((ACL_MEMCPY_DEVICE_TO_DEVICE if src._kind != _HOST else ACL_MEMCPY_HOST_TO_DEVICE)
                     if dst._kind != _HOST else
                     (ACL_MEMCPY_DEVICE_TO_HOST if src._kind != _HOST else ACL_MEMCPY_HOST_TO_HOST))
    if (dst._kind != _HOST and src._kind != _HOST) and dst._dev is not src._dev:
        raise ValueError("device-to-device copies need both buffers on one device")
    if stream is not None and stream._dev is not dev_side._dev:
        raise ValueError(f"the stream belongs to device {stream._dev._id}, "
                         f"the memory to device {dev_side._dev._id}")
    if n == 0:
        return 0
    cdef int32_t dev = dev_side._dev._id
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
