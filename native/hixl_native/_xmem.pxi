# BouncePool and ProcessSpan: memory of a client process that the daemon
# reaches with process_vm_readv / process_vm_writev (csrc/xmem.h), and
# copy_process, local copies with such memory on one side or both.

_MAX_PROBE_ADDRS = 1 << 24


cdef class BouncePool:
    """A fixed set of daemon-side buffers that stage client-process memory
    moving to or from a socket; made once, never grown.

    Args:
        count: Buffers, >= 1.
        size: Bytes per buffer, a positive multiple of 4096.

    Raises:
        ValueError: A count or size out of range.
        MemoryError: The buffers cannot be mapped.
    """

    def __cinit__(self, *args, **kwargs):
        self._b = NULL

    def __init__(self, count, size):
        cdef hixl_bounce *b = NULL
        if self._b != NULL:
            raise RuntimeError("BouncePool is already initialized")
        cdef size_t n = _int_in(count, 1, 1 << 16, "count")
        cdef size_t sz = _int_in(size, 4096, 1 << 30, "size")
        if sz % 4096:
            raise ValueError(f"size must be a multiple of 4096, got {size}")
        cdef int rc
        with nogil:
            rc = hixl_bounce_create(n, sz, &b)
        if rc != HIXL_OK:
            _raise(rc, f"cannot make {count} bounce buffers of {size} bytes")
        self._b = b

    def __dealloc__(self):
        if self._b != NULL:
            hixl_bounce_unref(self._b)  # users keep their own references
            self._b = NULL

    @property
    def buffer_size(self):
        return hixl_bounce_size(self._b)

    @property
    def free(self):
        """Buffers not taken right now."""
        return hixl_bounce_free_count(self._b)


cdef class ProcessSpan:
    """A span ``[base, base + size)`` of a client process's own memory.

    Args:
        pidfd: A pidfd of the process (duplicated; the caller keeps its own).
        pid: Its pid, as the kernel reported it for the pidfd.
        base: The span's first address in the process.
        size: Bytes, > 0.
        inbound: Bounce buffers for the data server's requests.
        outbound: Bounce buffers for this daemon's own requests and copies.

    Raises:
        ValueError: A size of 0 or a span that wraps around.
    """

    def __cinit__(self, *args, **kwargs):
        self._x = NULL
        self._revoked = False

    def __init__(self, pidfd, pid, base, size, BouncePool inbound not None,
                 BouncePool outbound not None):
        cdef hixl_xmem *x = NULL
        if self._x != NULL:
            raise RuntimeError("ProcessSpan is already initialized")
        cdef int cfd = _int_in(pidfd, 0, 0x7FFFFFFF, "pidfd")
        cdef int cpid = _int_in(pid, 1, 0x7FFFFFFF, "pid")
        cdef uint64_t cbase = _u64(base, "base")
        cdef uint64_t csize = _int_in(size, 1, _U64_MAX - cbase, "size")
        cdef int rc = hixl_xmem_create(cfd, cpid, cbase, csize, inbound._b, outbound._b, &x)
        if rc != HIXL_OK:
            _raise(rc, f"cannot describe {size} bytes at {base:#x} of process {pid}", errno)
        self._x = x
        self._size = csize

    def __dealloc__(self):
        if self._x != NULL:
            hixl_xmem_unref(self._x)
            self._x = NULL

    cdef int _check_open(self) except -1:
        if self._revoked:
            raise NativeError(HIXL_E_GONE, "the process memory was revoked")
        return 0

    @property
    def pid(self):
        return self._x.pid

    @property
    def base(self):
        return self._x.base

    @property
    def size(self):
        return self._size

    @property
    def revoked(self):
        return self._revoked

    @property
    def alive(self):
        """False once the process exited."""
        return bool(hixl_xmem_alive(self._x))

    def revoke(self):
        """End all access: every later native call on the span fails with
        ``E_GONE``; calls already under way finish. Idempotent."""
        self._revoked = True
        hixl_xmem_revoke(self._x)

    def probe(self, addrs):
        """Read one byte at each absolute address (GIL released).

        Raises:
            NativeError: ``E_REFUSED`` (errno EPERM: not allowed; EFAULT: not
                mapped), or ``E_GONE`` (the process exited or the span was revoked).
            ValueError: An address outside the span.
        """
        self._check_open()
        cdef size_t n = len(addrs), i
        if n > _MAX_PROBE_ADDRS:
            raise ValueError(f"at most {_MAX_PROBE_ADDRS} probe addresses, got {n}")
        cdef uint64_t *a = <uint64_t *>malloc(8 * n if n else 8)
        cdef uint64_t v
        cdef int rc, err
        if a == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                v = _u64(addrs[i], "addrs")
                if not (self._x.base <= v < self._x.base + self._size):
                    raise ValueError(f"address {v:#x} is outside the span")
                a[i] = v
            with nogil:
                rc = hixl_xmem_probe(self._x, a, n)
                err = errno
            if rc != HIXL_OK:
                raise NativeError(rc, f"cannot read process {self._x.pid}'s memory "
                                  f"({_errno_mod.errorcode.get(err, err)})", err)
        finally:
            free(a)

    def __repr__(self):
        return (f"<ProcessSpan pid {self._x.pid} [{self._x.base:#x}, +{self._size}) "
                f"{'revoked' if self._revoked else 'open'}>")


cdef int _side(object memory, hixl_xmem **x, uint8_t **addr, uint64_t *size) except -1:
    """One side of copy_process: a Mapping or a ProcessSpan."""
    if isinstance(memory, ProcessSpan):
        (<ProcessSpan>memory)._check_open()
        x[0] = (<ProcessSpan>memory)._x
        addr[0] = NULL
        size[0] = (<ProcessSpan>memory)._size
        return 0
    if isinstance(memory, Mapping):
        (<Mapping>memory)._check_open()
        x[0] = NULL
        addr[0] = (<Mapping>memory)._m.addr
        size[0] = (<Mapping>memory)._size
        return 0
    raise TypeError(f"expected a Mapping or a ProcessSpan, not {type(memory).__name__}")


def copy_process(dst not None, src not None, ranges, timeout_ms=60000,
                 uint64_t dst_shift=0, uint64_t src_shift=0):
    """Copy byte ranges where one side or both are a ``ProcessSpan``, GIL released.

    Args:
        dst, src: A ``Mapping`` or a ``ProcessSpan`` each (not both Mappings:
            ``copy_ranges`` copies those).
        ranges: (dst_offset, src_offset, length) uint64 triples, offsets from
            each side's start.
        timeout_ms: How long a copy between two process memories may wait for
            a bounce buffer.
        dst_shift, src_shift: As for ``copy_ranges``.

    Returns:
        The native status: ``OK``, ``E_GONE`` (revoked, or the process
        exited), ``E_REFUSED`` (not allowed, or not mapped), ``E_TIMEOUT``.

    Raises:
        TypeError / ValueError: Bad arguments or a triple outside a side
            (nothing is copied then).
    """
    cdef hixl_xmem *dx = NULL
    cdef hixl_xmem *sx = NULL
    cdef uint8_t *da = NULL
    cdef uint8_t *sa = NULL
    cdef uint64_t dsize = 0, ssize = 0, deadline
    cdef size_t n = 0, bad = 0
    cdef int rc
    _side(dst, &dx, &da, &dsize)
    _side(src, &sx, &sa, &ssize)
    if dx == NULL and sx == NULL:
        raise TypeError("copy_process needs a ProcessSpan on one side; use copy_ranges")
    cdef uint64_t tmo = _int_in(timeout_ms, 1, _MAX_TIMEOUT_MS, "timeout_ms")
    cdef uint8_t *triples = _snapshot_u64(ranges, 3, "ranges", &n)
    try:
        _shift_triples(triples, n, dst_shift, src_shift)
        if hixl_check_triples(triples, n, dsize, ssize, &bad) != HIXL_OK:
            raise ValueError(f"range {bad} is outside dst ({dsize} bytes) or src "
                             f"({ssize} bytes)")
        # Mappings are pinned (a close() from another thread cannot unmap
        # mid-copy); a ProcessSpan is kept by this call's references.
        if dx == NULL:
            hixl_mapping_pin((<Mapping>dst)._m)
        if sx == NULL:
            hixl_mapping_pin((<Mapping>src)._m)
        deadline = hixl_now_ns() + tmo * 1000000
        with nogil:
            rc = hixl_xmem_copy(dx, da, sx, sa, triples, n, deadline)
        if dx == NULL:
            hixl_mapping_unpin((<Mapping>dst)._m)
        if sx == NULL:
            hixl_mapping_unpin((<Mapping>src)._m)
    finally:
        free(triples)
    return rc
