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
`unsafe_memcpy`, the one entry point taking raw addresses. Buffers used by
work queued on a `Stream` stay pinned (cannot be freed) until the stream is
synchronized or destroyed.
"""

from cpython.buffer cimport (
    PyBUF_SIMPLE,
    PyBUF_WRITABLE,
    PyBuffer_FillInfo,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from libc.stdint cimport int32_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy as c_memcpy, strlen

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
cdef object _TOKEN = object()

cdef enum:
    _DEVICE_OWNED = 0
    _DEVICE_IMPORTED = 1
    _HOST = 2

# live counts, for leak checks in tests
cdef long _live[5]
_LIVE_NAMES = ("device_buffers", "imports", "host_buffers", "streams", "comms")
cdef enum:
    _LIVE_DEVBUF = 0
    _LIVE_IMPORT = 1
    _LIVE_HOSTBUF = 2
    _LIVE_STREAM = 3
    _LIVE_COMM = 4

_FEATURES = (
    (HIXL_ACL_HAS_SYNC_TIMEOUT, "sync_timeout"),
    (HIXL_ACL_HAS_IPC, "ipc"),
    (HIXL_ACL_HAS_BATCH, "batch_send_recv"),
    (HIXL_ACL_HAS_RECENT_ERR, "recent_error_message"),
    (HIXL_ACL_HAS_BARE_TGID, "bare_tgid"),
    (HIXL_ACL_HAS_ERR_STRING, "error_string"),
)


class MemcpyKind(_enum.IntEnum):
    """``aclrtMemcpyKind`` values, for `unsafe_memcpy`."""

    HOST_TO_HOST = ACL_MEMCPY_HOST_TO_HOST
    HOST_TO_DEVICE = ACL_MEMCPY_HOST_TO_DEVICE
    DEVICE_TO_HOST = ACL_MEMCPY_DEVICE_TO_HOST
    DEVICE_TO_DEVICE = ACL_MEMCPY_DEVICE_TO_DEVICE
    DEFAULT = ACL_MEMCPY_DEFAULT


class SendRecvKind(_enum.IntEnum):
    """``HcclSendRecvType`` values of a `SendRecvItem`."""

    SEND = HCCL_SEND
    RECV = HCCL_RECV


# ------------------------------------------------------------------ errors

class AscendUnavailable(RuntimeError):
    """CANN cannot be loaded or initialized in this process.

    Attributes:
        reason: Why, without the ``"HCCL backend unavailable: "`` prefix.
    """

    def __init__(self, reason):
        super().__init__(f"HCCL backend unavailable: {reason}")
        self.reason = reason

    def __reduce__(self):
        return (type(self), (self.reason,))


class AscendError(RuntimeError):
    """A CANN entry point returned an error code.

    Attributes:
        code: The native code (``aclError`` or ``HcclResult``).
        api: The entry point that failed, e.g. ``"aclrtMalloc"``.
        detail: CANN's own text (``aclGetRecentErrMsg`` and, for HCCL,
            ``HcclGetErrorString``), or ``""``.
        library: ``"acl"`` or ``"hccl"``.
    """

    library = "acl"

    def __init__(self, code, api, detail=""):
        text = f"{api} failed with {self.library.upper()} error {code}"
        super().__init__(f"{text}: {detail}" if detail else text)
        self.code = code
        self.api = api
        self.detail = detail

    def __reduce__(self):
        return (type(self), (self.code, self.api, self.detail))


class AclError(AscendError):
    """An ACL runtime entry point failed (``aclError``)."""

    library = "acl"


class HcclError(AscendError):
    """An HCCL entry point failed (``HcclResult``)."""

    library = "hccl"


cdef int _check(int rc) except -1:
    """The one place a native code becomes an exception: reads what the C
    shim recorded for this thread's failed call."""
    if rc == 0:
        return 0
    cdef const hixl_acl_status *st = hixl_acl_last_error()
    api = st.api.decode("ascii", "replace") if st.api != NULL else "?"
    detail = st.detail.decode("utf-8", "replace").strip()
    if st.lib == HIXL_LIB_HCCL:
        raise HcclError(rc, api, detail)
    raise AclError(rc, api, detail)


cdef object _int_in(object value, object lo, object hi, str what):
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < lo or value > hi:
        raise ValueError(f"{what} must be in [{lo}, {hi}], got {value}")
    return value


def live_objects():
    """Count live shim objects, for leak checks in tests.

    Returns:
        A mapping from kind (``device_buffers``, ``imports``, ``host_buffers``,
        ``streams``, ``comms``) to the number not yet closed.
    """
    return {name: _live[i] for i, name in enumerate(_LIVE_NAMES)}


# ----------------------------------------------------------------- loading

def _candidates(path):
    libs = ("libascendcl.so", "libhccl.so")
    if path is not None:
        d = _os.fspath(path)
        return [(d, *(_os.path.join(d, lib) for lib in libs))]
    found = []
    for var in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
        root = _os.environ.get(var)
        if root:
            d = _os.path.join(root, "lib64")
            found.append((f"${var}/lib64 = {d}", *(_os.path.join(d, lib) for lib in libs)))
    found.append(("default loader path", *libs))
    return found


cdef object _open(object path, bint trial):
    """Tries the candidates in order; returns None once one loads, else the
    reasons of all of them."""
    cdef char err[1024]
    cdef int rc
    cdef const char *cacl
    cdef const char *chccl
    reasons = []
    for label, acl, hccl in _candidates(path):
        bacl, bhccl = _os.fsencode(acl), _os.fsencode(hccl)
        cacl, chccl = bacl, bhccl
        with nogil:
            rc = hixl_acl_open(cacl, chccl, trial, err, sizeof(err))
        if rc == 0:
            return None
        reasons.append(f"{label}: {err.decode('utf-8', 'replace')}")
    return "; ".join(reasons)


def probe(path=None):
    """Tell whether CANN's libraries load here, without initializing them.

    Args:
        path: Directory holding ``libascendcl.so`` and ``libhccl.so``; None
            searches ``$ASCEND_TOOLKIT_HOME/lib64``, ``$ASCEND_HOME_PATH/lib64``
            and the default loader path, in that order.

    Returns:
        None when they load, else the message ``"HCCL backend unavailable:
        <reason>"``.
    """
    reason = _open(path, True)
    return None if reason is None else str(AscendUnavailable(reason))


_runtime = None


def load(path=None):
    """Load CANN and initialize ACL (once per process).

    Args:
        path: As for `probe`. An explicit directory is the only candidate.

    Returns:
        The process's `AscendRuntime` (the same object until it is finalized).

    Raises:
        AscendUnavailable: The libraries cannot be loaded, lack a required
            entry point, are not the ones already loaded, or ``aclInit`` failed.
    """
    global _runtime
    cdef int rc, owned = 0
    if path is None and _runtime is not None and not (<AscendRuntime>_runtime)._closed:
        return _runtime
    reason = _open(path, False)
    if reason is not None:
        raise AscendUnavailable(reason)
    if _runtime is not None and not (<AscendRuntime>_runtime)._closed:
        return _runtime
    with nogil:
        rc = hixl_acl_init(&owned)
    try:
        _check(rc)
    except AscendError as e:
        raise AscendUnavailable(str(e)) from e
    rt = AscendRuntime(_TOKEN)
    rt._closed = False
    rt._owned = owned != 0
    _runtime = rt
    return rt


cdef class AscendRuntime:
    """CANN loaded and ACL initialized: the factory of `Device` objects.

    Obtained from `load`; not constructible directly.
    """

    def __cinit__(self, token):
        if token is not _TOKEN:
            raise TypeError("use hixl_native._ascend.load()")
        self._closed = True
        self._devices = {}

    cdef int _check_open(self) except -1:
        if self._closed:
            raise RuntimeError("the Ascend runtime is finalized")
        return 0

    @property
    def closed(self):
        """Whether `finalize` was called."""
        return self._closed

    @property
    def paths(self):
        """Real paths of the loaded ``(libascendcl.so, libhccl.so)``."""
        return (hixl_acl_loaded_path(HIXL_LIB_ACL).decode(),
                hixl_acl_loaded_path(HIXL_LIB_HCCL).decode())

    @property
    def features(self):
        """Optional entry points present: names among ``sync_timeout``, ``ipc``,
        ``batch_send_recv``, ``recent_error_message``, ``bare_tgid``,
        ``error_string``."""
        cdef unsigned bits = hixl_acl_features()
        return frozenset(name for bit, name in _FEATURES if bits & bit)

    def device_count(self):
        """Return the number of devices (``aclrtGetDeviceCount``)."""
        self._check_open()
        cdef uint32_t n = 0
        cdef int rc
        with nogil:
            rc = hixl_acl_device_count(&n)
        _check(rc)
        return n

    def set_device(self, device_id):
        """Open a device (``aclrtSetDevice``) and return its `Device`.

        Args:
            device_id: Logical device id.

        Returns:
            The device's `Device`, the same object for the same id until reset.

        Raises:
            AclError: e.g. 107001 (``ACL_ERROR_RT_INVALID_DEVICEID``).
        """
        self._check_open()
        cdef int32_t dev = _int_in(device_id, 0, _I32_MAX, "device_id")
        cdef int rc
        found = self._devices.get(dev)
        if found is not None:
            return found
        with nogil:
            rc = hixl_acl_set_device(dev)
        _check(rc)
        d = Device(_TOKEN, self, dev)
        self._devices[dev] = d
        return d

    def bare_tgid(self):
        """Return this process's id as the driver sees it (``aclrtDeviceGetBareTgid``),
        for `DeviceBuffer.allow_import` in the exporting process; ``os.getpid()``
        where the entry point is absent."""
        self._check_open()
        cdef int32_t pid = 0
        cdef int rc
        if not hixl_acl_features() & HIXL_ACL_HAS_BARE_TGID:
            return _os.getpid()
        with nogil:
            rc = hixl_acl_bare_tgid(&pid)
        _check(rc)
        return pid

    def finalize(self):
        """Reset the opened devices and finalize ACL (if this runtime initialized it).

        Raises:
            RuntimeError: A device still has open buffers, streams or communicators.
        """
        global _runtime
        if self._closed:
            return
        for d in list(self._devices.values()):
            (<Device>d).reset()
        cdef int rc = 0
        if self._owned:
            with nogil:
                rc = hixl_acl_finalize()
        self._closed = True
        if _runtime is self:
            _runtime = None
        _check(rc)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.finalize()

    def __repr__(self):
        return f"<AscendRuntime {'finalized' if self._closed else self.paths[0]}>"


include_marker = None  # (the classes below follow the runtime's)
