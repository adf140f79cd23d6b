"""hixl's native core: shared-memory pools, local copies and the TCP data plane.

Everything here is implemented in C behind a Cython wrapper (``_core``); see
``_core.pyi`` for the typed interface.
"""

from hixl_native._core import (
    E_BUSY,
    E_CANCELLED,
    E_CLOSED,
    E_IO,
    E_PROTO,
    E_REFUSED,
    E_TIMEOUT,
    KEY_SIZE,
    OK,
    CompletionQueue,
    CopyPool,
    DataLink,
    DataServer,
    ExtentAllocator,
    Mapping,
    NativeError,
    PoolExhausted,
    SharedPool,
    copy_ranges,
    live_objects,
    set_tcp_liveness,
    status_name,
)

__all__ = [
    "E_BUSY",
    "E_CANCELLED",
    "E_CLOSED",
    "E_IO",
    "E_PROTO",
    "E_REFUSED",
    "E_TIMEOUT",
    "KEY_SIZE",
    "OK",
    "CompletionQueue",
    "CopyPool",
    "DataLink",
    "DataServer",
    "ExtentAllocator",
    "Mapping",
    "NativeError",
    "PoolExhausted",
    "SharedPool",
    "copy_ranges",
    "live_objects",
    "set_tcp_liveness",
    "status_name",
]
