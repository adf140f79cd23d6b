# Status codes and the one place where a C status becomes a Python exception.

import errno as _errno_mod
import os as _os

OK = HIXL_OK
E_TIMEOUT = HIXL_E_TIMEOUT
E_CLOSED = HIXL_E_CLOSED
E_REFUSED = HIXL_E_REFUSED
E_IO = HIXL_E_IO
E_PROTO = HIXL_E_PROTO
E_CANCELLED = HIXL_E_CANCELLED
E_GONE = HIXL_E_GONE
E_CHECKSUM = HIXL_E_CHECKSUM
E_BUSY = HIXL_E_BUSY

_STATUS_NAMES = {
    HIXL_OK: "OK",
    HIXL_E_TIMEOUT: "E_TIMEOUT",
    HIXL_E_CLOSED: "E_CLOSED",
    HIXL_E_REFUSED: "E_REFUSED",
    HIXL_E_IO: "E_IO",
    HIXL_E_PROTO: "E_PROTO",
    HIXL_E_CANCELLED: "E_CANCELLED",
    HIXL_E_GONE: "E_GONE",
    HIXL_E_CHECKSUM: "E_CHECKSUM",
    HIXL_E_NOMEM: "E_NOMEM",
    HIXL_E_EXHAUSTED: "E_EXHAUSTED",
    HIXL_E_INVAL: "E_INVAL",
    HIXL_E_BUSY: "E_BUSY",
    HIXL_E_EXISTS: "E_EXISTS",
}

_U64_MAX = 0xFFFFFFFFFFFFFFFF


def status_name(code):
    """Return the symbolic name of a native status code.

    Args:
        code: A status such as those posted in completions.

    Returns:
        The name (``"E_TIMEOUT"``), or ``"E_UNKNOWN(<code>)"`` for an unknown code.
    """
    return _STATUS_NAMES.get(code, f"E_UNKNOWN({code})")


def live_objects():
    """Count live native resources, for leak checks in tests.

    Counted: mapped memory, pools, open completion queues, requests not yet
    drained, registered regions, running servers, server connections not yet
    reaped, links not yet closed and extent allocators (each pool has one;
    each ``ExtentAllocator`` is one). ``close()`` of the owning object (or
    its garbage collection) brings each count back down.

    Returns:
        A mapping from object kind to count.
    """
    return {
        "mappings": hixl_live_count(HIXL_LIVE_MAPPINGS),
        "pools": hixl_live_count(HIXL_LIVE_POOLS),
        "queues": hixl_live_count(HIXL_LIVE_QUEUES),
        "requests": hixl_live_count(HIXL_LIVE_REQUESTS),
        "regions": hixl_live_count(HIXL_LIVE_REGIONS),
        "servers": hixl_live_count(HIXL_LIVE_SERVERS),
        "connections": hixl_live_count(HIXL_LIVE_CONNECTIONS),
        "links": hixl_live_count(HIXL_LIVE_LINKS),
        "allocators": hixl_live_count(HIXL_LIVE_ALLOCATORS),
        "process_memories": hixl_live_count(HIXL_LIVE_XMEMS),
    }


class NativeError(RuntimeError):
    """A failed native operation.

    Attributes:
        code: The native status code (one of the ``E_*`` constants).
        errno: The OS error number behind it, or 0 when there is none.
    """

    def __init__(self, code, message, errno=0):
        super().__init__(f"{status_name(code)}: {message}")
        self.code = code
        self.errno = errno


class PoolExhausted(NativeError):
    """A pool allocation that does not fit in any free extent."""


cdef int _raise(int code, str what, int err=0) except -1:
    """Raises the exception for a failed C call; `err` is the errno seen
    right after it (C callers leave errno set for HIXL_E_IO/HIXL_E_NOMEM)."""
    if code == HIXL_E_NOMEM:
        raise MemoryError(what)
    if code == HIXL_E_INVAL or code == HIXL_E_EXISTS:
        raise ValueError(what)
    if code == HIXL_E_BUSY:
        raise BufferError(what)
    if code == HIXL_E_EXHAUSTED:
        raise PoolExhausted(code, what)
    if code == HIXL_E_IO and err:
        name = _errno_mod.errorcode.get(err, str(err))
        what = f"{what} ({name}: {_os.strerror(err)})"
        raise NativeError(code, what, err)
    raise NativeError(code, what)


cdef object _u64(object value, str what):
    """Validates a Python int meant for a uint64 field (ValueError, not the
    OverflowError Cython's own conversion would raise)."""
    if not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < 0 or value > _U64_MAX:
        raise ValueError(f"{what} must be in [0, 2**64), got {value}")
    return value


cdef object _int_in(object value, object lo, object hi, str what):
    """Validates an int in [lo, hi]."""
    if not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < lo or value > hi:
        raise ValueError(f"{what} must be in [{lo}, {hi}], got {value}")
    return value
