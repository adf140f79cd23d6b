#define _GNU_SOURCE
#include "tcp_server.h"

#include <endian.h>
#include <errno.h>
#include <netdb.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "crc32c.h"
#include "hixl_common.h"
#include "spin.h"
#include "tcp_wire.h"

/* A peer gets this long to complete its handshake, and to deliver a
 * request's header and range list once its first byte arrived; the payload
 * itself is bounded by the request's own timeout instead. */
#define HANDSHAKE_TIMEOUT_MS 5000
#define HEADER_TIMEOUT_MS 10000
#define DISCARD_CHUNK (64 * 1024)
/* A worker that answered a request watches its connection this long for the
 * next one, if the one before came within as long of its predecessor's
 * answer: a stream of requests is then read without an epoll wake-up each,
 * and a connection used now and then costs no spinning at all. */
#define SERVE_SPIN_NS (50ull * 1000)
/* The target's deadline for a request trails the initiator's by this much,
 * so the initiator always gives up first (and closes its connection, which
 * ends the target's wait at once). The other order would make the
 * initiator see an EOF and take a slow transfer for a dead peer. */
#define DEADLINE_GRACE_MS 1000
/* Connections beyond the server's limit (max_conns) are still accepted and
 * have their HELLO answered with E_BUSY, so the peer learns which limit it
 * hit; this many more are closed unanswered, so that a peer opening
 * connections in a loop cannot exhaust the fds of the daemon. */
#define REFUSING_CONNS 64
/* How often a worker looks for handshakes past their deadline (and for an
 * accept paused by a shortage of fds). */
#define SWEEP_NS (500ull * 1000 * 1000)
#define ACCEPT_PAUSE_NS (100ull * 1000 * 1000)
#define ACCEPTS_PER_EVENT 64
/* Not a status: the handshake waits for more bytes. */
#define MORE 1

enum { CONN_HELLO, CONN_PROOF, CONN_SERVING };

typedef struct token_entry {
    uint64_t token;
    uint64_t cluster;
    uint8_t key[HIXL_KEY_SIZE];
    int may_write;
} token_entry;

/* A connection belongs to the one worker that took its event (its epoll
 * registration is one-shot) and to nobody while it waits in epoll; only
 * that worker closes and frees it, others may only shut its socket down. */
typedef struct hixl_conn {
    struct hixl_conn *prev, *next; /* the server's list, under srv->mu */
    hixl_server *srv;
    int fd; /* -1 once closed; changed under srv->mu */
    int state;
    int authed;
    int over_limit; /* accepted beyond max_conns: answered E_BUSY */
    int may_write;  /* the link may write into writable regions */
    uint64_t token;
    uint64_t cluster;
    uint64_t handshake_deadline_ns;
    /* The handshake, read without blocking a worker: the message so far. */
    uint8_t msg[HIXL_HELLO_SIZE > HIXL_PROOF_SIZE ? HIXL_HELLO_SIZE : HIXL_PROOF_SIZE];
    size_t msg_got;
    uint8_t nonce[HIXL_NONCE_SIZE];
    /* Per-connection buffers, grown on demand and reused by every request,
     * so the hot path allocates nothing. */
    uint8_t *ranges;
    struct iovec *iov;
    hixl_region **held;
    hixl_xmem **owners; /* per range: its client-process memory, or NULL */
    size_t cap;
    /* When the last request was answered, and the wait before the one after
     * it: while requests follow each other this closely, the worker watches
     * the connection for the next one instead of going back to epoll. */
    uint64_t answered_ns;
    uint64_t gap_ns;
} hixl_conn;

struct hixl_server {
    int listen_fd;
    int stop_fd;
    int epfd;
    uint16_t port;
    pthread_t *threads;
    int nthreads;
    int stopped;
    atomic_int stopping;
    atomic_uint_fast64_t next_sweep_ns;
    atomic_uint_fast64_t accept_paused_until_ns; /* 0: accepting */
    atomic_uint_fast64_t checksum_mismatches; /* writes refused by their CRC-32C */
    pthread_mutex_t mu; /* tokens and the connection list */
    token_entry *tokens;
    size_t ntokens, cap_tokens;
    hixl_conn *conns;
    size_t nconns;
    size_t max_conns;
    hixl_region_table regions;
};

/* ---- tokens ---- */

static token_entry *find_token(hixl_server *s, uint64_t token)
{
    for (size_t i = 0; i < s->ntokens; i++)
        if (s->tokens[i].token == token)
            return &s->tokens[i];
    return NULL;
}

int hixl_server_authorize(hixl_server *s, uint64_t token, uint64_t cluster,
                          const uint8_t *key, int may_write)
{
    int rc = HIXL_OK;
    pthread_mutex_lock(&s->mu);
    token_entry *e = find_token(s, token);
    if (e != NULL) {
        rc = e->cluster == cluster ? HIXL_OK : HIXL_E_EXISTS;
    } else if (s->ntokens == s->cap_tokens) {
        size_t ncap = s->cap_tokens ? s->cap_tokens * 2 : 8;
        token_entry *nv = realloc(s->tokens, ncap * sizeof(*nv));
        if (nv == NULL) {
            rc = HIXL_E_NOMEM;
        } else {
            s->tokens = nv;
            s->cap_tokens = ncap;
        }
    }
    if (rc == HIXL_OK && e == NULL) {
        e = &s->tokens[s->ntokens++];
        e->token = token;
        e->cluster = cluster;
    }
    if (rc == HIXL_OK) {
        memcpy(e->key, key, HIXL_KEY_SIZE);
        e->may_write = may_write;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void hixl_server_revoke(hixl_server *s, uint64_t token)
{
    pthread_mutex_lock(&s->mu);
    token_entry *e = find_token(s, token);
    if (e != NULL) {
        *e = s->tokens[--s->ntokens];
        OPENSSL_cleanse(&s->tokens[s->ntokens], sizeof(*e));
    }
    /* shutdown() rather than close(): the connection thread owns the fd and
     * closes it itself once it sees the connection end. */
    for (hixl_conn *c = s->conns; c != NULL; c = c->next)
        if (c->authed && c->token == token && c->fd >= 0)
            shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&s->mu);
}

/* ---- one connection ---- */

/* Reads the handshake message in c->msg up to `want` bytes without waiting:
 * HIXL_OK once it is whole, MORE when the socket has no more yet. */
static int handshake_recv(hixl_conn *c, size_t want)
{
    while (c->msg_got < want) {
        ssize_t k = recv(c->fd, c->msg + c->msg_got, want - c->msg_got, MSG_DONTWAIT);
        if (k > 0) {
            c->msg_got += (size_t)k;
            continue;
        }
        if (k == 0)
            return HIXL_E_CLOSED;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return MORE;
        return HIXL_E_IO;
    }
    return HIXL_OK;
}

/* A handshake message goes out whole or the connection fails: the socket's
 * send buffer is empty at this point and takes a few dozen bytes at once. */
static int handshake_send(hixl_conn *c, const uint8_t *msg, size_t len)
{
    ssize_t k = send(c->fd, msg, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    return k == (ssize_t)len ? HIXL_OK : HIXL_E_IO;
}

/* HELLO, CHALLENGE, PROOF, WELCOME (tcp_wire.h), one step per readable
 * event: HIXL_OK once the connection is served, MORE while it waits for the
 * peer, otherwise the status that ends it. The connection is authed only
 * once its MAC over this connection's fresh nonce matches the key of the
 * link its token names; nothing else is read before that. */
static int handshake_step(hixl_conn *c)
{
    hixl_server *s = c->srv;
    int rc;
    if (c->state == CONN_HELLO) {
        if ((rc = handshake_recv(c, HIXL_HELLO_SIZE)) != HIXL_OK)
            return rc;
        uint8_t challenge[HIXL_CHALLENGE_SIZE];
        int status = hixl_get_hello(c->msg, &c->token);
        if (status == HIXL_OK && c->over_limit)
            status = HIXL_E_BUSY;
        if (status == HIXL_OK && hixl_fill_random(c->nonce, sizeof(c->nonce)) != HIXL_OK)
            status = HIXL_E_IO;
        if (status != HIXL_OK)
            memset(c->nonce, 0, sizeof(c->nonce));
        hixl_put_challenge(challenge, status, c->nonce);
        rc = handshake_send(c, challenge, sizeof(challenge));
        if (rc != HIXL_OK || status != HIXL_OK)
            return rc != HIXL_OK ? rc : status;
        c->state = CONN_PROOF;
        c->msg_got = 0;
        return MORE;
    }
    if ((rc = handshake_recv(c, HIXL_PROOF_SIZE)) != HIXL_OK)
        return rc;
    uint8_t mac[HIXL_MAC_SIZE], want[HIXL_MAC_SIZE], welcome[HIXL_WELCOME_SIZE];
    int status = hixl_get_proof(c->msg, mac);
    if (status == HIXL_OK) {
        status = HIXL_E_REFUSED;
        pthread_mutex_lock(&s->mu);
        token_entry *e = find_token(s, c->token);
        if (e != NULL && hixl_data_mac(e->key, c->token, c->nonce, want) == HIXL_OK
            && CRYPTO_memcmp(want, mac, sizeof(want)) == 0) {
            c->authed = 1;
            c->cluster = e->cluster;
            c->may_write = e->may_write;
            status = HIXL_OK;
        }
        pthread_mutex_unlock(&s->mu);
    }
    hixl_put_welcome(welcome, status);
    rc = handshake_send(c, welcome, sizeof(welcome));
    if (rc != HIXL_OK || status != HIXL_OK)
        return rc != HIXL_OK ? rc : status;
    c->state = CONN_SERVING;
    return HIXL_OK;
}

static int reserve_buffers(hixl_conn *c, size_t n)
{
    if (n <= c->cap)
        return HIXL_OK;
    free(c->ranges);
    free(c->iov);
    free(c->held);
    free(c->owners);
    c->ranges = malloc(n * HIXL_RANGE_SIZE);
    c->iov = malloc((n + 2) * sizeof(*c->iov)); /* +2: the reply header, a CRC trailer */
    c->held = malloc(n * sizeof(*c->held));
    c->owners = malloc(n * sizeof(*c->owners));
    c->cap = (c->ranges && c->iov && c->held && c->owners) ? n : 0;
    return c->cap ? HIXL_OK : HIXL_E_NOMEM;
}

static int sum_lengths(const uint8_t *ranges, uint32_t n, uint64_t *total)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t len;
        memcpy(&len, ranges + (size_t)i * HIXL_RANGE_SIZE + 16, 8);
        len = le64toh(len);
        if (__builtin_add_overflow(sum, len, &sum))
            return HIXL_E_PROTO;
    }
    *total = sum;
    return HIXL_OK;
}

static int discard(hixl_conn *c, uint64_t bytes, uint64_t deadline)
{
    uint8_t scratch[DISCARD_CHUNK];
    while (bytes > 0) {
        size_t chunk = bytes > sizeof(scratch) ? sizeof(scratch) : (size_t)bytes;
        int rc = hixl_recv_buf(c->fd, c->srv->stop_fd, scratch, chunk, deadline);
        if (rc != HIXL_OK)
            return rc;
        bytes -= chunk;
    }
    return HIXL_OK;
}

static int send_reply(hixl_conn *c, uint64_t tag, int status, uint8_t flags,
                      uint64_t deadline)
{
    uint8_t reply[HIXL_REPLY_SIZE];
    hixl_put_reply(reply, tag, status, flags);
    return hixl_send_buf(c->fd, c->srv->stop_fd, reply, sizeof(reply), deadline);
}

/* Runs an accepted or refused request; any I/O failure ends the connection
 * because the byte stream can no longer be trusted to be in sync. */
static int transfer(hixl_conn *c, const hixl_request_hdr *h, int status, uint64_t deadline)
{
    int stop = c->srv->stop_fd;
    uint8_t crc = h->flags & HIXL_FLAG_CRC32C; /* honoured: echoed in the reply */
    uint8_t trailer[HIXL_TRAILER_SIZE];
    size_t n = h->nranges;
    if (h->op == HIXL_OP_WRITE) {
        int rc;
        if (status == HIXL_OK) {
            /* The trailer lands through the same cursor, after the payload;
             * the CRC is taken of the payload's bytes as they arrive. */
            c->iov[1 + n] = (struct iovec){trailer, sizeof(trailer)};
            hixl_iovcur cur = {c->iov + 1, n + (crc ? 1 : 0)};
            size_t want = (size_t)h->total_bytes + (crc ? sizeof(trailer) : 0);
            hixl_crcwin win = {.lo = 0, .hi = h->total_bytes};
            rc = hixl_recv_iov_crc(c->fd, stop, &cur, want, deadline, NULL, crc ? &win : NULL);
            if (rc == HIXL_OK && crc && hixl_get_trailer(trailer) != win.crc) {
                status = HIXL_E_CHECKSUM;
                atomic_fetch_add(&c->srv->checksum_mismatches, 1);
            }
        } else {
            rc = discard(c, h->total_bytes + (crc ? sizeof(trailer) : 0), deadline);
        }
        return rc != HIXL_OK ? rc : send_reply(c, h->tag, status, crc, deadline);
    }
    uint8_t reply[HIXL_REPLY_SIZE];
    hixl_put_reply(reply, h->tag, status, status == HIXL_OK ? crc : 0);
    c->iov[0] = (struct iovec){reply, sizeof(reply)};
    size_t cnt = status == HIXL_OK ? n + 1 : 1;
    if (status == HIXL_OK && crc) {
        /* Of the memory as it is sent: nothing of it is on the wire yet. */
        hixl_put_trailer(trailer, hixl_crc32c_iov(c->iov + 1, n));
        c->iov[cnt++] = (struct iovec){trailer, sizeof(trailer)};
    }
    hixl_iovcur cur = {c->iov, cnt};
    return hixl_send_iov(c->fd, stop, &cur, deadline);
}

/* The bounce pool of the first range in client-process memory; NULL when
 * every range is in mapped memory (the zero-copy path). Fills owners. */
static hixl_bounce *xmem_bounce(hixl_conn *c, uint32_t n)
{
    hixl_bounce *b = NULL;
    for (uint32_t i = 0; i < n; i++) {
        c->owners[i] = c->held[i]->xmem;
        if (b == NULL && c->owners[i] != NULL)
            b = c->owners[i]->inbound;
    }
    return b;
}

/*
 * An accepted request that touches client-process memory: its payload
 * moves through one bounce buffer of the daemon, a chunk at a time, with
 * process_vm_readv / process_vm_writev. A READ whose first chunk cannot be
 * read is refused before any payload is sent; a later failure leaves the
 * stream out of step and ends the connection (the client's process went
 * away mid-request: its cluster is being torn down). A WRITE always takes
 * the whole payload off the wire, and reports a failed store in its reply.
 */
static int transfer_bounced(hixl_conn *c, const hixl_request_hdr *h, hixl_bounce *b,
                            uint64_t deadline)
{
    int stop = c->srv->stop_fd;
    uint8_t *buf = hixl_bounce_take(b, deadline, &c->srv->stopping);
    if (buf == NULL) {
        int status = atomic_load(&c->srv->stopping) ? HIXL_E_CANCELLED : HIXL_E_TIMEOUT;
        return transfer(c, h, status, deadline); /* a WRITE's payload is discarded */
    }
    size_t cap = hixl_bounce_size(b);
    hixl_segs segs = {.iov = c->iov + 1, .owner = c->owners, .n = h->nranges};
    uint64_t left = h->total_bytes;
    int rc = HIXL_OK;
    /* The CRC of the bytes as they pass through the bounce buffer. */
    uint8_t crc_on = h->flags & HIXL_FLAG_CRC32C;
    uint32_t crc = 0;
    uint8_t trailer[HIXL_TRAILER_SIZE];
    if (h->op == HIXL_OP_WRITE) {
        int status = HIXL_OK;
        while (rc == HIXL_OK && left > 0) {
            size_t take = left < cap ? (size_t)left : cap;
            rc = hixl_recv_buf(c->fd, stop, buf, take, deadline);
            if (rc == HIXL_OK && crc_on)
                crc = hixl_crc32c(crc, buf, take);
            if (rc == HIXL_OK && status == HIXL_OK)
                status = hixl_segs_scatter(&segs, buf, take);
            left -= take;
        }
        if (status == HIXL_E_GONE)
            status = HIXL_E_REFUSED;
        if (rc == HIXL_OK && crc_on) {
            rc = hixl_recv_buf(c->fd, stop, trailer, sizeof(trailer), deadline);
            if (rc == HIXL_OK && status == HIXL_OK && hixl_get_trailer(trailer) != crc) {
                status = HIXL_E_CHECKSUM;
                atomic_fetch_add(&c->srv->checksum_mismatches, 1);
            }
        }
        if (rc == HIXL_OK)
            rc = send_reply(c, h->tag, status, crc_on, deadline);
    } else {
        int first = 1;
        while (rc == HIXL_OK && (left > 0 || first)) {
            size_t got = 0;
            int status = hixl_segs_gather(&segs, buf, cap, &got);
            if (status != HIXL_OK) {
                /* Before the first byte: a clean refusal; after: out of step. */
                rc = first ? send_reply(c, h->tag, HIXL_E_REFUSED, 0, deadline) : HIXL_E_IO;
                crc_on = 0; /* nothing more follows */
                break;
            }
            uint8_t reply[HIXL_REPLY_SIZE];
            struct iovec iov[3];
            size_t cnt = 0;
            if (first) {
                hixl_put_reply(reply, h->tag, HIXL_OK, crc_on);
                iov[cnt++] = (struct iovec){reply, sizeof(reply)};
                first = 0;
            }
            if (got > 0)
                iov[cnt++] = (struct iovec){buf, got};
            left -= got;
            if (crc_on)
                crc = hixl_crc32c(crc, buf, got);
            if (crc_on && left == 0) { /* the trailer goes out with the last chunk */
                hixl_put_trailer(trailer, crc);
                iov[cnt++] = (struct iovec){trailer, sizeof(trailer)};
            }
            hixl_iovcur cur = {iov, cnt};
            rc = hixl_send_iov(c->fd, stop, &cur, deadline);
        }
    }
    hixl_bounce_give(b, buf);
    return rc;
}

static int serve_request(hixl_conn *c)
{
    hixl_server *s = c->srv;
    uint8_t hdr[HIXL_REQUEST_SIZE];
    hixl_request_hdr h;
    uint64_t total = 0, deadline = hixl_deadline_after_ms(HEADER_TIMEOUT_MS);
    int rc = hixl_recv_buf(c->fd, s->stop_fd, hdr, sizeof(hdr), deadline);
    if (rc != HIXL_OK)
        return rc;
    if (hixl_get_request(hdr, &h) != HIXL_OK) {
        send_reply(c, h.tag, HIXL_E_PROTO, 0, deadline);
        return HIXL_E_PROTO;
    }
    if ((rc = reserve_buffers(c, h.nranges)) != HIXL_OK)
        return rc;
    rc = hixl_recv_buf(c->fd, s->stop_fd, c->ranges, (size_t)h.nranges * HIXL_RANGE_SIZE,
                       deadline);
    if (rc != HIXL_OK)
        return rc;
    if (sum_lengths(c->ranges, h.nranges, &total) != HIXL_OK || total != h.total_bytes) {
        send_reply(c, h.tag, HIXL_E_PROTO, 0, deadline);
        return HIXL_E_PROTO;
    }
    deadline = hixl_deadline_after_ms((uint64_t)h.timeout_ms + DEADLINE_GRACE_MS);
    /* A link its owner did not let write is refused before any range is
     * looked at, so none of its bytes lands anywhere. */
    int status = h.op == HIXL_OP_WRITE && !c->may_write
                     ? HIXL_E_REFUSED
                     : hixl_regions_acquire(&s->regions, c->cluster, h.op == HIXL_OP_WRITE,
                                            c->ranges, h.nranges, c->iov + 1, c->held);
    hixl_bounce *bounce = status == HIXL_OK ? xmem_bounce(c, h.nranges) : NULL;
    rc = bounce != NULL ? transfer_bounced(c, &h, bounce, deadline)
                        : transfer(c, &h, status, deadline);
    if (status == HIXL_OK)
        hixl_regions_release(&s->regions, c->held, h.nranges);
    return rc;
}

static void free_conn(hixl_conn *c)
{
    free(c->ranges);
    free(c->iov);
    free(c->held);
    free(c->owners);
    free(c);
    hixl_live_add(HIXL_LIVE_CONNECTIONS, -1);
}

/* By the connection's owner: out of the list and the epoll set, closed, freed. */
static void close_conn(hixl_conn *c)
{
    hixl_server *s = c->srv;
    pthread_mutex_lock(&s->mu);
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    s->nconns--;
    int fd = c->fd;
    c->fd = -1;
    pthread_mutex_unlock(&s->mu);
    (void)epoll_ctl(s->epfd, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    free_conn(c);
}

/* By the owner: the connection waits in epoll for its next bytes. */
static int arm_conn(hixl_conn *c, int op)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT, .data.ptr = c};
    return epoll_ctl(c->srv->epfd, op, c->fd, &ev) == 0 ? HIXL_OK : HIXL_E_IO;
}

/* Did the peer send more already? 1 yes, 0 not yet, -1 it hung up. */
static int more_waiting(hixl_conn *c)
{
    char b;
    ssize_t k = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k > 0)
        return 1;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    return -1;
}

/* A worker took the connection's event: a handshake step, or requests for
 * as long as they keep coming without a wait, or within a short spin while
 * they have been coming that fast. */
static void conn_ready(hixl_conn *c)
{
    if (c->state != CONN_SERVING) {
        int rc = handshake_step(c);
        if ((rc == MORE || rc == HIXL_OK) && arm_conn(c, EPOLL_CTL_MOD) == HIXL_OK)
            return;
        close_conn(c);
        return;
    }
    int more;
    do {
        /* No request before this one: not a stream (yet), nothing to spin for. */
        c->gap_ns = c->answered_ns != 0 ? hixl_now_ns() - c->answered_ns : UINT64_MAX;
        if (serve_request(c) != HIXL_OK) {
            close_conn(c);
            return;
        }
        c->answered_ns = hixl_now_ns();
        more = more_waiting(c);
        if (more == 0 && c->gap_ns < SERVE_SPIN_NS && hixl_spin_readable(c->fd, SERVE_SPIN_NS))
            more = more_waiting(c);
    } while (more > 0);
    if (more < 0 || arm_conn(c, EPOLL_CTL_MOD) != HIXL_OK)
        close_conn(c);
}

/* ---- accepting ---- */

static void add_conn(hixl_server *s, int fd)
{
    hixl_conn *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        close(fd);
        return;
    }
    hixl_live_add(HIXL_LIVE_CONNECTIONS, 1);
    c->srv = s;
    c->fd = fd;
    c->state = CONN_HELLO;
    c->handshake_deadline_ns = hixl_deadline_after_ms(HANDSHAKE_TIMEOUT_MS);
    pthread_mutex_lock(&s->mu);
    int room = s->nconns < s->max_conns + REFUSING_CONNS && !atomic_load(&s->stopping);
    if (room) {
        c->over_limit = s->nconns >= s->max_conns;
        c->next = s->conns;
        if (s->conns != NULL)
            s->conns->prev = c;
        s->conns = c;
        s->nconns++;
    }
    pthread_mutex_unlock(&s->mu);
    if (!room) {
        close(fd);
        free_conn(c);
        return;
    }
    /* Once armed the connection may be another worker's at once. */
    if (arm_conn(c, EPOLL_CTL_ADD) != HIXL_OK)
        close_conn(c);
}

static int arm_listener(hixl_server *s)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = &s->listen_fd};
    return epoll_ctl(s->epfd, EPOLL_CTL_MOD, s->listen_fd, &ev) == 0 ? HIXL_OK : HIXL_E_IO;
}

static void accept_some(hixl_server *s)
{
    for (int i = 0; i < ACCEPTS_PER_EVENT; i++) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR)
                continue;
            /* Out of fds or memory: pause accepting (the sweep takes it up
             * again) instead of spinning on a listener that stays readable. */
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                atomic_store(&s->accept_paused_until_ns, hixl_now_ns() + ACCEPT_PAUSE_NS);
                return;
            }
            break; /* EAGAIN, or a connection that died in the queue */
        }
        hixl_tcp_tune(fd);
        add_conn(s, fd);
    }
    (void)arm_listener(s);
}

/* Handshakes past their deadline are shut down (their owner, woken by
 * that, closes them); a paused accept resumes. At most one worker at a time
 * and every SWEEP_NS. */
static void sweep(hixl_server *s)
{
    uint64_t now = hixl_now_ns();
    uint_fast64_t due = atomic_load(&s->next_sweep_ns);
    if (now < due || !atomic_compare_exchange_strong(&s->next_sweep_ns, &due, now + SWEEP_NS))
        return;
    pthread_mutex_lock(&s->mu);
    for (hixl_conn *c = s->conns; c != NULL; c = c->next)
        if (c->state != CONN_SERVING && now >= c->handshake_deadline_ns && c->fd >= 0)
            shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&s->mu);
    uint_fast64_t paused = atomic_load(&s->accept_paused_until_ns);
    if (paused != 0 && now >= paused &&
        atomic_compare_exchange_strong(&s->accept_paused_until_ns, &paused, 0))
        (void)arm_listener(s);
}

/* Every worker waits in the one epoll set and serves what it takes: no
 * thread is tied to a connection, and no hand-off sits between a request's
 * arrival and its service. */
static void *worker_main(void *arg)
{
    hixl_server *s = arg;
    struct epoll_event ev;
    while (!atomic_load(&s->stopping)) {
        int n = epoll_wait(s->epfd, &ev, 1, (int)(SWEEP_NS / 1000000));
        if (atomic_load(&s->stopping))
            break;
        sweep(s);
        if (n <= 0)
            continue;
        if (ev.data.ptr == &s->stop_fd)
            break;
        if (ev.data.ptr == &s->listen_fd)
            accept_some(s);
        else
            conn_ready(ev.data.ptr);
    }
    return NULL;
}

/* ---- lifecycle ---- */

static int open_listener(const char *host, uint16_t port, int *out)
{
    char service[8];
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    snprintf(service, sizeof(service), "%u", (unsigned)port);
    if (getaddrinfo(host[0] ? host : NULL, service, &hints, &res) != 0) {
        errno = ENXIO;
        return HIXL_E_IO;
    }
    int rc = HIXL_E_IO, one = 1;
    for (struct addrinfo *ai = res; ai != NULL && rc != HIXL_OK; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        /* Accepted sockets inherit the buffer sizes, and the window scale
         * is fixed during the handshake: they must be set here. */
        hixl_tcp_tune(fd);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 128) == 0) {
            *out = fd;
            rc = HIXL_OK;
        } else {
            int err = errno;
            close(fd);
            errno = err;
        }
    }
    int err = errno;
    freeaddrinfo(res);
    errno = err;
    return rc;
}

static uint16_t bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return 0;
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

/* The epoll set: the stop eventfd (level-triggered, so it wakes every
 * worker once readable) and the listener (one-shot, taken by one worker). */
static int open_epoll(hixl_server *s)
{
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (s->epfd < 0)
        return HIXL_E_IO;
    struct epoll_event stop = {.events = EPOLLIN, .data.ptr = &s->stop_fd};
    struct epoll_event listen = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = &s->listen_fd};
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->stop_fd, &stop) != 0 ||
        epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->listen_fd, &listen) != 0)
        return HIXL_E_IO;
    return HIXL_OK;
}

int hixl_server_start(const char *host, uint16_t port, size_t max_conns, int nthreads,
                      hixl_server **out)
{
    if (max_conns == 0 || nthreads < 1 || nthreads > HIXL_SERVER_MAX_THREADS)
        return HIXL_E_INVAL;
    hixl_server *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return HIXL_E_NOMEM;
    s->max_conns = max_conns;
    hixl_live_add(HIXL_LIVE_SERVERS, 1);
    s->listen_fd = -1;
    s->epfd = -1;
    s->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_init(&s->mu, NULL);
    hixl_regions_init(&s->regions);
    s->threads = calloc((size_t)nthreads, sizeof(*s->threads));
    int rc = s->stop_fd >= 0 && s->threads != NULL ? HIXL_OK : HIXL_E_IO;
    if (rc == HIXL_OK)
        rc = open_listener(host, port, &s->listen_fd);
    if (rc == HIXL_OK) {
        s->port = bound_port(s->listen_fd);
        rc = open_epoll(s);
    }
    for (; rc == HIXL_OK && s->nthreads < nthreads; s->nthreads++)
        rc = hixl_spawn_thread(&s->threads[s->nthreads], worker_main, s);
    if (rc != HIXL_OK) {
        int err = errno;
        hixl_server_destroy(s);
        errno = err;
        return rc;
    }
    *out = s;
    return HIXL_OK;
}

uint16_t hixl_server_port(const hixl_server *s) { return s->port; }

int hixl_server_threads(const hixl_server *s) { return s->nthreads; }

uint64_t hixl_server_checksum_mismatches(hixl_server *s)
{
    return atomic_load(&s->checksum_mismatches);
}

hixl_region_table *hixl_server_regions(hixl_server *s) { return &s->regions; }

void hixl_server_stop(hixl_server *s)
{
    if (s->stopped)
        return;
    s->stopped = 1;
    atomic_store(&s->stopping, 1);
    hixl_live_add(HIXL_LIVE_SERVERS, -1); /* counts running servers */
    uint64_t one = 1;
    /* Cannot fail on a fresh eventfd; the shutdown() calls below and the
     * workers' check of the stop flag after every wait are the fallback. */
    if (s->stop_fd >= 0) {
        ssize_t n = write(s->stop_fd, &one, sizeof(one));
        (void)n;
    }
    pthread_mutex_lock(&s->mu);
    /* A worker busy in a long send never polls; shutdown makes it fail. */
    for (hixl_conn *c = s->conns; c != NULL; c = c->next)
        if (c->fd >= 0)
            shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->threads[i], NULL);
    s->nthreads = 0;
    /* No worker is left: what is still listed waited in epoll, owned by
     * nobody. */
    while (s->conns != NULL)
        close_conn(s->conns);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    s->listen_fd = -1;
}

void hixl_server_destroy(hixl_server *s)
{
    if (s == NULL)
        return;
    hixl_server_stop(s);
    hixl_regions_destroy(&s->regions);
    pthread_mutex_destroy(&s->mu);
    if (s->epfd >= 0)
        close(s->epfd);
    if (s->stop_fd >= 0)
        close(s->stop_fd);
    if (s->tokens != NULL)
        OPENSSL_cleanse(s->tokens, s->cap_tokens * sizeof(*s->tokens));
    free(s->tokens);
    free(s->threads);
    free(s);
}
