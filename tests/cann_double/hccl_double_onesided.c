/*
 * TEST DOUBLE of CANN HCCL's one-sided API (part of libhccl.so, see
 * build.py; left out of the build with `one_sided=False`, so that hixl's
 * fallback runs against a libhccl.so without these entry points).
 *
 * Registration is process-wide (HcclRegisterGlobalMem keeps the memory's
 * memfd); binding attaches registered memory to one communicator; and
 * HcclCommPrepare, called by both ranks, sends each rank's bound memory (its
 * addresses, sizes and memfds, over the communicator's unix sockets) to the
 * other, which maps it. HcclBatchGet / HcclBatchPut are then stream tasks
 * that copy between local bound memory and the peer's mapping: the peer
 * process does nothing per transfer, as with HCCL.
 *
 * With HIXL_DOUBLE_ONE_SIDED=0 in the environment every entry point here
 * returns HCCL_E_NOT_SUPPORT, as on a product whose HCCL exports the API but
 * does not support it (a process that must share its libraries with one
 * using the API, like a test's client, cannot use the build without them).
 *
 * The argument rules, and where each comes from (CANN's open-source HCCL,
 * src/.../hccl_one_sided_services.cc of the hcomm repository, which is what
 * the CANN API reference documents for these entry points; HIXL's
 * comm_channel.cc and its RegisterMem page for the usage rules):
 *
 * - HcclRegisterGlobalMem: mem and memHandle non-NULL (HCCL_E_PTR); type
 *   DEVICE or HOST, size > 0, a DEVICE range at most 64 GiB
 *   (ONE_SIDE_DEVICE_MEM_MAX_SIZE), HCCL_E_PARA otherwise. Registering the
 *   very range again answers the handle it already has (one record, no
 *   count: one deregistration ends it); a range overlapping another of the
 *   same memory type and device is refused (HCCL_E_PARA): global_mem_manager.cc
 *   (GlobalMemRegMgr::CheckOverlapAndInsert; records are ordered by type and
 *   device first, global_mem_record.h). The double registers device memory
 *   only (HOST: HCCL_E_NOT_SUPPORT).
 * - HcclDeregisterGlobalMem: a valid handle (HcclMemHandleParamCheck,
 *   HCCL_E_PARA); refused while bound to a communicator (HCCL_E_PARA,
 *   GlobalMemRegMgr::DeReg: "please unbind from all bound comm first").
 * - HcclCommBindMem / HcclCommUnbindMem: comm non-NULL, a valid handle
 *   (HCCL_E_PARA); binding twice and unbinding what is not bound are
 *   refused. Binding only records the memory (HcclOneSidedService::BindMem):
 *   the peer learns of it when the communicator is prepared
 *   (PrepareFullMesh -> RegisterBoundMems, ExchangeMemDescFullMesh), so a
 *   binding after HcclCommPrepare succeeds and the peer never sees it.
 *   Unbinding only drops the record too: the peer keeps its mapping of the
 *   memory until its own communicator is destroyed (DeInit ->
 *   DisableMemAccess, hccl_one_sided_service.cc).
 * - HcclCommDestroy (hccl_double.c) with memory still bound fails with
 *   HCCL_E_PARA (HcclOneSidedService::DeInit: "There are memories still
 *   bound to this comm").
 * - HcclCommPrepare: comm and config non-NULL (HCCL_E_PTR); timeout >= -1
 *   (seconds; 0: HCCL_CONNECT_TIMEOUT), else HCCL_E_PARA; blocks until the
 *   peer prepared too, HCCL_E_TIMEOUT otherwise. A second prepare succeeds
 *   and does nothing (HcclOneSidedService::Prepare: "has prepared").
 * - HcclBatchGet / HcclBatchPut: what the host call checks
 *   (one_sided_service_adapt.cc, HcclBatchParaCheck): comm, desc and stream
 *   non-NULL (HCCL_E_PTR); descNum 0 succeeds doing nothing; descNum above
 *   256 (MAX_DESC_NUM) and a remoteRank that is not another rank of the
 *   communicator are HCCL_E_PARA. The ranges themselves are only met when
 *   the task runs on the device, so the double checks them in the stream
 *   task and fails the stream (the next synchronize answers
 *   ACL_ERROR_RT_INTERNAL_ERROR): the communicator must be prepared, each
 *   descriptor needs non-NULL addresses and a valid data type, the local
 *   range must lie in memory bound to it, and the remote range in memory
 *   the peer had bound when it prepared.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cann_double.h"
#include "hccl_double_internal.h"

#define MAX_DESC_NUM 256u
#define DEVICE_MEM_MAX ((uint64_t)64 << 30)
#define MAX_BOUND 64 /* per communicator, within one SCM_RIGHTS message */
#define PREP_MAGIC 0x50455250u /* "PREP" */

typedef struct gmem {
    struct gmem *next;
    uint8_t *addr;
    uint64_t size;
    int type, device; /* overlaps count within one memory type and device */
    uint8_t *alloc_base; /* the allocation's start: the memfd's offset 0 */
    int fd;
    int binds;
} gmem;

typedef struct {
    uint64_t addr, size; /* in the peer's process */
    uint8_t *map;        /* here */
    size_t map_len;
    uint64_t map_off;    /* addr's offset inside the mapping */
} peer_mem;

typedef struct dbl_one_sided {
    gmem *bound[MAX_BOUND];
    int nbound;
    int prepared;
    peer_mem peer[MAX_BOUND];
    int npeer;
} dbl_one_sided;

typedef struct {
    uint32_t magic, count;
} prep_hdr;

typedef struct {
    uint64_t addr, size, file_off;
} prep_entry;

static pthread_mutex_t g_olock = PTHREAD_MUTEX_INITIALIZER; /* globals and comm state */
static gmem *g_gmems;

/* HCCL_E_NOT_SUPPORT when HIXL_DOUBLE_ONE_SIDED=0, else 0. */
static int unsupported(const char *api)
{
    const char *env = getenv("HIXL_DOUBLE_ONE_SIDED");
    if (env && strcmp(env, "0") == 0)
        return hfail(HCCL_E_NOT_SUPPORT, "%s: one-sided HCCL is off (HIXL_DOUBLE_ONE_SIDED=0)",
                     api);
    return 0;
}

static gmem *find_gmem_locked(const void *handle)
{
    for (gmem *m = g_gmems; m; m = m->next)
        if (m == handle)
            return m;
    return NULL;
}

static dbl_one_sided *state_of_locked(dbl_comm *c)
{
    if (!c->one_sided)
        c->one_sided = calloc(1, sizeof *c->one_sided);
    return c->one_sided;
}

void dbl_one_sided_free(dbl_comm *c)
{
    dbl_one_sided *s = c->one_sided;
    if (!s)
        return;
    pthread_mutex_lock(&g_olock);
    for (int i = 0; i < s->nbound; i++)
        s->bound[i]->binds--;
    pthread_mutex_unlock(&g_olock);
    for (int i = 0; i < s->npeer; i++)
        munmap(s->peer[i].map, s->peer[i].map_len);
    free(s);
    c->one_sided = NULL;
}

int dbl_one_sided_bound(dbl_comm *c)
{
    pthread_mutex_lock(&g_olock);
    int n = c->one_sided ? c->one_sided->nbound : 0;
    pthread_mutex_unlock(&g_olock);
    return n;
}

DBL_EXPORT HcclResult HcclRegisterGlobalMem(const void *mem_arg, void **memHandle)
{
    const char *api = "HcclRegisterGlobalMem";
    const struct {
        int type;
        void *addr;
        uint64_t size;
    } *mem = mem_arg; /* HcclMem */
    int rc = hccl_prologue(api);
    if (!rc)
        rc = unsupported(api);
    if (rc)
        return rc;
    if (!mem || !memHandle || !mem->addr)
        return hfail(HCCL_E_PTR, "%s: NULL argument", api);
    if (mem->type != 0 && mem->type != 1)
        return hfail(HCCL_E_PARA, "%s: memory type must be device or host", api);
    if (mem->type == 1)
        return hfail(HCCL_E_NOT_SUPPORT, "%s: the double registers device memory only", api);
    if (mem->size == 0 || mem->size > DEVICE_MEM_MAX)
        return hfail(HCCL_E_PARA, "%s: size must be in (0, 64 GiB]", api);
    gmem *g = calloc(1, sizeof *g);
    uint64_t alloc_size = 0;
    if (!g)
        return hfail(HCCL_E_MEMORY, "%s: out of memory", api);
    if (hixl_double_device_fd(mem->addr, mem->size, &g->alloc_base, &alloc_size, &g->fd)) {
        free(g);
        return hfail(HCCL_E_PARA, "%s: the range is not device memory of this process", api);
    }
    g->addr = mem->addr;
    g->size = mem->size;
    g->type = mem->type;
    g->device = hixl_double_current_device();
    pthread_mutex_lock(&g_olock);
    for (gmem *o = g_gmems; o; o = o->next) {
        if (o->type != g->type || o->device != g->device)
            continue;
        if (o->addr == g->addr && o->size == g->size) { /* the same record: its handle */
            pthread_mutex_unlock(&g_olock);
            close(g->fd);
            free(g);
            *memHandle = o;
            return HCCL_SUCCESS;
        }
        if (g->addr < o->addr + o->size && o->addr < g->addr + g->size) {
            pthread_mutex_unlock(&g_olock);
            close(g->fd);
            free(g);
            return hfail(HCCL_E_PARA, "%s: the range overlaps registered memory", api);
        }
    }
    g->next = g_gmems;
    g_gmems = g;
    pthread_mutex_unlock(&g_olock);
    hixl_double_count(DBL_LIVE_GLOBAL_MEMS, 1);
    *memHandle = g;
    return HCCL_SUCCESS;
}

DBL_EXPORT HcclResult HcclDeregisterGlobalMem(void *memHandle)
{
    const char *api = "HcclDeregisterGlobalMem";
    int rc = hixl_double_fault_call(api);
    if (rc)
        return rc;
    pthread_mutex_lock(&g_olock);
    gmem *g = find_gmem_locked(memHandle);
    if (!g || g->binds) {
        pthread_mutex_unlock(&g_olock);
        return hfail(HCCL_E_PARA, g ? "%s: the memory is still bound to a communicator"
                                    : "%s: not a registered memory handle", api);
    }
    for (gmem **pp = &g_gmems; *pp; pp = &(*pp)->next) {
        if (*pp == g) {
            *pp = g->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_olock);
    close(g->fd);
    free(g);
    hixl_double_count(DBL_LIVE_GLOBAL_MEMS, -1);
    return HCCL_SUCCESS;
}

static HcclResult bind_op(const char *api, HcclComm comm, void *memHandle, int binding)
{
    int rc = hccl_prologue(api);
    if (!rc)
        rc = unsupported(api);
    if (rc)
        return rc;
    dbl_comm *c = comm ? comm_ref(comm) : NULL;
    if (!c)
        return hfail(comm ? HCCL_E_PARA : HCCL_E_PTR, "%s: unknown communicator", api);
    const char *why = NULL;
    pthread_mutex_lock(&g_olock);
    gmem *g = find_gmem_locked(memHandle);
    dbl_one_sided *s = state_of_locked(c);
    int at = -1;
    for (int i = 0; s && i < s->nbound; i++)
        if (s->bound[i] == g)
            at = i;
    if (!s)
        why = "%s: out of memory";
    else if (!g)
        why = "%s: not a registered memory handle";
    else if (binding && at >= 0)
        why = "%s: the memory is already bound to this communicator";
    else if (binding && s->nbound == MAX_BOUND)
        why = "%s: the double binds at most 64 memories per communicator";
    else if (!binding && at < 0)
        why = "%s: the memory is not bound to this communicator";
    if (!why && binding) {
        s->bound[s->nbound++] = g;
        g->binds++;
    } else if (!why) {
        s->bound[at] = s->bound[--s->nbound];
        g->binds--;
    }
    pthread_mutex_unlock(&g_olock);
    comm_unref(c);
    return why ? hfail(HCCL_E_PARA, why, api) : HCCL_SUCCESS;
}

DBL_EXPORT HcclResult HcclCommBindMem(HcclComm comm, void *memHandle)
{
    return bind_op("HcclCommBindMem", comm, memHandle, 1);
}

DBL_EXPORT HcclResult HcclCommUnbindMem(HcclComm comm, void *memHandle)
{
    return bind_op("HcclCommUnbindMem", comm, memHandle, 0);
}

/* Sends our bound memory (entries and memfds in one message) on out_fd. */
static int send_table(dbl_comm *c, dbl_one_sided *s, uint64_t deadline)
{
    struct {
        prep_hdr h;
        prep_entry e[MAX_BOUND];
    } msg;
    int fds[MAX_BOUND];
    memset(&msg, 0, sizeof msg);
    msg.h.magic = PREP_MAGIC;
    msg.h.count = (uint32_t)s->nbound;
    for (int i = 0; i < s->nbound; i++) {
        gmem *g = s->bound[i];
        msg.e[i] = (prep_entry){(uint64_t)(uintptr_t)g->addr, g->size,
                                (uint64_t)(g->addr - g->alloc_base)};
        fds[i] = g->fd;
    }
    size_t len = sizeof msg.h + (size_t)s->nbound * sizeof(prep_entry);
    char ctl[CMSG_SPACE(sizeof fds)];
    struct iovec iov = {&msg, len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (s->nbound) {
        memset(ctl, 0, sizeof ctl);
        mh.msg_control = ctl;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)s->nbound);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)s->nbound);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)s->nbound);
    }
    for (;;) {
        ssize_t k = sendmsg(c->out_fd, &mh, MSG_NOSIGNAL);
        if (k == (ssize_t)len)
            return 0;
        if (k >= 0) /* the fds went with the first byte */
            return xfer_exact(c->out_fd, (char *)&msg + k, len - (size_t)k, 1, deadline);
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return -1;
        if (dbl_wait_fd(c->out_fd, POLLOUT, NULL, 0, deadline))
            return 2;
    }
}

/* Receives the peer's table on in_fd and maps its memory. */
static int recv_table(dbl_comm *c, dbl_one_sided *s, uint64_t deadline)
{
    prep_hdr h;
    char ctl[CMSG_SPACE(sizeof(int) * MAX_BOUND)];
    int fds[MAX_BOUND], nfds = 0;
    ssize_t k;
    for (;;) {
        struct iovec iov = {&h, sizeof h};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                            .msg_controllen = sizeof ctl};
        k = recvmsg(c->in_fd, &mh, MSG_CMSG_CLOEXEC);
        if (k > 0) {
            for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
                if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
                    nfds = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                    memcpy(fds, CMSG_DATA(cm), sizeof(int) * (size_t)nfds);
                }
            break;
        }
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return -1;
        int w = dbl_wait_fd(c->in_fd, POLLIN, NULL, 0, deadline);
        if (w)
            return w;
    }
    int rc = xfer_exact(c->in_fd, (char *)&h + k, sizeof h - (size_t)k, 0, deadline);
    prep_entry e[MAX_BOUND];
    if (!rc && (h.magic != PREP_MAGIC || h.count > MAX_BOUND || h.count != (uint32_t)nfds))
        rc = -1;
    if (!rc)
        rc = xfer_exact(c->in_fd, e, h.count * sizeof(prep_entry), 0, deadline);
    for (int i = 0; i < nfds; i++) {
        if (!rc) {
            size_t len = (size_t)(e[i].file_off + e[i].size);
            void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
            if (p == MAP_FAILED) {
                rc = -1;
            } else {
                s->peer[s->npeer++] = (peer_mem){e[i].addr, e[i].size, p, len, e[i].file_off};
            }
        }
        close(fds[i]);
    }
    return rc;
}

DBL_EXPORT HcclResult HcclCommPrepare(HcclComm comm, const void *prepareConfig, int32_t timeout)
{
    const char *api = "HcclCommPrepare";
    int rc = hccl_prologue(api);
    if (!rc)
        rc = unsupported(api);
    if (rc)
        return rc;
    if (!comm || !prepareConfig)
        return hfail(HCCL_E_PTR, "%s: NULL argument", api);
    if (timeout < -1)
        return hfail(HCCL_E_PARA, "%s: timeout must be -1 (none) or >= 0 seconds", api);
    dbl_comm *c = comm_ref(comm);
    if (!c)
        return hfail(HCCL_E_PARA, "%s: unknown communicator", api);
    pthread_mutex_lock(&g_olock);
    dbl_one_sided *s = state_of_locked(c);
    int again = s && s->prepared;
    if (s)
        s->prepared = 1; /* what is bound from here on stays unknown to the peer */
    pthread_mutex_unlock(&g_olock);
    if (!s) {
        comm_unref(c);
        return hfail(HCCL_E_MEMORY, "%s: out of memory", api);
    }
    if (again) { /* HcclOneSidedService::Prepare: a prepared communicator succeeds at once */
        comm_unref(c);
        return HCCL_SUCCESS;
    }
    uint64_t deadline = timeout == -1 ? 0
                        : timeout > 0 ? dbl_now_ms() + (uint64_t)timeout * 1000u
                                      : dbl_connect_deadline();
    rc = send_table(c, s, deadline);
    if (!rc)
        rc = recv_table(c, s, deadline);
    comm_unref(c);
    if (rc)
        return hfail(rc == 2 ? HCCL_E_TIMEOUT : HCCL_E_TCP_CONNECT,
                     "%s: exchanging memory with the peer failed", api);
    return HCCL_SUCCESS;
}

typedef struct {
    void *localAddr;
    void *remoteAddr;
    uint64_t count;
    HcclDataType dataType;
} one_side_desc; /* HcclOneSideOpDesc */

typedef struct {
    dbl_comm *c;
    int put;
    uint32_t n;
    one_side_desc desc[]; /* copied at queue time, checked when the task runs */
} one_sided_op;

static void op_free(void *ctx)
{
    one_sided_op *o = ctx;
    comm_unref(o->c);
    free(o);
}

/* The peer's mapping of [addr, addr + n) in its process, or NULL. */
static uint8_t *peer_range_locked(const dbl_one_sided *s, const void *addr, uint64_t n)
{
    uint64_t a = (uint64_t)(uintptr_t)addr;
    for (int i = 0; i < s->npeer; i++) {
        const peer_mem *p = &s->peer[i];
        if (a >= p->addr && a < p->addr + p->size && n <= p->addr + p->size - a)
            return p->map + p->map_off + (a - p->addr);
    }
    return NULL;
}

static int local_bound_locked(const dbl_one_sided *s, const void *addr, uint64_t n)
{
    const uint8_t *a = addr;
    for (int i = 0; i < s->nbound; i++) {
        const gmem *g = s->bound[i];
        if (a >= g->addr && a < g->addr + g->size && n <= (uint64_t)(g->addr + g->size - a))
            return 1;
    }
    return 0;
}

/* Resolves descriptor i to (local, remote-mapping, bytes), or says why not. */
static const char *resolve_locked(const one_sided_op *o, uint32_t i, uint8_t **remote,
                                  uint64_t *bytes)
{
    const dbl_one_sided *s = o->c->one_sided;
    const one_side_desc *d = &o->desc[i];
    uint64_t size = dtype_size(d->dataType);
    if (!s || !s->prepared)
        return "the communicator was not prepared (HcclCommPrepare)";
    if (!d->localAddr || !d->remoteAddr)
        return "a descriptor has a NULL address";
    if (!size || d->count > UINT64_MAX / size)
        return "a descriptor has a bad data type or count";
    *bytes = d->count * size;
    if (!local_bound_locked(s, d->localAddr, *bytes))
        return "a local range is not in memory bound to the communicator";
    *remote = peer_range_locked(s, d->remoteAddr, *bytes);
    if (!*remote)
        return "a remote range is not in memory the peer bound before preparing";
    return NULL;
}

static int run_one_sided(void *ctx, int abort_fd, dbl_fault fault)
{
    one_sided_op *o = ctx;
    if (fault.action == DBL_FAULT_HANG) {
        int aborts[2] = {abort_fd, o->c->abort_fd};
        dbl_wait_fd(-1, 0, aborts, 2, 0);
        return ACL_ERROR_RT_STREAM_ABORT;
    }
    if (fault.action == DBL_FAULT_SEVER)
        return fault.arg;
    const char *why = NULL;
    pthread_mutex_lock(&g_olock);
    for (uint32_t i = 0; !why && i < o->n; i++) {
        uint8_t *remote = NULL, *local = o->desc[i].localAddr;
        uint64_t bytes = 0;
        why = resolve_locked(o, i, &remote, &bytes);
        if (!why && o->put)
            memcpy(remote, local, bytes);
        else if (!why)
            memcpy(local, remote, bytes);
    }
    pthread_mutex_unlock(&g_olock);
    if (why)
        return hixl_double_fail(ACL_ERROR_RT_INTERNAL_ERROR, "%s task: %s",
                                o->put ? "HcclBatchPut" : "HcclBatchGet", why);
    return 0;
}

static HcclResult batch(const char *api, const char *point, int put, HcclComm comm,
                        uint32_t remoteRank, one_side_desc *desc, uint32_t descNum,
                        aclrtStream stream)
{
    int rc = hccl_prologue(api);
    if (!rc)
        rc = unsupported(api);
    if (rc)
        return rc;
    if (!comm || !desc || !stream)
        return hfail(HCCL_E_PTR, "%s: NULL argument", api);
    if (descNum == 0)
        return HCCL_SUCCESS;
    if (descNum > MAX_DESC_NUM)
        return hixl_double_fail(HCCL_E_PARA, "%s: %u descriptors exceed the specification (%u)",
                                api, descNum, MAX_DESC_NUM);
    dbl_comm *c = comm_ref(comm);
    if (!c)
        return hfail(HCCL_E_PARA, "%s: unknown communicator", api);
    if (remoteRank >= 2 || remoteRank == c->rank) {
        comm_unref(c);
        return hfail(HCCL_E_PARA, "%s: remoteRank must be the other rank of the communicator",
                     api);
    }
    one_sided_op *o = calloc(1, sizeof *o + descNum * sizeof o->desc[0]);
    if (!o) {
        comm_unref(c);
        return hfail(HCCL_E_MEMORY, "%s: out of memory", api);
    }
    memcpy(o->desc, desc, descNum * sizeof o->desc[0]);
    o->n = descNum;
    o->c = c;
    o->put = put;
    if (hixl_double_stream_submit(stream, point, run_one_sided, op_free, o))
        return hfail(15 /* HCCL_E_RUNTIME */, "%s: cannot enqueue on the stream", api);
    return HCCL_SUCCESS;
}

DBL_EXPORT HcclResult HcclBatchPut(HcclComm comm, uint32_t remoteRank, void *desc,
                                   uint32_t descNum, aclrtStream stream)
{
    return batch("HcclBatchPut", "exec:HcclBatchPut", 1, comm, remoteRank, desc, descNum,
                 stream);
}

DBL_EXPORT HcclResult HcclBatchGet(HcclComm comm, uint32_t remoteRank, void *desc,
                                   uint32_t descNum, aclrtStream stream)
{
    return batch("HcclBatchGet", "exec:HcclBatchGet", 0, comm, remoteRank, desc, descNum,
                 stream);
}
