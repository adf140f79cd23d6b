# cython: language_level=3
"""Native ceilings for hixl-bench: cold single-thread memcpy and raw loopback TCP.

Each ceiling owns a source and a destination buffer of ``cold_bytes`` (pre-
faulted, written) through which successive requests rotate, so that copies
read and write memory that is not in cache, as a real KV pool's do. A request
is ``nblocks`` blocks of ``block`` bytes; :meth:`run` times ``iters`` requests
back to back with the GIL released and returns each one's duration in seconds.
"""

from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc


cdef extern from "bench_ceiling.h" nogil:
    ctypedef struct hb_mem:
        pass
    ctypedef struct hb_tcp:
        pass
    int hb_mem_open(size_t cold_bytes, hb_mem **out)
    int hb_mem_run(hb_mem *m, size_t block, size_t nblocks, size_t iters, uint64_t *out_ns)
    void hb_mem_close(hb_mem *m)
    int hb_tcp_open(size_t cold_bytes, int streams, int sockbuf, hb_tcp **out)
    int hb_tcp_run(hb_tcp *t, size_t block, size_t nblocks, size_t iters, uint64_t *out_ns)
    void hb_tcp_close(hb_tcp *t)


cdef int _check(int rc, str what) except -1:
    """The one place a ceiling's negative errno becomes an exception."""
    if rc == 0:
        return 0
    import os
    if -rc == 22:  # EINVAL
        raise ValueError(f"{what}: invalid arguments (a request larger than cold_bytes?)")
    if -rc == 12:  # ENOMEM
        raise MemoryError(f"{what}: out of memory")
    raise OSError(-rc, f"{what}: {os.strerror(-rc)}")


cdef object _durations(uint64_t *ns, size_t n):
    return [ns[i] * 1e-9 for i in range(n)]


cdef uint64_t *_alloc_ns(size_t iters) except NULL:
    cdef uint64_t *ns = <uint64_t *>malloc((iters if iters > 0 else 1) * sizeof(uint64_t))
    if ns == NULL:
        raise MemoryError()
    return ns


cdef class _Ceiling:
    """What both ceilings share: timing requests with the GIL released, closing."""

    cdef bint _busy

    cdef bint _is_open(self):
        return False

    cdef int _run(self, size_t block, size_t nblocks, size_t iters, uint64_t *ns) noexcept nogil:
        return -22

    cdef void _close(self) noexcept nogil:
        pass

    def run(self, size_t block, size_t nblocks, size_t iters):
        """Time ``iters`` requests of ``nblocks`` x ``block`` bytes; seconds per request.

        Raises:
            ValueError: a request larger than the buffers, or an empty one.
            OSError: the transport failed (the ceiling is then unusable).
            RuntimeError: closed, or another thread is running it.
        """
        name = type(self).__name__
        if not self._is_open() or self._busy:
            raise RuntimeError(f"{name} is closed or busy")
        cdef uint64_t *ns = _alloc_ns(iters)
        cdef int rc
        self._busy = True
        try:
            with nogil:
                rc = self._run(block, nblocks, iters, ns)
            _check(rc, f"{name}.run")
            return _durations(ns, iters)
        finally:
            self._busy = False
            free(ns)

    def close(self):
        """Release the native resources (idempotent)."""
        if self._busy:
            raise RuntimeError(f"{type(self).__name__} is busy")
        if self._is_open():
            with nogil:
                self._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


cdef class MemcpyCeiling(_Ceiling):
    """Single-thread ``memcpy``, one call per block, over cold buffers.

    Args:
        cold_bytes: size of each of the source and destination buffers.

    Raises:
        ValueError: ``cold_bytes`` is below one page.
        MemoryError: the buffers cannot be mapped.
    """

    cdef hb_mem *_m

    def __cinit__(self, size_t cold_bytes):
        cdef int rc
        with nogil:
            rc = hb_mem_open(cold_bytes, &self._m)
        _check(rc, "MemcpyCeiling")

    cdef bint _is_open(self):
        return self._m != NULL

    cdef int _run(self, size_t block, size_t nblocks, size_t iters, uint64_t *ns) noexcept nogil:
        return hb_mem_run(self._m, block, nblocks, iters, ns)

    cdef void _close(self) noexcept nogil:
        hb_mem_close(self._m)
        self._m = NULL

    def __dealloc__(self):
        if self._m != NULL:
            hb_mem_close(self._m)


cdef class TcpCeiling(_Ceiling):
    """Raw loopback TCP pull between a C sender thread and a C receiver.

    The receiver sends the list of source ranges; the sender answers with the
    bytes (``sendmsg`` over iovecs) and the receiver ``recvmsg``s them straight
    into its destination buffer. A request is split by bytes over ``streams``
    connections (no split below 256 KiB per stream, as hixl's data plane).

    Args:
        cold_bytes: size of each of the source and destination buffers.
        streams: TCP connections, 1 to 64.
        sockbuf: ``SO_SNDBUF``/``SO_RCVBUF`` bytes (the kernel caps it at
            ``net.core.[rw]mem_max``), or 0 to leave the kernel's autotuning on.

    Raises:
        ValueError: bad arguments.
        OSError: a socket call failed.
    """

    cdef hb_tcp *_t

    def __cinit__(self, size_t cold_bytes, int streams=1, int sockbuf=4 << 20):
        cdef int rc
        with nogil:
            rc = hb_tcp_open(cold_bytes, streams, sockbuf, &self._t)
        _check(rc, "TcpCeiling")

    cdef bint _is_open(self):
        return self._t != NULL

    cdef int _run(self, size_t block, size_t nblocks, size_t iters, uint64_t *ns) noexcept nogil:
        return hb_tcp_run(self._t, block, nblocks, iters, ns)

    cdef void _close(self) noexcept nogil:
        hb_tcp_close(self._t)
        self._t = NULL

    def __dealloc__(self):
        if self._t != NULL:
            hb_tcp_close(self._t)
