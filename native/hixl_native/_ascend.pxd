# Attribute and method declarations of the _ascend extension types, so that
# other Cython modules can cimport them; the bodies live in _ascend.pyx.

from libc.stdint cimport int32_t, uint32_t, uint64_t

from hixl_native._acl cimport aclrtStream, hccl_comm_t


cdef class AscendRuntime:
    cdef bint _closed
    cdef bint _owned
    cdef dict _devices

    cdef int _check_open(self) except -1


cdef class Device:
    cdef AscendRuntime _rt
    cdef int32_t _id
    cdef int _children
    cdef bint _closed

    cdef int _check_open(self) except -1
    cdef void _adopt(self)
    cdef void _release(self)


cdef class _Memory:
    cdef Device _dev
    cdef char *_ptr
    cdef uint64_t _size
    cdef int _kind
    cdef int _pins
    cdef bint _closed
    cdef bint _exported
    cdef char _key[65]

    cdef int _check_open(self) except -1


cdef class DeviceMemory(_Memory):
    pass


cdef class DeviceBuffer(DeviceMemory):
    pass


cdef class ImportedBuffer(DeviceMemory):
    pass


cdef class HostBuffer(_Memory):
    cdef int _exports


cdef class HostRegion(_Memory):
    cdef Py_buffer _view


cdef class Stream:
    cdef Device _dev
    cdef aclrtStream _s
    cdef list _pinned
    cdef bint _closed

    cdef int _check_open(self) except -1
    cdef void _pin(self, _Memory mem)
    cdef void _unpin_all(self)
    cdef int _teardown(self, int32_t timeout_ms)


cdef class SendRecvItem:
    cdef readonly int kind
    cdef readonly DeviceMemory buffer
    cdef readonly uint64_t offset
    cdef readonly uint64_t nbytes
    cdef readonly uint32_t peer


cdef class HcclComm:
    cdef Device _dev
    cdef hccl_comm_t _c
    cdef uint32_t _rank
    cdef uint32_t _nranks
    cdef bint _closed

    cdef int _check_open(self) except -1
    cdef uint32_t _check_peer(self, object peer) except? 0xFFFFFFFF
    cdef int _p2p(self, bint sending, DeviceMemory mem, object offset, object nbytes, object peer,
                  Stream stream) except -1
    cdef int _p2p_ranges(self, int kind, DeviceMemory mem, object pairs, object peer,
                         Stream stream) except -1


# ---- one-sided HCCL and pinned host memory (_ascend_onesided.pxi) ----
cdef class GlobalMemory:
    cdef DeviceMemory _mem
    cdef void *_handle
    cdef bint _closed


cdef class PinnedHost:
    cdef Device _dev
    cdef Py_buffer _view
    cdef char *_ptr
    cdef uint64_t _size
    cdef bint _closed
