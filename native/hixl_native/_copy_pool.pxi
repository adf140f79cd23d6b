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
