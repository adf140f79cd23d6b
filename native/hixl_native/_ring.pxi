# Ring: one-way frames between two processes through shared memory.


def _pipe():
    """A non-blocking pipe: (read end, write end)."""
    return _os.pipe2(_os.O_NONBLOCK | _os.O_CLOEXEC)


cdef class Ring:
    """One side of a one-way frame ring in memory shared with another process.

    Made by ``Ring.create`` on one side, which also returns the three
    descriptors the other side passes to ``Ring.attach`` (sent over a unix
    socket). The producer writes frames, the consumer reads them, in order;
    a side with nothing to do spins up to ``spin_us``, then sleeps on a pipe
    the other side writes only while it sleeps (``csrc/ring.h``). Every
    length and position the other process wrote is checked: a corrupt ring
    raises ``NativeError`` (``E_PROTO``) instead of reading out of bounds.

    One thread at a time may use a side; any thread may close it, which
    ends a wait in progress (``E_CLOSED``) and unmaps the ring once that wait
    has returned. ``wait_fd`` is readable when an ``arm()``-ed side should
    look again, for waiting in an event loop.
    """

    cdef hixl_ring _r
    cdef void *_mem
    cdef size_t _bytes
    cdef int _memfd
    cdef int _waiting  # waits in progress, the GIL released
    cdef bint _closing
    cdef bytearray _buf

    def __cinit__(self):
        self._mem = NULL
        self._memfd = -1
        self._r.wait_fd = -1
        self._r.wake_fd = -1
        self._r.close_fd = -1

    def __dealloc__(self):
        self._release()

    cdef void _release(self) noexcept:
        if self._mem != NULL:
            hixl_ring_unmap(self._mem, self._bytes)
            self._mem = NULL
        for fd in (self._memfd, self._r.wait_fd, self._r.wake_fd, self._r.close_fd):
            if fd >= 0:
                _close_fd(fd)
        self._memfd = self._r.wait_fd = self._r.wake_fd = self._r.close_fd = -1

    @staticmethod
    def create(capacity, bint producer):
        """A fresh ring of ``capacity`` bytes (a power of two, 4 KiB to 1 GiB),
        and this process's side of it.

        Returns:
            ``(ring, (memfd, wait_fd, wake_fd))``: the far side's descriptors,
            new ones that the caller sends to the other process and closes.
        """
        cdef uint64_t cap = _u64(capacity, "capacity")
        cdef int memfd = -1
        cdef int rc = hixl_ring_memfd(cap, &memfd)
        cdef int err = errno
        if rc != HIXL_OK:
            _raise(rc, f"cannot make a ring of {capacity} bytes", err)
        fds = [memfd]
        try:
            # pipe 1: the consumer sleeps on it; pipe 2: the producer does
            consumer_wait, producer_wake = _pipe()
            fds += [consumer_wait, producer_wake]
            producer_wait, consumer_wake = _pipe()
            fds += [producer_wait, consumer_wake]
            far_memfd = _os.dup(memfd)
        except BaseException:
            for fd in fds:
                _os.close(fd)
            raise
        if producer:
            mine, theirs = (producer_wait, producer_wake), (consumer_wait, consumer_wake)
        else:
            mine, theirs = (consumer_wait, consumer_wake), (producer_wait, producer_wake)
        ring = Ring.attach(memfd, mine[0], mine[1], producer)
        return ring, (far_memfd, theirs[0], theirs[1])

    @staticmethod
    def attach(int memfd, int wait_fd, int wake_fd, bint producer):
        """Takes the three descriptors (owned by the ring from now on, closed
        by ``close``, even when this raises) and maps the ring."""
        cdef Ring ring = Ring.__new__(Ring)
        ring._memfd, ring._r.wait_fd, ring._r.wake_fd = memfd, wait_fd, wake_fd
        cdef int rc = hixl_ring_map(memfd, &ring._mem, &ring._bytes)
        cdef int err = errno
        if rc != HIXL_OK:
            ring._mem = NULL
            ring._release()
            _raise(rc, "cannot map the ring (not a sealed ring memfd?)", err)
        try:
            for fd in (wait_fd, wake_fd):
                _os.set_blocking(fd, False)
            close_fd = _os.eventfd(0, _os.EFD_NONBLOCK | _os.EFD_CLOEXEC)
        except BaseException:
            ring._release()
            raise
        rc = hixl_ring_attach(&ring._r, ring._mem, ring._bytes, producer, wait_fd, wake_fd)
        ring._r.close_fd = close_fd
        if rc != HIXL_OK:
            ring._release()
            _raise(rc, "not a ring, or a corrupt one")
        if not producer:
            ring._buf = bytearray(hixl_ring_max_frame(ring._r.capacity))
        return ring

    cdef int _check(self) except -1:
        if self._mem == NULL or self._closing:
            raise ValueError("the ring is closed")
        return 0

    @property
    def max_frame(self):
        """The longest frame the ring takes, in bytes."""
        self._check()
        return hixl_ring_max_frame(self._r.capacity)

    @property
    def wait_fd(self):
        """The read end this side sleeps on; -1 once closed."""
        return self._r.wait_fd

    def write(self, data):
        """Appends one frame (a bytes-like object). Producer only.

        Returns:
            False when the ring has no room for it now.
        """
        self._check()
        if self._buf is not None:
            raise ValueError("only the producer side of a ring writes")
        cdef const uint8_t[::1] view = data
        cdef int rc = hixl_ring_write(&self._r, &view[0] if view.shape[0] else NULL,
                                      view.shape[0])
        if rc == HIXL_E_BUSY:
            return False
        if rc != HIXL_OK:
            _raise(rc, f"cannot write a frame of {view.shape[0]} bytes to the ring "
                       f"(at most {hixl_ring_max_frame(self._r.capacity)}, producer side only)")
        return True

    def read(self):
        """The oldest frame, removed from the ring, or None. Consumer only."""
        self._check()
        if self._buf is None:
            raise ValueError("only the consumer side of a ring reads")
        cdef uint8_t[::1] buf = self._buf
        cdef size_t n = 0
        cdef int rc = hixl_ring_read(&self._r, &buf[0], buf.shape[0], &n)
        if rc == HIXL_E_BUSY:
            return None
        if rc != HIXL_OK:
            _raise(rc, "cannot read the ring (consumer side only)")
        return bytes(self._buf[:n])

    def wait(self, double timeout_s, double spin_us=0.0, int nbytes=0, int stop_fd=-1):
        """Waits, GIL released, until a frame can be read (consumer) or one of
        ``nbytes`` written (producer): spins up to ``spin_us``, then sleeps.

        Returns:
            True when ready, False at the timeout.

        Raises:
            NativeError: E_CANCELLED when ``stop_fd`` became readable,
                E_CLOSED when the ring was closed meanwhile, E_PROTO on a
                corrupt ring.
        """
        self._check()
        if timeout_s < 0 or spin_us < 0 or nbytes < 0:
            raise ValueError("timeout_s, spin_us and nbytes must not be negative")
        cdef uint64_t spin_ns = <uint64_t>(spin_us * 1000.0)
        cdef uint64_t deadline = hixl_now_ns() + <uint64_t>(timeout_s * 1e9)
        cdef int rc
        self._waiting += 1
        try:
            with nogil:
                if self._r.producer:
                    rc = hixl_ring_wait_writable(&self._r, nbytes, spin_ns, deadline, stop_fd)
                else:
                    rc = hixl_ring_wait_readable(&self._r, spin_ns, deadline, stop_fd)
        finally:
            self._waiting -= 1
            if self._closing and self._waiting == 0:
                self._release()
        if self._closing or self._mem == NULL:
            rc = HIXL_E_CLOSED
        if rc == HIXL_E_TIMEOUT:
            return False
        if rc != HIXL_OK:
            _raise(rc, "cannot wait on the ring")
        return True

    def arm(self, int nbytes=0):
        """Says this side goes to sleep on ``wait_fd`` (in an event loop).

        Returns:
            True when it should wait for ``wait_fd``; False when a frame (or
            room for ``nbytes``) is there already, and nothing was armed.
        """
        self._check()
        cdef int rc = hixl_ring_arm(&self._r, nbytes)
        if rc < 0:
            _raise(rc, "cannot arm the ring")
        return rc == 1

    def disarm(self):
        """After ``wait_fd`` was readable, or the wait was given up."""
        self._check()
        hixl_ring_disarm(&self._r)

    def close(self):
        """Unmaps the ring and closes its descriptors (once no wait is in
        progress: a wait is ended first). Idempotent; any thread."""
        if self._waiting:
            if not self._closing:
                self._closing = True
                _os.eventfd_write(self._r.close_fd, 1)
            return
        self._release()


def spin_readable(int fd, double budget_us):
    """Busy-waits, the GIL released, up to ``budget_us`` for the stream socket
    ``fd`` to have something to read (bytes, its end, an error), for a caller
    that expects an answer sooner than sleeping and being woken would take.
    Yields the core between two looks (``csrc/spin.h``).

    Returns:
        Whether ``fd`` is readable.
    """
    if budget_us < 0:
        raise ValueError("budget_us must not be negative")
    cdef uint64_t budget_ns = <uint64_t>(budget_us * 1000.0)
    cdef int rc
    with nogil:
        rc = hixl_spin_readable(fd, budget_ns)
    return rc == 1
