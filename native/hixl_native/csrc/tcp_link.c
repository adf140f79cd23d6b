#define _GNU_SOURCE
#include "tcp_link.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "copy.h"
#include "hixl_common.h"
#include "tcp_wire.h"

#define MAX_STREAMS 64
/* Below this, splitting a request over more streams costs more in wakeups
 * and round trips than the parallelism gains. */
#define MIN_PIECE_BYTES (256 * 1024)

typedef struct hixl_piece {
    struct hixl_piece *next;
    struct hixl_request *req;
    uint32_t nranges;
    uint64_t bytes;
    uint8_t *wire;      /* nranges little-endian wire ranges */
    struct iovec *iov;  /* [header][ranges or reply][nranges payload iovecs] */
    uint8_t hdr[HIXL_REQUEST_SIZE];
    uint8_t reply[HIXL_REPLY_SIZE];
} hixl_piece;

typedef struct hixl_request {
    hixl_cq_node node; /* first: the queue's consumer frees the request via it */
    hixl_cq *cq;
    hixl_mapping *local;
    uint64_t deadline_ns;
    int op;
    atomic_int remaining;
    atomic_int status;
    size_t npieces;
    hixl_piece pieces[];
} hixl_request;

typedef struct hixl_stream {
    struct hixl_link *link;
    pthread_t thread;
    int started;
    pthread_mutex_t mu; /* queue, exited, and changes of fd */
    hixl_piece *head, *tail;
    int exited;
    int fd;      /* written only by the worker (and by open before it starts) */
    int wake_fd; /* eventfd: the queue became non-empty */
} hixl_stream;

struct hixl_link {
    hixl_addr addr; /* the address stream 0 reached; used by all later connects */
    uint64_t token;
    int nstreams;
    hixl_stream *streams;
    hixl_cq *cq;
    int stop_fd; /* eventfd: readable once close() began */
    int closed;
    atomic_int closing;
    atomic_int dead;
    atomic_uint next_stream;
};

/* ---- completion ---- */

static void finish(hixl_request *r)
{
    hixl_mapping_unpin(r->local);
    hixl_mapping_unref(r->local);
    r->node.status = atomic_load(&r->status);
    hixl_cq_post(r->cq, &r->node); /* r may be freed from here on */
}

static void piece_done(hixl_piece *p, int status)
{
    hixl_request *r = p->req;
    if (status != HIXL_OK) {
        int expected = HIXL_OK;
        atomic_compare_exchange_strong(&r->status, &expected, status);
    }
    if (atomic_fetch_sub(&r->remaining, 1) == 1)
        finish(r);
}

/* ---- planning: cutting a request into pieces ---- */

typedef struct planner {
    hixl_request *r; /* NULL in the counting pass */
    uint8_t *wire;
    struct iovec *iov;
    uint8_t *local;
    uint64_t budget, left;
    size_t npieces, nwire;
    uint32_t ranges;
} planner;

static void start_piece(planner *pl)
{
    if (pl->r != NULL) {
        hixl_piece *p = &pl->r->pieces[pl->npieces];
        p->req = pl->r;
        p->wire = pl->wire + pl->nwire * HIXL_RANGE_SIZE;
        p->iov = pl->iov + pl->nwire + 2 * pl->npieces;
    }
    pl->npieces++;
    pl->left = pl->budget;
    pl->ranges = 0;
}

static void add_range(planner *pl, uint64_t region, uint64_t roff, uint64_t loff, uint64_t len)
{
    if (pl->r != NULL) {
        hixl_piece *p = &pl->r->pieces[pl->npieces - 1];
        hixl_put_range(p->wire + (size_t)p->nranges * HIXL_RANGE_SIZE, region, roff, len);
        p->iov[2 + p->nranges] = (struct iovec){pl->local + loff, (size_t)len};
        p->nranges++;
        p->bytes += len;
    }
    pl->nwire++;
    pl->ranges++;
    pl->left -= len;
}

/* Zero-length ranges move nothing and are dropped here. */
static void plan(planner *pl, const uint8_t *quads, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t region = hixl_load_u64(quads, 4 * i);
        uint64_t roff = hixl_load_u64(quads, 4 * i + 1);
        uint64_t loff = hixl_load_u64(quads, 4 * i + 2);
        uint64_t len = hixl_load_u64(quads, 4 * i + 3);
        while (len > 0) {
            if (pl->npieces == 0 || pl->left == 0 || pl->ranges == HIXL_WIRE_MAX_RANGES)
                start_piece(pl);
            uint64_t take = len < pl->left ? len : pl->left;
            add_range(pl, region, roff, loff, take);
            roff += take;
            loff += take;
            len -= take;
        }
    }
}

static hixl_request *build_request(hixl_link *l, const uint8_t *quads, size_t n,
                                   uint8_t *local, int *rc)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (__builtin_add_overflow(total, hixl_load_u64(quads, 4 * i + 3), &total)) {
            *rc = HIXL_E_INVAL;
            return NULL;
        }
    uint64_t want = (total + MIN_PIECE_BYTES - 1) / MIN_PIECE_BYTES;
    uint64_t target = want < (uint64_t)l->nstreams ? (want ? want : 1) : (uint64_t)l->nstreams;
    planner pl = {.budget = (total + target - 1) / target};
    plan(&pl, quads, n);

    size_t pieces_size = pl.npieces * sizeof(hixl_piece);
    size_t iov_size = (pl.nwire + 2 * pl.npieces) * sizeof(struct iovec);
    hixl_request *r = calloc(1, sizeof(*r) + pieces_size + iov_size + pl.nwire * HIXL_RANGE_SIZE);
    if (r == NULL) {
        *rc = HIXL_E_NOMEM;
        return NULL;
    }
    hixl_live_add(HIXL_LIVE_REQUESTS, 1); /* freed via hixl_cq_node_free */
    planner fill = {.r = r, .budget = pl.budget, .local = local};
    fill.iov = (struct iovec *)((uint8_t *)r->pieces + pieces_size);
    fill.wire = (uint8_t *)fill.iov + iov_size;
    plan(&fill, quads, n);
    r->npieces = fill.npieces;
    *rc = HIXL_OK;
    return r;
}

/* ---- queues ---- */

static void wake(int efd)
{
    uint64_t one = 1;
    ssize_t n = write(efd, &one, sizeof(one));
    (void)n; /* only fails if the counter saturates, i.e. already readable */
}

static void enqueue(hixl_stream *s, hixl_piece *p)
{
    p->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->exited) {
        pthread_mutex_unlock(&s->mu);
        piece_done(p, HIXL_E_CANCELLED);
        return;
    }
    int was_empty = s->head == NULL;
    if (was_empty)
        s->head = p;
    else
        s->tail->next = p;
    s->tail = p;
    pthread_mutex_unlock(&s->mu);
    /* A worker only sleeps after finding its queue empty under the lock,
     * so only the empty -> non-empty transition needs a wakeup. */
    if (was_empty)
        wake(s->wake_fd);
}

int hixl_link_submit(hixl_link *l, int op, uint64_t request_id, hixl_mapping *local,
                     const uint8_t *quads, size_t n, uint64_t timeout_ms)
{
    if (atomic_load(&l->closing))
        return HIXL_E_CLOSED;
    if (op != HIXL_OP_READ && op != HIXL_OP_WRITE)
        return HIXL_E_INVAL;
    int rc;
    hixl_request *r = build_request(l, quads, n, local->addr, &rc);
    if (r == NULL)
        return rc;
    r->node.id = request_id;
    r->cq = l->cq;
    r->local = local;
    r->op = op;
    r->deadline_ns = hixl_deadline_after_ms(timeout_ms);
    hixl_mapping_ref(local);
    hixl_mapping_pin(local);
    if (r->npieces == 0 || atomic_load(&l->dead)) {
        /* Nothing to move, or a peer known to be gone: complete at once. */
        atomic_init(&r->status, r->npieces == 0 ? HIXL_OK : HIXL_E_CLOSED);
        finish(r);
        return HIXL_OK;
    }
    atomic_init(&r->status, HIXL_OK);
    atomic_init(&r->remaining, (int)r->npieces);
    unsigned first = atomic_fetch_add(&l->next_stream, (unsigned)r->npieces);
    /* Once the last piece is queued the request may complete and be freed
     * by the consumer at any moment, so the loop must not read r. */
    size_t npieces = r->npieces;
    hixl_piece *pieces = r->pieces;
    for (size_t k = 0; k < npieces; k++)
        enqueue(&l->streams[(first + k) % (unsigned)l->nstreams], &pieces[k]);
    return HIXL_OK;
}

/* ---- stream workers ---- */

static void drop_socket(hixl_stream *s)
{
    pthread_mutex_lock(&s->mu);
    int fd = s->fd;
    s->fd = -1;
    pthread_mutex_unlock(&s->mu);
    if (fd >= 0)
        close(fd);
}

/* A stream that is idle should hear nothing; EOF or a reset means the
 * target went away (or revoked us), and stray bytes mean the stream is out
 * of sync. Noticing this while idle keeps `alive` honest between requests. */
static void check_idle_socket(hixl_stream *s)
{
    char b;
    ssize_t k = recv(s->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (k <= 0)
        atomic_store(&s->link->dead, 1);
    drop_socket(s);
}

/* HIXL_E_CANCELLED once the link is closing; HIXL_OK otherwise (including
 * spurious wakeups: the caller re-checks its queue). */
static int idle_wait(hixl_stream *s)
{
    struct pollfd p[3] = {
        {.fd = s->wake_fd, .events = POLLIN},
        {.fd = s->link->stop_fd, .events = POLLIN},
        {.fd = s->fd, .events = POLLIN | POLLRDHUP},
    };
    /* The timeout only guards against a lost wakeup; it is not polling. */
    int rc = poll(p, s->fd >= 0 ? 3 : 2, 1000);
    if (rc <= 0)
        return HIXL_OK;
    if (p[1].revents)
        return HIXL_E_CANCELLED;
    if (p[0].revents) {
        uint64_t count;
        ssize_t n = read(s->wake_fd, &count, sizeof(count));
        (void)n;
    }
    if (s->fd >= 0 && p[2].revents)
        check_idle_socket(s);
    return HIXL_OK;
}

static hixl_piece *next_piece(hixl_stream *s)
{
    for (;;) {
        pthread_mutex_lock(&s->mu);
        hixl_piece *p = s->head;
        if (p != NULL) {
            s->head = p->next;
            if (s->head == NULL)
                s->tail = NULL;
        }
        pthread_mutex_unlock(&s->mu);
        if (p != NULL)
            return p;
        if (atomic_load(&s->link->closing) || idle_wait(s) == HIXL_E_CANCELLED)
            return NULL;
    }
}

static int reconnect(hixl_stream *s, uint64_t deadline)
{
    hixl_link *l = s->link;
    int fd = -1;
    int rc = hixl_tcp_connect_addr(&l->addr, l->stop_fd, deadline, &fd);
    if (rc == HIXL_OK) {
        rc = hixl_tcp_handshake(fd, l->stop_fd, l->token, deadline);
        if (rc != HIXL_OK)
            close(fd);
    } else if (rc == HIXL_E_IO && errno == ECONNREFUSED) {
        rc = HIXL_E_CLOSED; /* nobody listens any more: the peer is gone */
    }
    if (rc == HIXL_E_CLOSED || rc == HIXL_E_REFUSED)
        atomic_store(&l->dead, 1);
    if (rc != HIXL_OK)
        return rc;
    pthread_mutex_lock(&s->mu);
    /* close() shuts down the sockets it can see; one connected after that
     * must not survive it. */
    int closing = atomic_load(&l->closing);
    if (!closing)
        s->fd = fd;
    pthread_mutex_unlock(&s->mu);
    if (closing) {
        close(fd);
        return HIXL_E_CANCELLED;
    }
    return HIXL_OK;
}

static uint32_t budget_ms(uint64_t deadline)
{
    uint64_t now = hixl_now_ns();
    uint64_t ms = now >= deadline ? 1 : (deadline - now + 999999) / 1000000;
    return ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
}

static int check_reply(hixl_piece *p, int32_t *status)
{
    uint64_t tag;
    if (hixl_get_reply(p->reply, &tag, status) != HIXL_OK || tag != p->req->node.id)
        return HIXL_E_PROTO;
    if (*status > HIXL_OK || *status < HIXL_E_CANCELLED)
        return HIXL_E_PROTO;
    return HIXL_OK;
}

static int send_request(hixl_stream *s, hixl_piece *p, uint64_t deadline)
{
    hixl_request *r = p->req;
    hixl_request_hdr h = {.op = (uint8_t)r->op, .nranges = p->nranges, .tag = r->node.id,
                          .total_bytes = p->bytes, .timeout_ms = budget_ms(deadline)};
    hixl_put_request(p->hdr, &h);
    p->iov[0] = (struct iovec){p->hdr, sizeof(p->hdr)};
    p->iov[1] = (struct iovec){p->wire, (size_t)p->nranges * HIXL_RANGE_SIZE};
    /* A WRITE's payload goes out in the same sendmsg batches as its header. */
    hixl_iovcur cur = {p->iov, r->op == HIXL_OP_WRITE ? 2 + (size_t)p->nranges : 2};
    return hixl_send_iov(s->fd, s->link->stop_fd, &cur, deadline);
}

static int finish_write(hixl_stream *s, hixl_piece *p, uint64_t deadline)
{
    int32_t status;
    int rc = hixl_recv_buf(s->fd, s->link->stop_fd, p->reply, sizeof(p->reply), deadline);
    if (rc == HIXL_OK)
        rc = check_reply(p, &status);
    return rc != HIXL_OK ? rc : status;
}

/* The reply header and the payload are received into one iovec array, so a
 * small READ completes in a single recvmsg. Nothing follows a refusal, so
 * receiving greedily cannot swallow bytes of another message. */
static int finish_read(hixl_stream *s, hixl_piece *p, uint64_t deadline)
{
    int32_t status;
    size_t got = 0;
    p->iov[1] = (struct iovec){p->reply, sizeof(p->reply)};
    hixl_iovcur cur = {p->iov + 1, 1 + (size_t)p->nranges};
    int rc = hixl_recv_iov(s->fd, s->link->stop_fd, &cur, sizeof(p->reply), deadline, &got);
    if (rc == HIXL_OK)
        rc = check_reply(p, &status);
    if (rc != HIXL_OK)
        return rc;
    if (status != HIXL_OK)
        return got == sizeof(p->reply) ? status : HIXL_E_PROTO;
    size_t rest = sizeof(p->reply) + (size_t)p->bytes - got;
    return hixl_recv_iov(s->fd, s->link->stop_fd, &cur, rest, deadline, NULL);
}

static int run_piece(hixl_stream *s, hixl_piece *p)
{
    hixl_link *l = s->link;
    hixl_request *r = p->req;
    int rc = atomic_load(&r->status); /* a sibling piece already failed it */
    if (atomic_load(&l->closing))
        return HIXL_E_CANCELLED;
    if (rc != HIXL_OK)
        return rc;
    if (atomic_load(&l->dead))
        return HIXL_E_CLOSED;
    if (hixl_now_ns() >= r->deadline_ns)
        return HIXL_E_TIMEOUT;
    if (s->fd < 0 && (rc = reconnect(s, r->deadline_ns)) != HIXL_OK)
        return rc;
    rc = send_request(s, p, r->deadline_ns);
    if (rc == HIXL_OK)
        rc = r->op == HIXL_OP_WRITE ? finish_write(s, p, r->deadline_ns)
                                    : finish_read(s, p, r->deadline_ns);
    if (rc == HIXL_OK || rc == HIXL_E_REFUSED)
        return rc; /* the stream is still in sync */
    /* Anything else leaves the byte stream in an unknown state. */
    drop_socket(s);
    if (atomic_load(&l->closing))
        return HIXL_E_CANCELLED;
    if (rc == HIXL_E_CLOSED)
        atomic_store(&l->dead, 1);
    return rc;
}

static void *stream_main(void *arg)
{
    hixl_stream *s = arg;
    hixl_piece *p;
    while ((p = next_piece(s)) != NULL)
        piece_done(p, run_piece(s, p));
    pthread_mutex_lock(&s->mu);
    s->exited = 1;
    p = s->head;
    s->head = s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    while (p != NULL) {
        hixl_piece *next = p->next;
        piece_done(p, HIXL_E_CANCELLED);
        p = next;
    }
    drop_socket(s);
    return NULL;
}

/* ---- lifecycle ---- */

static int open_stream(hixl_link *l, hixl_stream *s, const char *host, uint16_t port,
                       uint64_t deadline)
{
    s->link = l;
    s->fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->wake_fd < 0)
        return HIXL_E_IO;
    int rc = s == l->streams
                 ? hixl_tcp_connect(host, port, l->stop_fd, deadline, &s->fd, &l->addr)
                 : hixl_tcp_connect_addr(&l->addr, l->stop_fd, deadline, &s->fd);
    if (rc == HIXL_OK)
        rc = hixl_tcp_handshake(s->fd, l->stop_fd, l->token, deadline);
    return rc;
}

int hixl_link_open(const char *host, uint16_t port, uint64_t token, int nstreams,
                   hixl_cq *cq, uint64_t connect_timeout_ms, hixl_link **out)
{
    if (nstreams < 1 || nstreams > MAX_STREAMS)
        return HIXL_E_INVAL;
    hixl_link *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return HIXL_E_NOMEM;
    hixl_live_add(HIXL_LIVE_LINKS, 1);
    l->token = token;
    l->cq = cq;
    hixl_cq_ref(cq);
    l->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    l->streams = calloc((size_t)nstreams, sizeof(*l->streams));
    int rc = l->streams ? HIXL_OK : HIXL_E_NOMEM;
    if (rc == HIXL_OK && l->stop_fd < 0)
        rc = HIXL_E_IO;
    uint64_t deadline = hixl_deadline_after_ms(connect_timeout_ms);
    for (int i = 0; rc == HIXL_OK && i < nstreams; i++, l->nstreams++)
        rc = open_stream(l, &l->streams[i], host, port, deadline);
    for (int i = 0; rc == HIXL_OK && i < nstreams; i++) {
        rc = hixl_spawn_thread(&l->streams[i].thread, stream_main, &l->streams[i]);
        l->streams[i].started = rc == HIXL_OK;
    }
    if (rc != HIXL_OK) {
        int err = errno;
        hixl_link_destroy(l);
        errno = err;
        return rc;
    }
    *out = l;
    return HIXL_OK;
}

int hixl_link_alive(hixl_link *l)
{
    return !atomic_load(&l->closing) && !atomic_load(&l->dead);
}

void hixl_link_close(hixl_link *l)
{
    if (l->closed)
        return;
    l->closed = 1;
    atomic_store(&l->closing, 1);
    hixl_live_add(HIXL_LIVE_LINKS, -1); /* counts links not yet closed */
    if (l->stop_fd >= 0)
        wake(l->stop_fd);
    for (int i = 0; i < l->nstreams; i++) {
        hixl_stream *s = &l->streams[i];
        /* A worker inside a long sendmsg/recvmsg run never polls; shutting
         * the socket down makes its next call fail at once. */
        pthread_mutex_lock(&s->mu);
        if (s->fd >= 0)
            shutdown(s->fd, SHUT_RDWR);
        pthread_mutex_unlock(&s->mu);
    }
    for (int i = 0; i < l->nstreams; i++)
        if (l->streams[i].started)
            pthread_join(l->streams[i].thread, NULL);
}

void hixl_link_destroy(hixl_link *l)
{
    if (l == NULL)
        return;
    hixl_link_close(l);
    for (int i = 0; i < l->nstreams; i++) {
        hixl_stream *s = &l->streams[i];
        if (s->fd >= 0)
            close(s->fd);
        if (s->wake_fd >= 0)
            close(s->wake_fd);
        pthread_mutex_destroy(&s->mu);
    }
    if (l->stop_fd >= 0)
        close(l->stop_fd);
    hixl_cq_unref(l->cq);
    free(l->streams);
    free(l);
}
