# Streams: queued copies and HCCL operations, with the memory they pin.

cdef class Stream:
    """An ACL stream: queued copies and HCCL operations run in order.

    Memory used by queued work stays pinned until `synchronize` returns
    (other than on a timeout) or the stream is destroyed.
    """

    def __cinit__(self, *args, **kwargs):
        self._closed = True
        self._pinned = []

    def __init__(self, *args, **kwargs):
        raise TypeError("use Device.create_stream()")

    def __dealloc__(self):
        if not self._closed and self._dev is not None:
            with nogil:
                hixl_acl_stream_destroy(self._dev._id, self._s)
            self._closed = True
            self._unpin_all()
            self._dev._release()
            _live[_LIVE_STREAM] -= 1

    cdef int _check_open(self) except -1:
        if self._closed:
            raise ValueError("the stream is destroyed")
        return 0

    cdef void _pin(self, _Memory mem):
        mem._pins += 1
        self._pinned.append(mem)

    cdef void _unpin_all(self):
        for mem in self._pinned:
            (<_Memory>mem)._pins -= 1
        self._pinned = []

    @property
    def device(self):
        """The owning `Device`."""
        return self._dev

    @property
    def closed(self):
        """Whether the stream was destroyed."""
        return self._closed

    @property
    def pending(self):
        """Memory pins held by queued work."""
        return len(self._pinned)

    def memcpy_async(self, _Memory dst not None, dst_offset, _Memory src not None, src_offset,
                     nbytes):
        """Queue a copy (``aclrtMemcpyAsync``); the kind follows from the objects.

        Host memory must be a `HostBuffer` (it must outlive the queued copy).
        """
        cdef uint64_t doff, soff, n, n2
        _bounds(dst, dst_offset, nbytes, &doff, &n)
        _bounds(src, src_offset, nbytes, &soff, &n2)
        _copy(dst, doff, src, soff, n, self)

    def synchronize(self, timeout_ms=None):
        """Wait for the queued work.

        Args:
            timeout_ms: None waits without a bound (``aclrtSynchronizeStream``);
                else ``aclrtSynchronizeStreamWithTimeout`` with 1..2**31-1 ms.

        Raises:
            AclError: A queued task failed, or the timeout passed (e.g. 507046,
                ``ACL_ERROR_RT_STREAM_SYNC_TIMEOUT``; the work stays queued).
        """
        self._check_open()
        cdef int32_t t = -1 if timeout_ms is None else _int_in(timeout_ms, 1, _I32_MAX, "timeout_ms")
        cdef int rc
        with nogil:
            rc = hixl_acl_stream_sync(self._dev._id, self._s, t)
        if rc not in _STILL_BUSY:
            self._unpin_all()
        _check(rc)

    def destroy(self):
        """Destroy the stream (``aclrtDestroyStream``), dropping queued work; idempotent."""
        if self._closed:
            return
        cdef int rc
        with nogil:
            rc = hixl_acl_stream_destroy(self._dev._id, self._s)
        self._closed = True
        self._unpin_all()
        self._dev._release()
        _live[_LIVE_STREAM] -= 1
        _check(rc)

    close = destroy

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.destroy()

    def __repr__(self):
        return f"<Stream device {self._dev._id if self._dev is not None else '?'}" \
               f"{', destroyed' if self._closed else ''}>"
