# cython: language_level=3
"""The hixl native core: shared-memory pools, local copies and the TCP data plane.

The C code in csrc/ does the work and reports integer status codes; this
module wraps it in safe objects, validates every argument with the GIL held
and releases the GIL around everything that can block or take long.
"""

cimport cython
from cpython.buffer cimport (
    PyBUF_C_CONTIGUOUS,
    PyBUF_FORMAT,
    PyBUF_SIMPLE,
    PyBuffer_FillInfo,
    PyBuffer_Release,
    PyObject_CheckBuffer,
    PyObject_GetBuffer,
)
from libc.errno cimport errno
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from posix.unistd cimport close as _close_fd

from hixl_native._chixl cimport *

include "_errors.pxi"
include "_buffers.pxi"
include "_mapping.pxi"
include "_xmem.pxi"
include "_completion.pxi"
include "_copy_pool.pxi"
include "_dataplane.pxi"
include "_planning.pxi"
include "_ring.pxi"
include "_native_lane.pxi"
