#define _GNU_SOURCE
#include "ring.h"
#include "spin.h"

#include <errno.h>
#include <poll.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC 0x31474e49524c5848ull /* "HXLRING1" */
#define PAD_MARK 0xffffffffu
#define HDR 4u
#define MIN_CAPACITY (4ull << 10)
#define MAX_CAPACITY (1ull << 30)

static inline uint64_t align8(uint64_t n)
{
    return (n + 7) & ~7ull;
}

size_t hixl_ring_bytes(uint64_t capacity)
{
    return sizeof(hixl_ring_shared) + (size_t)capacity;
}

size_t hixl_ring_max_frame(uint64_t capacity)
{
    return (size_t)(capacity / 4) - HDR;
}

static int capacity_ok(uint64_t capacity)
{
    return capacity >= MIN_CAPACITY && capacity <= MAX_CAPACITY &&
           (capacity & (capacity - 1)) == 0;
}

int hixl_ring_init(void *mem, size_t bytes, uint64_t capacity)
{
    if (!capacity_ok(capacity) || bytes < hixl_ring_bytes(capacity))
        return HIXL_E_INVAL;
    hixl_ring_shared *s = mem;
    s->capacity = capacity;
    atomic_store(&s->tail, 0);
    atomic_store(&s->head, 0);
    atomic_store(&s->producer_asleep, 0);
    atomic_store(&s->consumer_asleep, 0);
    atomic_thread_fence(memory_order_release);
    s->magic = MAGIC;
    return HIXL_OK;
}

int hixl_ring_attach(hixl_ring *r, void *mem, size_t bytes, int producer, int wait_fd,
                     int wake_fd)
{
    if (bytes < sizeof(hixl_ring_shared))
        return HIXL_E_INVAL;
    hixl_ring_shared *s = mem;
    /* Read once, then never again: the other side may change it later. */
    uint64_t capacity = *(volatile uint64_t *)&s->capacity;
    if (*(volatile uint64_t *)&s->magic != MAGIC || !capacity_ok(capacity) ||
        bytes < hixl_ring_bytes(capacity))
        return HIXL_E_PROTO;
    r->shared = s;
    r->capacity = capacity;
    r->pos = producer ? atomic_load(&s->tail) : atomic_load(&s->head);
    r->producer = producer;
    r->wait_fd = wait_fd;
    r->wake_fd = wake_fd;
    r->close_fd = -1;
    /* A position that is not 8-aligned would put frame headers astride the
     * end; a fresh ring starts at 0, so this only refuses a corrupt one. */
    return (r->pos & 7) == 0 ? HIXL_OK : HIXL_E_PROTO;
}

static void wake(int fd)
{
    /* EAGAIN means the pipe is full: the sleeper is woken anyway. */
    ssize_t k = write(fd, "", 1);
    (void)k;
}

static void drain(int fd)
{
    char buf[64];
    while (read(fd, buf, sizeof(buf)) == (ssize_t)sizeof(buf))
        ;
}

/* ---- shared memory ---- */

int hixl_ring_memfd(uint64_t capacity, int *fd_out)
{
    if (!capacity_ok(capacity))
        return HIXL_E_INVAL;
    size_t bytes = hixl_ring_bytes(capacity);
    int fd = memfd_create("hixl-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return HIXL_E_IO;
    void *mem = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
        (mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        int err = errno;
        close(fd);
        errno = err;
        return HIXL_E_IO;
    }
    int rc = hixl_ring_init(mem, bytes, capacity);
    munmap(mem, bytes);
    if (rc != HIXL_OK) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return HIXL_OK;
}

int hixl_ring_map(int fd, void **mem_out, size_t *bytes_out)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return HIXL_E_IO;
    /* Unsealed memory could shrink under the mapping: a read past its end
     * would then kill this process with SIGBUS. */
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & F_SEAL_SHRINK) == 0 || st.st_size < (off_t)sizeof(hixl_ring_shared))
        return HIXL_E_PROTO;
    size_t bytes = (size_t)st.st_size;
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (mem == MAP_FAILED)
        return HIXL_E_IO;
    *mem_out = mem;
    *bytes_out = bytes;
    return HIXL_OK;
}

void hixl_ring_unmap(void *mem, size_t bytes)
{
    munmap(mem, bytes);
}

/* ---- producer ---- */

/* Bytes the consumer has not released yet, checked: the consumer writes head. */
static int used(hixl_ring *r, uint64_t *out)
{
    uint64_t head = atomic_load_explicit(&r->shared->head, memory_order_acquire);
    uint64_t n = r->pos - head;
    if (n > r->capacity || (head & 7) != 0)
        return HIXL_E_PROTO;
    *out = n;
    return HIXL_OK;
}

/* The bytes a frame of len takes at the current tail: its own, plus the pad
 * to the end when it does not fit before the end. */
static uint64_t footprint(hixl_ring *r, size_t len)
{
    uint64_t need = align8(HDR + len);
    uint64_t to_end = r->capacity - (r->pos & (r->capacity - 1));
    return need <= to_end ? need : to_end + need;
}

int hixl_ring_writable(hixl_ring *r, size_t len)
{
    uint64_t n;
    if (used(r, &n) != HIXL_OK)
        return HIXL_E_PROTO;
    return n + footprint(r, len) <= r->capacity;
}

int hixl_ring_write(hixl_ring *r, const void *buf, size_t len)
{
    if (!r->producer || len > hixl_ring_max_frame(r->capacity))
        return HIXL_E_INVAL;
    int room = hixl_ring_writable(r, len);
    if (room <= 0)
        return room < 0 ? room : HIXL_E_BUSY;
    uint64_t mask = r->capacity - 1;
    uint64_t to_end = r->capacity - (r->pos & mask);
    if (align8(HDR + len) > to_end) {
        uint32_t mark = PAD_MARK;
        memcpy(r->shared->data + (r->pos & mask), &mark, HDR);
        r->pos += to_end;
    }
    uint32_t n32 = (uint32_t)len;
    uint8_t *at = r->shared->data + (r->pos & mask);
    memcpy(at, &n32, HDR);
    memcpy(at + HDR, buf, len);
    r->pos += align8(HDR + len);
    atomic_store_explicit(&r->shared->tail, r->pos, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&r->shared->consumer_asleep, memory_order_relaxed))
        wake(r->wake_fd);
    return HIXL_OK;
}

/* ---- consumer ---- */

/* Bytes the producer has published past head, checked: the producer writes tail. */
static int avail(hixl_ring *r, uint64_t *out)
{
    uint64_t tail = atomic_load_explicit(&r->shared->tail, memory_order_acquire);
    uint64_t n = tail - r->pos;
    if (n > r->capacity || (tail & 7) != 0)
        return HIXL_E_PROTO;
    *out = n;
    return HIXL_OK;
}

int hixl_ring_readable(hixl_ring *r)
{
    uint64_t n;
    if (avail(r, &n) != HIXL_OK)
        return HIXL_E_PROTO;
    return n > 0;
}

static void release(hixl_ring *r)
{
    atomic_store_explicit(&r->shared->head, r->pos, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&r->shared->producer_asleep, memory_order_relaxed))
        wake(r->wake_fd);
}

int hixl_ring_read(hixl_ring *r, void *buf, size_t cap, size_t *len)
{
    uint64_t n, mask = r->capacity - 1;
    if (r->producer)
        return HIXL_E_INVAL;
    if (avail(r, &n) != HIXL_OK)
        return HIXL_E_PROTO;
    if (n == 0)
        return HIXL_E_BUSY;
    uint32_t n32;
    memcpy(&n32, r->shared->data + (r->pos & mask), HDR);
    if (n32 == PAD_MARK) {
        uint64_t to_end = r->capacity - (r->pos & mask);
        if (to_end > n)
            return HIXL_E_PROTO;
        r->pos += to_end;
        n -= to_end;
        if (n == 0) {
            release(r);
            return HIXL_E_BUSY;
        }
        memcpy(&n32, r->shared->data, HDR);
    }
    uint64_t to_end = r->capacity - (r->pos & mask);
    if (n32 > hixl_ring_max_frame(r->capacity) || align8(HDR + (uint64_t)n32) > n ||
        align8(HDR + (uint64_t)n32) > to_end)
        return HIXL_E_PROTO;
    *len = n32;
    if (n32 > cap)
        return HIXL_E_EXHAUSTED;
    memcpy(buf, r->shared->data + (r->pos & mask) + HDR, n32);
    r->pos += align8(HDR + (uint64_t)n32);
    release(r);
    return HIXL_OK;
}

/* ---- waiting ---- */

static int sleep_on(hixl_ring *r, uint64_t deadline_ns, int stop_fd)
{
    struct pollfd p[3] = {{.fd = r->wait_fd, .events = POLLIN},
                          {.fd = r->close_fd, .events = POLLIN},
                          {.fd = stop_fd, .events = POLLIN}};
    int timeout;
    if (hixl_poll_timeout(deadline_ns, &timeout) != HIXL_OK)
        return HIXL_E_TIMEOUT;
    /* poll skips entries whose fd is negative */
    int rc = poll(p, 3, timeout);
    if (rc < 0)
        return errno == EINTR ? HIXL_OK : HIXL_E_IO;
    if (p[1].revents)
        return HIXL_E_CLOSED;
    if (p[2].revents)
        return HIXL_E_CANCELLED;
    return HIXL_OK; /* woken, or the poll's whole-ms timeout: the caller checks */
}

/* ready(): 1 ready, 0 not, <0 an error. One wait loop for both sides. */
typedef int (*ready_fn)(hixl_ring *r, size_t len);

static int ready_readable(hixl_ring *r, size_t len)
{
    (void)len;
    return hixl_ring_readable(r);
}

static int wait_for(hixl_ring *r, ready_fn ready, size_t len, _Atomic uint32_t *asleep,
                    uint64_t spin_ns, uint64_t deadline_ns, int stop_fd)
{
    int rc;
    uint64_t spin_until = hixl_now_ns() + spin_ns;
    while ((rc = ready(r, len)) == 0 && !hixl_spin_over(spin_until))
        hixl_spin_pause();
    while (rc == 0) {
        atomic_store_explicit(asleep, 1, memory_order_relaxed);
        atomic_thread_fence(memory_order_seq_cst);
        if ((rc = ready(r, len)) != 0)
            break;
        rc = sleep_on(r, deadline_ns, stop_fd);
        drain(r->wait_fd);
        if (rc != HIXL_OK)
            break;
        if ((rc = ready(r, len)) == 0 && deadline_ns != 0 && hixl_now_ns() >= deadline_ns)
            rc = HIXL_E_TIMEOUT;
    }
    atomic_store_explicit(asleep, 0, memory_order_relaxed);
    return rc > 0 ? HIXL_OK : rc;
}

int hixl_ring_wait_readable(hixl_ring *r, uint64_t spin_ns, uint64_t deadline_ns, int stop_fd)
{
    if (r->producer)
        return HIXL_E_INVAL;
    return wait_for(r, ready_readable, 0, &r->shared->consumer_asleep, spin_ns, deadline_ns,
                    stop_fd);
}

int hixl_ring_wait_writable(hixl_ring *r, size_t len, uint64_t spin_ns, uint64_t deadline_ns,
                            int stop_fd)
{
    if (!r->producer || len > hixl_ring_max_frame(r->capacity))
        return HIXL_E_INVAL;
    return wait_for(r, hixl_ring_writable, len, &r->shared->producer_asleep, spin_ns,
                    deadline_ns, stop_fd);
}

int hixl_ring_arm(hixl_ring *r, size_t len)
{
    if (r->producer && len > hixl_ring_max_frame(r->capacity))
        return HIXL_E_INVAL;
    ready_fn ready = r->producer ? hixl_ring_writable : ready_readable;
    _Atomic uint32_t *asleep = r->producer ? &r->shared->producer_asleep
                                           : &r->shared->consumer_asleep;
    atomic_store_explicit(asleep, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    int rc = ready(r, len);
    if (rc == 0)
        return 1;
    atomic_store_explicit(asleep, 0, memory_order_relaxed);
    return rc < 0 ? rc : 0;
}

void hixl_ring_disarm(hixl_ring *r)
{
    atomic_store_explicit(r->producer ? &r->shared->producer_asleep
                                      : &r->shared->consumer_asleep,
                          0, memory_order_relaxed);
    drain(r->wait_fd);
}
