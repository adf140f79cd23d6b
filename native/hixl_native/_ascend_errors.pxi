# Enumerations, the exception types and the one function turning a native
# code into an exception.

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
    cdef const char *text = &st.detail[0]
    api = st.api.decode("ascii", "replace") if st.api != NULL else "?"
    detail = text.decode("utf-8", "replace").strip()
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
        ``streams``, ``comms``, ``host_regions``) to the number not yet closed.
    """
    return {name: _live[i] for i, name in enumerate(_LIVE_NAMES)}
