/*
 * Ceilings for hixl-bench: single-thread memcpy and raw loopback TCP, both
 * over cold (rotating, pre-faulted) buffers. See bench_ceiling.h.
 */
#define _GNU_SOURCE
#include "bench_ceiling.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define HB_PAGE 4096u
/* Below this a request is not split over more streams (as hixl's data plane). */
#define HB_MIN_PIECE (256u * 1024u)
#define HB_MAX_STREAMS 64

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Written, not only mapped: reads of never-written anonymous memory all hit
 * the one shared zero page and would stay in cache. */
static uint8_t *map_buffer(size_t n, int fill)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                   -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    memset(p, fill, n);
    return p;
}

/* The offset of the next request of `span` bytes, wrapping inside `cold`. */
static size_t rotate(size_t *cursor, size_t span, size_t cold)
{
    size_t at = *cursor;
    if (at + span > cold)
        at = 0;
    *cursor = at + ((span + HB_PAGE - 1) / HB_PAGE) * HB_PAGE;
    return at;
}

static int check_shape(size_t block, size_t nblocks, size_t cold)
{
    if (block == 0 || nblocks == 0 || nblocks > SIZE_MAX / block || block * nblocks > cold)
        return -EINVAL;
    return 0;
}

/* ---- memcpy ---- */

struct hb_mem {
    uint8_t *src, *dst;
    size_t cold, cursor;
};

int hb_mem_open(size_t cold_bytes, hb_mem **out)
{
    if (cold_bytes < HB_PAGE)
        return -EINVAL;
    hb_mem *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return -ENOMEM;
    m->cold = cold_bytes;
    m->src = map_buffer(cold_bytes, 0x5a);
    m->dst = m->src ? map_buffer(cold_bytes, 0) : NULL;
    if (m->dst == NULL) {
        hb_mem_close(m);
        return -ENOMEM;
    }
    *out = m;
    return 0;
}

int hb_mem_run(hb_mem *m, size_t block, size_t nblocks, size_t iters, uint64_t *out_ns)
{
    int rc = check_shape(block, nblocks, m->cold);
    if (rc)
        return rc;
    for (size_t it = 0; it < iters; it++) {
        size_t off = rotate(&m->cursor, block * nblocks, m->cold);
        uint64_t t0 = now_ns();
        for (size_t i = 0; i < nblocks; i++)
            memcpy(m->dst + off + i * block, m->src + off + i * block, block);
        out_ns[it] = now_ns() - t0;
    }
    return 0;
}

void hb_mem_close(hb_mem *m)
{
    if (m == NULL)
        return;
    if (m->src)
        munmap(m->src, m->cold);
    if (m->dst)
        munmap(m->dst, m->cold);
    free(m);
}

/* ---- loopback TCP ---- */

/* The wire, host order (loopback only): a header, then nranges ranges. */
typedef struct {
    uint32_t nranges;
    uint32_t quit;
} hb_hdr;

typedef struct {
    uint64_t off, len;
} hb_range;

typedef struct {
    uint64_t src, dst, len;
} hb_piece;

typedef struct {
    struct hb_tcp *t;
    int cfd, sfd; /* caller (receiving) end, sender end */
    pthread_t sender, worker;
    int has_sender, has_worker;
    /* this stream's share of the current request */
    hb_piece *job;
    size_t njob, cap;
    uint8_t *wire;        /* header + ranges sent by the caller */
    struct iovec *riov;   /* receive iovecs */
} hb_stream;

struct hb_tcp {
    uint8_t *src, *dst;
    size_t cold, cursor;
    int nstreams;
    hb_stream *s;
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    uint64_t gen;
    int pending, quit, err;
};

static int send_all(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? -errno : -EPIPE;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int recv_all(int fd, void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? -errno : -ECONNRESET;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* sendmsg/recvmsg over the whole iovec array, IOV_MAX at a time, resuming
 * after partial transfers. The array is consumed. */
static int xfer_iov(int fd, struct iovec *iov, size_t n, int sending)
{
    while (n > 0) {
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = n < IOV_MAX ? n : IOV_MAX};
        ssize_t k = sending ? sendmsg(fd, &msg, MSG_NOSIGNAL) : recvmsg(fd, &msg, MSG_WAITALL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? -errno : -ECONNRESET;
        size_t done = (size_t)k;
        while (n > 0 && done >= iov->iov_len) {
            done -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + done;
            iov->iov_len -= done;
        }
    }
    return 0;
}

static int reserve(hb_stream *s, size_t n)
{
    if (n <= s->cap)
        return 0;
    hb_piece *job = realloc(s->job, n * sizeof(*job));
    if (job != NULL)
        s->job = job;
    uint8_t *wire = realloc(s->wire, sizeof(hb_hdr) + n * sizeof(hb_range));
    if (wire != NULL)
        s->wire = wire;
    struct iovec *iov = realloc(s->riov, n * sizeof(*iov));
    if (iov != NULL)
        s->riov = iov;
    if (job == NULL || wire == NULL || iov == NULL)
        return -ENOMEM;
    s->cap = n;
    return 0;
}

/* The target side: answer every list of ranges with their bytes. */
static void *sender_main(void *arg)
{
    hb_stream *s = arg;
    hb_range *ranges = NULL;
    struct iovec *iov = NULL;
    size_t cap = 0;
    for (;;) {
        hb_hdr h;
        if (recv_all(s->sfd, &h, sizeof(h)) || h.quit)
            break;
        if (h.nranges > cap) {
            free(ranges);
            free(iov);
            cap = h.nranges;
            ranges = malloc(cap * sizeof(*ranges));
            iov = malloc(cap * sizeof(*iov));
            if (ranges == NULL || iov == NULL)
                break;
        }
        if (recv_all(s->sfd, ranges, h.nranges * sizeof(*ranges)))
            break;
        int bad = 0;
        for (uint32_t i = 0; i < h.nranges; i++) {
            bad |= ranges[i].off > s->t->cold || ranges[i].len > s->t->cold - ranges[i].off;
            iov[i].iov_base = s->t->src + ranges[i].off;
            iov[i].iov_len = ranges[i].len;
        }
        if (bad || xfer_iov(s->sfd, iov, h.nranges, 1))
            break;
    }
    free(ranges);
    free(iov);
    shutdown(s->sfd, SHUT_RDWR);
    return NULL;
}

/* The initiator side of one stream: ask for this stream's pieces, receive them. */
static int pull_share(hb_stream *s)
{
    if (s->njob == 0)
        return 0;
    hb_hdr h = {.nranges = (uint32_t)s->njob, .quit = 0};
    memcpy(s->wire, &h, sizeof(h));
    hb_range *r = (hb_range *)(s->wire + sizeof(h));
    for (size_t i = 0; i < s->njob; i++) {
        r[i].off = s->job[i].src;
        r[i].len = s->job[i].len;
        s->riov[i].iov_base = s->t->dst + s->job[i].dst;
        s->riov[i].iov_len = s->job[i].len;
    }
    int rc = send_all(s->cfd, s->wire, sizeof(h) + s->njob * sizeof(hb_range));
    return rc ? rc : xfer_iov(s->cfd, s->riov, s->njob, 0);
}

static void *worker_main(void *arg)
{
    hb_stream *s = arg;
    hb_tcp *t = s->t;
    uint64_t seen = 0;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->quit && t->gen == seen)
            pthread_cond_wait(&t->cv_job, &t->mu);
        if (t->quit)
            break;
        seen = t->gen;
        if (s->njob == 0) /* no share of this request: not counted in pending */
            continue;
        pthread_mutex_unlock(&t->mu);
        int rc = pull_share(s);
        pthread_mutex_lock(&t->mu);
        if (rc && !t->err)
            t->err = rc;
        if (--t->pending == 0)
            pthread_cond_signal(&t->cv_done);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static int connect_pair(int lfd, const struct sockaddr_in *addr, int sockbuf, hb_stream *s)
{
    s->cfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s->cfd < 0)
        return -errno;
    int one = 1;
    /* Buffers are set before connect so the window scale covers them; 0
     * leaves the kernel's autotuning on. */
    if (sockbuf > 0) {
        setsockopt(s->cfd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof(sockbuf));
        setsockopt(s->cfd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof(sockbuf));
    }
    if (connect(s->cfd, (const struct sockaddr *)addr, sizeof(*addr)) < 0)
        return -errno;
    s->sfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (s->sfd < 0)
        return -errno;
    if (sockbuf > 0)
        setsockopt(s->sfd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof(sockbuf));
    setsockopt(s->cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(s->sfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return 0;
}

static int open_streams(hb_tcp *t, int sockbuf)
{
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0)
        return -errno;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(addr);
    if (sockbuf > 0)
        setsockopt(lfd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof(sockbuf));
    int rc = 0;
    if (bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(lfd, HB_MAX_STREAMS) < 0
        || getsockname(lfd, (struct sockaddr *)&addr, &len) < 0)
        rc = -errno;
    for (int i = 0; rc == 0 && i < t->nstreams; i++) {
        hb_stream *s = &t->s[i];
        rc = connect_pair(lfd, &addr, sockbuf, s);
        if (rc == 0)
            rc = -pthread_create(&s->sender, NULL, sender_main, s);
        s->has_sender = rc == 0;
        if (rc == 0 && i > 0) {
            rc = -pthread_create(&s->worker, NULL, worker_main, s);
            s->has_worker = rc == 0;
        }
    }
    close(lfd);
    return rc;
}

int hb_tcp_open(size_t cold_bytes, int streams, int sockbuf, hb_tcp **out)
{
    if (cold_bytes < HB_PAGE || streams < 1 || streams > HB_MAX_STREAMS || sockbuf < 0)
        return -EINVAL;
    hb_tcp *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return -ENOMEM;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv_job, NULL);
    pthread_cond_init(&t->cv_done, NULL);
    t->cold = cold_bytes;
    t->nstreams = streams;
    t->s = calloc((size_t)streams, sizeof(hb_stream));
    if (t->s == NULL) {
        hb_tcp_close(t);
        return -ENOMEM;
    }
    for (int i = 0; i < streams; i++)
        t->s[i] = (hb_stream){.t = t, .cfd = -1, .sfd = -1};
    t->src = map_buffer(cold_bytes, 0x5a);
    t->dst = t->src ? map_buffer(cold_bytes, 0) : NULL;
    int rc = t->dst ? open_streams(t, sockbuf) : -ENOMEM;
    if (rc) {
        hb_tcp_close(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* Split the request's blocks by bytes over the streams that get a share. */
static int plan_request(hb_tcp *t, size_t off, size_t block, size_t nblocks)
{
    size_t total = block * nblocks;
    size_t want = (total + HB_MIN_PIECE - 1) / HB_MIN_PIECE;
    size_t active = want < (size_t)t->nstreams ? (want ? want : 1) : (size_t)t->nstreams;
    size_t budget = (total + active - 1) / active;
    for (int i = 0; i < t->nstreams; i++) {
        t->s[i].njob = 0;
        if (reserve(&t->s[i], nblocks + 1))
            return -ENOMEM;
    }
    size_t si = 0, left = budget;
    for (size_t b = 0; b < nblocks; b++) {
        size_t pos = off + b * block, len = block;
        while (len > 0) {
            if (left == 0) {
                si++;
                left = budget;
            }
            size_t take = len < left ? len : left;
            hb_stream *s = &t->s[si];
            s->job[s->njob++] = (hb_piece){.src = pos, .dst = pos, .len = take};
            pos += take;
            len -= take;
            left -= take;
        }
    }
    return 0;
}

static int run_one(hb_tcp *t)
{
    int helpers = 0;
    for (int i = 1; i < t->nstreams; i++)
        helpers += t->s[i].njob > 0;
    /* A request that fits one stream wakes no other thread. */
    if (helpers > 0) {
        pthread_mutex_lock(&t->mu);
        t->pending = helpers;
        t->err = 0;
        t->gen++;
        pthread_cond_broadcast(&t->cv_job);
        pthread_mutex_unlock(&t->mu);
    }
    int rc = pull_share(&t->s[0]);
    if (helpers > 0) {
        pthread_mutex_lock(&t->mu);
        while (t->pending > 0)
            pthread_cond_wait(&t->cv_done, &t->mu);
        if (rc == 0)
            rc = t->err;
        pthread_mutex_unlock(&t->mu);
    }
    return rc;
}

int hb_tcp_run(hb_tcp *t, size_t block, size_t nblocks, size_t iters, uint64_t *out_ns)
{
    int rc = check_shape(block, nblocks, t->cold);
    if (rc == 0 && nblocks > UINT32_MAX - 1)
        rc = -EINVAL;
    for (size_t it = 0; rc == 0 && it < iters; it++) {
        size_t off = rotate(&t->cursor, block * nblocks, t->cold);
        uint64_t t0 = now_ns();
        rc = plan_request(t, off, block, nblocks);
        if (rc == 0)
            rc = run_one(t);
        out_ns[it] = now_ns() - t0;
    }
    return rc;
}

void hb_tcp_close(hb_tcp *t)
{
    if (t == NULL)
        return;
    if (t->s != NULL) {
        pthread_mutex_lock(&t->mu);
        t->quit = 1;
        pthread_cond_broadcast(&t->cv_job);
        pthread_mutex_unlock(&t->mu);
        hb_hdr quit = {.nranges = 0, .quit = 1};
        for (int i = 0; i < t->nstreams; i++) {
            hb_stream *s = &t->s[i];
            if (s->has_worker)
                pthread_join(s->worker, NULL);
            if (s->cfd >= 0)
                (void)send_all(s->cfd, &quit, sizeof(quit));
            if (s->has_sender)
                pthread_join(s->sender, NULL);
            if (s->cfd >= 0)
                close(s->cfd);
            if (s->sfd >= 0)
                close(s->sfd);
            free(s->job);
            free(s->wire);
            free(s->riov);
        }
        free(t->s);
    }
    if (t->src)
        munmap(t->src, t->cold);
    if (t->dst)
        munmap(t->dst, t->cold);
    pthread_cond_destroy(&t->cv_job);
    pthread_cond_destroy(&t->cv_done);
    pthread_mutex_destroy(&t->mu);
    free(t);
}
