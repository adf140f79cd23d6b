# Mapping (a shared mapping of an fd), SharedPool (a memfd plus allocator),
# ExtentAllocator (the allocator alone, for memory that is not a mapping)
# and copy_ranges.


cdef class Mapping:
    """A shared memory mapping of an fd (MAP_SHARED, read/write).

    The mapping exports itself through the buffer protocol; ``view()`` and
    ``memoryview(mapping)`` are zero-copy. Every live view, registered
    server region and in-flight native operation pins the memory, and
    ``close()`` refuses to unmap while anything is pinned.

    Args:
        fd: The file descriptor to map. The caller keeps ownership of it.
        size: Number of bytes to map, from offset 0.

    Raises:
        ValueError: ``size`` is not positive or exceeds the file's size.
        NativeError: ``mmap`` failed (code ``E_IO``, errno in the message).
    """

    def __cinit__(self, *args, **kwargs):
        self._m = NULL
        self._size = 0

    def __init__(self, fd, size):
        cdef hixl_mapping *m = NULL
        cdef int rc, err, cfd
        cdef uint64_t csize
        if self._m != NULL:
            raise RuntimeError("Mapping is already initialized")
        cfd = _int_in(fd, 0, 0x7FFFFFFF, "fd")
        csize = _int_in(size, 1, 0x7FFFFFFFFFFFFFFF, "size")
        with nogil:
            rc = hixl_mapping_create(cfd, csize, 0, -1, &m)
            err = errno
        if rc == HIXL_E_INVAL:
            raise ValueError(f"cannot map {size} bytes of fd {fd}: larger than the file")
        if rc != HIXL_OK:
            _raise(rc, f"cannot map {size} bytes of fd {fd}", err)
        self._m = m
        self._size = csize

    def __dealloc__(self):
        if self._m != NULL:
            hixl_mapping_unref(self._m)
            self._m = NULL

    cdef int _check_open(self) except -1:
        if self._m == NULL or self._m.addr == NULL:
            raise ValueError("mapping is closed")
        return 0

    @property
    def address(self):
        """Base address in this process (0 once closed)."""
        if self._m == NULL or self._m.addr == NULL:
            return 0
        return <uintptr_t>self._m.addr

    @property
    def size(self):
        """Mapped size in bytes."""
        return self._size

    @property
    def closed(self):
        """True once ``close()`` unmapped the memory."""
        return self._m == NULL or self._m.addr == NULL

    @property
    def exports(self):
        """Live pins: buffer views plus native users (regions, transfers)."""
        return 0 if self._m == NULL else hixl_mapping_pins(self._m)

    def view(self, offset, length):
        """Return a writable zero-copy view of ``[offset, offset + length)``.

        Args:
            offset: Start of the view in bytes.
            length: Length of the view in bytes.

        Returns:
            A ``memoryview`` of format ``B``; it pins the mapping until released.

        Raises:
            ValueError: The range lies outside the mapping, or it is closed.
        """
        self._check_open()
        _int_in(offset, 0, self._size, "offset")
        _int_in(length, 0, self._size - offset, "length")
        return memoryview(self)[offset:offset + length]

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        if self._m == NULL or self._m.addr == NULL:
            raise BufferError("mapping is closed")
        PyBuffer_FillInfo(buffer, self, self._m.addr, <Py_ssize_t>self._size, 0, flags)
        hixl_mapping_pin(self._m)

    def __releasebuffer__(self, Py_buffer *buffer):
        hixl_mapping_unpin(self._m)

    def close(self):
        """Unmap the memory. Idempotent.

        Raises:
            BufferError: Views or native users still pin the mapping.
        """
        if self._m == NULL or self._m.addr == NULL:
            return
        cdef int rc = hixl_mapping_unmap(self._m)
        if rc != HIXL_OK:
            _raise(rc, f"mapping still has {hixl_mapping_pins(self._m)} exports")

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self):
        state = "closed" if self.closed else f"{self._size} bytes at {self.address:#x}"
        return f"<{type(self).__name__} {state}>"



cdef class AdoptedMapping(Mapping):
    """This process's own memory, moved onto an fd in place (``MAP_FIXED``).

    The bytes of ``[address, address + size)`` are copied into ``fd`` and the
    fd is mapped over them at the same address, so pointers into the range
    (a tensor's, an allocator's) stay valid while another process that maps
    ``fd`` shares the bytes. ``close()`` forgets the range and never unmaps
    it: it still belongs to whoever allocated it.

    Args:
        fd: A memfd at least ``size`` long. The caller keeps ownership of it.
        address: The range's first byte, page-aligned.
        size: Its length, a whole number of pages.

    Raises:
        ValueError: an unaligned range, or a file shorter than ``size``.
        NativeError: the copy or the mapping failed; the range keeps its
            bytes, part of them on the fd.
    """

    def __init__(self, fd, address, size):
        cdef hixl_mapping *m = NULL
        cdef int rc, err, cfd
        cdef uint64_t csize
        cdef uintptr_t caddr
        if self._m != NULL:
            raise RuntimeError("AdoptedMapping is already initialized")
        cfd = _int_in(fd, 0, 0x7FFFFFFF, "fd")
        caddr = _int_in(address, 1, _U64_MAX, "address")
        csize = _int_in(size, 1, 0x7FFFFFFFFFFFFFFF, "size")
        with nogil:
            rc = hixl_mapping_adopt(<void *>caddr, csize, cfd, &m)
            err = errno
        if rc == HIXL_E_INVAL:
            raise ValueError(f"cannot move {size} bytes at {address:#x} onto fd {fd}: the "
                             "range must be whole pages and the file at least that long")
        if rc != HIXL_OK:
            _raise(rc, f"cannot move {size} bytes at {address:#x} onto fd {fd}", err)
        self._m = m
        self._size = csize

# The allocator methods SharedPool and ExtentAllocator share; `owner` names
# the object in the exhaustion message.

cdef object _extents_alloc(hixl_extents *x, object nbytes, str owner):
    cdef uint64_t n, off = 0, used, free_bytes
    cdef int rc
    n = _int_in(nbytes, 1, _U64_MAX, "nbytes")
    with nogil:
        rc = hixl_extents_alloc(x, n, &off)
    if rc != HIXL_OK:
        hixl_extents_usage(x, &used, &free_bytes)
        _raise(rc, f"cannot allocate {nbytes} bytes: {free_bytes} of "
                   f"{hixl_extents_size(x)} bytes free in {owner}")
    return off


cdef int _extents_free(hixl_extents *x, object offset) except -1:
    cdef uint64_t off = _u64(offset, "offset")
    cdef int rc
    with nogil:
        rc = hixl_extents_free(x, off)
    if rc != HIXL_OK:
        _raise(rc, f"offset {offset} is not the start of an allocation")
    return 0


cdef object _extents_allocation_size(hixl_extents *x, object offset):
    cdef uint64_t size = 0
    cdef int rc = hixl_extents_allocation_size(x, _u64(offset, "offset"), &size)
    if rc != HIXL_OK:
        _raise(rc, f"offset {offset} is not the start of an allocation")
    return size


cdef tuple _extents_usage(hixl_extents *x):
    cdef uint64_t used, free_bytes
    hixl_extents_usage(x, &used, &free_bytes)
    return used, free_bytes


cdef class SharedPool(Mapping):
    """A page-granular allocator over an anonymous memfd.

    The memfd (``MFD_CLOEXEC``, named ``hixl-pool:<name>`` for diagnostics
    only, never visible in a filesystem) is created by the daemon; clients
    map ``fd`` with :class:`Mapping`. Allocation is thread-safe and runs
    without the GIL.

    Args:
        name: A label for /proc/<pid>/maps and fd listings.
        size: Pool size in bytes, rounded up to whole pages.
        page_shift: log2 of the page size, in [10, 31).
        populate: Pre-fault every page now (MAP_POPULATE) and write it
            once, so the first transfer into a page pays neither a page
            fault nor a hypervisor's first-write trap.

    Raises:
        ValueError: A bad size, page shift or name.
        NativeError: The memfd could not be created or mapped.
    """

    def __cinit__(self, *args, **kwargs):
        self._pool = NULL

    def __init__(self, name, size, page_shift, populate=True):
        cdef hixl_pool *p = NULL
        cdef int rc, err, cpop = bool(populate)
        cdef uint64_t csize
        cdef unsigned cshift
        if self._m != NULL:
            raise RuntimeError("SharedPool is already initialized")
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        bname = name.encode()
        if b"\0" in bname or len(bname) > 200:
            raise ValueError("name must be at most 200 bytes and contain no NUL")
        cshift = _int_in(page_shift, HIXL_EXTENTS_MIN_PAGE_SHIFT,
                         HIXL_EXTENTS_MAX_PAGE_SHIFT - 1, "page_shift")
        csize = _int_in(size, 1, (1 << 62), "size")
        cdef const char *cname = bname
        with nogil:
            rc = hixl_pool_create(cname, csize, cshift, cpop, &p)
            err = errno
        if rc != HIXL_OK:
            _raise(rc, f"cannot create pool {name!r} of {size} bytes", err)
        self._pool = p
        self._page_shift = cshift
        self._m = p.map
        hixl_mapping_ref(self._m)
        self._size = p.map.size

    def __dealloc__(self):
        if self._pool != NULL:
            hixl_pool_destroy(self._pool)
            self._pool = NULL

    cdef int _check_pool(self) except -1:
        if self._pool == NULL:
            raise ValueError("pool is closed")
        return 0

    @property
    def fd(self):
        """The memfd, owned by the pool (-1 once closed)."""
        return -1 if self._pool == NULL else self._pool.map.owned_fd

    @property
    def page_size(self):
        """Allocation granularity in bytes."""
        return 1 << self._page_shift

    @property
    def page_shift(self):
        """log2 of ``page_size``."""
        return self._page_shift

    @property
    def used_bytes(self):
        """Bytes in live allocations (whole pages)."""
        self._check_pool()
        return _extents_usage(&self._pool.ext)[0]

    @property
    def free_bytes(self):
        """Bytes not allocated (possibly fragmented)."""
        self._check_pool()
        return _extents_usage(&self._pool.ext)[1]

    def alloc(self, nbytes):
        """Allocate ``nbytes`` rounded up to whole pages.

        Args:
            nbytes: Requested size, > 0.

        Returns:
            The offset of the block in the pool.

        Raises:
            ValueError: ``nbytes`` is not positive, or the pool is closed.
            PoolExhausted: No free extent is large enough.
        """
        self._check_pool()
        return _extents_alloc(&self._pool.ext, nbytes, "pool")

    def free(self, offset):
        """Return a block to the pool, coalescing it with free neighbours.

        Args:
            offset: The offset ``alloc()`` returned.

        Raises:
            ValueError: ``offset`` does not start a live allocation.
        """
        self._check_pool()
        _extents_free(&self._pool.ext, offset)

    def allocation_size(self, offset):
        """Return the rounded size of the live allocation at ``offset``.

        Raises:
            ValueError: ``offset`` does not start a live allocation.
        """
        self._check_pool()
        return _extents_allocation_size(&self._pool.ext, offset)

    def close(self):
        """Unmap the pool and close its memfd. Idempotent.

        Raises:
            BufferError: Views or native users still pin the pool.
        """
        Mapping.close(self)
        if self._pool != NULL:
            hixl_pool_destroy(self._pool)
            self._pool = NULL


cdef class ExtentAllocator:
    """A page-granular, thread-safe allocator of offsets, with no memory behind it.

    The allocator of :class:`SharedPool` on its own, for memory that is not
    a mapping (device memory): it hands out page-aligned offsets in
    ``[0, size)`` and the caller owns the memory they index, which must
    span ``size`` bytes (the requested size rounded up to whole pages).
    Allocation and freeing run without the GIL. There is no ``close()``:
    the bookkeeping is freed when the object is garbage collected, so no
    thread can still be inside a call.

    Args:
        size: Bytes to manage, rounded up to whole pages.
        page_shift: log2 of the page size, in [10, 31).

    Raises:
        TypeError: ``size`` or ``page_shift`` is not an int.
        ValueError: A bad size or page shift.
    """

    def __cinit__(self, *args, **kwargs):
        self._x = NULL

    def __init__(self, size, page_shift):
        cdef hixl_extents *x = NULL
        cdef uint64_t csize
        cdef unsigned cshift
        cdef int rc
        if self._x != NULL:
            raise RuntimeError("ExtentAllocator is already initialized")
        cshift = _int_in(page_shift, HIXL_EXTENTS_MIN_PAGE_SHIFT,
                         HIXL_EXTENTS_MAX_PAGE_SHIFT - 1, "page_shift")
        csize = _int_in(size, 1, (1 << 62), "size")
        rc = hixl_extents_create(csize, cshift, &x)
        if rc != HIXL_OK:
            _raise(rc, f"cannot create an allocator of {size} bytes")
        self._x = x
        self._page_shift = cshift

    def __dealloc__(self):
        if self._x != NULL:
            hixl_extents_destroy(self._x)
            self._x = NULL

    cdef int _check_init(self) except -1:
        if self._x == NULL:
            raise ValueError("allocator is not initialized")
        return 0

    @property
    def size(self):
        """Managed size in bytes (whole pages)."""
        self._check_init()
        return hixl_extents_size(self._x)

    @property
    def page_size(self):
        """Allocation granularity in bytes."""
        self._check_init()
        return 1 << self._page_shift

    @property
    def page_shift(self):
        """log2 of ``page_size``."""
        self._check_init()
        return self._page_shift

    @property
    def used_bytes(self):
        """Bytes in live allocations (whole pages)."""
        self._check_init()
        return _extents_usage(self._x)[0]

    @property
    def free_bytes(self):
        """Bytes not allocated (possibly fragmented)."""
        self._check_init()
        return _extents_usage(self._x)[1]

    def alloc(self, nbytes):
        """Allocate ``nbytes`` rounded up to whole pages.

        Args:
            nbytes: Requested size, > 0.

        Returns:
            The offset of the block, a multiple of ``page_size``.

        Raises:
            ValueError: ``nbytes`` is not positive.
            PoolExhausted: No free extent is large enough.
        """
        self._check_init()
        return _extents_alloc(self._x, nbytes, "allocator")

    def free(self, offset):
        """Release a block, coalescing it with free neighbours.

        Args:
            offset: The offset ``alloc()`` returned.

        Raises:
            ValueError: ``offset`` does not start a live allocation.
        """
        self._check_init()
        _extents_free(self._x, offset)

    def allocation_size(self, offset):
        """Return the rounded size of the live allocation at ``offset``.

        Raises:
            ValueError: ``offset`` does not start a live allocation.
        """
        self._check_init()
        return _extents_allocation_size(self._x, offset)

    def __repr__(self):
        if self._x == NULL:
            return f"<{type(self).__name__} uninitialized>"
        used, _ = _extents_usage(self._x)
        return (f"<{type(self).__name__} {used} of {hixl_extents_size(self._x)} bytes "
                f"used, page {1 << self._page_shift}>")


cdef int _check_triples(const uint8_t *triples, size_t n, Mapping dst,
                        Mapping src) except -1:
    """Raises ValueError naming the first (dst, src, length) triple outside a mapping."""
    cdef size_t bad = 0
    if hixl_check_triples(triples, n, dst._size, src._size, &bad) != HIXL_OK:
        raise ValueError(
            f"range {bad} (dst_offset={hixl_load_u64(triples, 3 * bad)}, "
            f"src_offset={hixl_load_u64(triples, 3 * bad + 1)}, "
            f"length={hixl_load_u64(triples, 3 * bad + 2)}) is outside "
            f"dst ({dst._size} bytes) or src ({src._size} bytes)")
    return 0


cdef int _shift_triples(uint8_t *triples, size_t n, uint64_t dst_shift,
                        uint64_t src_shift) except -1:
    """Adds the shifts to every (dst, src, length) triple's offsets, in place;
    raises ValueError where an offset would wrap around."""
    cdef size_t i
    cdef uint64_t d, s
    if dst_shift == 0 and src_shift == 0:
        return 0
    for i in range(n):
        d = hixl_load_u64(triples, 3 * i)
        s = hixl_load_u64(triples, 3 * i + 1)
        if d + dst_shift < d or s + src_shift < s:
            raise ValueError(f"range {i} shifted by ({dst_shift}, {src_shift}) overflows")
        d += dst_shift
        s += src_shift
        memcpy(triples + 24 * i, &d, 8)
        memcpy(triples + 24 * i + 8, &s, 8)
    return 0


def copy_ranges(Mapping dst not None, Mapping src not None, ranges,
                uint64_t request_bytes=0, uint64_t dst_shift=0, uint64_t src_shift=0):
    """Copy many byte ranges between two mappings with the GIL released.

    Args:
        dst: Destination mapping.
        src: Source mapping (may be ``dst`` itself).
        ranges: A C-contiguous buffer of uint64 (``array('Q')``, numpy
            uint64, bytes) holding (dst_offset, src_offset, length) triples.
        request_bytes: The size of the whole request when ``ranges`` is one
            share of it (copied by several threads): large requests use
            streaming stores. 0: the total of ``ranges``.
        dst_shift, src_shift: Added to every triple's destination and source
            offset before anything is checked: one list of ranges serves
            every pair of batch slots without a new list per copy.

    Raises:
        TypeError: ``ranges`` is not a buffer of uint64.
        ValueError: A shifted triple lies outside a mapping (the message names
            its index), or a mapping is closed. Nothing is copied then.
    """
    cdef size_t n = 0
    dst._check_open()
    src._check_open()
    cdef uint8_t *triples = _snapshot_u64(ranges, 3, "ranges", &n)
    try:
        _shift_triples(triples, n, dst_shift, src_shift)
        _check_triples(triples, n, dst, src)
        # Pinned, so a close() from another thread cannot unmap mid-copy.
        hixl_mapping_pin(dst._m)
        hixl_mapping_pin(src._m)
        with nogil:
            hixl_copy_triples(dst._m.addr, src._m.addr, triples, n, request_bytes)
        hixl_mapping_unpin(src._m)
        hixl_mapping_unpin(dst._m)
    finally:
        free(triples)
