# Issue 18: communicators from a rank table, communicator options, device
# facts a rank table needs, and the shim's creation count.


cdef int _comm_options(object buffer_mb, object name, hixl_comm_options *opt) except -1:
    cdef bytes bname = name.encode("ascii") if isinstance(name, str) and name.isascii() else None
    if bname is None:
        raise ValueError(f"a communicator name must be an ASCII str, not {name!r}")
    if len(bname) >= HIXL_HCCL_COMM_NAME_MAX or b"\0" in bname:
        raise ValueError(f"a communicator name has at most {HIXL_HCCL_COMM_NAME_MAX - 1} "
                         f"characters and no NUL: {name!r}")
    opt.buffer_mb = _int_in(buffer_mb, 0, 0xFFFFFFFF, "buffer_mb")
    c_memcpy(opt.name, <const char *>bname, len(bname) + 1)
    return 0


cdef int _adopt_comm(HcclComm comm, Device device, hccl_comm_t c, uint32_t rank,
                     uint32_t nranks) except -1:
    comm._dev = device
    comm._c = c
    comm._rank = rank
    comm._nranks = nranks
    comm._closed = False
    device._adopt()
    _live[_LIVE_COMM] += 1
    return 0


def _rank_count(str rank_table):
    import json
    try:
        servers = json.loads(rank_table)["server_list"]
        n = sum(len(server["device"]) for server in servers)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a rank table (server_list of devices): {exc}") from None
    if n < 1:
        raise ValueError("the rank table names no device")
    return n


def comm_from_rank_table(Device device not None, rank_table, rank, *, buffer_mb=0, name=""):
    """Create this rank's communicator from a rank table
    (``HcclCommInitClusterInfoMemConfig``), blocking until every rank joined.

    Args:
        device: The device this rank runs on.
        rank_table: The rank table's JSON text (not a path); every rank passes
            the same text.
        rank: This rank: the ``rank_id`` the table gives this device.
        buffer_mb: ``hcclBufferSize`` in MB (the same on every rank); 0: 200.
        name: Communicator name, unique in the process; "" lets HCCL pick one.

    Returns:
        An `HcclComm`.

    Raises:
        HcclError: 5 (``HCCL_E_NOT_SUPPORT``) where this CANN lacks the entry
            point (`AscendRuntime.features` has no ``rank_table``), or HCCL's
            own refusal or timeout.
    """
    device._check_open()
    if not isinstance(rank_table, str) or not rank_table:
        raise TypeError("rank_table must be the rank table's JSON text")
    cdef bytes table = rank_table.encode("utf-8")
    if b"\0" in table:
        raise ValueError("rank_table holds a NUL character")
    cdef uint32_t n = _rank_count(rank_table)
    cdef uint32_t r = _int_in(rank, 0, n - 1, "rank")
    cdef hixl_comm_options opt
    _comm_options(buffer_mb, name, &opt)
    cdef const char *ctable = table
    cdef hccl_comm_t c = NULL
    cdef int rc
    with nogil:
        rc = hixl_hccl_comm_init_rank_table(device._id, ctable, r, &opt, &c)
    _check(rc)
    comm = HcclComm.__new__(HcclComm)
    _adopt_comm(comm, device, c, r, n)
    return comm


def physical_device_id(Device device not None):
    """The physical id of a logical device (``aclrtGetPhyDevIdByLogicDevId``),
    as a rank table's ``device_id`` names it; the logical id where the entry
    point is absent."""
    device._check_open()
    cdef int32_t phy = -1
    cdef int rc
    with nogil:
        rc = hixl_acl_physical_id(device._id, &phy)
    _check(rc)
    return phy


def soc_name():
    """The SoC's version name (``aclrtGetSocName``, e.g. ``Ascend910B1`` or
    ``Ascend910_9391``); None where CANN lacks the entry point or answers NULL."""
    if not hixl_acl_features() & HIXL_ACL_HAS_SOC_INFO:
        return None
    cdef char buf[HIXL_ACL_SOC_NAME_MAX]
    cdef int rc
    with nogil:
        rc = hixl_acl_soc_name(buf, sizeof(buf))
    _check(rc)
    name = buf.decode("utf-8", "replace")
    return name or None


def super_pod_ids(Device device not None):
    """``(super_device_id, super_pod_id)`` of a device on an Atlas A3 product
    (``aclrtGetDeviceInfo`` with ``ACL_DEV_ATTR_SUPER_POD_DEVIDE_ID`` and
    ``ACL_DEV_ATTR_SUPER_POD_ID``, as HIXL's rank_table_generator_v2.cc reads
    them).

    Raises:
        AclError: CANN lacks the entry point (200001) or the product has no
            super pod.
    """
    device._check_open()
    cdef int64_t sdid = -1, pod = -1
    cdef int rc
    with nogil:
        rc = hixl_acl_device_info(device._id, HIXL_ACL_DEV_ATTR_SUPER_POD_DEVICE_ID, &sdid)
        if rc == 0:
            rc = hixl_acl_device_info(device._id, HIXL_ACL_DEV_ATTR_SUPER_POD_ID, &pod)
    _check(rc)
    return sdid, pod


def comm_inits():
    """Communicators whose creation started in this process (all of them
    serialised by the shim's lock)."""
    return hixl_hccl_comm_inits()
