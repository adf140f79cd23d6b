# cython: language_level=3
"""The ACL/HCCL shim: CANN's runtime and HCCL, loaded with dlopen at run time.

`load` finds ``libascendcl.so`` and ``libhccl.so`` (an explicit directory,
else ``$ASCEND_TOOLKIT_HOME/lib64``, ``$ASCEND_HOME_PATH/lib64``, then the
default loader path), so this module imports everywhere and reports
``"HCCL backend unavailable: <reason>"`` where CANN is absent. The objects
below own device memory, streams and communicators; every CANN call runs
with the GIL released, and every CANN error code becomes an `AclError` or
`HcclError` carrying the code, in `_check` only.

Device addresses reach Python only as opaque ints (``address``) or through
`unsafe_memcpy`, the one entry point taking raw addresses unchecked (a
`HostRegion` takes a host address too, but only inside its owner's buffer).
Buffers used by work queued on a `Stream` stay pinned (cannot be freed)
until the stream is synchronized or destroyed. Planned transfers come as
arrays of byte ranges (`Stream.memcpy_ranges`, `HcclComm.send_ranges`,
`HcclComm.recv_ranges`), queued in one call without a Python loop.
"""

from cpython.buffer cimport (
    PyBUF_C_CONTIGUOUS,
    PyBUF_FORMAT,
    PyBUF_SIMPLE,
    PyBUF_WRITABLE,
    PyBuffer_FillInfo,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy as c_memcpy

from hixl_native._acl cimport *

import enum as _enum
import os as _os

HCCL_ROOT_INFO_BYTES = HIXL_HCCL_ROOT_INFO_BYTES
DEVICE_ALIGNMENT = 2 << 20
"""Device allocations are rounded up to whole 2 MiB huge pages."""

cdef uint64_t _ALIGN = 2 << 20
cdef object _U64_MAX = 0xFFFFFFFFFFFFFFFF
cdef object _I32_MAX = 0x7FFFFFFF
# Synchronize results that leave work queued on the stream (its pins stay).
cdef frozenset _STILL_BUSY = frozenset((107019, 107020, 207020, 507046))
# The shim's code for an absent optional entry point (ACL_ERROR_API_NOT_SUPPORT).
cdef int _ACL_API_NOT_SUPPORT = 200001
# How long a stream's aborted work may take to end before the stream is
# abandoned rather than destroyed (Stream.destroy).
_ABANDON_WAIT_MS = 2000
cdef object _TOKEN = object()

cdef enum:
    _DEVICE_OWNED = 0
    _DEVICE_IMPORTED = 1
    _HOST = 2
    _HOST_REGION = 3

# live counts, for leak checks in tests
cdef long _live[7]
_LIVE_NAMES = ("device_buffers", "imports", "host_buffers", "streams", "comms", "host_regions",
               "abandoned_streams")
cdef enum:
    _LIVE_DEVBUF = 0
    _LIVE_IMPORT = 1
    _LIVE_HOSTBUF = 2
    _LIVE_STREAM = 3
    _LIVE_COMM = 4
    _LIVE_HOSTREGION = 5
    _LIVE_ABANDONED_STREAM = 6

_FEATURES = (
    (HIXL_ACL_HAS_SYNC_TIMEOUT, "sync_timeout"),
    (HIXL_ACL_HAS_IPC, "ipc"),
    (HIXL_ACL_HAS_BATCH, "batch_send_recv"),
    (HIXL_ACL_HAS_RECENT_ERR, "recent_error_message"),
    (HIXL_ACL_HAS_BARE_TGID, "bare_tgid"),
    (HIXL_ACL_HAS_ERR_STRING, "error_string"),
    (HIXL_ACL_HAS_ONE_SIDED, "one_sided"),
    (HIXL_ACL_HAS_HOST_REGISTER, "host_register"),
    (HIXL_ACL_HAS_STREAM_ABORT, "stream_abort"),
    (HIXL_ACL_HAS_RANK_TABLE, "rank_table"),
    (HIXL_ACL_HAS_ROOT_CONFIG, "root_info_config"),
    (HIXL_ACL_HAS_PHY_ID, "physical_device_id"),
    (HIXL_ACL_HAS_HOST_PIN, "host_pin"),
    (HIXL_ACL_HAS_SOC_INFO, "soc_info"),
)

include "_ascend_errors.pxi"
include "_ascend_runtime.pxi"
include "_ascend_memory.pxi"
include "_ascend_stream.pxi"
include "_ascend_context.pxi"
include "_ascend_hccl.pxi"
include "_ascend_onesided.pxi"
