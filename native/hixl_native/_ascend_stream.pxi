# Streams: queued copies and HCCL operations, with the memory they pin.

cdef class Stream:
    """An ACL stream: queued copies and HCCL operations run in order.

    Memory used by queued work stays pinned until `synchronize` returns
    (other than on a timeout) or the stream is destroyed.

    CANN's ``aclrtDestroyStream`` waits for unfinished tasks ("aclrtDestroyStream",
    CANN API reference, aclcppdevg_03_0070: synchronize first), so a stream whose
    last synchronize did not complete is never destroyed as is: `destroy` first
    aborts its work (``aclrtStreamAbort``, aclcppdevg_03_1777, where present) and
    waits for it within a bound, and abandons the stream (memory stays pinned)
    if that wait does not end.
    """

    def __cinit__(self, *args, **kwargs):
        self._closed = True
        self._pinned = []

    def __init__(self, *args, **kwargs):
        raise TypeError("use Device.create_stream()")

    def __dealloc__(self):
        if not self._closed and self._dev is not None:
            self._teardown(_ABANDON_WAIT_MS)

    cdef int _teardown(self, int32_t timeout_ms):
        """Destroy the stream, or abandon it when its work does not end (see the
        class); returns the destroy's code, or the wait's when abandoned."""
        cdef int rc = 0
        cdef int32_t dev = self._dev._id
        cdef bint can_abort = (hixl_acl_features() & HIXL_ACL_HAS_STREAM_ABORT) != 0
        if self._pinned:
            with nogil:
                if can_abort:
                    hixl_acl_stream_abort(dev, self._s)
                rc = hixl_acl_stream_sync(dev, self._s, timeout_ms)
            if rc in _STILL_BUSY or rc == _ACL_API_NOT_SUPPORT:
                # still running: destroying it would block (and free pinned memory)
                self._closed = True
                _live[_LIVE_STREAM] -= 1
                _live[_LIVE_ABANDONED_STREAM] += 1
                return rc
        with nogil:
            rc = hixl_acl_stream_destroy(dev, self._s)
        self._closed = True
        self._unpin_all()
        self._dev._release()
        _live[_LIVE_STREAM] -= 1
        return rc

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

        Host memory must be a `HostBuffer` or `HostRegion` (it must outlive the
        queued copy).
        """
        cdef uint64_t doff, soff, n, n2
        _bounds(dst, dst_offset, nbytes, &doff, &n)
        _bounds(src, src_offset, nbytes, &soff, &n2)
        _copy(dst, doff, src, soff, n, self)

    def memcpy_ranges(self, _Memory dst not None, _Memory src not None, triples):
        """Queue one copy (``aclrtMemcpyAsync``) per range of a planned transfer.

        Every range is checked before any is queued; the copies are queued in
        one loop without the GIL. The kind follows from the objects, as for
        `memcpy_async`. Both objects are pinned until `synchronize`.

        Args:
            dst: Memory copied into.
            src: Memory copied from.
            triples: A C-contiguous buffer of native uint64 (e.g. a numpy
                array of shape (n, 3)) holding ``(dst_offset, src_offset,
                length)`` triples, offsets relative to ``dst`` and ``src``.
                Ranges of length 0 are skipped.

        Raises:
            TypeError: ``triples`` is not a buffer of uint64.
            ValueError: It holds a partial triple, a range lies outside its
                object, or the devices differ.
            AclError: CANN refused a copy; the ranges before it stay queued
                (and the memory pinned).
        """
        self._check_open()
        dst._check_open()
        src._check_open()
        cdef int32_t dev = _copy_device(dst, src, self)._id
        cdef int kind = _copy_kind(dst, src)
        cdef size_t n, i, queued = 0
        cdef uint64_t *r = _u64_tuples(triples, 3, "triples", &n)
        cdef uint64_t *t
        cdef int rc = 0
        try:
            for i in range(n):
                t = r + 3 * i
                if not _range_in(t[0], t[2], dst._size) or not _range_in(t[1], t[2], src._size):
                    raise ValueError(f"triples[{i}] = ({t[0]}, {t[1]}, {t[2]}) lies outside dst "
                                     f"({dst._size} bytes) or src ({src._size} bytes)")
            # pinned while the GIL is released, so that no other thread frees them
            dst._pins += 1
            src._pins += 1
            with nogil:
                for i in range(n):
                    t = r + 3 * i
                    if t[2] == 0:
                        continue
                    rc = hixl_acl_memcpy_async(dev, dst._ptr + t[0], t[2], src._ptr + t[1], t[2],
                                               kind, self._s)
                    if rc:
                        break
                    queued += 1
            dst._pins -= 1
            src._pins -= 1
        finally:
            free(r)
        if queued:
            self._pin(dst)
            self._pin(src)
        _check(rc)

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

    def destroy(self, timeout_ms=_ABANDON_WAIT_MS):
        """Destroy the stream (``aclrtDestroyStream``); idempotent.

        Work whose synchronize did not complete is aborted first and waited for
        up to ``timeout_ms``; if it does not end, the stream is abandoned, not
        destroyed (its memory stays pinned; counted as ``abandoned_streams`` in
        `live_objects`).

        Raises:
            AclError: ``aclrtDestroyStream`` failed, or the stream was abandoned
                (the wait's code, e.g. 507046).
        """
        if self._closed:
            return
        cdef int32_t t = _int_in(timeout_ms, 1, _I32_MAX, "timeout_ms")
        _check(self._teardown(t))

    def abort(self):
        """Stop the running task and drop the queued ones (``aclrtStreamAbort``).

        A later `synchronize` reports the abort (107023,
        ``ACL_ERROR_RT_STREAM_ABORT``) and releases the pins.

        Raises:
            AclError: 200001 (``ACL_ERROR_API_NOT_SUPPORT``) where this CANN lacks
                the entry point (`AscendRuntime.features` has no ``stream_abort``).
        """
        self._check_open()
        cdef int rc
        with nogil:
            rc = hixl_acl_stream_abort(self._dev._id, self._s)
        _check(rc)

    close = destroy

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.destroy()

    def __repr__(self):
        return f"<Stream device {self._dev._id if self._dev is not None else '?'}" \
               f"{', destroyed' if self._closed else ''}>"
