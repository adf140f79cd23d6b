# Finding and loading CANN; the runtime and its devices.

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
        busy = [(<Device>d)._id for d in self._devices.values() if (<Device>d)._children]
        if busy:
            raise RuntimeError(f"devices {busy} still have open buffers, streams or communicators")
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



# ------------------------------------------------------------------ device

cdef class Device:
    """One opened device; creates its memory, streams and communicators.

    Obtained from `AscendRuntime.set_device`. Each call made for it first
    makes the device current on the calling thread.
    """

    def __cinit__(self, token, AscendRuntime rt, int32_t dev):
        if token is not _TOKEN:
            raise TypeError("use AscendRuntime.set_device()")
        self._rt = rt
        self._id = dev
        self._children = 0
        self._closed = False

    cdef int _check_open(self) except -1:
        if self._closed:
            raise RuntimeError(f"device {self._id} is reset")
        self._rt._check_open()
        return 0

    cdef void _adopt(self):
        self._children += 1

    cdef void _release(self):
        self._children -= 1

    @property
    def id(self):
        """The logical device id."""
        return self._id

    @property
    def closed(self):
        """Whether `reset` was called."""
        return self._closed

    def malloc(self, size, *, huge_only=True):
        """Allocate device memory (``aclrtMalloc``), rounded up to 2 MiB.

        Args:
            size: Bytes wanted, > 0.
            huge_only: ``ACL_MEM_MALLOC_HUGE_ONLY`` (default) or ``HUGE_FIRST``.

        Raises:
            AclError: e.g. 207001 (``ACL_ERROR_RT_MEMORY_ALLOCATION``) when out of memory.
        """
        self._check_open()
        cdef uint64_t n = _int_in(size, 1, _U64_MAX - DEVICE_ALIGNMENT, "size")
        n = (n + _ALIGN - 1) & ~(_ALIGN - 1)
        cdef int policy = ACL_MEM_MALLOC_HUGE_ONLY if huge_only else ACL_MEM_MALLOC_HUGE_FIRST
        cdef void *p = NULL
        cdef int rc
        with nogil:
            rc = hixl_acl_malloc(self._id, n, policy, &p)
        _check(rc)
        return _adopt_memory(DeviceBuffer.__new__(DeviceBuffer), self, p, n, _DEVICE_OWNED)

    def malloc_host(self, size):
        """Allocate page-locked host memory (``aclrtMallocHost``), e.g. as the
        host side of `Stream.memcpy_async`; it exports the buffer protocol."""
        self._check_open()
        cdef size_t n = _int_in(size, 1, _U64_MAX, "size")
        cdef void *p = NULL
        cdef int rc
        with nogil:
            rc = hixl_acl_malloc_host(self._id, n, &p)
        _check(rc)
        return _adopt_memory(HostBuffer.__new__(HostBuffer), self, p, n, _HOST)

    def import_ipc(self, key, size):
        """Map device memory another process exported (``aclrtIpcMemImportByKey``).

        Args:
            key: The exporter's `DeviceBuffer.export_key`.
            size: Its size, as the exporter reports it (CANN cannot tell;
                the importer's bounds checks rely on it).

        Returns:
            An `ImportedBuffer`, closed with ``aclrtIpcMemClose``.
        """
        self._check_open()
        cdef bytes bkey = _ipc_key(key)
        cdef uint64_t n = _int_in(size, 1, _U64_MAX, "size")
        cdef const char *ckey = bkey
        cdef void *p = NULL
        cdef int rc
        with nogil:
            rc = hixl_acl_ipc_import(self._id, ckey, &p)
        _check(rc)
        buf = _adopt_memory(ImportedBuffer.__new__(ImportedBuffer), self, p, n, _DEVICE_IMPORTED)
        c_memcpy(buf._key, ckey, len(bkey) + 1)
        return buf

    def create_stream(self):
        """Create a `Stream` (``aclrtCreateStream``)."""
        self._check_open()
        cdef aclrtStream s = NULL
        cdef int rc
        with nogil:
            rc = hixl_acl_stream_create(self._id, &s)
        _check(rc)
        st = Stream.__new__(Stream)
        (<Stream>st)._dev = self
        (<Stream>st)._s = s
        (<Stream>st)._closed = False
        self._adopt()
        _live[_LIVE_STREAM] += 1
        return st

    def hccl_root_info(self):
        """Create a rendezvous for a communicator (``HcclGetRootInfo``).

        Returns:
            The opaque root info (`HCCL_ROOT_INFO_BYTES` bytes) every rank passes
            to `HcclComm`; it travels to the peer over the control plane.
        """
        self._check_open()
        cdef HcclRootInfo ri
        cdef int rc
        with nogil:
            rc = hixl_hccl_root_info(self._id, &ri)
        _check(rc)
        return ri.internal[:HIXL_HCCL_ROOT_INFO_BYTES]

    def reset(self):
        """Release the device (``aclrtResetDevice``).

        Raises:
            RuntimeError: Buffers, streams or communicators of it are still open.
        """
        if self._closed:
            return
        if self._children:
            raise RuntimeError(f"device {self._id} still has {self._children} open objects")
        cdef int rc
        with nogil:
            rc = hixl_acl_reset_device(self._id)
        self._closed = True
        self._rt._devices.pop(self._id, None)
        _check(rc)

    def __repr__(self):
        return f"<Device {self._id}{' reset' if self._closed else ''}>"


cdef bytes _ipc_key(object key):
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    bkey = key.encode("ascii", "strict") if key.isascii() else b""
    if not 0 < len(bkey) < HIXL_ACL_IPC_KEY_LEN or b"\0" in bkey:
        raise ValueError(f"not an IPC export key: {key!r}")
    return bkey


cdef _Memory _adopt_memory(_Memory m, Device dev, void *p, uint64_t size, int kind):
    m._dev = dev
    m._ptr = <char *>p
    m._size = size
    m._kind = kind
    m._closed = False
    dev._adopt()
    _live[_live_slot(kind)] += 1
    return m
