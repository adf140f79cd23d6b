# The native submission path of repeated transfers (csrc/native_lane.h).

NL_OK = HIXL_NL_OK
NL_FALLBACK = HIXL_NL_FALLBACK
NL_FAILED = HIXL_NL_FAILED
NL_CANCELLED = HIXL_NL_CANCELLED
NL_CANCEL = HIXL_NL_CANCEL  # a submission's kind: cancel the call it names


cdef class RepeatCell:
    """A prepared transfer that native lanes may run: a shape's planned ranges
    on one TCP link, started between other slots by shifting them.

    Args:
        handle: The shape's repeat handle (unique in the daemon's lifetime).
        owner: Which lanes may run it (those started with the same owner).
        push: A push (the data link writes) or a pull (it reads).
        checksum: The requests carry a CRC-32C.
        link: The link; kept alive by the cell.
        local: The local memory; referenced by the cell.
        region_id: The far region every range is in.
        ranges: (n, 3) uint64 rows planned between slots 0 and 0: (remote
            offset, local offset, length) for a pull, (local offset, remote
            offset, length) for a push, as ``DataLink`` takes them.
        src_stride, src_slots, dst_stride, dst_slots: What a slot adds to the
            source and destination offsets, and how many slots each has.
        nbytes: Bytes one transfer moves.
        timeout_ms: Bounds each transfer.

    Not in the lanes' table until ``publish``; ``revoke`` takes it out, and
    ``inflight`` then says how many transfers of it still run (each ends by
    its timeout). ``close`` revokes and waits for them.
    """

    cdef hixl_nl_cell *_c
    cdef DataLink _link
    cdef Mapping _local

    def __cinit__(self, *args, **kwargs):
        self._c = NULL

    def __init__(self, handle, owner, bint push, bint checksum, DataLink link not None,
                 Mapping local not None, region_id, ranges, src_stride, src_slots, dst_stride,
                 dst_slots, nbytes, timeout_ms):
        cdef uint64_t h = _u64(handle, "handle")
        cdef uint64_t o = _u64(owner, "owner")
        cdef uint64_t region = _u64(region_id, "region_id")
        cdef uint64_t sstride = _u64(src_stride, "src_stride")
        cdef uint64_t dstride = _u64(dst_stride, "dst_stride")
        cdef uint32_t sslots = _int_in(src_slots, 1, 0xFFFFFFFF, "src_slots")
        cdef uint32_t dslots = _int_in(dst_slots, 1, 0xFFFFFFFF, "dst_slots")
        cdef uint64_t nb = _u64(nbytes, "nbytes")
        cdef uint64_t tmo = _int_in(timeout_ms, 1, _MAX_TIMEOUT_MS, "timeout_ms")
        if link._closed:
            raise NativeError(HIXL_E_CLOSED, "the link is closed")
        local._check_open()
        cdef int remote_col = 1 if push else 0
        cdef int local_col = 0 if push else 1
        cdef Py_buffer view
        _u64_view(ranges, 3, "ranges", &view)
        cdef size_t n = <size_t>(view.len // 24), i
        cdef uint64_t *quads = NULL
        cdef const uint8_t *triples = <const uint8_t *>view.buf
        cdef int rc
        try:
            if n == 0:
                raise ValueError("a repeat cell needs at least one range")
            quads = <uint64_t *>malloc(32 * n)
            if quads == NULL:
                raise MemoryError()
            for i in range(n):
                quads[4 * i] = region
                quads[4 * i + 1] = hixl_load_u64(triples, 3 * i + remote_col)
                quads[4 * i + 2] = hixl_load_u64(triples, 3 * i + local_col)
                quads[4 * i + 3] = hixl_load_u64(triples, 3 * i + 2)
            rc = hixl_nl_cell_create(h, o, push, checksum, link._l, local._m, quads, n, sstride,
                                     sslots, dstride, dslots, nb, tmo, &self._c)
            if rc != HIXL_OK:
                _raise(rc, "cannot make a repeat cell")
        finally:
            PyBuffer_Release(&view)
            free(quads)
        self._link = link
        self._local = local

    def __dealloc__(self):
        if self._c != NULL:
            with nogil:
                hixl_nl_cell_destroy(self._c)
            self._c = NULL

    cdef int _check(self) except -1:
        if self._c == NULL:
            raise ValueError("the repeat cell is closed")
        return 0

    def publish(self):
        """Lets lanes of its owner run it (idempotent). Raises ValueError when
        another cell of the same handle is published."""
        self._check()
        cdef int rc = hixl_nl_publish(self._c)
        if rc != HIXL_OK:
            _raise(rc, "cannot publish the repeat cell")

    def revoke(self):
        """No lane starts it again once this returns. Idempotent."""
        if self._c != NULL:
            hixl_nl_revoke(self._c)

    @property
    def inflight(self):
        """Transfers of it that lanes run now."""
        return hixl_nl_inflight(self._c) if self._c != NULL else 0

    def close(self):
        """Revokes, waits (GIL released) until no transfer of it runs, frees it. Idempotent."""
        cdef hixl_nl_cell *c = self._c
        self._c = NULL
        if c != NULL:
            with nogil:
                hixl_nl_cell_destroy(c)
        self._link = None
        self._local = None


cdef class NativeLaneLog:
    """Where native lanes log the transfers they ran, for the event loop to
    read afterwards: ``fd`` is readable while records wait."""

    cdef hixl_nl_log *_g
    cdef hixl_nl_record *_buf
    cdef size_t _cap

    def __cinit__(self, capacity=65536):
        self._g = NULL
        self._cap = _int_in(capacity, 1, 1 << 24, "capacity")
        self._buf = <hixl_nl_record *>malloc(self._cap * sizeof(hixl_nl_record))
        if self._buf == NULL:
            raise MemoryError()
        cdef int rc = hixl_nl_log_create(self._cap, &self._g)
        if rc != HIXL_OK:
            _raise(rc, "cannot make the native lanes' log")

    def __dealloc__(self):
        hixl_nl_log_destroy(self._g)
        free(self._buf)

    @property
    def fd(self):
        return hixl_nl_log_fd(self._g)

    def take(self):
        """The records logged since the last take, oldest first, as tuples
        (owner, handle, outcome, native status, bytes, data ns), and how many
        were lost to a full log meanwhile."""
        cdef uint64_t dropped = 0
        cdef size_t n = hixl_nl_log_take(self._g, self._buf, self._cap, &dropped), k
        return [(self._buf[k].owner, self._buf[k].handle, self._buf[k].outcome,
                 self._buf[k].native_status, self._buf[k].bytes, self._buf[k].data_ns)
                for k in range(n)], dropped


cdef class NativeLane:
    """A thread that runs the repeats a client writes into ``submissions`` (this
    side consumes) and answers each in ``completions`` (this side produces),
    for the cells of ``owner``; it logs to ``log``. The rings are the lane's
    until ``stop``, which must come before they are closed, and which waits
    (GIL released) for transfers still out, each bounded by its deadline."""

    cdef hixl_nlane *_l
    cdef Ring _submissions
    cdef Ring _completions
    cdef NativeLaneLog _log

    def __cinit__(self, *args, **kwargs):
        self._l = NULL

    def __init__(self, Ring submissions not None, Ring completions not None, owner,
                 NativeLaneLog log not None):
        submissions._check()
        completions._check()
        cdef uint64_t o = _u64(owner, "owner")
        cdef int rc = hixl_nl_start(&submissions._r, &completions._r, o, log._g, &self._l)
        if rc != HIXL_OK:
            _raise(rc, "cannot start a native lane (a consuming and a producing ring?)")
        self._submissions = submissions
        self._completions = completions
        self._log = log

    def __dealloc__(self):
        if self._l != NULL:
            with nogil:
                hixl_nl_stop(self._l)
            self._l = NULL

    @property
    def served(self):
        """Submissions answered so far."""
        return hixl_nl_served(self._l) if self._l != NULL else 0

    @property
    def under_way(self):
        """Transfers it has out now (cancelled ones not counted)."""
        return hixl_nl_under_way(self._l) if self._l != NULL else 0

    @property
    def ended(self):
        """The thread ended on its own (a broken ring, a client that stopped reading)."""
        return self._l == NULL or bool(hixl_nl_ended(self._l))

    def stop(self):
        """Ends the thread (a transfer under way first ends) and releases the
        rings to their owner. Idempotent."""
        cdef hixl_nlane *l = self._l
        self._l = NULL
        if l != NULL:
            with nogil:
                hixl_nl_stop(l)
