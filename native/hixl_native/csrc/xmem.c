#define _GNU_SOURCE
#include "xmem.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "copy.h"
#include "hixl_common.h"

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif
#define STOP_CHECK_NS 100000000ull

/* ---- bounce buffers ---- */

struct hixl_bounce {
    pthread_mutex_t mu;
    pthread_cond_t freed;
    uint8_t *mem;
    size_t count, size, nfree;
    uint8_t **free_list;
    atomic_int refs;
};

int hixl_bounce_create(size_t count, size_t size, hixl_bounce **out)
{
    if (count == 0 || size == 0 || size % 4096 || count > SIZE_MAX / size)
        return HIXL_E_INVAL;
    hixl_bounce *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return HIXL_E_NOMEM;
    b->free_list = calloc(count, sizeof(*b->free_list));
    b->mem = mmap(NULL, count * size, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (b->free_list == NULL || b->mem == MAP_FAILED) {
        if (b->mem != MAP_FAILED && b->mem != NULL)
            munmap(b->mem, count * size);
        free(b->free_list);
        free(b);
        return HIXL_E_NOMEM;
    }
    pthread_mutex_init(&b->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&b->freed, &attr);
    pthread_condattr_destroy(&attr);
    b->count = b->nfree = count;
    b->size = size;
    for (size_t i = 0; i < count; i++)
        b->free_list[i] = b->mem + i * size;
    atomic_init(&b->refs, 1);
    *out = b;
    return HIXL_OK;
}

void hixl_bounce_ref(hixl_bounce *b) { atomic_fetch_add(&b->refs, 1); }

void hixl_bounce_unref(hixl_bounce *b)
{
    if (b == NULL || atomic_fetch_sub(&b->refs, 1) != 1)
        return;
    munmap(b->mem, b->count * b->size);
    pthread_cond_destroy(&b->freed);
    pthread_mutex_destroy(&b->mu);
    free(b->free_list);
    free(b);
}

size_t hixl_bounce_size(const hixl_bounce *b) { return b->size; }

size_t hixl_bounce_free_count(hixl_bounce *b)
{
    pthread_mutex_lock(&b->mu);
    size_t n = b->nfree;
    pthread_mutex_unlock(&b->mu);
    return n;
}

uint8_t *hixl_bounce_take(hixl_bounce *b, uint64_t deadline_ns, const atomic_int *stop)
{
    uint8_t *buf = NULL;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        if (b->nfree > 0) {
            buf = b->free_list[--b->nfree];
            break;
        }
        uint64_t now = hixl_now_ns();
        if (now >= deadline_ns || (stop != NULL && atomic_load(stop)))
            break;
        uint64_t until = deadline_ns - now > STOP_CHECK_NS ? now + STOP_CHECK_NS : deadline_ns;
        struct timespec ts = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
        pthread_cond_timedwait(&b->freed, &b->mu, &ts);
    }
    pthread_mutex_unlock(&b->mu);
    return buf;
}

void hixl_bounce_give(hixl_bounce *b, uint8_t *buf)
{
    pthread_mutex_lock(&b->mu);
    b->free_list[b->nfree++] = buf;
    pthread_mutex_unlock(&b->mu);
    pthread_cond_signal(&b->freed);
}

/* ---- one span of a client process ---- */

int hixl_xmem_create(int pidfd, pid_t pid, uint64_t base, uint64_t size, hixl_bounce *inbound,
                     hixl_bounce *outbound, hixl_xmem **out)
{
    if (size == 0 || base + size < base || pid <= 0)
        return HIXL_E_INVAL;
    hixl_xmem *x = calloc(1, sizeof(*x));
    if (x == NULL)
        return HIXL_E_NOMEM;
    x->pidfd = fcntl(pidfd, F_DUPFD_CLOEXEC, 0);
    if (x->pidfd < 0) {
        free(x);
        return HIXL_E_IO;
    }
    x->pid = pid;
    x->base = base;
    x->size = size;
    x->inbound = inbound;
    x->outbound = outbound;
    hixl_bounce_ref(inbound);
    hixl_bounce_ref(outbound);
    atomic_init(&x->refs, 1);
    atomic_init(&x->revoked, 0);
    hixl_live_add(HIXL_LIVE_XMEMS, 1);
    *out = x;
    return HIXL_OK;
}

void hixl_xmem_ref(hixl_xmem *x) { atomic_fetch_add(&x->refs, 1); }

void hixl_xmem_unref(hixl_xmem *x)
{
    if (x == NULL || atomic_fetch_sub(&x->refs, 1) != 1)
        return;
    close(x->pidfd);
    hixl_bounce_unref(x->inbound);
    hixl_bounce_unref(x->outbound);
    free(x);
    hixl_live_add(HIXL_LIVE_XMEMS, -1);
}

void hixl_xmem_revoke(hixl_xmem *x) { atomic_store(&x->revoked, 1); }

/* A pidfd turns readable once its process exited. */
int hixl_xmem_alive(const hixl_xmem *x)
{
    struct pollfd p = {.fd = x->pidfd, .events = POLLIN};
    int rc;
    do {
        rc = poll(&p, 1, 0);
    } while (rc < 0 && errno == EINTR);
    return rc == 0;
}

static int usable(const hixl_xmem *x)
{
    return !atomic_load(&x->revoked) && hixl_xmem_alive(x);
}

static int failure(int err)
{
    errno = err;
    if (err == ESRCH)
        return HIXL_E_GONE;
    if (err == ENOMEM)
        return HIXL_E_NOMEM;
    return HIXL_E_REFUSED; /* EPERM, EFAULT, EINVAL */
}

/* One call for up to IOV_MAX entries on each side, repeated over what a
 * partial transfer left; the checks around each call are the pid-reuse
 * guard of the header. */
static int rw_batch(hixl_xmem *x, int to_remote, struct iovec *local, size_t nl,
                    struct iovec *remote, size_t nr)
{
    while (nl > 0 && nr > 0) {
        if (!usable(x))
            return HIXL_E_GONE;
        ssize_t k = to_remote ? process_vm_writev(x->pid, local, nl, remote, nr, 0)
                              : process_vm_readv(x->pid, local, nl, remote, nr, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return failure(errno);
        if (!hixl_xmem_alive(x))
            return HIXL_E_GONE;
        if (k == 0)
            return failure(EFAULT);
        /* Advance both lists past the bytes moved (a partial transfer stops
         * at the first remote segment it could not reach; the retry then
         * reports why). */
        size_t left = (size_t)k;
        while (left > 0 && nl > 0) {
            size_t take = left < local->iov_len ? left : local->iov_len;
            local->iov_base = (uint8_t *)local->iov_base + take;
            local->iov_len -= take;
            left -= take;
            if (local->iov_len == 0) {
                local++;
                nl--;
            }
        }
        left = (size_t)k;
        while (left > 0 && nr > 0) {
            size_t take = left < remote->iov_len ? left : remote->iov_len;
            remote->iov_base = (uint8_t *)remote->iov_base + take;
            remote->iov_len -= take;
            left -= take;
            if (remote->iov_len == 0) {
                remote++;
                nr--;
            }
        }
        while (nl > 0 && local->iov_len == 0) {
            local++;
            nl--;
        }
        while (nr > 0 && remote->iov_len == 0) {
            remote++;
            nr--;
        }
    }
    return HIXL_OK;
}

int hixl_xmem_pairs(hixl_xmem *x, int to_remote, const struct iovec *local,
                    const struct iovec *remote, size_t n)
{
    struct iovec l[IOV_MAX], r[IOV_MAX];
    for (size_t i = 0; i < n; i += IOV_MAX) {
        size_t k = n - i < IOV_MAX ? n - i : IOV_MAX;
        memcpy(l, local + i, k * sizeof(*l));
        memcpy(r, remote + i, k * sizeof(*r));
        int rc = rw_batch(x, to_remote, l, k, r, k);
        if (rc != HIXL_OK)
            return rc;
    }
    return HIXL_OK;
}

int hixl_xmem_flat(hixl_xmem *x, int to_remote, uint8_t *buf, const struct iovec *remote,
                   size_t n)
{
    struct iovec r[IOV_MAX];
    for (size_t i = 0; i < n; i += IOV_MAX) {
        size_t k = n - i < IOV_MAX ? n - i : IOV_MAX, bytes = 0;
        for (size_t j = 0; j < k; j++)
            bytes += remote[i + j].iov_len;
        memcpy(r, remote + i, k * sizeof(*r));
        struct iovec l = {buf, bytes};
        int rc = rw_batch(x, to_remote, &l, 1, r, k);
        if (rc != HIXL_OK)
            return rc;
        buf += bytes;
    }
    return HIXL_OK;
}

int hixl_xmem_probe(hixl_xmem *x, const uint64_t *addrs, size_t n)
{
    uint8_t scratch[IOV_MAX];
    struct iovec r[IOV_MAX];
    for (size_t i = 0; i < n; i += IOV_MAX) {
        size_t k = n - i < IOV_MAX ? n - i : IOV_MAX;
        for (size_t j = 0; j < k; j++)
            r[j] = (struct iovec){(void *)(uintptr_t)addrs[i + j], 1};
        struct iovec l = {scratch, k};
        int rc = rw_batch(x, 0, &l, 1, r, k);
        if (rc != HIXL_OK)
            return rc;
    }
    return HIXL_OK;
}

/* ---- segment walks ---- */

static hixl_xmem *owner_of(const hixl_segs *s, size_t i)
{
    return s->owner != NULL ? s->owner[i] : s->one;
}

/* Moves up to `cap` bytes between `buf` and the next segments. Runs of
 * segments of one xmem go in batched calls; local segments are memcpy'd. */
static int segs_move(hixl_segs *s, uint8_t *buf, size_t cap, int to_segs, size_t *moved)
{
    struct iovec batch[IOV_MAX];
    size_t nb = 0, pos = 0, batch_pos = 0;
    hixl_xmem *batch_owner = NULL;
    int rc = HIXL_OK;
    while (s->i < s->n && pos < cap) {
        const struct iovec *seg = &s->iov[s->i];
        size_t take = seg->iov_len - s->off;
        if (take > cap - pos)
            take = cap - pos;
        uint8_t *at = (uint8_t *)seg->iov_base + s->off;
        hixl_xmem *owner = owner_of(s, s->i);
        if (nb > 0 && (owner != batch_owner || nb == IOV_MAX)) {
            rc = hixl_xmem_flat(batch_owner, to_segs, buf + batch_pos, batch, nb);
            if (rc != HIXL_OK)
                return rc;
            nb = 0;
        }
        if (owner == NULL) {
            if (to_segs)
                memcpy(at, buf + pos, take);
            else
                memcpy(buf + pos, at, take);
        } else {
            if (nb == 0) {
                batch_owner = owner;
                batch_pos = pos;
            }
            batch[nb++] = (struct iovec){at, take};
        }
        pos += take;
        s->off += take;
        if (s->off == seg->iov_len) {
            s->i++;
            s->off = 0;
        }
    }
    if (nb > 0)
        rc = hixl_xmem_flat(batch_owner, to_segs, buf + batch_pos, batch, nb);
    *moved = pos;
    return rc;
}

int hixl_segs_gather(hixl_segs *s, uint8_t *buf, size_t cap, size_t *got)
{
    return segs_move(s, buf, cap, 0, got);
}

int hixl_segs_scatter(hixl_segs *s, const uint8_t *buf, size_t len)
{
    size_t moved = 0;
    int rc = segs_move(s, (uint8_t *)buf, len, 1, &moved);
    return rc == HIXL_OK && moved != len ? HIXL_E_INVAL : rc;
}

/* ---- local copies ---- */

static int copy_direct(hixl_xmem *x, int to_remote, uint8_t *local, const uint8_t *triples,
                       size_t n, int remote_col)
{
    struct iovec l[IOV_MAX], r[IOV_MAX];
    int local_col = remote_col == 0 ? 1 : 0;
    for (size_t i = 0; i < n; i += IOV_MAX) {
        size_t k = n - i < IOV_MAX ? n - i : IOV_MAX, m = 0;
        for (size_t j = 0; j < k; j++) {
            uint64_t len = hixl_load_u64(triples, 3 * (i + j) + 2);
            if (len == 0)
                continue;
            l[m] = (struct iovec){local + hixl_load_u64(triples, 3 * (i + j) + local_col), len};
            r[m] = (struct iovec){
                (void *)(uintptr_t)(x->base + hixl_load_u64(triples, 3 * (i + j) + remote_col)),
                len};
            m++;
        }
        int rc = rw_batch(x, to_remote, l, m, r, m);
        if (rc != HIXL_OK)
            return rc;
    }
    return HIXL_OK;
}

int hixl_xmem_copy(hixl_xmem *dst, uint8_t *dst_local, hixl_xmem *src, uint8_t *src_local,
                   const uint8_t *triples, size_t n, uint64_t deadline_ns)
{
    if (dst == NULL && src == NULL)
        return HIXL_E_INVAL;
    if (dst == NULL)
        return copy_direct(src, 0, dst_local, triples, n, 1);
    if (src == NULL)
        return copy_direct(dst, 1, src_local, triples, n, 0);
    hixl_bounce *b = src->outbound;
    uint8_t *buf = hixl_bounce_take(b, deadline_ns, NULL);
    if (buf == NULL)
        return HIXL_E_TIMEOUT;
    size_t cap = hixl_bounce_size(b);
    int rc = HIXL_OK;
    for (size_t i = 0; i < n && rc == HIXL_OK; i++) {
        uint64_t d = hixl_load_u64(triples, 3 * i), sr = hixl_load_u64(triples, 3 * i + 1);
        uint64_t len = hixl_load_u64(triples, 3 * i + 2);
        /* Chunks of one range overlapping itself must go in the direction
         * that keeps them intact (memmove's rule). */
        int backward = dst == src && d > sr && d < sr + len;
        for (uint64_t done = 0; done < len && rc == HIXL_OK;) {
            size_t take = len - done < cap ? (size_t)(len - done) : cap;
            uint64_t at = backward ? len - done - take : done;
            struct iovec rs = {(void *)(uintptr_t)(src->base + sr + at), take};
            struct iovec rd = {(void *)(uintptr_t)(dst->base + d + at), take};
            rc = hixl_xmem_flat(src, 0, buf, &rs, 1);
            if (rc == HIXL_OK)
                rc = hixl_xmem_flat(dst, 1, buf, &rd, 1);
            done += take;
        }
    }
    hixl_bounce_give(b, buf);
    return rc;
}
