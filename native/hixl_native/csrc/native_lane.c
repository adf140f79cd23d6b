/* The native submission path of repeated transfers: see native_lane.h. */
#define _GNU_SOURCE
#include "native_lane.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "completion.h"
#include "copy.h"
#include "hixl_common.h"
#include "spin.h"
#include "tcp_wire.h"

/* A lane that served its last submission less than this ago expects the
 * next one soon and spins for it (up to SPIN_NS) before it sleeps: a client
 * repeating transfers back to back sends the next within its own Python
 * work, much sooner than a sleeping thread would be woken. */
#define SPIN_AFTER_NS 200000ull
#define SPIN_NS 100000ull
/* How long the lane's thread waits, on itself, for a request's reply before
 * a link worker takes the reply over (as the event loop's own inline wait,
 * transports/tcp.py). Sending and receiving on the lane's thread spares the
 * hand-offs to and from a worker, which cost more than a small request's
 * round trip; a far side slower than this holds up the requests behind it
 * by this long at most, then its reply comes through the lane's queue. */
#define INLINE_WAIT_US 200ull
/* A client that leaves its completion ring full this long is not reading it. */
#define STUCK_NS 5000000000ull

/* ---- cells ---- */

struct hixl_nl_cell {
    hixl_nl_cell *next; /* in its bucket, while published */
    uint64_t handle;
    uint64_t owner;
    int push;
    int op; /* HIXL_OP_READ or _WRITE, maybe | HIXL_SUBMIT_CRC32C */
    hixl_link *link;
    hixl_mapping *local;
    uint64_t *quads;
    size_t n;
    uint64_t src_stride, dst_stride;
    uint32_t src_slots, dst_slots;
    uint64_t bytes;
    uint64_t timeout_ms;
    int published;
    atomic_int inflight;
};

#define BUCKETS 1024u

static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static hixl_nl_cell *table[BUCKETS];

static unsigned bucket_of(uint64_t handle)
{
    return (unsigned)((handle * 0x9E3779B97F4A7C15ull) >> 54) & (BUCKETS - 1);
}

int hixl_nl_cell_create(uint64_t handle, uint64_t owner, int push, int checksum,
                        hixl_link *link, hixl_mapping *local, const uint64_t *quads, size_t n,
                        uint64_t src_stride, uint32_t src_slots, uint64_t dst_stride,
                        uint32_t dst_slots, uint64_t bytes, uint64_t timeout_ms,
                        hixl_nl_cell **out)
{
    if (link == NULL || local == NULL || n == 0 || timeout_ms == 0)
        return HIXL_E_INVAL;
    hixl_nl_cell *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return HIXL_E_NOMEM;
    c->quads = malloc(n * 4 * sizeof(uint64_t));
    if (c->quads == NULL) {
        free(c);
        return HIXL_E_NOMEM;
    }
    memcpy(c->quads, quads, n * 4 * sizeof(uint64_t));
    c->handle = handle;
    c->owner = owner;
    c->push = push != 0;
    c->op = (push ? HIXL_OP_WRITE : HIXL_OP_READ) | (checksum ? HIXL_SUBMIT_CRC32C : 0);
    c->link = link;
    c->local = local;
    hixl_mapping_ref(local);
    c->n = n;
    c->src_stride = src_stride;
    c->dst_stride = dst_stride;
    c->src_slots = src_slots;
    c->dst_slots = dst_slots;
    c->bytes = bytes;
    c->timeout_ms = timeout_ms;
    atomic_init(&c->inflight, 0);
    *out = c;
    return HIXL_OK;
}

int hixl_nl_publish(hixl_nl_cell *c)
{
    unsigned b = bucket_of(c->handle);
    int rc = HIXL_OK;
    pthread_mutex_lock(&table_mu);
    for (hixl_nl_cell *p = table[b]; p != NULL && !c->published; p = p->next)
        if (p->handle == c->handle)
            rc = HIXL_E_EXISTS;
    if (rc == HIXL_OK && !c->published) {
        c->next = table[b];
        table[b] = c;
        c->published = 1;
    }
    pthread_mutex_unlock(&table_mu);
    return rc;
}

void hixl_nl_revoke(hixl_nl_cell *c)
{
    pthread_mutex_lock(&table_mu);
    if (c->published) {
        hixl_nl_cell **p = &table[bucket_of(c->handle)];
        while (*p != c)
            p = &(*p)->next;
        *p = c->next;
        c->published = 0;
    }
    pthread_mutex_unlock(&table_mu);
}

int hixl_nl_inflight(const hixl_nl_cell *c)
{
    return atomic_load((atomic_int *)&c->inflight);
}

void hixl_nl_cell_destroy(hixl_nl_cell *c)
{
    if (c == NULL)
        return;
    hixl_nl_revoke(c);
    while (atomic_load(&c->inflight) > 0) /* each transfer ends by its deadline */
        usleep(200);
    hixl_mapping_unref(c->local);
    free(c->quads);
    free(c);
}

/* The published cell of `handle` for `owner`, counted in flight; NULL when none. */
static hixl_nl_cell *take_cell(uint64_t handle, uint64_t owner, int push)
{
    pthread_mutex_lock(&table_mu);
    hixl_nl_cell *c = table[bucket_of(handle)];
    while (c != NULL && c->handle != handle)
        c = c->next;
    if (c != NULL && (c->owner != owner || c->push != push))
        c = NULL;
    if (c != NULL)
        atomic_fetch_add(&c->inflight, 1);
    pthread_mutex_unlock(&table_mu);
    return c;
}

/* ---- the log ---- */

struct hixl_nl_log {
    pthread_mutex_t mu;
    int efd;
    hixl_nl_record *records; /* a ring of `capacity` */
    size_t capacity, head, count;
    uint64_t dropped;
};

int hixl_nl_log_create(size_t capacity, hixl_nl_log **out)
{
    if (capacity == 0)
        return HIXL_E_INVAL;
    hixl_nl_log *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return HIXL_E_NOMEM;
    g->records = calloc(capacity, sizeof(hixl_nl_record));
    g->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (g->records == NULL || g->efd < 0) {
        int rc = g->records == NULL ? HIXL_E_NOMEM : HIXL_E_IO;
        if (g->efd >= 0)
            close(g->efd);
        free(g->records);
        free(g);
        return rc;
    }
    pthread_mutex_init(&g->mu, NULL);
    g->capacity = capacity;
    *out = g;
    return HIXL_OK;
}

int hixl_nl_log_fd(hixl_nl_log *g)
{
    return g->efd;
}

static void log_add(hixl_nl_log *g, const hixl_nl_record *rec)
{
    int wake = 0;
    pthread_mutex_lock(&g->mu);
    if (g->count == g->capacity) {
        g->dropped++;
    } else {
        g->records[(g->head + g->count) % g->capacity] = *rec;
        wake = g->count++ == 0;
    }
    if (wake) { /* one write per empty -> non-empty, as completion.c does */
        uint64_t one = 1;
        ssize_t rc = write(g->efd, &one, sizeof(one));
        (void)rc;
    }
    pthread_mutex_unlock(&g->mu);
}

size_t hixl_nl_log_take(hixl_nl_log *g, hixl_nl_record *out, size_t cap, uint64_t *dropped)
{
    pthread_mutex_lock(&g->mu);
    size_t n = g->count < cap ? g->count : cap;
    for (size_t k = 0; k < n; k++)
        out[k] = g->records[(g->head + k) % g->capacity];
    g->head = (g->head + n) % g->capacity;
    g->count -= n;
    *dropped = g->dropped;
    g->dropped = 0;
    if (g->count == 0) {
        uint64_t v;
        ssize_t rc = read(g->efd, &v, sizeof(v));
        (void)rc;
    }
    pthread_mutex_unlock(&g->mu);
    return n;
}

void hixl_nl_log_destroy(hixl_nl_log *g)
{
    if (g == NULL)
        return;
    close(g->efd);
    pthread_mutex_destroy(&g->mu);
    free(g->records);
    free(g);
}

/* ---- lanes ---- */

typedef struct hixl_nl_pending {
    hixl_nl_cell *cell; /* NULL: a free slot */
    uint64_t request_id;
    uint64_t call_id;
    uint64_t handle;
    uint64_t started_ns;
    int cancelled; /* its completion went out already */
} hixl_nl_pending;

struct hixl_nlane {
    hixl_ring *submissions, *completions;
    uint64_t owner;
    hixl_nl_log *log;
    hixl_cq *cq; /* this lane's requests that did not end on its thread */
    int stop_fd;
    pthread_t thread;
    atomic_int ended;
    atomic_ulong served;
    atomic_int under_way; /* pending and not cancelled */
    hixl_nl_pending pending[HIXL_NL_MAX_PENDING];
    int npending;
    uint64_t next_request; /* request ids: a sequence number above, the slot below */
    uint64_t *quads;       /* the shifted quads of the request being sent */
    size_t quads_cap;
    uint64_t active_ns;    /* the last time a submission or a reply came */
};

#define SLOT_BITS 16

/* Shifts the cell's quads into l->quads; 0 when a range leaves the local
 * mapping or overflows (the full call words that error). */
static int shift_quads(hixl_nlane *l, const hixl_nl_cell *c, uint64_t remote_shift,
                       uint64_t local_shift)
{
    if (l->quads_cap < c->n) {
        uint64_t *q = realloc(l->quads, c->n * 4 * sizeof(uint64_t));
        if (q == NULL)
            return 0;
        l->quads = q;
        l->quads_cap = c->n;
    }
    uint64_t size = c->local->size;
    for (size_t i = 0; i < c->n; i++) {
        const uint64_t *in = &c->quads[4 * i];
        uint64_t *out = &l->quads[4 * i];
        uint64_t roff = in[1] + remote_shift, loff = in[2] + local_shift;
        if (roff < remote_shift || loff < local_shift || !hixl_in_bounds(loff, in[3], size))
            return 0;
        out[0] = in[0];
        out[1] = roff;
        out[2] = loff;
        out[3] = in[3];
    }
    return 1;
}

/* Writes one completion; not HIXL_OK once the ring is unusable (the client
 * stopped reading it, or the lane stops). */
static int complete(hixl_nlane *l, const hixl_nl_completion *done)
{
    int rc = hixl_ring_write(l->completions, done, sizeof(*done));
    if (rc == HIXL_E_BUSY) { /* a client keeps fewer in flight than the ring holds */
        rc = hixl_ring_wait_writable(l->completions, sizeof(*done), 0,
                                     hixl_now_ns() + STUCK_NS, l->stop_fd);
        if (rc == HIXL_OK)
            rc = hixl_ring_write(l->completions, done, sizeof(*done));
    }
    return rc;
}

/* The end of a transfer that ran: its completion (unless its caller
 * cancelled it), its record in the log, and its cell let go. */
static int finish(hixl_nlane *l, hixl_nl_cell *c, uint64_t call_id, uint64_t handle,
                  int cancelled, int32_t status, uint64_t data_ns)
{
    int rc = HIXL_OK;
    if (status != HIXL_E_REFUSED) {
        hixl_nl_record rec = {.owner = l->owner, .handle = handle,
                              .outcome = status == HIXL_OK ? HIXL_NL_OK : HIXL_NL_FAILED,
                              .native_status = status,
                              .bytes = status == HIXL_OK ? c->bytes : 0, .data_ns = data_ns};
        log_add(l->log, &rec);
    }
    if (!cancelled) {
        hixl_nl_completion done = {.call_id = call_id};
        if (status == HIXL_E_REFUSED) { /* the far side has no such region now: nothing moved */
            done.outcome = HIXL_NL_FALLBACK;
        } else {
            done.outcome = status == HIXL_OK ? HIXL_NL_OK : HIXL_NL_FAILED;
            done.native_status = status;
            done.bytes = status == HIXL_OK ? c->bytes : 0;
            done.data_us = (uint32_t)(data_ns / 1000);
        }
        rc = complete(l, &done);
    }
    atomic_fetch_sub(&c->inflight, 1); /* the cell may be freed from here on */
    return rc;
}

/* Takes the replies that link workers finished for this lane. */
static int reap(hixl_nlane *l)
{
    int rc = HIXL_OK;
    hixl_cq_node *node = hixl_cq_take(l->cq);
    while (node != NULL) {
        hixl_cq_node *next = node->next;
        hixl_nl_pending *p = &l->pending[node->id & ((1u << SLOT_BITS) - 1)];
        if (p->cell != NULL && p->request_id == node->id) {
            hixl_nl_cell *c = p->cell;
            p->cell = NULL;
            l->npending--;
            if (!p->cancelled)
                atomic_fetch_sub(&l->under_way, 1);
            int frc = finish(l, c, p->call_id, p->handle, p->cancelled, node->status,
                             hixl_now_ns() - p->started_ns);
            if (rc == HIXL_OK)
                rc = frc;
        }
        hixl_cq_node_free(node);
        node = next;
    }
    return rc;
}

/* Starts one submission: ends it here when it can (a fallback, or a request
 * whose reply came within the inline wait), else leaves it pending on the
 * link. */
static int start(hixl_nlane *l, const hixl_nl_submission *s)
{
    hixl_nl_completion fallback = {.call_id = s->call_id, .outcome = HIXL_NL_FALLBACK};
    hixl_nl_cell *c = NULL;
    if (s->kind == HIXL_NL_PULL || s->kind == HIXL_NL_PUSH)
        c = take_cell(s->handle, l->owner, s->kind == HIXL_NL_PUSH);
    if (c == NULL)
        return complete(l, &fallback);
    uint64_t src_shift = (uint64_t)s->src_batch * c->src_stride;
    uint64_t dst_shift = (uint64_t)s->dst_batch * c->dst_stride;
    if (s->src_batch >= c->src_slots || s->dst_batch >= c->dst_slots ||
        !hixl_link_alive(c->link) ||
        !(c->push ? shift_quads(l, c, dst_shift, src_shift)
                  : shift_quads(l, c, src_shift, dst_shift))) {
        atomic_fetch_sub(&c->inflight, 1);
        return complete(l, &fallback);
    }
    unsigned slot = 0;
    while (l->pending[slot].cell != NULL) /* the caller keeps a slot free */
        slot++;
    uint64_t request_id = (++l->next_request << SLOT_BITS) | slot;
    uint64_t started = hixl_now_ns();
    int32_t status = 1;
    int rc = hixl_link_submit_wait_to(c->link, c->op, request_id, c->local,
                                      (const uint8_t *)l->quads, c->n, c->timeout_ms,
                                      INLINE_WAIT_US, &status, l->cq);
    if (rc != HIXL_OK) { /* nothing posted: the link closed, or no memory */
        atomic_fetch_sub(&c->inflight, 1);
        return complete(l, &fallback);
    }
    if (status != 1)
        return finish(l, c, s->call_id, s->handle, 0, status, hixl_now_ns() - started);
    l->pending[slot] = (hixl_nl_pending){.cell = c, .request_id = request_id,
                                         .call_id = s->call_id, .handle = s->handle,
                                         .started_ns = started};
    l->npending++;
    atomic_fetch_add(&l->under_way, 1);
    return HIXL_OK;
}

/* The client gave up a call: its completion goes out now (the transfer
 * itself runs to its end, as a cancelled call's does on the ordinary lane). */
static int cancel(hixl_nlane *l, uint64_t call_id)
{
    for (int k = 0; k < HIXL_NL_MAX_PENDING; k++) {
        hixl_nl_pending *p = &l->pending[k];
        if (p->cell != NULL && !p->cancelled && p->call_id == call_id) {
            p->cancelled = 1;
            atomic_fetch_sub(&l->under_way, 1);
            hixl_nl_completion done = {.call_id = call_id, .outcome = HIXL_NL_CANCELLED};
            return complete(l, &done);
        }
    }
    return HIXL_OK; /* answered already */
}

/* Waits for a submission or a reply: spins while replies are due or
 * submissions came lately, then sleeps. HIXL_E_CANCELLED once stopped. */
static int wait_for_work(hixl_nlane *l)
{
    uint64_t now = hixl_now_ns();
    if (l->npending > 0 || now - l->active_ns < SPIN_AFTER_NS) {
        uint64_t until = now + SPIN_NS;
        while (!hixl_spin_over(until)) {
            if (hixl_ring_readable(l->submissions) != 0 || hixl_cq_pending(l->cq))
                return HIXL_OK;
            hixl_spin_pause();
        }
    }
    if (hixl_ring_arm(l->submissions, 0) != 1)
        return HIXL_OK; /* a submission came meanwhile (or the ring is corrupt: read says) */
    struct pollfd p[3] = {{.fd = l->submissions->wait_fd, .events = POLLIN},
                          {.fd = hixl_cq_fd(l->cq), .events = POLLIN},
                          {.fd = l->stop_fd, .events = POLLIN}};
    int rc = poll(p, 3, -1);
    hixl_ring_disarm(l->submissions);
    if (rc < 0 && errno != EINTR)
        return HIXL_E_IO;
    return p[2].revents ? HIXL_E_CANCELLED : HIXL_OK;
}

static void *lane_main(void *arg)
{
    hixl_nlane *l = arg;
    hixl_nl_submission s;
    for (;;) {
        if (hixl_cq_pending(l->cq)) {
            l->active_ns = hixl_now_ns();
            if (reap(l) != HIXL_OK)
                break;
        }
        int took = 0, rc = HIXL_OK;
        while (l->npending < HIXL_NL_MAX_PENDING) {
            size_t len = 0;
            rc = hixl_ring_read(l->submissions, &s, sizeof(s), &len);
            if (rc == HIXL_E_BUSY) {
                rc = HIXL_OK;
                break;
            }
            if (rc != HIXL_OK || len != sizeof(s)) {
                rc = HIXL_E_PROTO; /* a corrupt ring or a foreign frame: the client is broken */
                break;
            }
            took = 1;
            atomic_fetch_add(&l->served, 1);
            if (s.kind == HIXL_NL_CANCEL) {
                rc = cancel(l, s.call_id);
            } else {
                rc = start(l, &s);
            }
            if (rc != HIXL_OK)
                break;
        }
        if (rc != HIXL_OK)
            break;
        if (took) {
            l->active_ns = hixl_now_ns();
            continue;
        }
        if (wait_for_work(l) != HIXL_OK)
            break;
    }
    /* Requests still out use their cells' memory until they end (each by its
     * deadline; a closed link ends them at once): wait for them. */
    while (l->npending > 0) {
        struct pollfd p = {.fd = hixl_cq_fd(l->cq), .events = POLLIN};
        (void)poll(&p, 1, 1000);
        (void)reap(l); /* their completions may find the ring unusable: no matter */
    }
    atomic_store(&l->ended, 1);
    return NULL;
}

int hixl_nl_start(hixl_ring *submissions, hixl_ring *completions, uint64_t owner,
                  hixl_nl_log *log, hixl_nlane **out)
{
    if (submissions->producer || !completions->producer)
        return HIXL_E_INVAL;
    hixl_nlane *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return HIXL_E_NOMEM;
    l->submissions = submissions;
    l->completions = completions;
    l->owner = owner;
    l->log = log;
    l->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    int rc = l->stop_fd < 0 ? HIXL_E_IO : hixl_cq_create(&l->cq);
    if (rc == HIXL_OK)
        rc = hixl_spawn_thread(&l->thread, lane_main, l);
    if (rc != HIXL_OK) {
        if (l->cq != NULL) {
            hixl_cq_close(l->cq);
            hixl_cq_unref(l->cq);
        }
        if (l->stop_fd >= 0)
            close(l->stop_fd);
        free(l);
        return rc;
    }
    *out = l;
    return HIXL_OK;
}

uint64_t hixl_nl_served(hixl_nlane *l)
{
    return atomic_load(&l->served);
}

int hixl_nl_under_way(hixl_nlane *l)
{
    return atomic_load(&l->under_way);
}

int hixl_nl_ended(hixl_nlane *l)
{
    return atomic_load(&l->ended);
}

void hixl_nl_stop(hixl_nlane *l)
{
    if (l == NULL)
        return;
    uint64_t one = 1;
    ssize_t rc = write(l->stop_fd, &one, sizeof(one));
    (void)rc;
    pthread_join(l->thread, NULL);
    close(l->stop_fd);
    hixl_cq_close(l->cq);
    hixl_cq_unref(l->cq);
    free(l->quads);
    free(l);
}
