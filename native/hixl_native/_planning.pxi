# The block planner of the daemon (hixl_service.planning): one C loop per
# request, whatever the number of blocks and tensors.

# Above this many (tensor, block) pieces the loops run without the GIL.
cdef enum:
    _PLAN_NOGIL_PIECES = 4096


cdef const uint64_t *_block_array(object blocks, Py_ssize_t *count, list keep) except? NULL:
    """Block indices as a C array: read in place from a contiguous uint64
    buffer, or copied from any other sequence of ints (a short list, or a
    protobuf repeated field, costs less copied here than made into an array
    first); None gives NULL, which ``_block_at`` reads as 0, 1, 2, ..."""
    if blocks is None:
        return NULL
    cdef const uint64_t[::1] view
    cdef Py_ssize_t i, n
    cdef uint64_t *filled
    if PyObject_CheckBuffer(blocks):
        view = blocks
        keep.append(view)  # the pointer stays valid while the view lives
        count[0] = view.shape[0]
        return &view[0] if view.shape[0] else NULL
    n = len(blocks)
    count[0] = n
    if not n:
        return NULL
    copied = bytearray(8 * n)
    keep.append(copied)  # likewise: nothing resizes it
    filled = <uint64_t *><char *>copied
    for i in range(n):
        filled[i] = <uint64_t>_u64(blocks[i], "a block index")
    return filled


cdef inline uint64_t _block_at(const uint64_t *blocks, Py_ssize_t i) noexcept nogil:
    return blocks[i] if blocks != NULL else <uint64_t>i


cdef Py_ssize_t _pieces(const uint64_t *sbase, const uint64_t *dbase, Py_ssize_t ntensors,
                        const uint64_t *sblocks, const uint64_t *dblocks, Py_ssize_t nblocks,
                        uint64_t block, uint64_t *out) noexcept nogil:
    """Emits (or, with ``out`` NULL, counts) the merged ranges: tensor by
    tensor, block by block, a piece joining the previous one when it follows
    it on both sides."""
    cdef Py_ssize_t t, i, m = 0
    cdef uint64_t so, do, last_s = 0, last_d = 0, last_len = 0
    for t in range(ntensors):
        for i in range(nblocks):
            so = sbase[t] + _block_at(sblocks, i) * block
            do = dbase[t] + _block_at(dblocks, i) * block
            if m and last_s + last_len == so and last_d + last_len == do:
                last_len += block
                if out != NULL:
                    out[3 * m - 1] = last_len
                continue
            last_s, last_d, last_len = so, do, block
            if out != NULL:
                out[3 * m] = so
                out[3 * m + 1] = do
                out[3 * m + 2] = block
            m += 1
    return m


cdef object _first_out_of_range(const uint64_t *blocks, Py_ssize_t count, uint64_t limit):
    cdef Py_ssize_t i
    for i in range(count):
        if _block_at(blocks, i) >= limit:
            return _block_at(blocks, i)
    return None


def range_bytes(ranges):
    """The bytes a list of ranges moves: the sum of their lengths.

    Args:
        ranges: C-contiguous buffer of uint64 (src, dst, length) triples, e.g.
            a planner's ``(n, 3)`` array.

    Raises:
        TypeError / ValueError: As the transports, for a buffer of another
            format or not of whole triples.
    """
    cdef Py_buffer view
    cdef const uint64_t *rows
    cdef Py_ssize_t i, n
    cdef uint64_t total = 0
    _u64_view(ranges, 3, "ranges", &view)
    try:
        rows = <const uint64_t *>view.buf
        n = view.len // 24
        for i in range(n):
            total += rows[3 * i + 2]
    finally:
        PyBuffer_Release(&view)
    return total


def block_ranges(src_bases, src_add, dst_bases, dst_add, src_blocks, dst_blocks, block,
                 src_limit, dst_limit):
    """The merged ranges copying block ``src_blocks[i]`` to ``dst_blocks[i]``
    of every tensor pair, for the planners.

    For tensor pair t and block i: ``block`` bytes from ``src_bases[t] +
    src_add + src_blocks[i] * block`` to ``dst_bases[t] + dst_add +
    dst_blocks[i] * block``, ordered tensor by tensor; neighbours that are
    contiguous on both sides are merged.

    Args:
        src_bases: Sequence of int: where each source tensor starts.
        src_add: Added to every source base (e.g. a batch slot's start).
        dst_bases: As ``src_bases``, for the destination (the same length).
        dst_add: As ``src_add``, for the destination.
        src_blocks: Source block indices: a contiguous uint64 buffer (read in
            place) or a sequence of ints, or None for 0, 1, 2, ... (a
            continuous slot cut into blocks).
        dst_blocks: Destination block indices, as ``src_blocks`` (not None).
        block: Bytes per block.
        src_limit: Source block indices must be below it.
        dst_limit: As ``src_limit``, for the destination.

    Returns:
        A bytearray of native uint64 (src, dst, length) triples.

    Raises:
        IndexError: A block index at or above its limit (the message names
            the list, the index and the limit), or lists of different lengths.
        TypeError / ValueError: Arguments that are not ints in range.
    """
    cdef Py_ssize_t ntensors = len(src_bases)
    if len(dst_bases) != ntensors:
        raise ValueError(f"{ntensors} source tensors but {len(dst_bases)} destination ones")
    cdef uint64_t ln = _u64(block, "block")
    cdef list keep = []
    cdef Py_ssize_t nblocks = 0, nsrc = 0
    cdef const uint64_t *dblocks = _block_array(dst_blocks, &nblocks, keep)
    nsrc = nblocks
    cdef const uint64_t *sblocks = _block_array(src_blocks, &nsrc, keep)
    if nsrc != nblocks:
        raise IndexError(f"{nsrc} source blocks do not match {nblocks} destination blocks")
    bad = _first_out_of_range(sblocks, nblocks, _u64(src_limit, "src_limit"))
    if bad is not None:
        raise IndexError(f"src_blocks holds block {bad}, out of range [0, {src_limit})")
    bad = _first_out_of_range(dblocks, nblocks, _u64(dst_limit, "dst_limit"))
    if bad is not None:
        raise IndexError(f"dst_blocks holds block {bad}, out of range [0, {dst_limit})")
    if not ln or not ntensors or not nblocks:
        return bytearray()
    cdef uint64_t sadd = _u64(src_add, "src_add")
    cdef uint64_t dadd = _u64(dst_add, "dst_add")
    cdef uint64_t *bases = <uint64_t *>malloc(2 * ntensors * sizeof(uint64_t))
    if bases == NULL:
        raise MemoryError()
    cdef Py_ssize_t t, m
    cdef uint64_t *filled
    cdef bint release = ntensors * nblocks > _PLAN_NOGIL_PIECES
    try:
        for t in range(ntensors):
            bases[t] = <uint64_t>_u64(src_bases[t], "src_bases") + sadd
            bases[ntensors + t] = <uint64_t>_u64(dst_bases[t], "dst_bases") + dadd
        if release:
            with nogil:
                m = _pieces(bases, bases + ntensors, ntensors, sblocks, dblocks, nblocks, ln,
                            NULL)
        else:
            m = _pieces(bases, bases + ntensors, ntensors, sblocks, dblocks, nblocks, ln, NULL)
        out = bytearray(24 * m)
        filled = <uint64_t *><char *>out
        if release:
            with nogil:
                _pieces(bases, bases + ntensors, ntensors, sblocks, dblocks, nblocks, ln, filled)
        else:
            _pieces(bases, bases + ntensors, ntensors, sblocks, dblocks, nblocks, ln, filled)
    finally:
        free(bases)
    return out
