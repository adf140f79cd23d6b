# DataServer (target side) and DataLink (initiator side) of the TCP data plane.

_MAX_STREAMS = 64
_MAX_TIMEOUT_MS = 0x7FFFFFFF
# Bytes of a link key (tcp_wire.h); the all-zero key is the default of tests
# that make links by hand.
KEY_SIZE = 32
_NO_KEY = bytes(KEY_SIZE)
_MAX_CONNECTIONS = 1 << 20


cdef bytes _link_key(object key):
    if not isinstance(key, bytes) or len(key) != KEY_SIZE:
        raise ValueError(f"key must be {KEY_SIZE} bytes, got {key!r:.40}")
    return key


def set_tcp_liveness(idle_s, interval_s, count, user_timeout_ms):
    """TCP keepalive and ``TCP_USER_TIMEOUT`` of every data-plane socket made or
    accepted from now on (0 keeps the kernel's default of that option).

    Args:
        idle_s: Seconds a connection is idle before the first keepalive probe.
        interval_s: Seconds between probes.
        count: Unanswered probes after which the connection fails.
        user_timeout_ms: Milliseconds sent data may stay unacknowledged before
            the connection fails (also bounds the probes, Linux tcp(7)).
    """
    cdef int idle = _int_in(idle_s, 0, 32767, "idle_s")
    cdef int interval = _int_in(interval_s, 0, 32767, "interval_s")
    cdef int cnt = _int_in(count, 0, 127, "count")
    cdef int user = _int_in(user_timeout_ms, 0, _MAX_TIMEOUT_MS, "user_timeout_ms")
    hixl_tcp_set_liveness(idle, interval, cnt, user)


def crc32c(data, crc=0):
    """The CRC-32C (Castagnoli) of a buffer, as the data plane's checksum
    trailer carries it (``tcp_wire.h``); computed with the GIL released.

    Args:
        data: Any contiguous buffer.
        crc: A previous result to continue from (0 to start).

    Returns:
        The CRC as an int.
    """
    cdef Py_buffer view
    cdef uint32_t c = <uint32_t>_int_in(crc, 0, 0xFFFFFFFF, "crc")
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        with nogil:
            c = hixl_crc32c(c, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return c


def crc32c_table(data, crc=0):
    """``crc32c`` by the byte table alone, whatever the CPU offers (for tests)."""
    cdef Py_buffer view
    cdef uint32_t c = <uint32_t>_int_in(crc, 0, 0xFFFFFFFF, "crc")
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        with nogil:
            c = hixl_crc32c_table(c, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return c


def crc32c_hardware():
    """Whether ``crc32c`` uses the CPU's CRC instruction (SSE4.2, ARMv8 CRC32)."""
    return bool(hixl_crc32c_hardware())


def run_ranges(src_offsets, src_first, src_add, dst_offsets, dst_first, dst_add, count,
               length):
    """The merged ranges of a run of tensor pairs, for the planners.

    For k in [0, count): ``length`` bytes from ``src_offsets[src_first + k] +
    src_add`` to ``dst_offsets[dst_first + k] + dst_add``; neighbours that are
    contiguous on both sides are merged and empty ranges dropped, in one C
    loop whatever ``count`` is.

    Args:
        src_offsets: Sequence of int tensor offsets of the source.
        src_first: First source tensor of the run.
        src_add: Added to every source offset (e.g. the batch slot's start).
        dst_offsets: As ``src_offsets``, for the destination.
        dst_first: First destination tensor of the run.
        dst_add: As ``src_add``, for the destination.
        count: Number of pairs.
        length: Bytes per pair.

    Returns:
        A bytearray of native uint64 (src, dst, length) triples.

    Raises:
        IndexError: The run leaves a sequence of offsets.
        TypeError / ValueError: Arguments that are not ints in range.
    """
    cdef uint64_t sadd = _u64(src_add, "src_add")
    cdef uint64_t dadd = _u64(dst_add, "dst_add")
    cdef uint64_t ln = _u64(length, "length")
    cdef Py_ssize_t sfirst = _int_in(src_first, 0, len(src_offsets), "src_first")
    cdef Py_ssize_t dfirst = _int_in(dst_first, 0, len(dst_offsets), "dst_first")
    cdef Py_ssize_t n = _int_in(count, 0, min(len(src_offsets) - sfirst,
                                              len(dst_offsets) - dfirst), "count")
    cdef Py_ssize_t k, m = 0
    cdef uint64_t so, do
    out = bytearray(24 * n if ln else 0)
    if not ln:
        return out
    cdef uint64_t *o = <uint64_t *><char *>out
    for k in range(n):
        so = <uint64_t>_u64(src_offsets[sfirst + k], "src_offsets") + sadd
        do = <uint64_t>_u64(dst_offsets[dfirst + k], "dst_offsets") + dadd
        if m and o[3 * m - 3] + o[3 * m - 1] == so and o[3 * m - 2] + o[3 * m - 1] == do:
            o[3 * m - 1] += ln
        else:
            o[3 * m] = so
            o[3 * m + 1] = do
            o[3 * m + 2] = ln
            m += 1
    del out[24 * m:]
    return out


def set_link_threads(threads):
    """How many native workers move the data streams of every ``DataLink`` of
    this process (1-256). Set before the first link opens; later, it can only
    add workers.
    """
    cdef int n = _int_in(threads, 1, 256, "threads")
    cdef int rc
    with nogil:
        rc = hixl_jobs_set_threads(n)
    if rc != HIXL_OK:
        _raise(rc, "cannot start the data links' workers", errno)


def link_threads():
    """The workers that move data streams (``set_link_threads``), besides one watcher."""
    return hixl_jobs_threads()


cdef class DataServer:
    """The target side of the TCP data plane: a listening socket plus native threads.

    Args:
        host: Address to bind ("" or "0.0.0.0" for all interfaces).
        port: TCP port; 0 picks an ephemeral one (see ``port``).
        max_connections: Data connections served at once; a HELLO beyond
            them is answered ``E_BUSY``.
        threads: Native workers serving every connection (1-256): a
            connection holds one only while it moves a request.

    Raises:
        NativeError: The address cannot be resolved or bound (``E_IO``).
    """

    def __cinit__(self, *args, **kwargs):
        self._s = NULL
        self._closed = True
        self._regions = {}

    def __init__(self, str host not None, port, max_connections=1024, threads=16):
        cdef hixl_server *s = NULL
        cdef int rc, err
        cdef uint16_t cport = _int_in(port, 0, 65535, "port")
        cdef size_t cmax = _int_in(max_connections, 1, _MAX_CONNECTIONS, "max_connections")
        cdef int cthreads = _int_in(threads, 1, HIXL_SERVER_MAX_THREADS, "threads")
        if self._s != NULL:
            raise RuntimeError("DataServer is already initialized")
        bhost = host.encode()
        cdef const char *chost = bhost
        with nogil:
            rc = hixl_server_start(chost, cport, cmax, cthreads, &s)
            err = errno
        if rc != HIXL_OK:
            _raise(rc, f"cannot listen on {host}:{port}", err)
        self._s = s
        self._port = hixl_server_port(s)
        self._closed = False

    def __dealloc__(self):
        if self._s != NULL:
            with nogil:
                hixl_server_destroy(self._s)
            self._s = NULL

    cdef int _check_running(self) except -1:
        if self._closed:
            raise NativeError(HIXL_E_CLOSED, "the data server is closed")
        return 0

    @property
    def port(self):
        """The bound TCP port."""
        return self._port

    @property
    def threads(self):
        """The native workers serving this server's connections."""
        self._check_running()
        return hixl_server_threads(self._s)

    @property
    def checksum_mismatches(self):
        """Writes refused since the start because their bytes did not match
        their CRC-32C (``E_CHECKSUM`` answered to the writer); still read
        after ``close()`` (a scrape during the daemon's stop)."""
        return 0 if self._s == NULL else hixl_server_checksum_mismatches(self._s)

    def authorize(self, token, cluster_id, key=_NO_KEY, may_write=True):
        """Let connections of link ``token`` that prove ``key`` access regions of
        ``cluster_id``.

        Args:
            token: The uint64 that names one link.
            cluster_id: The uint64 cluster whose regions the link opens.
            key: The link's ``KEY_SIZE``-byte secret; each connection proves
                it by a MAC over a fresh nonce (``tcp_wire.h``).
            may_write: Whether the link may write into the cluster's writable
                regions; False refuses every WRITE before a byte lands.

        Raises:
            ValueError: Out-of-range integers, a key of another size, or the
                token is already bound to another cluster.
        """
        self._check_running()
        cdef uint64_t t = _u64(token, "token")
        cdef uint64_t c = _u64(cluster_id, "cluster_id")
        cdef bytes k = _link_key(key)
        cdef const uint8_t *ck = k
        cdef int rc = hixl_server_authorize(self._s, t, c, ck, 1 if may_write else 0)
        if rc != HIXL_OK:
            _raise(rc, f"token is already authorized for another cluster")

    def revoke(self, token):
        """Forget ``token`` and shut down the connections that presented it."""
        cdef uint64_t t = _u64(token, "token")
        if not self._closed:
            hixl_server_revoke(self._s, t)

    def register_region(self, region_id, Mapping mapping not None, offset, length,
                        cluster_id, writable=False):
        """Expose ``[offset, offset + length)`` of ``mapping`` to ``cluster_id``'s peers.

        The server pins the mapping (it cannot be closed) until the region
        is unregistered or the server closed.

        Args:
            region_id: uint64, unique within this server.
            mapping: The memory to expose.
            offset: Start of the region in the mapping.
            length: Length of the region, > 0.
            cluster_id: uint64 cluster owning the region.
            writable: Whether peers may WRITE into it.

        Raises:
            ValueError: The id is taken or the range lies outside the mapping.
        """
        self._check_running()
        mapping._check_open()
        cdef uint64_t rid = _u64(region_id, "region_id")
        cdef uint64_t cl = _u64(cluster_id, "cluster_id")
        cdef uint64_t off = _int_in(offset, 0, mapping._size, "offset")
        cdef uint64_t ln = _int_in(length, 1, mapping._size - off, "length")
        cdef int rc = hixl_regions_add(hixl_server_regions(self._s), rid, mapping._m,
                                       off, ln, cl, 1 if writable else 0)
        if rc == HIXL_E_EXISTS:
            raise ValueError(f"region {region_id} is already registered")
        if rc != HIXL_OK:
            _raise(rc, f"cannot register region {region_id}")
        self._regions[region_id] = mapping

    def register_process_region(self, region_id, ProcessSpan memory not None, offset, length,
                                cluster_id, writable=False):
        """``register_region`` for a client process's memory: peers' requests
        naming it move through the span's inbound bounce buffers.

        Raises:
            ValueError: The id is taken or the range lies outside the span.
        """
        self._check_running()
        memory._check_open()
        cdef uint64_t rid = _u64(region_id, "region_id")
        cdef uint64_t cl = _u64(cluster_id, "cluster_id")
        cdef uint64_t off = _int_in(offset, 0, memory._size, "offset")
        cdef uint64_t ln = _int_in(length, 1, memory._size - off, "length")
        cdef int rc = hixl_regions_add_xmem(hixl_server_regions(self._s), rid, memory._x,
                                            off, ln, cl, 1 if writable else 0)
        if rc == HIXL_E_EXISTS:
            raise ValueError(f"region {region_id} is already registered")
        if rc != HIXL_OK:
            _raise(rc, f"cannot register region {region_id}")
        self._regions[region_id] = memory

    def unregister_region(self, region_id):
        """Withdraw a region; unknown ids are ignored.

        New requests naming it are refused at once; the call then waits,
        with the GIL released, until requests already using it finish
        (each is bounded by its timeout). As it may block that long, call
        it from an executor thread, not from an event loop.
        """
        cdef uint64_t rid = _u64(region_id, "region_id")
        if self._s == NULL:
            return
        with nogil:
            hixl_regions_remove(hixl_server_regions(self._s), rid)
        self._regions.pop(region_id, None)

    def close(self):
        """Stop accepting, close every connection, join the threads and
        release all regions. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with nogil:
            hixl_server_stop(self._s)
            # No connection thread is left to use a region: drop them all.
            hixl_regions_clear(hixl_server_regions(self._s))
        self._regions.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self):
        state = "closed" if self._closed else f"port {self._port}"
        return f"<DataServer {state}, {len(self._regions)} regions>"


cdef extern from "tcp_link.h" nogil:
    int hixl_link_submit_wait(hixl_link *l, int op, uint64_t request_id, hixl_mapping *local,
                              const uint8_t *quads, size_t n, uint64_t timeout_ms,
                              uint64_t wait_us, int32_t *status)

# Longest inline wait a caller may ask for (the calling thread blocks that long).
_MAX_WAIT_US = 100_000


cdef object _submit_region(DataLink link, int op, object request_id, object local,
                           object region_id, object ranges, int remote_col, int local_col,
                           object timeout_ms, object wait_us, uint64_t remote_shift,
                           uint64_t local_shift, bint checksum):
    """DataLink._submit with ranges as (offset, offset, length) triples in one
    region, each offset shifted; returns the final status when the request
    ended here, else None. ``checksum``: the request carries a CRC-32C."""
    cdef size_t n = 0, i
    cdef uint64_t size, roff, loff, length
    cdef const uint8_t *triples
    cdef uint64_t *quads = NULL
    cdef int32_t status = 1
    cdef int rc
    cdef Py_buffer view
    cdef bint viewing = False
    cdef ProcessSpan xlocal = None
    cdef Mapping mlocal = None
    if isinstance(local, ProcessSpan):
        xlocal = <ProcessSpan>local
        xlocal._check_open()
        size = xlocal._size
    elif isinstance(local, Mapping):
        mlocal = <Mapping>local
        mlocal._check_open()
        size = mlocal._size
    else:
        raise TypeError(f"local memory must be a Mapping or a ProcessSpan, "
                        f"not {type(local).__name__}")
    if link._closed:
        raise NativeError(HIXL_E_CLOSED, "the link is closed")
    cdef uint64_t rid = _u64(request_id, "request_id")
    cdef uint64_t region = _u64(region_id, "region_id")
    cdef uint64_t tmo = _int_in(timeout_ms, 1, _MAX_TIMEOUT_MS, "timeout_ms")
    cdef uint64_t wait = _int_in(wait_us, 0, _MAX_WAIT_US, "wait_us")
    _u64_view(ranges, 3, "ranges", &view)
    viewing = True
    if checksum:
        op |= HIXL_SUBMIT_CRC32C
    try:
        n = <size_t>(view.len // 24)
        quads = <uint64_t *>malloc(32 * n if n else 1)
        if quads == NULL:
            raise MemoryError()
        # Each triple is read once into locals, checked, and written to the
        # private quads, which alone reach the data link: another thread
        # changing the caller's array meanwhile cannot slip an unchecked
        # range through (and no separate snapshot of the list is needed,
        # which for 200k ranges would be 4.6 MiB more at once).
        triples = <const uint8_t *>view.buf  # raw bytes may be unaligned: load each word
        for i in range(n):
            roff = hixl_load_u64(triples, 3 * i + remote_col) + remote_shift
            loff = hixl_load_u64(triples, 3 * i + local_col) + local_shift
            length = hixl_load_u64(triples, 3 * i + 2)
            if roff < remote_shift or loff < local_shift:
                raise ValueError(f"range {i} shifted by ({remote_shift}, {local_shift}) "
                                 f"overflows")
            if not hixl_in_bounds(loff, length, size):
                raise ValueError(
                    f"range {i}: local [{loff}, {loff}+{length}) is outside "
                    f"the local mapping of {size} bytes")
            quads[4 * i] = region
            quads[4 * i + 1] = roff
            quads[4 * i + 2] = loff
            quads[4 * i + 3] = length
        PyBuffer_Release(&view)
        viewing = False
        if xlocal is not None:
            # Staged by the streams' workers: never finished here.
            rc = hixl_link_submit_xmem(link._l, op, rid, xlocal._x, <uint8_t *>quads, n, tmo)
        elif wait:
            # Pinned before the GIL goes: submit reads the mapping's address
            # before it takes its own pin, and an unmap from another thread
            # (which needs the GIL, as pins do) must not slip in between.
            # Nothing since the view was released ran Python, so the mapping
            # is still the one checked above.
            mlocal._check_open()
            hixl_mapping_pin(mlocal._m)
            with nogil:
                rc = hixl_link_submit_wait(link._l, op, rid, mlocal._m, <uint8_t *>quads, n,
                                           tmo, wait, &status)
            hixl_mapping_unpin(mlocal._m)
        elif checksum:
            # A small piece may be sent, and its CRC computed, on this thread:
            # without the GIL, the mapping pinned as above.
            mlocal._check_open()
            hixl_mapping_pin(mlocal._m)
            with nogil:
                rc = hixl_link_submit(link._l, op, rid, mlocal._m, <uint8_t *>quads, n, tmo)
            hixl_mapping_unpin(mlocal._m)
        else:
            rc = hixl_link_submit(link._l, op, rid, mlocal._m, <uint8_t *>quads, n, tmo)
        if rc != HIXL_OK:
            _raise(rc, f"cannot submit request {request_id}")
    finally:
        if viewing:
            PyBuffer_Release(&view)
        free(quads)
    return None if status == 1 else status


cdef class DataLink:
    """The initiator side of one link: ``streams`` TCP connections to a DataServer.

    Requests are submitted without blocking; each posts exactly one
    ``(request_id, status)`` completion to ``completions`` when done.

    Args:
        host: The DataServer's address.
        port: The DataServer's port.
        token: uint64 token the server was told to ``authorize``.
        streams: Number of parallel connections, 1..64.
        completions: Where completions are posted.
        connect_timeout_ms: Budget for connecting and handshaking all streams.
        key: The link's ``KEY_SIZE``-byte key, the one the server was given.

    Raises:
        NativeError: ``E_REFUSED`` if the server does not know the token or
            the key is not the link's, ``E_BUSY`` if the server is at its
            limit of data connections,
            ``E_TIMEOUT`` if it does not answer in time, ``E_IO`` if it
            cannot be reached (errno in the message).
    """

    def __cinit__(self, *args, **kwargs):
        self._l = NULL
        self._closed = True

    def __init__(self, str host not None, port, token, streams,
                 CompletionQueue completions not None, connect_timeout_ms, key=_NO_KEY):
        cdef hixl_link *l = NULL
        cdef int rc, err
        if self._l != NULL:
            raise RuntimeError("DataLink is already initialized")
        cdef uint16_t cport = _int_in(port, 1, 65535, "port")
        cdef uint64_t tok = _u64(token, "token")
        cdef int n = _int_in(streams, 1, _MAX_STREAMS, "streams")
        cdef uint64_t tmo = _int_in(connect_timeout_ms, 1, _MAX_TIMEOUT_MS, "connect_timeout_ms")
        cdef bytes k = _link_key(key)
        cdef const uint8_t *ck = k
        bhost = host.encode()
        cdef const char *chost = bhost
        with nogil:
            rc = hixl_link_open(chost, cport, tok, ck, n, completions._q, tmo, &l)
            err = errno
        if rc == HIXL_E_BUSY:  # a refusal of the far server, not a local shortage
            raise NativeError(rc, f"cannot link to {host}:{port}: the data server is at its "
                              f"limit of concurrent data connections")
        if rc != HIXL_OK:
            _raise(rc, f"cannot link to {host}:{port}", err)
        self._l = l
        self._cq = completions
        self._streams = n
        self._closed = False

    def __dealloc__(self):
        if self._l != NULL:
            with nogil:
                hixl_link_destroy(self._l)
            self._l = NULL

    @property
    def streams(self):
        """Number of TCP connections."""
        return self._streams

    @property
    def alive(self):
        """False once a stream saw the peer vanish, or after ``close()``."""
        return not self._closed and bool(hixl_link_alive(self._l))

    @property
    def streams_up(self):
        """Streams holding an open connection now; a lost one is reopened in the
        background by its idle worker (0 after ``close()``)."""
        return 0 if self._closed else hixl_link_streams_up(self._l)

    def stream_pieces(self):
        """Request pieces each stream was given so far, one count per stream:
        how the link spread its traffic (counts remain readable after ``close()``)."""
        return tuple(hixl_link_stream_pieces(self._l, i) for i in range(self._streams))

    cdef int _submit(self, int op, object request_id, Mapping local, object ranges,
                     object timeout_ms) except -1:
        cdef size_t n = 0, i
        cdef uint64_t size, loff, length
        if self._closed:
            raise NativeError(HIXL_E_CLOSED, "the link is closed")
        cdef uint64_t rid = _u64(request_id, "request_id")
        cdef uint64_t tmo = _int_in(timeout_ms, 1, _MAX_TIMEOUT_MS, "timeout_ms")
        local._check_open()
        size = local._size
        cdef uint8_t *quads = _snapshot_u64(ranges, 4, "ranges", &n)
        try:
            for i in range(n):
                loff = hixl_load_u64(quads, 4 * i + 2)
                length = hixl_load_u64(quads, 4 * i + 3)
                if not hixl_in_bounds(loff, length, size):
                    raise ValueError(
                        f"range {i}: local [{loff}, {loff}+{length}) is outside "
                        f"the local mapping of {size} bytes")
            rc = hixl_link_submit(self._l, op, rid, local._m, quads, n, tmo)
            if rc != HIXL_OK:
                _raise(rc, f"cannot submit request {request_id}")
        finally:
            free(quads)
        return 0

    def read_from(self, request_id, dst not None, region_id, ranges, timeout_ms,
                  wait_us=0, uint64_t remote_shift=0, uint64_t local_shift=0, *,
                  bint checksum=False):
        """``read`` of ranges that all lie in one remote region, maybe finished here.

        With ``wait_us`` > 0, a request of at most 512 KiB may be sent whole
        and its reply received on this thread when a stream is idle, blocking
        it (with the GIL released) for up to ``wait_us`` plus 1 us per 2000
        bytes moved; a later reply is left to the link's worker.

        Args:
            request_id: uint64 echoed in the completion.
            dst: Local destination: a mapping, pinned until completion, or a
                ``ProcessSpan`` (staged through its bounce buffers, never
                finished here).
            region_id: uint64 remote region of every range.
            ranges: Buffer of uint64 triples (remote_offset, local_dst_offset,
                length), e.g. an ``(n, 3)`` uint64 array.
            timeout_ms: Deadline for the whole request, > 0.
            wait_us: How long this thread may wait for the reply, 0..100000
                (plus the allowance for the bytes moved); 0 never waits.
            remote_shift, local_shift: Added to every range's remote and
                local offset before it is checked: one list of ranges serves
                every pair of batch slots without a new list per request.
            checksum: The far end sends a CRC-32C of the payload after it,
                checked over what arrived; a difference ends the request with
                ``E_CHECKSUM`` (``tcp_wire.h``).

        Returns:
            The request's status when it ended here (then nothing is posted),
            else None: one completion will be posted.

        Raises:
            As ``read``.
        """
        return _submit_region(self, HIXL_OP_READ, request_id, dst, region_id, ranges, 0, 1,
                              timeout_ms, wait_us, remote_shift, local_shift, checksum)

    def write_to(self, request_id, src not None, region_id, ranges, timeout_ms,
                 wait_us=0, uint64_t remote_shift=0, uint64_t local_shift=0, *,
                 bint checksum=False):
        """``write`` of ranges that all lie in one remote region, maybe finished here.

        Args:
            request_id: uint64 echoed in the completion.
            src: Local source: as ``read_from``'s ``dst``.
            region_id: uint64 remote region of every range.
            ranges: Buffer of uint64 triples (local_src_offset, remote_offset,
                length), e.g. an ``(n, 3)`` uint64 array.
            timeout_ms: Deadline for the whole request, > 0.
            wait_us, remote_shift, local_shift: As for ``read_from``.
            checksum: A CRC-32C of the payload follows it; the far end checks
                it over what landed and answers ``E_CHECKSUM`` on a difference
                (the bytes are in place then, but not to be trusted).

        Returns:
            As ``read_from``.

        Raises:
            As ``write``.
        """
        return _submit_region(self, HIXL_OP_WRITE, request_id, src, region_id, ranges, 1, 0,
                              timeout_ms, wait_us, remote_shift, local_shift, checksum)

    def read(self, request_id, Mapping dst not None, ranges, timeout_ms):
        """Start reading remote ranges into ``dst``; returns at once.

        Args:
            request_id: uint64 echoed in the completion.
            dst: Local destination mapping, pinned until completion.
            ranges: Buffer of uint64 quads (remote_region_id, remote_offset,
                local_dst_offset, length).
            timeout_ms: Deadline for the whole request, > 0.

        Raises:
            TypeError: ``ranges`` is not a buffer of uint64.
            ValueError: A local range lies outside ``dst`` (nothing is sent).
            NativeError: ``E_CLOSED`` if the link was closed locally.
        """
        self._submit(HIXL_OP_READ, request_id, dst, ranges, timeout_ms)

    def write(self, request_id, Mapping src not None, ranges, timeout_ms):
        """Start writing ``src`` ranges into remote writable regions; returns at once.

        Args:
            request_id: uint64 echoed in the completion.
            src: Local source mapping, pinned until completion.
            ranges: Buffer of uint64 quads (remote_region_id, remote_offset,
                local_src_offset, length).
            timeout_ms: Deadline for the whole request, > 0.

        Raises:
            TypeError: ``ranges`` is not a buffer of uint64.
            ValueError: A local range lies outside ``src`` (nothing is sent).
            NativeError: ``E_CLOSED`` if the link was closed locally.
        """
        self._submit(HIXL_OP_WRITE, request_id, src, ranges, timeout_ms)

    def close(self):
        """Fail queued and in-flight requests with ``E_CANCELLED`` (each still
        gets exactly one completion) and join the threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with nogil:
            hixl_link_close(self._l)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self):
        return f"<DataLink streams={self._streams} alive={self.alive}>"
