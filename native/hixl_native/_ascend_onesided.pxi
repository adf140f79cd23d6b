# One-sided HCCL (HIXL's direct path) and page-locked host memory.
#
# Memory is registered once per process (`GlobalMemory`, HcclRegisterGlobalMem)
# and bound to each communicator that reaches it (`hccl_bind`,
# HcclCommBindMem); `hccl_prepare` (HcclCommPrepare) makes the links ready
# and exchanges what is bound, so bind before preparing. A transfer is then a
# list of (local address, remote address, count) descriptors queued by one
# side only (`hccl_batch_get`, `hccl_batch_put`), in calls of at most
# `MAX_DESC_NUM` descriptors each. All of it needs CANN's one-sided entry
# points (`one_sided_supported`); they are optional symbols of the shim.

MAX_DESC_NUM = HIXL_HCCL_MAX_DESC_NUM
"""Descriptors per HcclBatchGet / HcclBatchPut call that HCCL accepts."""

HOST_REGISTER_ALIGNMENT = 4096
"""aclrtHostRegisterV2: "the host memory address must be 4K page aligned"."""


def one_sided_supported():
    """Whether the loaded CANN has every one-sided HCCL entry point."""
    return bool(hixl_acl_features() & HIXL_ACL_HAS_ONE_SIDED)


def host_register_supported():
    """Whether the loaded CANN can page-lock host memory: it has aclrtHostRegisterV2
    (whose ACL_HOST_REG_PINNED pins; aclrtHostRegister only maps, so hixl does not
    use it) and aclrtHostUnregister."""
    return bool(hixl_acl_features() & HIXL_ACL_HAS_HOST_PIN)


cdef class GlobalMemory:
    """Device memory registered for one-sided access (``HcclRegisterGlobalMem``).

    The memory stays pinned (cannot be freed) until `release`, which
    deregisters it; every communicator it was bound to must have unbound it
    first (HCCL refuses to deregister memory still in use).

    Args:
        memory: Device memory of this process (owned or imported), whole.

    Raises:
        HcclError: HCCL refused it (e.g. already registered), or the loaded
            CANN lacks the one-sided entry points (5, ``HCCL_E_NOT_SUPPORT``).
    """

    def __cinit__(self, *args, **kwargs):
        self._closed = True

    def __init__(self, DeviceMemory memory not None):
        memory._check_open()
        if self._mem is not None:
            raise RuntimeError("GlobalMemory is already initialized")
        cdef void *handle = NULL
        cdef int rc
        with nogil:
            rc = hixl_hccl_register_global(memory._dev._id, HCCL_MEM_TYPE_DEVICE, memory._ptr,
                                           memory._size, &handle)
        _check(rc)
        self._mem = memory
        self._handle = handle
        self._closed = False
        memory._pins += 1

    def __dealloc__(self):
        if not self._closed and self._mem is not None:
            with nogil:
                hixl_hccl_deregister_global(self._mem._dev._id, self._handle)
            self._mem._pins -= 1

    @property
    def memory(self):
        """The registered `DeviceMemory`."""
        return self._mem

    @property
    def closed(self):
        return self._closed

    def release(self):
        """Deregister (``HcclDeregisterGlobalMem``); idempotent. The memory may
        be freed afterwards."""
        if self._closed:
            return
        cdef int rc
        with nogil:
            rc = hixl_hccl_deregister_global(self._mem._dev._id, self._handle)
        _check(rc)
        self._closed = True
        self._mem._pins -= 1

    def __repr__(self):
        state = "released" if self._closed else f"{self._mem._size} bytes"
        return f"<GlobalMemory {state}>"


cdef int _one_sided_comm(HcclComm comm, GlobalMemory mem) except -1:
    comm._check_open()
    if mem._closed:
        raise ValueError("the memory was deregistered")
    if mem._mem._dev is not comm._dev:
        raise ValueError(f"the memory is on device {mem._mem._dev._id}, the communicator on "
                         f"{comm._dev._id}")
    return 0


def hccl_bind(HcclComm comm not None, GlobalMemory memory not None):
    """Bind registered memory to a communicator (``HcclCommBindMem``), before `hccl_prepare`."""
    _one_sided_comm(comm, memory)
    cdef int rc
    with nogil:
        rc = hixl_hccl_bind_mem(comm._dev._id, comm._c, memory._handle)
    _check(rc)


def hccl_unbind(HcclComm comm not None, GlobalMemory memory not None):
    """Unbind registered memory from a communicator (``HcclCommUnbindMem``)."""
    _one_sided_comm(comm, memory)
    cdef int rc
    with nogil:
        rc = hixl_hccl_unbind_mem(comm._dev._id, comm._c, memory._handle)
    _check(rc)


def hccl_prepare(HcclComm comm not None, timeout_s):
    """Make the communicator's links ready (``HcclCommPrepare``, full mesh); blocks,
    without the GIL, until the peer prepared too or ``timeout_s`` (>= 1) passed."""
    comm._check_open()
    cdef int32_t t = _int_in(timeout_s, 1, _I32_MAX, "timeout_s")
    cdef int rc
    with nogil:
        rc = hixl_hccl_prepare(comm._dev._id, comm._c, t)
    _check(rc)


def hccl_batch_get(HcclComm comm not None, DeviceMemory local not None, triples,
                   remote_address, remote_size, peer, Stream stream not None):
    """Queue one-sided reads of the peer's memory into ``local`` (``HcclBatchGet``).

    Args:
        comm: A prepared communicator both memories are bound to.
        local: Device memory read into.
        triples: A C-contiguous buffer of native uint64 ``(remote offset,
            local offset, length)`` triples. Ranges of length 0 are left
            out and neighbours contiguous on both sides merged, so that the
            descriptors are as few as the ranges allow.
        remote_address: Start of the peer's registered memory, in the peer's
            process; remote offsets are relative to it.
        remote_size: Bytes of it the ranges may reach.
        peer: The peer's rank.
        stream: Stream of the communicator's device; ``local`` stays pinned
            until it is synchronized.

    Returns:
        The number of descriptors queued (calls of at most `MAX_DESC_NUM`).

    Raises:
        ValueError: A range lies outside ``local`` or the remote memory.
        HcclError: HCCL refused a call; earlier calls stay queued.
    """
    return _one_sided(comm, False, local, triples, remote_address, remote_size, peer, stream)


def hccl_batch_put(HcclComm comm not None, DeviceMemory local not None, triples,
                   remote_address, remote_size, peer, Stream stream not None):
    """Queue one-sided writes of ``local`` into the peer's memory (``HcclBatchPut``).

    As `hccl_batch_get`, with ``(local offset, remote offset, length)`` triples.
    """
    return _one_sided(comm, True, local, triples, remote_address, remote_size, peer, stream)


cdef size_t _one_sided(HcclComm comm, bint put, DeviceMemory local, object triples,
                       object remote_address, object remote_size, object peer,
                       Stream stream) except? 0:
    comm._check_open()
    stream._check_open()
    local._check_open()
    _same_device(comm, stream, local)
    cdef uint32_t p = comm._check_peer(peer)
    cdef uint64_t rbase = _int_in(remote_address, 1, _U64_MAX, "remote_address")
    cdef uint64_t rsize = _int_in(remote_size, 1, _U64_MAX - rbase, "remote_size")
    cdef size_t n, i, k = 0, queued = 0
    cdef uint64_t *r = _u64_tuples(triples, 3, "triples", &n)
    cdef uint64_t loff, roff, length
    cdef HcclOneSideOpDesc *desc = NULL
    cdef int rc = 0
    try:
        desc = <HcclOneSideOpDesc *>malloc((n if n else 1) * sizeof(HcclOneSideOpDesc))
        if desc == NULL:
            raise MemoryError()
        for i in range(n):
            if put:
                loff = r[3 * i]
                roff = r[3 * i + 1]
            else:
                roff = r[3 * i]
                loff = r[3 * i + 1]
            length = r[3 * i + 2]
            if not _range_in(loff, length, local._size) or not _range_in(roff, length, rsize):
                raise ValueError(f"triples[{i}] = ({r[3 * i]}, {r[3 * i + 1]}, {length}) lies "
                                 f"outside the local memory ({local._size} bytes) or the "
                                 f"remote one ({rsize} bytes)")
            if length == 0:
                continue
            if k and (<char *>desc[k - 1].localAddr + desc[k - 1].count == local._ptr + loff
                      and <uint64_t><uintptr_t>desc[k - 1].remoteAddr + desc[k - 1].count
                      == rbase + roff):
                desc[k - 1].count += length
                continue
            desc[k].localAddr = local._ptr + loff
            desc[k].remoteAddr = <void *><uintptr_t>(rbase + roff)
            desc[k].count = length  # bytes: HCCL_DATA_TYPE_INT8 counts bytes
            desc[k].dataType = HCCL_DATA_TYPE_INT8
            k += 1
        if k:
            local._pins += 1
            with nogil:
                rc = hixl_hccl_one_sided(comm._dev._id, comm._c, put, p, desc, k, stream._s,
                                         &queued)
            local._pins -= 1
    finally:
        free(r)
        free(desc)
    if queued:
        stream._pin(local)
    _check(rc)
    return k


cdef class PinnedHost:
    """Host memory of another object (a `hixl_native.Mapping`) page-locked for
    the device with ``aclrtHostRegisterV2(ACL_HOST_REG_PINNED | ACL_HOST_REG_MAPPED)``.

    ACL copies of page-locked memory stay asynchronous (CANN 8.5 and later
    copy other host memory synchronously; earlier releases warn of
    unpredictable errors on training products). ``aclrtHostRegister`` with
    ``ACL_HOST_REGISTER_MAPPED`` would map the memory without locking it. The object holds a buffer
    export of ``owner`` until `close`, so the owner cannot unmap it while
    it is registered.

    Args:
        device: The device made current for the call.
        owner: An object exporting a writable, contiguous buffer whose start
            is 4 KiB aligned (aclrtHostRegister's rule).

    Raises:
        ValueError: The buffer is not 4 KiB aligned or is empty.
        AclError: CANN refused it (200001 where aclrtHostRegisterV2 is absent).
    """

    def __cinit__(self, *args, **kwargs):
        self._closed = True

    def __init__(self, Device device not None, owner):
        device._check_open()
        if self._dev is not None:
            raise RuntimeError("PinnedHost is already initialized")
        PyObject_GetBuffer(owner, &self._view, PyBUF_WRITABLE)
        cdef int rc
        cdef char *ptr = <char *>self._view.buf
        cdef uint64_t size = self._view.len
        address = <uintptr_t>ptr
        if size == 0 or address % HOST_REGISTER_ALIGNMENT:
            PyBuffer_Release(&self._view)
            raise ValueError(f"host memory at {address:#x} ({size} bytes) must be "
                             f"non-empty and {HOST_REGISTER_ALIGNMENT}-byte aligned to be "
                             f"registered")
        with nogil:
            rc = hixl_acl_host_register(device._id, ptr, size)
        if rc:
            PyBuffer_Release(&self._view)
            _check(rc)
        self._dev = device
        self._ptr = ptr
        self._size = size
        self._closed = False
        device._adopt()

    def __dealloc__(self):
        if not self._closed and self._dev is not None:
            with nogil:
                hixl_acl_host_unregister(self._dev._id, self._ptr)
            PyBuffer_Release(&self._view)
            self._dev._release()

    @property
    def address(self):
        return <uintptr_t>self._ptr

    @property
    def size(self):
        return self._size

    @property
    def closed(self):
        return self._closed

    def close(self):
        """Unregister (``aclrtHostUnregister``) and drop the export; idempotent."""
        if self._closed:
            return
        cdef int rc
        with nogil:
            rc = hixl_acl_host_unregister(self._dev._id, self._ptr)
        self._closed = True
        PyBuffer_Release(&self._view)
        self._dev._release()
        _check(rc)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self):
        address = <uintptr_t>self._ptr
        state = "closed" if self._closed else f"{self._size} bytes at {address:#x}"
        return f"<PinnedHost {state}>"
