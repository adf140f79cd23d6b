/*
 * TEST DOUBLE of CANN HCCL (built as libhccl.so by build.py; links against
 * the double's libascendcl.so for streams, device memory and faults).
 *
 * Point-to-point only, two ranks per communicator. HcclGetRootInfo opens a
 * listening abstract unix socket and writes its name into the root info.
 * In HcclCommInitRootInfo the rank whose process holds that listener
 * accepts, the other connects, each side opening two connections: one
 * carries data from the connecting rank to the accepting one, the other the
 * reverse. Every message is a 16-byte header and its payload; the receiver
 * acknowledges each message once it is in memory, and a send completes only
 * on that acknowledgement, so a send whose peer never posts the matching
 * receive does not complete (as with HCCL). Send, Recv and BatchSendRecv
 * are stream tasks; a batch moves its sends and receives concurrently.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cann_double.h"
#include "hccl_double_internal.h"

#define ROOT_MAGIC "CANNDBL1"
#define WIRE_MAGIC 0x4842444cu /* "LDBH" */

typedef struct {
    char magic[8];
    uint64_t id;
    int32_t pid;
} root_blob;

typedef struct root_listener {
    struct root_listener *next;
    uint64_t id;
    int fd;
    int claimed;
} root_listener;


typedef struct {
    uint32_t magic, rank, nranks, dir;
    uint64_t id;
} hello_msg;

typedef struct {
    uint32_t magic;
    int32_t status;
    uint64_t nbytes;
} wire_hdr; /* data header and acknowledgement alike */

static pthread_mutex_t g_hlock = PTHREAD_MUTEX_INITIALIZER;
static root_listener *g_listeners;
static dbl_comm *g_comms;

int hfail(int code, const char *fmt, const char *a)
{
    return hixl_double_fail(code, fmt, a);
}

DBL_EXPORT const char *HcclGetErrorString(HcclResult code)
{
    static const char *names[] = {
        "no error", "parameter error", "empty pointer", "memory error", "internal error",
        "not support feature", "not found specific resource", "resource unavailable",
        "call system interface error", "timeout", "open file fail", "tcp connect fail",
        "roce connect fail", "tcp transfer fail", "roce transfer fail", "call runtime api fail",
        "call driver api fail", "call profiling api fail", "call cce api fail",
        "call network api fail", "try again", "error cqe", "error communicator suspending",
        "retry constraint", "out of memory",
    };
    if (code >= 0 && (size_t)code < sizeof names / sizeof names[0])
        return names[code];
    return code == 1041 ? "the error information is in the status" : "unknown error";
}

int hccl_prologue(const char *api)
{
    int rc = hixl_double_fault_call(api);
    if (rc)
        return rc;
    if (!hixl_double_initialized() || hixl_double_current_device() < 0)
        return hfail(15 /* HCCL_E_RUNTIME */, "%s: no device is set on this thread", api);
    return 0;
}

static socklen_t root_address(const root_blob *b, struct sockaddr_un *a)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "cann-double-hccl-%d-%016llx",
                     (int)b->pid, (unsigned long long)b->id);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

DBL_EXPORT HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo)
{
    int rc = hccl_prologue("HcclGetRootInfo");
    if (rc)
        return rc;
    if (!rootInfo)
        return hfail(HCCL_E_PTR, "%s: rootInfo is NULL", "HcclGetRootInfo");
    root_blob b;
    memset(&b, 0, sizeof b);
    memcpy(b.magic, ROOT_MAGIC, 8);
    b.pid = (int32_t)getpid();
    if (getrandom(&b.id, sizeof b.id, 0) != (ssize_t)sizeof b.id)
        return hfail(HCCL_E_INTERNAL, "%s: no randomness", "HcclGetRootInfo");
    struct sockaddr_un a;
    socklen_t alen = root_address(&b, &a);
    root_listener *l = calloc(1, sizeof *l);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (!l || s < 0 || bind(s, (struct sockaddr *)&a, alen) != 0 || listen(s, 8) != 0) {
        if (s >= 0)
            close(s);
        free(l);
        return hfail(HCCL_E_TCP_CONNECT, "%s: cannot listen", "HcclGetRootInfo");
    }
    l->id = b.id;
    l->fd = s;
    pthread_mutex_lock(&g_hlock);
    l->next = g_listeners;
    g_listeners = l;
    pthread_mutex_unlock(&g_hlock);
    memset(rootInfo, 0, sizeof *rootInfo);
    memcpy(rootInfo->internal, &b, sizeof b);
    return HCCL_SUCCESS;
}

static root_listener *claim_listener(uint64_t id)
{
    pthread_mutex_lock(&g_hlock);
    root_listener *l = g_listeners;
    while (l && (l->id != id || l->claimed))
        l = l->next;
    if (l)
        l->claimed = 1;
    pthread_mutex_unlock(&g_hlock);
    return l;
}

static void drop_listener(root_listener *l)
{
    pthread_mutex_lock(&g_hlock);
    for (root_listener **pp = &g_listeners; *pp; pp = &(*pp)->next) {
        if (*pp == l) {
            *pp = l->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_hlock);
    close(l->fd);
    free(l);
}

/* Blocking-with-deadline transfer of exactly n bytes on a non-blocking fd.
 * Returns 0, or 2 on timeout, or -1 on EOF/error. */
int xfer_exact(int fd, void *buf, size_t n, int writing, uint64_t deadline)
{
    size_t done = 0;
    while (done < n) {
        ssize_t k = writing ? send(fd, (char *)buf + done, n - done, MSG_NOSIGNAL)
                            : recv(fd, (char *)buf + done, n - done, 0);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return -1;
        int w = dbl_wait_fd(fd, writing ? POLLOUT : POLLIN, NULL, 0, deadline);
        if (w)
            return w;
    }
    return 0;
}

static int accept_peers(root_listener *l, uint32_t rank, uint64_t deadline, int fds[2],
                        uint32_t *peer)
{
    fds[0] = fds[1] = -1;
    for (int got = 0; got < 2;) {
        if (dbl_wait_fd(l->fd, POLLIN, NULL, 0, deadline))
            return HCCL_E_TIMEOUT;
        int c = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0)
            continue;
        hello_msg h = {0};
        wire_hdr reply = {WIRE_MAGIC, 0, rank};
        int r = xfer_exact(c, &h, sizeof h, 0, deadline);
        /* dir 0 carries the connector's data to us: our input, fds[1] */
        int slot = h.dir == 0 ? 1 : 0;
        if (r || h.magic != WIRE_MAGIC || h.id != l->id || h.dir > 1 || fds[slot] >= 0) {
            close(c);
            if (r == 2)
                return HCCL_E_TIMEOUT;
            continue;
        }
        if (h.nranks != 2 || h.rank >= 2 || h.rank == rank)
            reply.status = HCCL_E_PARA;
        if (xfer_exact(c, &reply, sizeof reply, 1, deadline) || reply.status) {
            close(c);
            return reply.status ? reply.status : HCCL_E_TCP_CONNECT;
        }
        fds[slot] = c;
        *peer = h.rank;
        got++;
    }
    return 0;
}

static int connect_root(const root_blob *b, uint32_t rank, uint32_t dir, uint64_t deadline,
                        int *out, uint32_t *peer)
{
    struct sockaddr_un a;
    socklen_t alen = root_address(b, &a);
    for (;;) {
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0)
            return HCCL_E_TCP_CONNECT;
        if (connect(s, (struct sockaddr *)&a, alen) == 0) {
            fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
            hello_msg h = {WIRE_MAGIC, rank, 2, dir, b->id};
            wire_hdr reply;
            int r = xfer_exact(s, &h, sizeof h, 1, deadline);
            if (!r)
                r = xfer_exact(s, &reply, sizeof reply, 0, deadline);
            if (r || reply.magic != WIRE_MAGIC || reply.status) {
                close(s);
                return r == 2 ? HCCL_E_TIMEOUT : (r ? HCCL_E_TCP_CONNECT : reply.status);
            }
            *peer = (uint32_t)reply.nbytes;
            *out = s;
            return 0;
        }
        close(s);
        if (dbl_now_ms() >= deadline)
            return HCCL_E_TIMEOUT;
        usleep(10000);
    }
}

/* How long HCCL waits for a peer: HCCL_CONNECT_TIMEOUT seconds (CANN
 * environment variable reference; 120 s by default). Tests shorten it with
 * HIXL_DOUBLE_CONNECT_TIMEOUT_MS, which wins when both are set. */
uint64_t dbl_connect_deadline(void)
{
    const char *ms = getenv("HIXL_DOUBLE_CONNECT_TIMEOUT_MS");
    const char *s = getenv("HCCL_CONNECT_TIMEOUT");
    uint64_t wait = 120000u;
    if (ms && *ms)
        wait = strtoull(ms, NULL, 0);
    else if (s && *s)
        wait = strtoull(s, NULL, 0) * 1000u;
    return dbl_now_ms() + wait;
}

static HcclResult rendezvous(const char *api, const root_blob *bp, uint32_t rank,
                             const char *name, HcclComm *comm);
static HcclResult rendezvous_locked(const char *api, const root_blob *bp, uint32_t rank,
                                    const char *name, HcclComm *comm);

DBL_EXPORT HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo,
                                           uint32_t rank, HcclComm *comm)
{
    int rc = hccl_prologue("HcclCommInitRootInfo");
    if (rc)
        return rc;
    if (!rootInfo || !comm)
        return hfail(HCCL_E_PTR, "%s: NULL argument", "HcclCommInitRootInfo");
    if (nRanks != 2)
        return hfail(HCCL_E_NOT_SUPPORT, "%s: the double supports 2 ranks only", "HcclCommInitRootInfo");
    if (rank >= nRanks)
        return hfail(HCCL_E_PARA, "%s: rank out of range", "HcclCommInitRootInfo");
    root_blob b;
    memcpy(&b, rootInfo->internal, sizeof b);
    if (memcmp(b.magic, ROOT_MAGIC, 8))
        return hfail(HCCL_E_PARA, "%s: not a root info of the double", "HcclCommInitRootInfo");
    return rendezvous("HcclCommInitRootInfo", &b, rank, NULL, comm);
}

/* "HcclCommInitRootInfo" (CANN 8.x HCCL API reference): communicators of
 * one device are created by one thread at a time; the 8.0.RC2 page of
 * HcclCommInitRootInfoConfig asks for serial calls only. The double
 * refuses a creation on a device while another runs in the process. */
static int g_init_busy[64];

static int begin_init(const char *api)
{
    int dev = hixl_double_current_device();
    if (dev < 0 || dev >= 64)
        return hfail(15 /* HCCL_E_RUNTIME */, "%s: no device is set on this thread", api);
    pthread_mutex_lock(&g_hlock);
    int busy = g_init_busy[dev];
    if (!busy)
        g_init_busy[dev] = 1;
    pthread_mutex_unlock(&g_hlock);
    if (busy)
        return hixl_double_fail(7 /* HCCL_E_UNAVAIL */,
                                "%s: another communicator of device %d is being created "
                                "concurrently (CANN creates them one at a time per device)",
                                api, dev);
    return 0;
}

static void end_init(void)
{
    int dev = hixl_double_current_device();
    pthread_mutex_lock(&g_hlock);
    if (dev >= 0 && dev < 64)
        g_init_busy[dev] = 0;
    pthread_mutex_unlock(&g_hlock);
}

/* Both ranks meet at the root's listener (claimed by the rank whose process
 * holds it) and open their two connections. Creation blocks until the other
 * rank has joined, or HCCL_CONNECT_TIMEOUT passes, as HCCL's does: hcomm
 * topoinfo_exchange_agent.cc (TopoInfoExchangeAgent::Setup connects to the
 * root's exchange server with retries and waits for every rank's topology
 * before the creation call returns). So two processes that each hold their
 * creation lock waiting for the other (issue 30, defect 6) wait until the
 * timeout, here as with HCCL. */
static HcclResult rendezvous(const char *api, const root_blob *bp, uint32_t rank,
                             const char *name, HcclComm *comm)
{
    int rc = begin_init(api);
    if (rc)
        return rc;
    rc = rendezvous_locked(api, bp, rank, name, comm);
    end_init();
    return rc;
}

static HcclResult rendezvous_locked(const char *api, const root_blob *bp, uint32_t rank,
                                    const char *name, HcclComm *comm)
{
    root_blob b = *bp;
    int rc;
    uint64_t deadline = dbl_connect_deadline();

    int fds[2] = {-1, -1}; /* [0] out, [1] in */
    uint32_t peer = 0, peer2 = 0;
    root_listener *l = claim_listener(b.id);
    if (l) {
        rc = accept_peers(l, rank, deadline, fds, &peer);
        drop_listener(l);
    } else {
        rc = connect_root(&b, rank, 0, deadline, &fds[0], &peer);
        if (!rc)
            rc = connect_root(&b, rank, 1, deadline, &fds[1], &peer2);
    }
    dbl_comm *c = rc ? NULL : calloc(1, sizeof *c);
    int efd = c ? eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK) : -1;
    if (rc || efd < 0) {
        for (int i = 0; i < 2; i++)
            if (fds[i] >= 0)
                close(fds[i]);
        free(c);
        if (!rc)
            rc = HCCL_E_INTERNAL;
        return hfail(rc, "%s: rendezvous failed", api);
    }
    if (name)
        snprintf(c->name, sizeof c->name, "%s", name);
    pthread_mutex_init(&c->mu, NULL);
    c->refs = 1;
    c->rank = rank;
    c->peer = peer;
    c->out_fd = fds[0];
    c->in_fd = fds[1];
    c->abort_fd = efd;
    pthread_mutex_lock(&g_hlock);
    c->next = g_comms;
    g_comms = c;
    pthread_mutex_unlock(&g_hlock);
    hixl_double_count(DBL_LIVE_COMMS, 1);
    *comm = c;
    return HCCL_SUCCESS;
}

dbl_comm *comm_ref(HcclComm comm)
{
    pthread_mutex_lock(&g_hlock);
    dbl_comm *c = g_comms;
    while (c && c != comm)
        c = c->next;
    if (c)
        __atomic_add_fetch(&c->refs, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&g_hlock);
    return c;
}

/* Without the one-sided API in the build (build.py, one_sided=False) there is
 * no one-sided state to drop; hccl_double_onesided.c replaces this. */
__attribute__((weak)) void dbl_one_sided_free(dbl_comm *c)
{
    (void)c;
}

void comm_unref(dbl_comm *c)
{
    if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_SEQ_CST))
        return;
    dbl_one_sided_free(c); /* bindings and the peer's prepared memory */
    close(c->out_fd);
    close(c->in_fd);
    close(c->abort_fd);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

__attribute__((weak)) int dbl_one_sided_bound(dbl_comm *c)
{
    (void)c;
    return 0;
}

DBL_EXPORT HcclResult HcclCommDestroy(HcclComm comm)
{
    int rc = hixl_double_fault_call("HcclCommDestroy");
    if (rc)
        return rc;
    dbl_comm *c = comm_ref(comm);
    /* HcclOneSidedService::DeInit (hcomm hccl_one_sided_service.cc) refuses
     * to tear down a communicator that still has memory bound to it. */
    int bound = c ? dbl_one_sided_bound(c) : 0;
    if (c)
        comm_unref(c);
    if (bound)
        return hixl_double_fail(HCCL_E_PARA, "%s: %d memories are still bound to the "
                                "communicator; unbind them first", "HcclCommDestroy", bound);
    c = NULL;
    pthread_mutex_lock(&g_hlock);
    for (dbl_comm **pp = &g_comms; *pp; pp = &(*pp)->next) {
        if (*pp == comm) {
            c = *pp;
            *pp = c->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_hlock);
    if (!c)
        return hfail(HCCL_E_PARA, "%s: unknown communicator", "HcclCommDestroy");
    uint64_t one = 1;
    (void)!write(c->abort_fd, &one, sizeof one);
    shutdown(c->out_fd, SHUT_RDWR);
    shutdown(c->in_fd, SHUT_RDWR);
    hixl_double_count(DBL_LIVE_COMMS, -1);
    comm_unref(c);
    return HCCL_SUCCESS;
}


/* ------------------------------------------------------ point-to-point ops */

typedef struct {
    uint8_t *buf;
    uint64_t n;
} seg;

typedef struct {
    dbl_comm *c;
    int ns, nr;
    seg *sends, *recvs;
} p2p_op;

static void op_release(void *ctx)
{
    p2p_op *o = ctx;
    comm_unref(o->c);
    free(o->sends);
    free(o->recvs);
    free(o);
}

uint64_t dtype_size(HcclDataType dt)
{
    static const uint8_t sizes[] = {1, 2, 4, 2, 4, 8, 8, 1, 2, 4, 8, 2, 16};
    return dt >= 0 && (size_t)dt < sizeof sizes ? sizes[dt] : 0;
}

#define AGAIN() (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)

typedef struct {
    p2p_op *o;
    int s_idx, acks_in, r_idx, acks_out;
    uint64_t s_off, r_off;
    size_t ack_in_got, ack_out_off;
    wire_hdr s_hdr, ack_in, r_hdr;
    int sever, sever_code;
} p2p_state;

/* Writes as much of the pending sends as the socket takes. */
static int push_sends(p2p_state *st)
{
    dbl_comm *c = st->o->c;
    while (st->s_idx < st->o->ns) {
        seg *sg = &st->o->sends[st->s_idx];
        uint64_t total = sizeof(wire_hdr) + sg->n;
        ssize_t k;
        if (st->s_off < sizeof(wire_hdr)) {
            st->s_hdr = (wire_hdr){WIRE_MAGIC, 0, sg->n};
            k = send(c->out_fd, (char *)&st->s_hdr + st->s_off, sizeof(wire_hdr) - st->s_off,
                     MSG_NOSIGNAL);
        } else {
            uint64_t at = st->s_off - sizeof(wire_hdr), end = st->sever ? sg->n / 2 : sg->n;
            if (st->sever && at >= end) {
                /* injected link cut in the middle of the payload */
                shutdown(c->out_fd, SHUT_RDWR);
                shutdown(c->in_fd, SHUT_RDWR);
                return st->sever_code;
            }
            k = send(c->out_fd, sg->buf + at, (size_t)(end - at), MSG_NOSIGNAL);
        }
        if (k < 0 && AGAIN())
            return 0;
        if (k <= 0)
            return ACL_ERROR_RT_SUSPECT_REMOTE_ERROR;
        st->s_off += (uint64_t)k;
        if (st->s_off == total) {
            st->s_idx++;
            st->s_off = 0;
        }
    }
    return 0;
}

static int pull_acks(p2p_state *st)
{
    dbl_comm *c = st->o->c;
    while (st->acks_in < st->s_idx) {
        ssize_t k = recv(c->out_fd, (char *)&st->ack_in + st->ack_in_got,
                         sizeof(wire_hdr) - st->ack_in_got, 0);
        if (k < 0 && AGAIN())
            return 0;
        if (k <= 0)
            return ACL_ERROR_RT_SUSPECT_REMOTE_ERROR;
        st->ack_in_got += (size_t)k;
        if (st->ack_in_got < sizeof(wire_hdr))
            continue;
        st->ack_in_got = 0;
        if (st->ack_in.magic != WIRE_MAGIC)
            return ACL_ERROR_RT_INTERNAL_ERROR;
        if (st->ack_in.status)
            return st->ack_in.status;
        st->acks_in++;
    }
    return 0;
}

/* Reads the pending receives, never past the current message: bytes of the
 * peer's next operation stay in the socket for the next task. */
static int pull_recvs(p2p_state *st)
{
    dbl_comm *c = st->o->c;
    while (st->r_idx < st->o->nr) {
        seg *sg = &st->o->recvs[st->r_idx];
        ssize_t k;
        if (st->r_off < sizeof(wire_hdr))
            k = recv(c->in_fd, (char *)&st->r_hdr + st->r_off, sizeof(wire_hdr) - st->r_off, 0);
        else
            k = recv(c->in_fd, sg->buf + (st->r_off - sizeof(wire_hdr)),
                     (size_t)(sizeof(wire_hdr) + sg->n - st->r_off), 0);
        if (k < 0 && AGAIN())
            return 0;
        if (k <= 0)
            return ACL_ERROR_RT_SUSPECT_REMOTE_ERROR;
        st->r_off += (uint64_t)k;
        if (st->r_off == sizeof(wire_hdr) &&
            (st->r_hdr.magic != WIRE_MAGIC || st->r_hdr.nbytes != sg->n)) {
            wire_hdr nack = {WIRE_MAGIC, ACL_ERROR_RT_INTERNAL_ERROR, sg->n};
            (void)!send(c->in_fd, &nack, sizeof nack, MSG_NOSIGNAL | MSG_DONTWAIT);
            return ACL_ERROR_RT_INTERNAL_ERROR; /* sizes of send and recv differ */
        }
        if (st->r_off == sizeof(wire_hdr) + sg->n) {
            st->r_idx++;
            st->r_off = 0;
            st->acks_out++;
        }
    }
    return 0;
}

static int push_acks(p2p_state *st)
{
    dbl_comm *c = st->o->c;
    static const wire_hdr ack = {WIRE_MAGIC, 0, 0};
    while (st->acks_out) {
        ssize_t k = send(c->in_fd, (const char *)&ack + st->ack_out_off,
                         sizeof ack - st->ack_out_off, MSG_NOSIGNAL);
        if (k < 0 && AGAIN())
            return 0;
        if (k <= 0)
            return ACL_ERROR_RT_SUSPECT_REMOTE_ERROR;
        st->ack_out_off += (size_t)k;
        if (st->ack_out_off == sizeof ack) {
            st->ack_out_off = 0;
            st->acks_out--;
        }
    }
    return 0;
}

static int run_p2p(void *ctx, int abort_fd, dbl_fault fault)
{
    p2p_state st;
    memset(&st, 0, sizeof st);
    st.o = ctx;
    st.sever = fault.action == DBL_FAULT_SEVER && st.o->ns > 0;
    st.sever_code = fault.arg;
    dbl_comm *c = st.o->c;
    if (fault.action == DBL_FAULT_HANG) {
        int aborts[2] = {abort_fd, c->abort_fd};
        dbl_wait_fd(-1, 0, aborts, 2, 0);
        return ACL_ERROR_RT_STREAM_ABORT;
    }
    while (st.acks_in < st.o->ns || st.r_idx < st.o->nr || st.acks_out) {
        struct pollfd p[4] = {
            {abort_fd, POLLIN, 0},
            {c->abort_fd, POLLIN, 0},
            {c->out_fd, (short)((st.s_idx < st.o->ns ? POLLOUT : 0) |
                                (st.acks_in < st.s_idx ? POLLIN : 0)), 0},
            {c->in_fd, (short)((st.r_idx < st.o->nr ? POLLIN : 0) | (st.acks_out ? POLLOUT : 0)), 0},
        };
        /* an fd with nothing to wait for would report HUP forever */
        for (int i = 2; i < 4; i++)
            if (!p[i].events)
                p[i].fd = -1;
        if (poll(p, 4, -1) < 0)
            continue;
        if (p[0].revents || p[1].revents)
            return ACL_ERROR_RT_STREAM_ABORT;
        int rc = 0;
        if (p[2].revents)
            rc = push_sends(&st);
        if (!rc && p[2].revents)
            rc = pull_acks(&st);
        if (!rc && p[3].revents)
            rc = pull_recvs(&st);
        if (!rc && (p[3].revents || st.acks_out))
            rc = push_acks(&st);
        if (rc)
            return rc;
    }
    return 0;
}

/* Validates one buffer of a send or receive; returns its byte count in *n. */
static int check_buffer(const char *api, const dbl_comm *c, void *buf, uint64_t count,
                        HcclDataType dt, uint32_t peer, uint64_t *n)
{
    uint64_t size = dtype_size(dt);
    if (!buf)
        return hfail(HCCL_E_PTR, "%s: buffer is NULL", api);
    if (!size || count > UINT64_MAX / size)
        return hfail(HCCL_E_PARA, "%s: bad data type or count", api);
    if (peer != c->peer)
        return hfail(HCCL_E_PARA, "%s: remote rank is not the peer of this communicator", api);
    *n = count * size;
    if (*n && !hixl_double_is_device_range(buf, *n))
        return hfail(HCCL_E_PARA, "%s: buffer is not device memory", api);
    return 0;
}

#define LINK_MARK 0x4b4e494c /* "LINK": the first message each way on a communicator */

/* Reads exactly n bytes of in_fd before the deadline, unless the
 * communicator is destroyed meanwhile: 0, 1 destroyed, 2 timeout, -1 EOF. */
static int read_link(dbl_comm *c, void *buf, size_t n, uint64_t deadline)
{
    size_t done = 0;
    while (done < n) {
        ssize_t k = recv(c->in_fd, (char *)buf + done, n - done, 0);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return -1;
        int w = dbl_wait_fd(c->in_fd, POLLIN, &c->abort_fd, 1, deadline);
        if (w)
            return w;
    }
    return 0;
}

/* Lazy link set-up, as HCCL does it: the first Send, Recv or BatchSendRecv
 * host call on a communicator builds its links to the peer inside the call
 * and returns only once the peer made its own first call, or fails after
 * HCCL_CONNECT_TIMEOUT (hcomm hccl_communicator_host.cc: ExecOp ->
 * AllocAlgResource / IncreAllocLink; transport_manager.cc:
 * WaitLinksEstablishCompleted). Later calls only queue their task. */
static int ensure_linked(const char *api, dbl_comm *c)
{
    pthread_mutex_lock(&c->mu);
    if (c->linked) {
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    uint64_t deadline = dbl_connect_deadline();
    wire_hdr mine = {WIRE_MAGIC, LINK_MARK, 0}, theirs;
    int r = xfer_exact(c->out_fd, &mine, sizeof mine, 1, deadline);
    if (!r)
        r = read_link(c, &theirs, sizeof theirs, deadline);
    if (!r && (theirs.magic != WIRE_MAGIC || theirs.status != LINK_MARK))
        r = -1;
    c->linked = !r;
    pthread_mutex_unlock(&c->mu);
    if (r == 2)
        return hixl_double_fail(HCCL_E_TIMEOUT, "%s: the peer made no matching call within "
                                "HCCL_CONNECT_TIMEOUT (the first operation of a communicator "
                                "sets up its links and waits for the peer)", api);
    if (r)
        return hfail(HCCL_E_TCP_CONNECT, "%s: setting up the links to the peer failed", api);
    return 0;
}

static int submit_p2p(const char *api, const char *point, p2p_op *o, aclrtStream stream)
{
    int rc = ensure_linked(api, o->c);
    if (rc) {
        op_release(o);
        return rc;
    }
    if (hixl_double_stream_submit(stream, point, run_p2p, op_release, o))
        return hfail(15 /* HCCL_E_RUNTIME */, "%s: cannot enqueue on the stream", api);
    return HCCL_SUCCESS;
}

static HcclResult single_op(const char *api, const char *point, int sending, void *buf, uint64_t count,
                            HcclDataType dt, uint32_t peer, HcclComm comm, aclrtStream stream)
{
    int rc = hccl_prologue(api);
    if (rc)
        return rc;
    dbl_comm *c = comm_ref(comm);
    if (!c)
        return hfail(HCCL_E_PARA, "%s: unknown communicator", api);
    uint64_t n = 0;
    p2p_op *o = NULL;
    seg *sg = NULL;
    rc = check_buffer(api, c, buf, count, dt, peer, &n);
    if (!rc && (!(o = calloc(1, sizeof *o)) || !(sg = malloc(sizeof *sg))))
        rc = hfail(HCCL_E_MEMORY, "%s: out of memory", api);
    if (rc) {
        free(o);
        comm_unref(c);
        return rc;
    }
    sg->buf = buf;
    sg->n = n;
    o->c = c;
    if (sending) {
        o->sends = sg;
        o->ns = 1;
    } else {
        o->recvs = sg;
        o->nr = 1;
    }
    return submit_p2p(api, point, o, stream);
}

DBL_EXPORT HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType, uint32_t destRank,
                               HcclComm comm, aclrtStream stream)
{
    return single_op("HcclSend", "exec:HcclSend", 1, sendBuf, count, dataType, destRank, comm, stream);
}

DBL_EXPORT HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType, uint32_t srcRank,
                               HcclComm comm, aclrtStream stream)
{
    return single_op("HcclRecv", "exec:HcclRecv", 0, recvBuf, count, dataType, srcRank, comm, stream);
}

DBL_EXPORT HcclResult HcclBatchSendRecv(HcclSendRecvItem *sendRecvInfo, uint32_t itemNum, HcclComm comm,
                                        aclrtStream stream)
{
    const char *api = "HcclBatchSendRecv";
    int rc = hccl_prologue(api);
    if (rc)
        return rc;
    if (!sendRecvInfo || itemNum == 0)
        return hfail(HCCL_E_PTR, "%s: no items", api);
    dbl_comm *c = comm_ref(comm);
    if (!c)
        return hfail(HCCL_E_PARA, "%s: unknown communicator", api);
    p2p_op *o = calloc(1, sizeof *o);
    seg *sends = calloc(itemNum, sizeof *sends), *recvs = calloc(itemNum, sizeof *recvs);
    if (!o || !sends || !recvs)
        rc = hfail(HCCL_E_MEMORY, "%s: out of memory", api);
    for (uint32_t i = 0; !rc && i < itemNum; i++) {
        HcclSendRecvItem *it = &sendRecvInfo[i];
        uint64_t n = 0;
        if (it->sendRecvType != 0 && it->sendRecvType != 1) {
            rc = hfail(HCCL_E_PARA, "%s: bad item type", api);
            break;
        }
        rc = check_buffer(api, c, it->buf, it->count, it->dataType, it->remoteRank, &n);
        if (rc)
            break;
        /* CANN 8.0 HcclBatchSendRecv page (hcclcpp_07_0026, "约束说明"): the task
         * list must not hold two send tasks to, or two receive tasks from, the
         * same rank; the 8.2 HCCL user guide (hcclug_000011) allows one memory
         * block per direction between two ranks per call. */
        for (uint32_t j = 0; j < i; j++) {
            if (sendRecvInfo[j].sendRecvType == it->sendRecvType &&
                sendRecvInfo[j].remoteRank == it->remoteRank) {
                rc = hixl_double_fail(HCCL_E_PARA,
                                      "%s: items %u and %u are both %s rank %u; CANN allows one "
                                      "per rank and direction in a call",
                                      api, j, i, it->sendRecvType == 0 ? "sends to" : "receives from",
                                      it->remoteRank);
                break;
            }
        }
        if (rc)
            break;
        seg *dst = it->sendRecvType == 0 ? &sends[o->ns++] : &recvs[o->nr++];
        dst->buf = it->buf;
        dst->n = n;
    }
    if (rc) {
        free(o);
        free(sends);
        free(recvs);
        comm_unref(c);
        return rc;
    }
    o->c = c;
    o->sends = sends;
    o->recvs = recvs;
    return submit_p2p(api, "exec:HcclBatchSendRecv", o, stream);
}


/* --------------------------------------------- configured communicators */

/* hixl's view of HcclCommConfig: the 24-byte header HcclCommConfigInit
 * writes (size, magic word, version, reserved), then the version-1 and
 * version-2 fields ("HcclCommConfig", HCCL API reference). */
typedef struct {
    size_t size;
    uint32_t magic;
    uint32_t version;
    uint64_t reserved;
    uint32_t buffer_mb;
    uint32_t deterministic;
    char name[128];
} dbl_comm_config;

#define CONFIG_MAGIC 0xf0f0f0f0u
#define CONFIG_V1_SIZE 32u

/* "HcclCommInitClusterInfoConfig" / "HcclCommInitRootInfoConfig" (8.0 HCCL
 * API reference, hcclcpp_07_0004 / _0007): the config must come from
 * HcclCommConfigInit, hold values in range (hcclBufferSize >= 1 MB) and a
 * communicator name no other communicator of the process uses. */
static int check_config(const char *api, const void *config, char *name, uint32_t *buffer_mb)
{
    const dbl_comm_config *cfg = config;
    name[0] = '\0';
    if (!cfg)
        return hfail(HCCL_E_PTR, "%s: config is NULL", api);
    if (cfg->magic != CONFIG_MAGIC || cfg->version < 1 || cfg->size < CONFIG_V1_SIZE)
        return hfail(HCCL_E_PARA, "%s: config was not initialized by HcclCommConfigInit", api);
    /* HcclCommConfigInit leaves fields at 0xFFFFFFFF, "unset": the environment
     * (HCCL_BUFFSIZE, HCCL_DETERMINISTIC) or HCCL's defaults apply then. */
    if (cfg->buffer_mb == 0xFFFFFFFFu) {
        const char *env = getenv("HCCL_BUFFSIZE");
        *buffer_mb = env && *env ? (uint32_t)strtoul(env, NULL, 10) : 200u;
    } else if (cfg->buffer_mb < 1) {
        return hfail(HCCL_E_PARA, "%s: hcclBufferSize must be at least 1 (MB)", api);
    } else {
        *buffer_mb = cfg->buffer_mb;
    }
    if (cfg->deterministic != 0xFFFFFFFFu && cfg->deterministic > 1)
        return hfail(HCCL_E_PARA, "%s: hcclDeterministic must be 0, 1 or unset", api);
    if (cfg->version >= 2 && cfg->size >= sizeof *cfg) {
        memcpy(name, cfg->name, sizeof cfg->name);
        name[sizeof cfg->name - 1] = '\0';
    }
    if (!name[0])
        return 0;
    pthread_mutex_lock(&g_hlock);
    int taken = 0;
    for (dbl_comm *c = g_comms; c && !taken; c = c->next)
        taken = !strcmp(c->name, name);
    pthread_mutex_unlock(&g_hlock);
    if (taken)
        return hixl_double_fail(HCCL_E_PARA, "%s: communicator name %s is in use", api, name);
    return 0;
}

static void set_buffer(HcclComm comm, uint32_t buffer_mb)
{
    ((dbl_comm *)comm)->buffer_mb = buffer_mb;
}

DBL_EXPORT HcclResult HcclCommInitRootInfoConfig(uint32_t nRanks, const HcclRootInfo *rootInfo,
                                                 uint32_t rank, const void *config,
                                                 HcclComm *comm)
{
    const char *api = "HcclCommInitRootInfoConfig";
    int rc = hccl_prologue(api);
    if (rc)
        return rc;
    char name[128];
    uint32_t buffer_mb = 0;
    if (!rootInfo || !comm)
        return hfail(HCCL_E_PTR, "%s: NULL argument", api);
    if ((rc = check_config(api, config, name, &buffer_mb)))
        return rc;
    if (nRanks != 2)
        return hfail(HCCL_E_NOT_SUPPORT, "%s: the double supports 2 ranks only", api);
    if (rank >= nRanks)
        return hfail(HCCL_E_PARA, "%s: rank out of range", api);
    root_blob b;
    memcpy(&b, rootInfo->internal, sizeof b);
    if (memcmp(b.magic, ROOT_MAGIC, 8))
        return hfail(HCCL_E_PARA, "%s: not a root info of the double", api);
    rc = rendezvous(api, &b, rank, name, comm);
    if (!rc)
        set_buffer(*comm, buffer_mb);
    return rc;
}

/* The rank_id values of a rank table, in order (a scan of the JSON text for
 * "rank_id": "N" or "rank_id": N); returns how many, or -1. */
static int table_ranks(const char *t, uint32_t *ranks, int max)
{
    int n = 0;
    for (const char *p = strstr(t, "\"rank_id\""); p; p = strstr(p + 1, "\"rank_id\"")) {
        const char *q = p + strlen("\"rank_id\"");
        while (*q == ' ' || *q == ':' || *q == '"' || *q == '\t' || *q == '\n')
            q++;
        char *end = NULL;
        unsigned long v = strtoul(q, &end, 10);
        if (end == q || n == max)
            return -1;
        ranks[n++] = (uint32_t)v;
    }
    return n;
}

/* HcclCommInitClusterInfoMemConfig (HCCL's op_base.h; what HIXL builds its
 * two-rank communicators with): the rank table's JSON text itself, this
 * rank's rank_id in it, and a config as for HcclCommInitClusterInfoConfig
 * (hcclcpp_07_0004: the rank must equal its "rank_id" in the table). The
 * table follows CANN's rank table format ("Configuring Resource Information
 * Through the Ranktable File": version, server_count, server_list of
 * devices with device_id, device_ip, rank_id, and status "completed"). Both
 * ranks of the double meet at a listener named after the table's text and
 * the communicator name: rank 0 listens, rank 1 connects. */
DBL_EXPORT HcclResult HcclCommInitClusterInfoMemConfig(const char *rankTable, uint32_t rank,
                                                       void *config, HcclComm *comm)
{
    const char *api = "HcclCommInitClusterInfoMemConfig";
    int rc = hccl_prologue(api);
    if (rc)
        return rc;
    if (!rankTable || !comm)
        return hfail(HCCL_E_PTR, "%s: NULL argument", api);
    char name[128];
    uint32_t buffer_mb = 0;
    if ((rc = check_config(api, config, name, &buffer_mb)))
        return rc;
    /* hcomm op_base.cc, HcclCommInitClusterInfoMemConfig: "hcclCommName is error" */
    if (!name[0])
        return hixl_double_fail(HCCL_E_PARA, "%s: the config names no communicator "
                                "(hcclCommName is empty)", api);
    static const char *const needed[] = {"\"version\"", "\"server_count\"", "\"server_list\"",
                                         "\"device_id\"", "\"status\""};
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++)
        if (!strstr(rankTable, needed[i]))
            return hixl_double_fail(HCCL_E_PARA, "%s: the rank table lacks %s", api, needed[i]);
    /* Version 1.2 (Atlas A3): hcomm topoinfo_ranktableConcise.cc reads each
     * device's super_device_id (GetSingleSuperDeviceId) and the
     * super_pod_list (GetSuperPodList); a table lacking them is refused. */
    const char *ver = strstr(rankTable, "\"version\"");
    if (ver)
        ver += strlen("\"version\"");
    while (ver && (*ver == ' ' || *ver == ':' || *ver == '\t'))
        ver++;
    if (ver && strncmp(ver, "\"1.2\"", 5) == 0) {
        int devices = 0, super_ids = 0;
        for (const char *p = rankTable; (p = strstr(p, "\"device_id\"")); p++)
            devices++;
        for (const char *p = rankTable; (p = strstr(p, "\"super_device_id\"")); p++)
            super_ids++;
        if (super_ids != devices || !strstr(rankTable, "\"super_pod_list\""))
            return hixl_double_fail(HCCL_E_PARA, "%s: a version 1.2 rank table needs every "
                                    "device's super_device_id and a super_pod_list", api);
    }
    uint32_t ranks[8];
    int n = table_ranks(rankTable, ranks, 8);
    if (n != 2)
        return hixl_double_fail(n < 0 ? HCCL_E_PARA : HCCL_E_NOT_SUPPORT,
                                "%s: the double supports rank tables of 2 ranks (found %d)", api, n);
    if (!((ranks[0] == 0 && ranks[1] == 1) || (ranks[0] == 1 && ranks[1] == 0)))
        return hixl_double_fail(HCCL_E_PARA, "%s: rank_ids must be 0 and 1", api);
    if (rank > 1)
        return hixl_double_fail(HCCL_E_PARA, "%s: rank %u is no rank_id of the table", api, rank);
    root_blob b;
    memset(&b, 0, sizeof b);
    memcpy(b.magic, ROOT_MAGIC, 8);
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the table and the name */
    for (const char *p = rankTable; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    b.id = h;
    b.pid = 0;
    if (rank == 0) {
        struct sockaddr_un a;
        socklen_t alen = root_address(&b, &a);
        root_listener *l = calloc(1, sizeof *l);
        int sfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (!l || sfd < 0 || bind(sfd, (struct sockaddr *)&a, alen) != 0 || listen(sfd, 8) != 0) {
            if (sfd >= 0)
                close(sfd);
            free(l);
            return hfail(HCCL_E_TCP_CONNECT, "%s: cannot listen (a communicator of this table "
                         "and name exists)", api);
        }
        l->id = b.id;
        l->fd = sfd;
        pthread_mutex_lock(&g_hlock);
        l->next = g_listeners;
        g_listeners = l;
        pthread_mutex_unlock(&g_hlock);
    }
    rc = rendezvous(api, &b, rank, name, comm);
    if (!rc) {
        set_buffer(*comm, buffer_mb);
    } else if (rank == 0) {
        root_listener *l = claim_listener(b.id);
        if (l)
            drop_listener(l);
    }
    return rc;
}

/* For tests: the HCCL buffer (MB) a communicator was configured with. */
DBL_EXPORT int hixl_double_comm_buffer_mb(HcclComm comm)
{
    dbl_comm *c = comm_ref(comm);
    if (!c)
        return -1;
    int n = (int)c->buffer_mb;
    comm_unref(c);
    return n;
}

/* For tests: whether a communicator of `device` is being created now. */
DBL_EXPORT int hixl_double_init_busy(int device)
{
    if (device < 0 || device >= 64)
        return -1;
    pthread_mutex_lock(&g_hlock);
    int busy = g_init_busy[device];
    pthread_mutex_unlock(&g_hlock);
    return busy;
}
