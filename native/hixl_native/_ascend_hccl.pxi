# HCCL communicators for point-to-point transfers.

cdef class SendRecvItem:
    """One send or receive of `HcclComm.batch_send_recv`.

    Args:
        kind: `SendRecvKind.SEND` or `SendRecvKind.RECV`.
        buffer: Device memory sent from or received into.
        offset: Start in ``buffer``.
        nbytes: Bytes; the peer's matching item must have as many.
        peer: The peer's rank.
    """

    def __init__(self, kind, DeviceMemory buffer not None, offset, nbytes, peer):
        self.kind = SendRecvKind(kind)
        self.buffer = buffer
        self.offset = _int_in(offset, 0, buffer._size, "offset")
        self.nbytes = _int_in(nbytes, 0, buffer._size - self.offset, "nbytes")
        self.peer = _int_in(peer, 0, 0xFFFFFFFE, "peer")

    @staticmethod
    def send(DeviceMemory buffer not None, offset, nbytes, peer):
        """A send item."""
        return SendRecvItem(HCCL_SEND, buffer, offset, nbytes, peer)

    @staticmethod
    def recv(DeviceMemory buffer not None, offset, nbytes, peer):
        """A receive item."""
        return SendRecvItem(HCCL_RECV, buffer, offset, nbytes, peer)

    def __repr__(self):
        return (f"SendRecvItem({SendRecvKind(self.kind).name}, offset={self.offset}, "
                f"nbytes={self.nbytes}, peer={self.peer})")


cdef class HcclComm:
    """An HCCL communicator (``HcclCommInitRootInfo``), for point-to-point transfers.

    Construction blocks, with the GIL released, until every rank joined (or
    HCCL's connect timeout passed). Operations are queued on a `Stream` of the
    same device; `Stream.synchronize` waits for them.

    Args:
        device: The device this rank runs on.
        root_info: `Device.hccl_root_info` of the rank that created the rendezvous.
        nranks: Ranks in the communicator (2 for one link).
        rank: This rank, in [0, nranks).
        buffer_mb: HCCL buffer of the communicator in MB (``hcclBufferSize``
            of ``HcclCommInitRootInfoConfig`` where present, else
            ``HCCL_BUFFSIZE`` applies); 0 leaves it unset, so that
            ``HCCL_BUFFSIZE`` (else HCCL's 200) applies.
        name: Communicator name (unique in the process); "" lets HCCL pick one.

    Communicators are created one at a time per process (the shim's lock), so
    the ranks of one communicator live in different processes.

    Raises:
        HcclError: e.g. 9 (``HCCL_E_TIMEOUT``) when a peer never joins.
    """

    def __cinit__(self, *args, **kwargs):
        self._closed = True

    def __init__(self, Device device not None, root_info, nranks, rank, *, buffer_mb=0,
                 name=""):
        device._check_open()
        if self._dev is not None:
            raise RuntimeError("HcclComm is already initialized")
        cdef bytes raw = bytes(root_info)
        if len(raw) != HIXL_HCCL_ROOT_INFO_BYTES:
            raise ValueError(f"root_info must be {HIXL_HCCL_ROOT_INFO_BYTES} bytes, got {len(raw)}")
        cdef uint32_t n = _int_in(nranks, 1, 0xFFFFFFFF, "nranks")
        cdef uint32_t r = _int_in(rank, 0, n - 1, "rank")
        cdef HcclRootInfo ri
        cdef hccl_comm_t c = NULL
        cdef int rc
        cdef hixl_comm_options opt
        _comm_options(buffer_mb, name, &opt)
        c_memcpy(ri.internal, <const char *>raw, HIXL_HCCL_ROOT_INFO_BYTES)
        with nogil:
            rc = hixl_hccl_comm_init_config(device._id, n, &ri, r, &opt, &c)
        _check(rc)
        _adopt_comm(self, device, c, r, n)

    def __dealloc__(self):
        if not self._closed and self._dev is not None:
            with nogil:
                hixl_hccl_comm_destroy(self._dev._id, self._c)
            self._dev._release()
            _live[_LIVE_COMM] -= 1

    cdef int _check_open(self) except -1:
        if self._closed:
            raise ValueError("the communicator is destroyed")
        return 0

    cdef uint32_t _check_peer(self, object peer) except? 0xFFFFFFFF:
        cdef uint32_t p = _int_in(peer, 0, self._nranks - 1, "peer")
        if p == self._rank:
            raise ValueError(f"peer {p} is this rank")
        return p

    @property
    def rank(self):
        """This rank."""
        return self._rank

    @property
    def nranks(self):
        """Ranks in the communicator."""
        return self._nranks

    @property
    def device(self):
        """The owning `Device`."""
        return self._dev

    @property
    def closed(self):
        """Whether the communicator was destroyed."""
        return self._closed

    def send(self, DeviceMemory src not None, offset, nbytes, peer, Stream stream not None):
        """Queue a send of ``nbytes`` at ``offset`` of ``src`` to ``peer`` (``HcclSend``)."""
        self._p2p(True, src, offset, nbytes, peer, stream)

    def recv(self, DeviceMemory dst not None, offset, nbytes, peer, Stream stream not None):
        """Queue a receive of ``nbytes`` into ``offset`` of ``dst`` from ``peer`` (``HcclRecv``)."""
        self._p2p(False, dst, offset, nbytes, peer, stream)

    cdef int _p2p(self, bint sending, DeviceMemory mem, object offset, object nbytes, object peer,
                  Stream stream) except -1:
        self._check_open()
        stream._check_open()
        cdef uint64_t off, n
        _bounds(mem, offset, nbytes, &off, &n)
        cdef uint32_t p = self._check_peer(peer)
        _same_device(self, stream, mem)
        cdef int rc
        with nogil:
            if sending:
                rc = hixl_hccl_send(self._dev._id, mem._ptr + off, n, p, self._c, stream._s)
            else:
                rc = hixl_hccl_recv(self._dev._id, mem._ptr + off, n, p, self._c, stream._s)
        _check(rc)
        stream._pin(mem)
        return 0

    def send_ranges(self, DeviceMemory mem not None, pairs, peer, Stream stream not None):
        """Queue sends of ranges of ``mem`` to ``peer``, one ``HcclBatchSendRecv`` each.

        One range per call: CANN allows one send and one receive per peer in
        a call. The peer posts `recv_ranges` with the same lengths in the same order.
        Every range is checked before the batch is queued; ``mem`` is pinned
        until `Stream.synchronize`.

        Args:
            mem: Device memory sent from (HCCL moves device memory only).
            pairs: A C-contiguous buffer of native uint64 (e.g. a numpy array
                of shape (n, 2)) holding ``(offset, length)`` pairs, in the
                order sent. Pairs of length 0 are skipped; when all are,
                nothing is queued.
            peer: The receiving rank.
            stream: Stream of this communicator's device.

        Raises:
            TypeError: ``mem`` is not device memory, or ``pairs`` is not a
                buffer of uint64.
            ValueError: ``pairs`` is empty or holds a partial pair, a range
                lies outside ``mem``, the peer is invalid, or the devices differ.
            HcclError: HCCL refused a call; the ranges before it stay queued
                (and ``mem`` pinned).
        """
        self._p2p_ranges(HCCL_SEND, mem, pairs, peer, stream)

    def recv_ranges(self, DeviceMemory mem not None, pairs, peer, Stream stream not None):
        """Queue receives into ranges of ``mem`` from ``peer``, one ``HcclBatchSendRecv`` each.

        The counterpart of `send_ranges`, with the same arguments and errors;
        each range receives the peer's message of the same position.
        """
        self._p2p_ranges(HCCL_RECV, mem, pairs, peer, stream)

    cdef int _p2p_ranges(self, int kind, DeviceMemory mem, object pairs, object peer,
                         Stream stream) except -1:
        self._check_open()
        stream._check_open()
        mem._check_open()
        cdef uint32_t p = self._check_peer(peer)
        _same_device(self, stream, mem)
        cdef size_t n, i, k = 0, queued = 0
        cdef uint64_t *r = _u64_tuples(pairs, 2, "pairs", &n)
        cdef HcclSendRecvItem *arr = NULL
        cdef int rc = 0
        try:
            if n == 0:
                raise ValueError("pairs is empty")
            if n > 0xFFFFFFFF:  # HcclBatchSendRecv counts items in 32 bits
                raise ValueError(f"{n} pairs are too many for one batch")
            arr = <HcclSendRecvItem *>malloc(n * sizeof(HcclSendRecvItem))
            if arr == NULL:
                raise MemoryError()
            for i in range(n):
                if not _range_in(r[2 * i], r[2 * i + 1], mem._size):
                    raise ValueError(f"pairs[{i}] = ({r[2 * i]}, {r[2 * i + 1]}) lies outside "
                                     f"the memory ({mem._size} bytes)")
                if r[2 * i + 1] == 0:
                    continue
                arr[k].sendRecvType = kind
                arr[k].buf = mem._ptr + r[2 * i]
                arr[k].count = r[2 * i + 1]
                arr[k].dataType = HCCL_DATA_TYPE_INT8
                arr[k].remoteRank = p
                k += 1
            if k:
                # pinned while the GIL is released, so that no other thread frees it
                mem._pins += 1
                # One item per call: CANN 8.0's HcclBatchSendRecv page forbids two
                # sends (or receives) to the same rank in one task list, and the
                # 8.2 HCCL user guide allows one memory block per direction between
                # two ranks per call. The peer queues its side in the same order.
                with nogil:
                    for i in range(k):
                        rc = hixl_hccl_batch(self._dev._id, arr + i, 1, self._c, stream._s)
                        if rc:
                            break
                        queued += 1
                mem._pins -= 1
        finally:
            free(r)
            free(arr)
        if queued:
            stream._pin(mem)
        _check(rc)
        return 0

    def batch_send_recv(self, items, Stream stream not None):
        """Queue sends and receives that progress together (``HcclBatchSendRecv``).

        Args:
            items: `SendRecvItem` objects.
            stream: Stream of this communicator's device.
        """
        self._check_open()
        stream._check_open()
        checked = list(items)
        if not checked:
            raise ValueError("batch_send_recv needs at least one item")
        cdef HcclSendRecvItem *arr = <HcclSendRecvItem *>malloc(len(checked) * sizeof(HcclSendRecvItem))
        cdef uint32_t i, n = len(checked)
        cdef uint64_t off, nb
        cdef int rc
        if arr == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                it = checked[i]
                if not isinstance(it, SendRecvItem):
                    raise TypeError(f"items must be SendRecvItem, not {type(it).__name__}")
                _bounds((<SendRecvItem>it).buffer, (<SendRecvItem>it).offset,
                        (<SendRecvItem>it).nbytes, &off, &nb)
                _same_device(self, stream, (<SendRecvItem>it).buffer)
                arr[i].sendRecvType = (<SendRecvItem>it).kind
                arr[i].buf = (<SendRecvItem>it).buffer._ptr + off
                arr[i].count = nb
                arr[i].dataType = HCCL_DATA_TYPE_INT8
                arr[i].remoteRank = self._check_peer((<SendRecvItem>it).peer)
            with nogil:
                rc = hixl_hccl_batch(self._dev._id, arr, n, self._c, stream._s)
        finally:
            free(arr)
        _check(rc)
        for it in checked:
            stream._pin((<SendRecvItem>it).buffer)

    def destroy(self):
        """Destroy the communicator (``HcclCommDestroy``); idempotent. Queued
        operations of it fail. Refused with memory still bound to it (HCCL_E_PARA,
        hcomm HcclOneSidedService::DeInit), it stays open: unbind, then again."""
        if self._closed:
            return
        cdef int rc
        with nogil:
            rc = hixl_hccl_comm_destroy(self._dev._id, self._c)
        if rc == 1:  # HCCL_E_PARA: HCCL kept the communicator
            _check(rc)
        self._closed = True
        self._dev._release()
        _live[_LIVE_COMM] -= 1
        _check(rc)

    close = destroy

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.destroy()

    def __repr__(self):
        state = "destroyed" if self._closed else f"rank {self._rank} of {self._nranks}"
        return f"<HcclComm {state}>"


cdef int _same_device(HcclComm comm, Stream stream, DeviceMemory mem) except -1:
    if stream._dev is not comm._dev or mem._dev is not comm._dev:
        raise ValueError(f"the stream and memory must be on the communicator's device "
                         f"{comm._dev._id}")
    return 0
