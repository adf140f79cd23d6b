# CompletionQueue: native threads post, the asyncio loop drains.


cdef class CompletionQueue:
    """Completions from native threads to the asyncio loop, without polling.

    ``fd`` is an eventfd that is readable exactly while completions are
    pending: register it with ``loop.add_reader(fd, callback)`` and call
    ``drain()`` from the callback.

    Raises:
        NativeError: The eventfd could not be created.
    """

    def __cinit__(self):
        cdef hixl_cq *q = NULL
        cdef int err
        cdef int rc = hixl_cq_create(&q)
        err = errno
        if rc != HIXL_OK:
            _raise(rc, "cannot create the completion eventfd", err)
        self._q = q

    def __dealloc__(self):
        if self._q != NULL:
            hixl_cq_unref(self._q)
            self._q = NULL

    @property
    def fd(self):
        """The eventfd (EFD_NONBLOCK | EFD_CLOEXEC); -1 once closed."""
        return hixl_cq_fd(self._q)

    def drain(self):
        """Reset the eventfd and return every pending completion.

        Returns:
            ``(request_id, status)`` pairs, oldest first; status is ``OK``
            or one of the ``E_*`` codes.
        """
        cdef hixl_cq_node *node = hixl_cq_take(self._q)
        cdef hixl_cq_node *nxt
        out = []
        try:
            while node != NULL:
                out.append((node.id, node.status))
                nxt = node.next
                hixl_cq_node_free(node)
                node = nxt
        finally:
            # Only reached with nodes left if append raised MemoryError.
            while node != NULL:
                nxt = node.next
                hixl_cq_node_free(node)
                node = nxt
        return out

    def close(self):
        """Close the eventfd; later completions are dropped. Idempotent."""
        hixl_cq_close(self._q)

    def __repr__(self):
        return f"<CompletionQueue fd={self.fd}>"
