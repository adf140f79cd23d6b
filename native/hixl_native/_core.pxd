# Attribute and method declarations of the _core extension types, so that
# other Cython modules can cimport them; the bodies live in the .pxi parts
# that _core.pyx includes.

from libc.stdint cimport uint16_t, uint64_t

from hixl_native._chixl cimport (
    hixl_copy_pool,
    hixl_cq,
    hixl_extents,
    hixl_link,
    hixl_mapping,
    hixl_pool,
    hixl_server,
    hixl_bounce,
    hixl_xmem,
)


cdef class Mapping:
    cdef hixl_mapping *_m
    cdef uint64_t _size

    cdef int _check_open(self) except -1


cdef class SharedPool(Mapping):
    cdef hixl_pool *_pool
    cdef unsigned _page_shift

    cdef int _check_pool(self) except -1


cdef class ExtentAllocator:
    cdef hixl_extents *_x
    cdef unsigned _page_shift

    cdef int _check_init(self) except -1


cdef class CompletionQueue:
    cdef hixl_cq *_q


cdef class CopyPool:
    cdef hixl_copy_pool *_p


cdef class DataServer:
    cdef hixl_server *_s
    cdef uint16_t _port
    cdef bint _closed
    cdef dict _regions

    cdef int _check_running(self) except -1


cdef class DataLink:
    cdef hixl_link *_l
    cdef CompletionQueue _cq
    cdef int _streams
    cdef bint _closed

    cdef int _submit(self, int op, object request_id, Mapping local, object ranges,
                     object timeout_ms) except -1


cdef class BouncePool:
    cdef hixl_bounce *_b


cdef class ProcessSpan:
    cdef hixl_xmem *_x
    cdef uint64_t _size
    cdef bint _revoked

    cdef int _check_open(self) except -1
