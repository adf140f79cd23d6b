# Reading range lists from arbitrary Python buffers.

# Unsigned 64-bit integers in native (= little-endian here) order, and raw
# bytes; anything else (signed, floats, big-endian) is a caller's mistake.
_U64_FORMATS = frozenset((b"Q", b"@Q", b"=Q", b"<Q", b"L", b"@L"))
_BYTE_FORMATS = frozenset((b"B", b"@B", b"=B", b"b", b"c"))


cdef int _u64_view(object obj, Py_ssize_t group, str what, Py_buffer *view) except -1:
    """Gets a C-contiguous buffer of uint64 `group`-tuples into *view (the
    caller releases it) after checking its format and length."""
    PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    try:
        fmt = b"B" if view.format == NULL else <bytes>view.format
        if not ((view.itemsize == 8 and fmt in _U64_FORMATS)
                or (view.itemsize == 1 and fmt in _BYTE_FORMATS)):
            raise TypeError(
                f"{what} must be a buffer of native uint64 (or raw bytes), "
                f"not format {fmt.decode('ascii', 'replace')!r}")
        if view.len % (8 * group):
            raise ValueError(
                f"{what} must hold whole {group}-tuples of uint64, got {view.len} bytes")
    except BaseException:
        PyBuffer_Release(view)
        raise
    return 0


cdef uint8_t *_snapshot_u64(object obj, Py_ssize_t group, str what,
                            size_t *count) except NULL:
    """Copies a C-contiguous buffer of uint64 `group`-tuples into a private
    malloc'd array (the caller frees it) and sets *count to the number of
    tuples.

    The copy is what makes validate-then-use safe: a numpy array or
    array.array may be changed by another thread once the GIL is released,
    which must not turn checked ranges into unchecked ones. It costs a
    memcpy of the list, negligible next to the bytes the ranges describe.
    """
    cdef Py_buffer view
    cdef uint8_t *copy = NULL
    _u64_view(obj, group, what, &view)
    try:
        copy = <uint8_t *>malloc(<size_t>view.len if view.len else 1)
        if copy == NULL:
            raise MemoryError()
        memcpy(copy, view.buf, <size_t>view.len)
        count[0] = <size_t>(view.len // (8 * group))
    finally:
        PyBuffer_Release(&view)
    return copy
