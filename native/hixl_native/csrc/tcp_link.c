#define _GNU_SOURCE
#include "tcp_link.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "copy.h"
#include "crc32c.h"
#include "hixl_common.h"
#include "link_threads.h"
#include "spin.h"
#include "tcp_wire.h"

#define MAX_STREAMS 64
/* Below this, splitting a request over more streams costs more in wakeups
 * and round trips than the parallelism gains. */
#define MIN_PIECE_BYTES (256 * 1024)
/* A piece whose outgoing bytes (header, ranges, a WRITE's payload) fit in
 * this is sent by the submitting thread itself when a stream is idle, so the
 * peer starts on it without waiting for a worker to wake up. */
#define DIRECT_MAX_BYTES (64 * 1024)
/* hixl_link_submit_wait waits for the reply itself only for a request of
 * one piece moving at most this many bytes. */
#define INLINE_MAX_BYTES (512 * 1024)
/* ... and waits longer for a larger one: this many bytes per extra
 * microsecond (2 GB/s, well below what loopback TCP moves). */
#define INLINE_BYTES_PER_US 2000
/* ... spinning for it first, up to twice the recent reply time and this at
 * most, while replies come back that fast (see spin.h); sleeping in poll
 * and being woken for a reply costs more than a reply this quick. */
#define INLINE_SPIN_NS (100ull * 1000)
/* Not a status: the request is still in flight. */
#define PENDING 1

typedef struct hixl_piece {
    struct hixl_piece *next;
    struct hixl_request *req;
    uint32_t nranges;
    uint64_t bytes;
    uint8_t *wire;      /* nranges little-endian wire ranges */
    struct iovec *iov;  /* [header][ranges or reply][npayload payload iovecs][trailer] */
    uint32_t npayload;  /* nranges, or 1: the bounce buffer of client-process memory */
    struct iovec *remote; /* client-process memory: the ranges' addresses there */
    uint8_t *bounce;    /* taken while the piece runs */
    /* Set when the submitting thread started the piece (direct send, maybe
     * an inline wait): how far it got, for the worker to carry on. */
    int present;        /* bytes of it may be on the wire */
    int phase;          /* PHASE_*: how far a worker moved it */
    int early_rc;       /* HIXL_OK, or the failure that ends it */
    hixl_iovcur out;    /* what is left to send */
    /* The reply, received in steps that may be spread over two threads. */
    int replied;        /* the reply header arrived and was checked */
    size_t got;         /* bytes received: reply header, then payload */
    hixl_iovcur in;
    uint8_t hdr[HIXL_REQUEST_SIZE];
    uint8_t reply[HIXL_REPLY_SIZE];
    uint8_t trailer[HIXL_TRAILER_SIZE]; /* the payload's CRC, with HIXL_FLAG_CRC32C */
    hixl_crcwin crc;    /* a READ's: of the payload bytes received so far */
} hixl_piece;

typedef struct hixl_request {
    hixl_cq_node node; /* first: the queue's consumer frees the request via it */
    hixl_cq *cq;
    hixl_mapping *local; /* or NULL and: */
    hixl_xmem *xmem;     /* client-process memory, through bounce buffers */
    uint64_t deadline_ns;
    int op;
    uint8_t flags; /* HIXL_FLAG_* of every piece's request */
    atomic_int remaining;
    atomic_int status;
    size_t npieces;
    hixl_piece pieces[];
} hixl_request;

typedef struct hixl_stream {
    hixl_job job; /* first: the stream is the job the shared threads run */
    struct hixl_link *link;
    pthread_mutex_t mu; /* everything below but `pieces` */
    pthread_cond_t idle; /* signalled, once the link closes, when the stream lets go */
    hixl_piece *head, *tail;
    hixl_piece *parked; /* the piece waiting in the watcher for its socket */
    int exited;    /* the link is closing: pieces are cancelled, not queued */
    int scheduled; /* a worker owns the stream: queued, running or parked */
    int claimed;   /* a submitting thread uses the socket; nothing else may */
    int running;   /* workers inside run_stream (one owns it, one may finish) */
    int hup;       /* the watcher saw a hang-up while the socket was in use */
    int reopen;    /* the owning worker connects it again before anything */
    int idle_watch; /* fd is watched for hang-ups (not parked, not disarmed) */
    int fd;        /* changed only by the stream's owner */
    atomic_ulong pieces; /* pieces this stream was given: how the load spread */
    /* A lost connection is reopened (reopen_now) no sooner than
     * reopen_at_ns; the pause doubles after each failure. */
    uint64_t reopen_at_ns;
    uint64_t reopen_pause_ns;
} hixl_stream;

struct hixl_link {
    hixl_addr addr; /* the address stream 0 reached; used by all later connects */
    uint64_t token;
    uint8_t key[HIXL_KEY_SIZE]; /* the link's key: proves each connection */
    int nstreams;
    hixl_stream *streams;
    hixl_cq *cq;
    int stop_fd; /* eventfd: readable once close() began */
    int closed;
    atomic_int closing;
    atomic_int dead;
    uint64_t connect_timeout_ms; /* bounds each reopening of a lost stream */
    atomic_uint next_stream;
    /* The stream the last inline request used. A request alone tries it
     * first: one connection, and the one peer thread serving it, stay warm
     * in cache instead of taking turns with the others (3-6% of a 512 KiB
     * read, paired against round robin). */
    atomic_uint recent_stream;
    /* How long inline replies took lately (a running mean; 0: none yet). */
    atomic_uint_fast64_t inline_reply_ns;
};

/* ---- completion ---- */

static void release_local(hixl_request *r)
{
    if (r->local != NULL) {
        hixl_mapping_unpin(r->local);
        hixl_mapping_unref(r->local);
    } else {
        hixl_xmem_unref(r->xmem);
    }
}

static void finish(hixl_request *r)
{
    release_local(r);
    r->node.status = atomic_load(&r->status);
    hixl_cq_post(r->cq, &r->node); /* r may be freed from here on */
}

/* A request that ended on the submitting thread: nothing is posted. */
static void finish_here(hixl_request *r)
{
    release_local(r);
    hixl_cq_node_free(&r->node);
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
    struct iovec *remote; /* client-process memory: a copy of the payload iovecs */
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
        p->iov = pl->iov + pl->nwire + 3 * pl->npieces;
        p->remote = pl->remote != NULL ? pl->remote + pl->nwire : NULL;
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
        if (p->remote != NULL)
            p->remote[p->nranges] = p->iov[2 + p->nranges];
        p->nranges++;
        p->npayload = p->nranges;
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

/* `whole`: one piece up to INLINE_MAX_BYTES (a request the caller may finish
 * inline moves fastest without any handoff). `bounce_cap` > 0: the local
 * memory is a client process's (`local` its address there), each piece at
 * most one bounce buffer. */
static hixl_request *build_request(hixl_link *l, const uint8_t *quads, size_t n,
                                   uint8_t *local, int whole, size_t bounce_cap, int *rc)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (__builtin_add_overflow(total, hixl_load_u64(quads, 4 * i + 3), &total)) {
            *rc = HIXL_E_INVAL;
            return NULL;
        }
    uint64_t want = (total + MIN_PIECE_BYTES - 1) / MIN_PIECE_BYTES;
    uint64_t target = want < (uint64_t)l->nstreams ? (want ? want : 1) : (uint64_t)l->nstreams;
    if (whole && total <= INLINE_MAX_BYTES)
        target = 1;
    planner pl = {.budget = (total + target - 1) / target};
    if (bounce_cap > 0 && pl.budget > bounce_cap)
        pl.budget = bounce_cap;
    plan(&pl, quads, n);

    size_t pieces_size = pl.npieces * sizeof(hixl_piece);
    size_t iov_size = (pl.nwire + 3 * pl.npieces) * sizeof(struct iovec);
    size_t remote_size = bounce_cap > 0 ? pl.nwire * sizeof(struct iovec) : 0;
    hixl_request *r = calloc(1, sizeof(*r) + pieces_size + iov_size + remote_size +
                                    pl.nwire * HIXL_RANGE_SIZE);
    if (r == NULL) {
        *rc = HIXL_E_NOMEM;
        return NULL;
    }
    hixl_live_add(HIXL_LIVE_REQUESTS, 1); /* freed via hixl_cq_node_free */
    planner fill = {.r = r, .budget = pl.budget, .local = local};
    fill.iov = (struct iovec *)((uint8_t *)r->pieces + pieces_size);
    fill.remote = bounce_cap > 0 ? (struct iovec *)((uint8_t *)fill.iov + iov_size) : NULL;
    fill.wire = (uint8_t *)fill.iov + iov_size + remote_size;
    plan(&fill, quads, n);
    r->npieces = fill.npieces;
    *rc = HIXL_OK;
    return r;
}

/* ---- the wire form of a piece ---- */

static uint32_t budget_ms(uint64_t deadline)
{
    uint64_t now = hixl_now_ns();
    uint64_t ms = now >= deadline ? 1 : (deadline - now + 999999) / 1000000;
    return ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
}

/* Encodes the header and returns the cursor over everything the piece sends. */
static hixl_iovcur prepare_request(hixl_piece *p, uint64_t deadline)
{
    hixl_request *r = p->req;
    hixl_request_hdr h = {.op = (uint8_t)r->op, .flags = r->flags, .nranges = p->nranges,
                          .tag = r->node.id, .total_bytes = p->bytes,
                          .timeout_ms = budget_ms(deadline)};
    hixl_put_request(p->hdr, &h);
    p->iov[0] = (struct iovec){p->hdr, sizeof(p->hdr)};
    p->iov[1] = (struct iovec){p->wire, (size_t)p->nranges * HIXL_RANGE_SIZE};
    if (r->op != HIXL_OP_WRITE)
        return (hixl_iovcur){p->iov, 2};
    /* A WRITE's payload (and its CRC) go out in the same sendmsg batches as
     * its header; nothing of it is on the wire yet, so the iovecs are whole. */
    size_t cnt = 2 + (size_t)p->npayload;
    if (r->flags & HIXL_FLAG_CRC32C) {
        hixl_put_trailer(p->trailer, hixl_crc32c_iov(p->iov + 2, p->npayload));
        p->iov[cnt++] = (struct iovec){p->trailer, sizeof(p->trailer)};
    }
    return (hixl_iovcur){p->iov, cnt};
}

static int check_reply(hixl_piece *p, int32_t *status)
{
    uint64_t tag;
    uint8_t flags;
    if (hixl_get_reply(p->reply, &tag, status, &flags) != HIXL_OK || tag != p->req->node.id)
        return HIXL_E_PROTO;
    if (*status > HIXL_OK || (*status < HIXL_E_CANCELLED && *status != HIXL_E_CHECKSUM))
        return HIXL_E_PROTO;
    /* A target that did not honour the CRC flag checked nothing (and did not
     * read a WRITE's trailer): the request cannot be trusted. */
    if (*status == HIXL_OK && (p->req->flags & ~flags) != 0)
        return HIXL_E_PROTO;
    return HIXL_OK;
}

/*
 * Receives the reply and a READ's payload until done or `deadline`, in steps:
 * a call that ends early (HIXL_E_TIMEOUT) can be repeated, on any thread,
 * with a later deadline. The reply header and the payload land through one
 * iovec array, so a small READ completes in a single recvmsg. Nothing
 * follows a refusal, so receiving greedily cannot swallow bytes of another
 * message. Returns HIXL_OK, the peer's status, or an I/O failure.
 */
static int recv_reply(int fd, int stop_fd, hixl_piece *p, uint64_t deadline)
{
    int read = p->req->op == HIXL_OP_READ;
    /* A READ's CRC trailer follows its payload, through the same cursor. */
    size_t crc = read && (p->req->flags & HIXL_FLAG_CRC32C) ? sizeof(p->trailer) : 0;
    int rc;
    if (!p->replied) {
        if (p->got == 0) {
            p->iov[1] = (struct iovec){p->reply, sizeof(p->reply)};
            p->iov[2 + p->npayload] = (struct iovec){p->trailer, sizeof(p->trailer)};
            p->in = (hixl_iovcur){p->iov + 1,
                                  read ? 1 + (size_t)p->npayload + (crc ? 1 : 0) : 1};
            p->crc = (hixl_crcwin){.lo = sizeof(p->reply), .hi = sizeof(p->reply) + p->bytes};
        }
        if (p->got < sizeof(p->reply)) {
            rc = hixl_recv_iov_crc(fd, stop_fd, &p->in, sizeof(p->reply) - p->got, deadline,
                                   &p->got, crc ? &p->crc : NULL);
            if (rc != HIXL_OK)
                return rc;
        }
        int32_t status;
        if ((rc = check_reply(p, &status)) != HIXL_OK)
            return rc;
        if (status != HIXL_OK)
            return p->got == sizeof(p->reply) ? status : HIXL_E_PROTO;
        p->replied = 1;
    }
    size_t total = sizeof(p->reply) + (read ? (size_t)p->bytes + crc : 0);
    if (p->got < total
        && (rc = hixl_recv_iov_crc(fd, stop_fd, &p->in, total - p->got, deadline, &p->got,
                                   crc ? &p->crc : NULL)) != HIXL_OK)
        return rc;
    if (crc && hixl_get_trailer(p->trailer) != p->crc.crc)
        return HIXL_E_CHECKSUM; /* every byte arrived: the stream is in step */
    return HIXL_OK;
}

static uint64_t outgoing_bytes(const hixl_piece *p)
{
    uint64_t n = HIXL_REQUEST_SIZE + (uint64_t)p->nranges * HIXL_RANGE_SIZE;
    uint64_t crc = (p->req->flags & HIXL_FLAG_CRC32C) ? HIXL_TRAILER_SIZE : 0;
    return p->req->op == HIXL_OP_WRITE ? n + p->bytes + crc : n;
}

/* ---- queues ---- */

static void wake(int efd)
{
    uint64_t one = 1;
    ssize_t n = write(efd, &one, sizeof(one));
    (void)n; /* only fails if the counter saturates, i.e. already readable */
}

/* With s->mu held: gives the stream to a worker, unless one has it. */
static void schedule_locked(hixl_stream *s)
{
    if (!s->scheduled && !s->claimed) {
        s->scheduled = 1;
        hixl_jobs_run(&s->job);
    }
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
    atomic_fetch_add(&s->pieces, 1);
    if (s->head == NULL)
        s->head = p;
    else
        s->tail->next = p;
    s->tail = p;
    schedule_locked(s);
    pthread_mutex_unlock(&s->mu);
}

/* ---- direct sends ---- */

/* Claims an idle, connected stream (no worker owns it, nothing queued), trying
 * them in turn from `first`; NULL when none is. */
static hixl_stream *claim_idle(hixl_link *l, unsigned first)
{
    for (int k = 0; k < l->nstreams; k++) {
        hixl_stream *s = &l->streams[(first + (unsigned)k) % (unsigned)l->nstreams];
        pthread_mutex_lock(&s->mu);
        int idle = !s->exited && !s->scheduled && !s->claimed && s->head == NULL && s->fd >= 0 &&
                   !atomic_load(&l->closing);
        if (idle)
            s->claimed = 1;
        pthread_mutex_unlock(&s->mu);
        if (idle) {
            atomic_fetch_add(&s->pieces, 1);
            return s;
        }
    }
    return NULL;
}

static void check_idle_locked(hixl_stream *s);

/* With s->mu held: the submitting thread is done with the socket. */
static void unclaim_locked(hixl_stream *s)
{
    s->claimed = 0;
    if (s->hup)
        check_idle_locked(s);
    if (s->head != NULL)
        schedule_locked(s); /* pieces queued meanwhile */
    if (s->exited)
        pthread_cond_broadcast(&s->idle);
}

/* Gives a piece the submitting thread started to a worker, first in the
 * stream's queue (its reply comes first): the worker sends any rest,
 * receives the reply, or fails the piece with early_rc. */
static void hand_over(hixl_stream *s, hixl_piece *p)
{
    pthread_mutex_lock(&s->mu);
    s->claimed = 0;
    if (s->exited) {
        pthread_cond_broadcast(&s->idle);
        pthread_mutex_unlock(&s->mu);
        piece_done(p, HIXL_E_CANCELLED);
        return;
    }
    p->next = s->head;
    s->head = p;
    if (s->tail == NULL)
        s->tail = p;
    schedule_locked(s);
    pthread_mutex_unlock(&s->mu);
}

/* Sends a piece on a claimed stream from this thread, as far as the socket
 * takes it without waiting; s->fd cannot change while the stream is claimed. */
static void send_direct(hixl_stream *s, hixl_piece *p, uint64_t deadline)
{
    p->out = prepare_request(p, deadline);
    p->present = 1;
    int rc = hixl_send_iov_nowait(s->fd, &p->out);
    p->early_rc = rc == HIXL_E_BUSY ? HIXL_OK : rc;
}

/* The spin before an inline reply: none while replies take longer than
 * INLINE_SPIN_NS, which would only burn the core. */
static uint64_t reply_spin_ns(hixl_link *l)
{
    uint64_t recent = atomic_load_explicit(&l->inline_reply_ns, memory_order_relaxed);
    if (recent >= INLINE_SPIN_NS)
        return 0;
    return recent == 0 || 2 * recent > INLINE_SPIN_NS ? INLINE_SPIN_NS : 2 * recent;
}

static void reply_took(hixl_link *l, uint64_t ns)
{
    uint64_t recent = atomic_load_explicit(&l->inline_reply_ns, memory_order_relaxed);
    atomic_store_explicit(&l->inline_reply_ns, recent == 0 ? ns : (3 * recent + ns) / 4,
                          memory_order_relaxed);
}

/*
 * The whole of a one-piece request on the submitting thread: send it, wait up
 * to `wait_ns` for the reply and receive it. Returns the request's status
 * when it ended here (the stream is released, nothing is posted) and PENDING
 * when a worker must carry on from where this thread stopped.
 */
static int run_inline(hixl_stream *s, hixl_piece *p, uint64_t wait_ns)
{
    hixl_request *r = p->req;
    send_direct(s, p, r->deadline_ns);
    if (p->early_rc != HIXL_OK || p->out.cnt > 0)
        return PENDING;
    uint64_t now = hixl_now_ns();
    uint64_t until = r->deadline_ns > now + wait_ns ? now + wait_ns : r->deadline_ns;
    uint64_t spin = reply_spin_ns(s->link);
    if (spin > 0)
        (void)hixl_spin_readable(s->fd, now + spin < until ? spin : until - now);
    int rc = recv_reply(s->fd, s->link->stop_fd, p, until);
    if (rc == HIXL_OK)
        reply_took(s->link, hixl_now_ns() - now);
    if (rc == HIXL_E_TIMEOUT && hixl_now_ns() < r->deadline_ns)
        return PENDING; /* no reply yet: a worker waits on, to the real deadline */
    if (rc != HIXL_OK && rc != HIXL_E_REFUSED && rc != HIXL_E_CHECKSUM) {
        p->early_rc = rc; /* the stream is out of sync: the worker drops it */
        return PENDING;
    }
    pthread_mutex_lock(&s->mu);
    unclaim_locked(s);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int submit(hixl_link *l, int op, uint64_t request_id, hixl_mapping *local,
                  hixl_xmem *xmem, const uint8_t *quads, size_t n, uint64_t timeout_ms,
                  uint64_t wait_us, int32_t *done, hixl_cq *cq)
{
    if (atomic_load(&l->closing))
        return HIXL_E_CLOSED;
    uint8_t flags = (op & HIXL_SUBMIT_CRC32C) ? HIXL_FLAG_CRC32C : 0;
    op &= ~HIXL_SUBMIT_CRC32C;
    if (op != HIXL_OP_READ && op != HIXL_OP_WRITE)
        return HIXL_E_INVAL;
    int rc;
    /* Client-process memory never goes out from the submitting thread: its
     * bytes are staged by a worker, which holds the bounce buffer. */
    if (xmem != NULL)
        done = NULL;
    hixl_request *r =
        xmem != NULL
            ? build_request(l, quads, n, (uint8_t *)(uintptr_t)xmem->base, 0,
                            hixl_bounce_size(xmem->outbound), &rc)
            : build_request(l, quads, n, local->addr, done != NULL && wait_us > 0, 0, &rc);
    if (r == NULL)
        return rc;
    r->node.id = request_id;
    r->cq = cq != NULL ? cq : l->cq;
    r->local = local;
    r->xmem = xmem;
    r->op = op;
    r->flags = flags;
    r->deadline_ns = hixl_deadline_after_ms(timeout_ms);
    if (xmem != NULL) {
        hixl_xmem_ref(xmem);
    } else {
        hixl_mapping_ref(local);
        hixl_mapping_pin(local);
    }
    if (r->npieces == 0 || atomic_load(&l->dead)) {
        /* Nothing to move, or a peer known to be gone: complete at once. */
        atomic_init(&r->status, r->npieces == 0 ? HIXL_OK : HIXL_E_CLOSED);
        if (done != NULL) {
            *done = atomic_load(&r->status);
            finish_here(r);
        } else {
            finish(r);
        }
        return HIXL_OK;
    }
    atomic_init(&r->status, HIXL_OK);
    atomic_init(&r->remaining, (int)r->npieces);
    unsigned first = atomic_fetch_add(&l->next_stream, (unsigned)r->npieces);
    hixl_piece *pieces = r->pieces;
    if (done != NULL && wait_us > 0 && r->npieces == 1 &&
        outgoing_bytes(&pieces[0]) <= DIRECT_MAX_BYTES && pieces[0].bytes <= INLINE_MAX_BYTES) {
        hixl_stream *s = claim_idle(l, atomic_load(&l->recent_stream));
        if (s != NULL) {
            atomic_store(&l->recent_stream, (unsigned)(s - l->streams));
            uint64_t wait_ns = (wait_us + pieces[0].bytes / INLINE_BYTES_PER_US) * 1000;
            rc = run_inline(s, &pieces[0], wait_ns);
            if (rc != PENDING) {
                *done = rc;
                finish_here(r);
            } else {
                hand_over(s, &pieces[0]);
            }
            return HIXL_OK;
        }
    }
    /* Once the last piece is handed over the request may complete and be
     * freed by the consumer at any moment, so the loop must not read r. */
    size_t npieces = r->npieces;
    uint64_t deadline = r->deadline_ns;
    for (size_t k = 0; k < npieces; k++) {
        hixl_stream *s = NULL;
        if (xmem == NULL && outgoing_bytes(&pieces[k]) <= DIRECT_MAX_BYTES)
            s = claim_idle(l, first + (unsigned)k);
        if (s != NULL) {
            send_direct(s, &pieces[k], deadline);
            hand_over(s, &pieces[k]);
        } else {
            enqueue(&l->streams[(first + k) % (unsigned)l->nstreams], &pieces[k]);
        }
    }
    return HIXL_OK;
}

int hixl_link_submit(hixl_link *l, int op, uint64_t request_id, hixl_mapping *local,
                     const uint8_t *quads, size_t n, uint64_t timeout_ms)
{
    return submit(l, op, request_id, local, NULL, quads, n, timeout_ms, 0, NULL, NULL);
}

int hixl_link_submit_xmem(hixl_link *l, int op, uint64_t request_id, hixl_xmem *local,
                          const uint8_t *quads, size_t n, uint64_t timeout_ms)
{
    return submit(l, op, request_id, NULL, local, quads, n, timeout_ms, 0, NULL, NULL);
}

int hixl_link_submit_wait(hixl_link *l, int op, uint64_t request_id, hixl_mapping *local,
                          const uint8_t *quads, size_t n, uint64_t timeout_ms,
                          uint64_t wait_us, int32_t *status)
{
    *status = PENDING;
    return submit(l, op, request_id, local, NULL, quads, n, timeout_ms, wait_us, status, NULL);
}

int hixl_link_submit_wait_to(hixl_link *l, int op, uint64_t request_id, hixl_mapping *local,
                             const uint8_t *quads, size_t n, uint64_t timeout_ms,
                             uint64_t wait_us, int32_t *status, hixl_cq *cq)
{
    *status = PENDING;
    return submit(l, op, request_id, local, NULL, quads, n, timeout_ms, wait_us, status, cq);
}

/* ---- streams on the shared threads (link_threads.h) ---- */

#define REOPEN_FIRST_PAUSE_NS (200ull * 1000 * 1000)
#define REOPEN_MAX_PAUSE_NS (5ull * 1000 * 1000 * 1000)
/* A reopening waits this long for a free slot (see reopen_slot). */
#define REOPEN_SLOT_WAIT_NS (50ull * 1000 * 1000)
/* A piece whose socket moves no byte for this long hands its worker back
 * and waits in the watcher (parked) until the socket is ready again, so a
 * silent peer holds no thread; shorter waits stay on the worker, where the
 * reply is read the moment it comes. */
#define PARK_AFTER_NS (2ull * 1000 * 1000)
/* Not a status: the piece is to wait in the watcher. */
#define PARKED 2

enum { PHASE_START, PHASE_SEND, PHASE_RECV };

/* Idle sockets are watched for hang-ups only (edge-triggered: once per
 * change); a parked piece's socket for the one event it waits on. */
#define IDLE_EVENTS (EPOLLRDHUP | EPOLLET)

/* Connections being made again in the background, all links together: a
 * partition that cuts many links must not occupy every worker with
 * connection attempts that can only time out. */
static atomic_int reopening;

static int reopen_slot(void)
{
    int max = hixl_jobs_threads() / 4;
    if (max < 1)
        max = 1;
    int n = atomic_load(&reopening);
    while (n < max)
        if (atomic_compare_exchange_weak(&reopening, &n, n + 1))
            return 1;
    return 0;
}

/* With s->mu held: a stream that lost its connection and that nobody owns
 * is reopened when its pause is over. */
static void lost_locked(hixl_stream *s)
{
    if (s->fd < 0 && !s->scheduled && !s->claimed && !s->exited &&
        !atomic_load(&s->link->closing))
        hixl_jobs_time(&s->job, s->reopen_at_ns);
}

/* With s->mu held: fd leaves the watcher's set and is closed. */
static void drop_socket_locked(hixl_stream *s)
{
    int fd = s->fd;
    s->fd = -1;
    s->hup = 0;
    s->idle_watch = 0;
    if (fd >= 0) {
        (void)hixl_jobs_watch(EPOLL_CTL_DEL, fd, 0, &s->job);
        close(fd);
    }
}

static void drop_socket(hixl_stream *s)
{
    pthread_mutex_lock(&s->mu);
    drop_socket_locked(s);
    pthread_mutex_unlock(&s->mu);
}

/* With s->mu held, and no reply due on the socket: an idle stream should
 * hear nothing. EOF or a reset means the target went away (or revoked us),
 * and stray bytes mean the stream is out of sync. Noticing this while idle
 * keeps `alive` and `streams_up` honest between requests. */
static void check_idle_locked(hixl_stream *s)
{
    char b;
    s->hup = 0;
    if (s->fd < 0)
        return;
    ssize_t k = recv(s->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (k <= 0)
        atomic_store(&s->link->dead, 1);
    drop_socket_locked(s);
    lost_locked(s);
}

/* With s->mu held: the owning worker lets the stream go. */
static void go_idle_locked(hixl_stream *s)
{
    if (s->hup)
        check_idle_locked(s);
    if (s->fd >= 0 && !s->idle_watch &&
        hixl_jobs_watch(EPOLL_CTL_MOD, s->fd, IDLE_EVENTS, &s->job) == HIXL_OK)
        s->idle_watch = 1;
    s->scheduled = 0;
    lost_locked(s);
    if (s->exited)
        pthread_cond_broadcast(&s->idle);
}

static int reconnect(hixl_stream *s, uint64_t deadline)
{
    hixl_link *l = s->link;
    int fd = -1;
    int rc = hixl_tcp_connect_addr(&l->addr, l->stop_fd, deadline, &fd);
    if (rc == HIXL_OK) {
        rc = hixl_tcp_handshake(fd, l->stop_fd, l->token, l->key, deadline);
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
    if (!closing && hixl_jobs_watch(EPOLL_CTL_ADD, fd, IDLE_EVENTS, &s->job) != HIXL_OK)
        rc = HIXL_E_IO;
    if (!closing && rc == HIXL_OK) {
        s->fd = fd;
        s->hup = 0;
        s->idle_watch = 1;
    }
    pthread_mutex_unlock(&s->mu);
    if (closing || rc != HIXL_OK) {
        close(fd);
        return closing ? HIXL_E_CANCELLED : rc;
    }
    return HIXL_OK;
}

/* The owning worker connects a lost stream again; a link marked dead comes
 * back to life once a connection handshakes again (the far daemon still
 * knows the link's token). */
static void reopen_now(hixl_stream *s)
{
    hixl_link *l = s->link;
    int rc = reconnect(s, hixl_deadline_after_ms(l->connect_timeout_ms));
    atomic_fetch_sub(&reopening, 1);
    pthread_mutex_lock(&s->mu);
    if (rc == HIXL_OK) {
        atomic_store(&l->dead, 0);
        s->reopen_pause_ns = REOPEN_FIRST_PAUSE_NS;
        s->reopen_at_ns = 0;
    } else {
        s->reopen_at_ns = hixl_now_ns() + s->reopen_pause_ns;
        s->reopen_pause_ns = s->reopen_pause_ns * 2 > REOPEN_MAX_PAUSE_NS
                                 ? REOPEN_MAX_PAUSE_NS : s->reopen_pause_ns * 2;
    }
    pthread_mutex_unlock(&s->mu);
}

/* Checks before a piece goes out: HIXL_OK, or the status that ends it. */
static int may_run(hixl_link *l, hixl_request *r)
{
    int rc = atomic_load(&r->status); /* a sibling piece already failed it */
    if (atomic_load(&l->closing))
        return HIXL_E_CANCELLED;
    if (rc != HIXL_OK)
        return rc;
    if (atomic_load(&l->dead))
        return HIXL_E_CLOSED;
    if (hixl_now_ns() >= r->deadline_ns)
        return HIXL_E_TIMEOUT;
    return HIXL_OK;
}

/* Ends a piece whose stream is out of sync: the socket goes, and the status
 * says why (the link closing wins; a peer that hung up marks the link dead). */
static int out_of_sync(hixl_stream *s, int rc)
{
    hixl_link *l = s->link;
    drop_socket(s);
    if (atomic_load(&l->closing))
        return HIXL_E_CANCELLED;
    if (rc == HIXL_E_CLOSED)
        atomic_store(&l->dead, 1);
    return rc;
}

/* A piece of client-process memory takes a bounce buffer and points its
 * payload at it; a WRITE's bytes are read from the client first. Nothing
 * is on the wire yet, so a failure here leaves the stream in step. */
static int stage_piece(hixl_link *l, hixl_piece *p)
{
    hixl_request *r = p->req;
    hixl_bounce *b = r->xmem->outbound;
    p->bounce = hixl_bounce_take(b, r->deadline_ns, &l->closing);
    if (p->bounce == NULL)
        return atomic_load(&l->closing) ? HIXL_E_CANCELLED : HIXL_E_TIMEOUT;
    int rc = r->op == HIXL_OP_WRITE
                 ? hixl_xmem_flat(r->xmem, 0, p->bounce, p->remote, p->nranges)
                 : HIXL_OK;
    p->iov[2] = (struct iovec){p->bounce, (size_t)p->bytes};
    p->npayload = 1;
    return rc;
}

static int unstage_piece(hixl_piece *p, int rc)
{
    hixl_request *r = p->req;
    if (p->bounce == NULL)
        return rc;
    if (rc == HIXL_OK && r->op == HIXL_OP_READ)
        rc = hixl_xmem_flat(r->xmem, 1, p->bounce, p->remote, p->nranges);
    hixl_bounce_give(r->xmem->outbound, p->bounce);
    p->bounce = NULL;
    return rc;
}

static uint64_t park_or_deadline(uint64_t deadline)
{
    uint64_t soon = hixl_now_ns() + PARK_AFTER_NS;
    return deadline < soon ? deadline : soon;
}

/* Sends what is left of the piece; PARKED once the socket took nothing for
 * PARK_AFTER_NS. */
static int send_step(hixl_stream *s, hixl_piece *p, uint64_t deadline)
{
    for (;;) {
        struct iovec *iov = p->out.iov;
        size_t cnt = p->out.cnt;
        void *base = cnt > 0 ? iov->iov_base : NULL;
        int rc = hixl_send_iov(s->fd, s->link->stop_fd, &p->out, park_or_deadline(deadline));
        if (rc != HIXL_E_TIMEOUT || hixl_now_ns() >= deadline)
            return rc;
        if (p->out.iov == iov && p->out.cnt == cnt && (cnt == 0 || iov->iov_base == base))
            return PARKED;
    }
}

/* Receives the reply (and a READ's payload); PARKED once nothing arrived
 * for PARK_AFTER_NS. */
static int recv_step(hixl_stream *s, hixl_piece *p, uint64_t deadline)
{
    for (;;) {
        size_t before = p->got;
        int rc = recv_reply(s->fd, s->link->stop_fd, p, park_or_deadline(deadline));
        if (rc != HIXL_E_TIMEOUT || hixl_now_ns() >= deadline)
            return rc;
        if (p->got == before)
            return PARKED;
    }
}

/* Moves a piece on as far as its socket allows: its final status, or PARKED
 * (it resumes on a worker, in the phase it reached, once the socket is
 * ready or its deadline came). */
static int step_piece(hixl_stream *s, hixl_piece *p)
{
    hixl_link *l = s->link;
    hixl_request *r = p->req;
    int rc;
    if (p->phase == PHASE_START) {
        if (p->present) {
            /* The submitting thread sent some or all of it (and may have
             * read part of the reply): whatever ends it now leaves the
             * stream out of sync. */
            rc = p->early_rc;
            if (rc == HIXL_OK)
                rc = may_run(l, r);
            if (rc != HIXL_OK)
                return out_of_sync(s, rc);
            p->phase = p->out.cnt > 0 ? PHASE_SEND : PHASE_RECV;
        } else {
            if ((rc = may_run(l, r)) != HIXL_OK)
                return rc;
            if (s->fd < 0 && (rc = reconnect(s, r->deadline_ns)) != HIXL_OK)
                return rc;
            if (r->xmem != NULL && (rc = stage_piece(l, p)) != HIXL_OK)
                return unstage_piece(p, rc);
            p->out = prepare_request(p, r->deadline_ns);
            p->phase = PHASE_SEND;
        }
    }
    if (p->phase == PHASE_SEND) {
        rc = send_step(s, p, r->deadline_ns);
        if (rc == PARKED)
            return rc;
        if (rc != HIXL_OK) {
            unstage_piece(p, rc);
            return out_of_sync(s, rc);
        }
        p->phase = PHASE_RECV;
    }
    rc = recv_step(s, p, r->deadline_ns);
    if (rc == PARKED)
        return rc;
    if (rc == HIXL_OK || rc == HIXL_E_REFUSED || rc == HIXL_E_CHECKSUM)
        return unstage_piece(p, rc); /* the stream is still in sync */
    unstage_piece(p, rc);
    return out_of_sync(s, rc); /* anything else leaves the byte stream unknown */
}

/* Hands the piece to the watcher until its socket is ready or its deadline
 * comes; the stream stays owned (scheduled) meanwhile. HIXL_OK, or why it
 * could not wait. */
static int park(hixl_stream *s, hixl_piece *p)
{
    uint32_t events = (p->phase == PHASE_SEND ? EPOLLOUT : EPOLLIN) | EPOLLRDHUP | EPOLLONESHOT;
    int rc = HIXL_OK;
    pthread_mutex_lock(&s->mu);
    /* hixl_link_close wakes every parked piece after setting `closing`,
     * under this lock: checked here, none can be left behind. */
    if (atomic_load(&s->link->closing))
        rc = HIXL_E_CANCELLED;
    else if (hixl_jobs_watch(EPOLL_CTL_MOD, s->fd, events, &s->job) != HIXL_OK)
        rc = HIXL_E_IO;
    if (rc == HIXL_OK) {
        s->idle_watch = 0;
        s->parked = p;
        hixl_jobs_time(&s->job, p->req->deadline_ns);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* With s->mu held: the parked piece goes back to the front of the queue of
 * its stream, which its owner (still `scheduled`) runs on. */
static void wake_parked_locked(hixl_stream *s)
{
    hixl_piece *p = s->parked;
    if (p == NULL)
        return;
    s->parked = NULL;
    hixl_jobs_untime(&s->job);
    p->next = s->head;
    s->head = p;
    if (s->tail == NULL)
        s->tail = p;
    hixl_jobs_run(&s->job);
}

/* With s->mu held: the piece to move next. */
static hixl_piece *take_piece_locked(hixl_stream *s)
{
    hixl_piece *p = s->head;
    if (p != NULL) {
        s->head = p->next;
        if (s->head == NULL)
            s->tail = NULL;
    }
    return p;
}

/* A worker runs the stream it was given until its queue is empty or a piece
 * parks. */
static void run_stream(hixl_job *job)
{
    hixl_stream *s = (hixl_stream *)job;
    pthread_mutex_lock(&s->mu);
    s->running++;
    if (s->reopen) {
        s->reopen = 0;
        pthread_mutex_unlock(&s->mu);
        reopen_now(s);
        pthread_mutex_lock(&s->mu);
    }
    for (;;) {
        hixl_piece *p = take_piece_locked(s);
        if (p == NULL) {
            go_idle_locked(s);
            break;
        }
        pthread_mutex_unlock(&s->mu);
        int rc = step_piece(s, p);
        if (rc == PARKED) {
            int why = park(s, p);
            if (why == HIXL_OK) {
                pthread_mutex_lock(&s->mu);
                break;
            }
            unstage_piece(p, why);
            rc = out_of_sync(s, why);
        }
        pthread_mutex_lock(&s->mu);
        int last = s->head == NULL;
        /* Idle again before the completion, which may bring the next
         * request (and find the stream free for a direct send). */
        if (last)
            go_idle_locked(s);
        pthread_mutex_unlock(&s->mu);
        piece_done(p, rc);
        pthread_mutex_lock(&s->mu);
        if (last)
            break;
    }
    s->running--;
    if (s->exited)
        pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
}

/* On the watcher: the stream's socket reported `events`. */
static void stream_ready(hixl_job *job, uint32_t events)
{
    (void)events;
    hixl_stream *s = (hixl_stream *)job;
    pthread_mutex_lock(&s->mu);
    if (s->parked != NULL) {
        wake_parked_locked(s);
    } else if (!s->scheduled && !s->claimed) {
        check_idle_locked(s);
    } else {
        s->hup = 1; /* in use: its user finds out, or checks when done */
    }
    pthread_mutex_unlock(&s->mu);
}

/* On the watcher: a parked piece's deadline, or a lost stream's reopening. */
static void stream_due(hixl_job *job)
{
    hixl_stream *s = (hixl_stream *)job;
    pthread_mutex_lock(&s->mu);
    if (s->parked != NULL) {
        wake_parked_locked(s); /* its next step times out */
    } else if (s->fd < 0 && !s->scheduled && !s->claimed && !s->exited &&
               !atomic_load(&s->link->closing)) {
        if (reopen_slot()) {
            s->reopen = 1;
            schedule_locked(s);
        } else {
            hixl_jobs_time(job, hixl_now_ns() + REOPEN_SLOT_WAIT_NS);
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/* ---- lifecycle ---- */

static int open_stream(hixl_link *l, hixl_stream *s, const char *host, uint16_t port,
                       uint64_t deadline)
{
    s->link = l;
    s->fd = -1;
    s->job.run = run_stream;
    s->job.ready = stream_ready;
    s->job.due = stream_due;
    s->reopen_pause_ns = REOPEN_FIRST_PAUSE_NS;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle, NULL);
    int rc = s == l->streams
                 ? hixl_tcp_connect(host, port, l->stop_fd, deadline, &s->fd, &l->addr)
                 : hixl_tcp_connect_addr(&l->addr, l->stop_fd, deadline, &s->fd);
    if (rc == HIXL_OK)
        rc = hixl_tcp_handshake(s->fd, l->stop_fd, l->token, l->key, deadline);
    return rc;
}

/* The streams' sockets join the watcher's set once every stream is open. */
static int watch_streams(hixl_link *l)
{
    int rc = hixl_jobs_start();
    for (int i = 0; rc == HIXL_OK && i < l->nstreams; i++) {
        hixl_stream *s = &l->streams[i];
        rc = hixl_jobs_watch(EPOLL_CTL_ADD, s->fd, IDLE_EVENTS, &s->job);
        s->idle_watch = rc == HIXL_OK;
    }
    return rc;
}

int hixl_link_open(const char *host, uint16_t port, uint64_t token, const uint8_t *key,
                   int nstreams, hixl_cq *cq, uint64_t connect_timeout_ms, hixl_link **out)
{
    if (nstreams < 1 || nstreams > MAX_STREAMS)
        return HIXL_E_INVAL;
    hixl_link *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return HIXL_E_NOMEM;
    hixl_live_add(HIXL_LIVE_LINKS, 1);
    l->token = token;
    l->connect_timeout_ms = connect_timeout_ms;
    memcpy(l->key, key, HIXL_KEY_SIZE);
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
    if (rc == HIXL_OK)
        rc = watch_streams(l);
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

int hixl_link_streams_up(hixl_link *l)
{
    int up = 0;
    for (int i = 0; i < l->nstreams; i++) {
        hixl_stream *s = &l->streams[i];
        pthread_mutex_lock(&s->mu);
        up += s->fd >= 0;
        pthread_mutex_unlock(&s->mu);
    }
    return up;
}

uint64_t hixl_link_stream_pieces(hixl_link *l, int stream)
{
    if (stream < 0 || stream >= l->nstreams)
        return 0;
    return atomic_load(&l->streams[stream].pieces);
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
        pthread_mutex_lock(&s->mu);
        s->exited = 1;
        /* A worker inside a long sendmsg/recvmsg run never polls; shutting
         * the socket down makes its next call fail at once. */
        if (s->fd >= 0)
            shutdown(s->fd, SHUT_RDWR);
        wake_parked_locked(s); /* its owner ends it, cancelled */
        hixl_jobs_untime(&s->job); /* no reopening any more */
        pthread_mutex_unlock(&s->mu);
    }
    /* Workers and submitting threads finish what they hold (every wait
     * they are in now ends at once), and take nothing new. */
    for (int i = 0; i < l->nstreams; i++) {
        hixl_stream *s = &l->streams[i];
        pthread_mutex_lock(&s->mu);
        while (s->scheduled || s->claimed || s->running > 0)
            pthread_cond_wait(&s->idle, &s->mu);
        drop_socket_locked(s);
        pthread_mutex_unlock(&s->mu);
    }
    /* The watcher may still hold an event or a timer of these streams. */
    hixl_jobs_quiesce();
    /* Nothing waits on the stop eventfd any more: every use of it is by a
     * thread that claimed, was given or reopens a stream, and the streams are
     * idle and exited (nothing claims or schedules them again). A closed link
     * that Python still references then holds no fd. */
    if (l->stop_fd >= 0) {
        close(l->stop_fd);
        l->stop_fd = -1;
    }
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
        pthread_cond_destroy(&s->idle);
        pthread_mutex_destroy(&s->mu);
    }
    if (l->stop_fd >= 0)
        close(l->stop_fd);
    hixl_cq_unref(l->cq);
    free(l->streams);
    free(l);
}
