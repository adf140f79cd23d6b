# CopyPool: local copies on native threads, finished through a CompletionQueue.


cdef class CopyPool:
    """Native threads copying between mappings; each copy posts one completion.

    Unlike Python's thread pool the workers never take the GIL, so a copy
    handed over while the event loop's thread runs Python starts at once.

    Args:
        threads: Worker threads, 1..64.
        completions: Where each copy posts ``(request_id, status)``: ``OK``,
            or ``E_CANCELLED`` when the pool closed before the copy started.

    Raises:
        MemoryError: The workers could not be started.
    """

    def __cinit__(self, *args, **kwargs):
        self._p = NULL

    def __init__(self, threads, CompletionQueue completions not None):
        cdef hixl_copy_pool *p = NULL
        cdef int rc
        if self._p != NULL:
            raise RuntimeError("CopyPool is already initialized")
        cdef int n = _int_in(threads, 1, 64, "threads")
        with nogil:
            rc = hixl_copy_pool_open(n, completions._q, &p)
        if rc != HIXL_OK:
            _raise(rc, "cannot start the copy threads")
        self._p = p

    def submit(self, request_id, Mapping dst not None, Mapping src not None, ranges,
               uint64_t request_bytes=0):
        """Queue a ``copy_ranges`` and return at once.

        The ranges are checked and copied here; both mappings stay pinned
        until the copy's completion is posted.

        Args:
            request_id: uint64 echoed in the completion.
            dst, src, ranges, request_bytes: As ``copy_ranges``.

        Raises:
            As ``copy_ranges`` for bad ranges; ``NativeError`` (``E_CLOSED``)
            once the pool is closed. Nothing is posted then.
        """
        cdef uint64_t rid = _u64(request_id, "request_id")
        cdef Py_buffer view
        cdef size_t n
        cdef const uint8_t *triples
        cdef int rc
        if self._p == NULL:
            _raise(HIXL_E_CLOSED, "the copy pool is closed")
        dst._check_open()
        src._check_open()
        # Checked and copied with the GIL held throughout, so no other thread
        # can change the ranges in between.
        _u64_view(ranges, 3, "ranges", &view)
        try:
            n = <size_t>(view.len // 24)
            triples = <const uint8_t *>view.buf
            _check_triples(triples, n, dst, src)
            rc = hixl_copy_pool_submit(self._p, rid, dst._m, src._m, triples, n, request_bytes)
        finally:
            PyBuffer_Release(&view)
        if rc != HIXL_OK:
            _raise(rc, f"cannot queue copy {request_id}")

    def copy_helped(self, Mapping dst not None, Mapping src not None, ranges,
                    uint64_t dst_shift=0, uint64_t src_shift=0):
        """Copy now, on the calling thread and one worker at once (GIL released).

        The ranges are cut into two shares of about equal bytes; a worker
        copies one while the caller copies the other, and the call returns
        when both are done: no completion is posted. If no worker has taken
        its share by the time the caller is done with its own, the caller
        copies that too. Ranges must not overlap each other, since the
        shares are copied at the same time.

        Args:
            dst, src, ranges, dst_shift, src_shift: As ``copy_ranges``.

        Raises:
            As ``copy_ranges`` for bad ranges (nothing is copied);
            ``NativeError`` (``E_CLOSED``) once the pool is closed.
        """
        cdef size_t n = 0
        cdef int rc
        cdef hixl_copy_pool *p = NULL
        if self._p == NULL:
            _raise(HIXL_E_CLOSED, "the copy pool is closed")
        dst._check_open()
        src._check_open()
        cdef uint8_t *triples = _snapshot_u64(ranges, 3, "ranges", &n)
        try:
            _shift_triples(triples, n, dst_shift, src_shift)
            _check_triples(triples, n, dst, src)
            # Read again: taking the buffer may have run Python, and another
            # thread's close() with it. From here to the hold nothing can, so
            # the hold (taken with the GIL, like close) keeps the pool alive.
            p = self._p
            if p == NULL:
                _raise(HIXL_E_CLOSED, "the copy pool is closed")
            # Pinned, so a close() from another thread cannot unmap mid-copy.
            hixl_mapping_pin(dst._m)
            hixl_mapping_pin(src._m)
            hixl_copy_pool_hold(p)
            with nogil:
                rc = hixl_copy_pool_copy_helped(p, dst._m, src._m, triples, n)
            hixl_mapping_unpin(src._m)
            hixl_mapping_unpin(dst._m)
        finally:
            free(triples)
        if rc != HIXL_OK:
            _raise(rc, "cannot share the copy")

    def close(self):
        """Cancel queued copies, wait for running ones, stop the threads. Idempotent."""
        cdef hixl_copy_pool *p = self._p
        self._p = NULL
        if p != NULL:
            with nogil:
                hixl_copy_pool_close(p)

    def __dealloc__(self):
        if self._p != NULL:
            with nogil:
                hixl_copy_pool_close(self._p)
            self._p = NULL
