/*
 * TEST DOUBLE of CANN's ACL runtime (built as libascendcl.so by build.py).
 *
 * Devices are simulated: "device memory" is host memory from a memfd
 * (so that another process can import it by IPC key), streams are worker
 * threads executing their tasks in order, and errors are CANN's public
 * error codes. See cann_double.h and __init__.py for what is simulated and
 * how to inject faults. Nothing here talks to an accelerator.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "cann_double.h"

#include "acl_double_internal.h"

pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_release_cv = PTHREAD_COND_INITIALIZER;
static unsigned g_release_gen;
int g_initialized;
int g_device_count = -1; /* -1: read the environment at aclInit */
static uint64_t g_mem_limit;
static uint64_t g_mem_used[MAX_DEVICES];
dbl_mem *g_mems;
static fault_slot g_faults[MAX_FAULTS];
static long g_live[DBL_LIVE_KINDS];
static int g_env_faults_loaded;

__thread int t_device = -1;
static __thread char t_errmsg[512];
static __thread int t_has_errmsg;

/* ------------------------------------------------------------------ errors */

DBL_EXPORT int hixl_double_fail(int code, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(t_errmsg, sizeof t_errmsg, "EH9999: [cann-double] ");
    va_start(ap, fmt);
    vsnprintf(t_errmsg + n, sizeof t_errmsg - (size_t)n, fmt, ap);
    va_end(ap);
    t_has_errmsg = 1;
    return code;
}

DBL_EXPORT const char *aclGetRecentErrMsg(void)
{
    if (!t_has_errmsg)
        return NULL;
    t_has_errmsg = 0;
    return t_errmsg;
}

/* ------------------------------------------------------------------ faults */

static int parse_fault_action(const char *s)
{
    if (!strcmp(s, "fail"))
        return DBL_FAULT_FAIL;
    if (!strcmp(s, "delay"))
        return DBL_FAULT_DELAY;
    if (!strcmp(s, "hang"))
        return DBL_FAULT_HANG;
    if (!strcmp(s, "sever"))
        return DBL_FAULT_SEVER;
    return DBL_FAULT_NONE;
}

static int inject_locked(const char *point, int action, int arg, int count, int skip)
{
    if (!point || strlen(point) >= sizeof g_faults[0].point || action < DBL_FAULT_NONE ||
        action > DBL_FAULT_SEVER)
        return -1;
    fault_slot *free_slot = NULL;
    for (int i = 0; i < MAX_FAULTS; i++) {
        if (g_faults[i].point[0] && !strcmp(g_faults[i].point, point)) {
            free_slot = &g_faults[i];
            break;
        }
        if (!g_faults[i].point[0] && !free_slot)
            free_slot = &g_faults[i];
    }
    if (!free_slot)
        return -1;
    if (action == DBL_FAULT_NONE || count == 0) {
        memset(free_slot, 0, sizeof *free_slot);
        return 0;
    }
    snprintf(free_slot->point, sizeof free_slot->point, "%s", point);
    free_slot->action = action;
    free_slot->arg = arg;
    free_slot->count = count;
    free_slot->skip = skip;
    return 0;
}

/* HIXL_DOUBLE_FAULTS="point=action[:arg[:count[:skip]]];..." */
static void load_env_faults_locked(void)
{
    if (g_env_faults_loaded)
        return;
    g_env_faults_loaded = 1;
    const char *env = getenv("HIXL_DOUBLE_FAULTS");
    if (!env || !*env)
        return;
    char *copy = strdup(env), *save = NULL;
    for (char *item = strtok_r(copy, ";", &save); item; item = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(item, '=');
        if (!eq)
            continue;
        *eq = '\0';
        char action[16] = {0};
        int arg = 0, count = 1, skip = 0;
        char *spec = eq + 1, *colon = strchr(spec, ':');
        size_t alen = colon ? (size_t)(colon - spec) : strlen(spec);
        if (alen >= sizeof action)
            continue;
        memcpy(action, spec, alen);
        if (colon)
            sscanf(colon + 1, "%d:%d:%d", &arg, &count, &skip);
        inject_locked(item, parse_fault_action(action), arg, count, skip);
    }
    free(copy);
}

/* Arms `point` (an entry point such as "aclrtMalloc", or "exec:HcclSend"
 * for a task executing on a stream): after `skip` untouched calls, the next
 * `count` calls (-1: all) get `action` with `arg`. count 0 disarms. */
DBL_EXPORT int hixl_double_inject(const char *point, int action, int arg, int count, int skip)
{
    pthread_mutex_lock(&g_lock);
    load_env_faults_locked();
    int rc = inject_locked(point, action, arg, count, skip);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

DBL_EXPORT dbl_fault hixl_double_fault_take(const char *point)
{
    dbl_fault f = {DBL_FAULT_NONE, 0};
    pthread_mutex_lock(&g_lock);
    load_env_faults_locked();
    for (int i = 0; i < MAX_FAULTS; i++) {
        fault_slot *s = &g_faults[i];
        if (!s->point[0] || strcmp(s->point, point))
            continue;
        if (s->skip > 0) {
            s->skip--;
            break;
        }
        f.action = s->action;
        f.arg = s->arg;
        if (s->count > 0 && --s->count == 0)
            memset(s, 0, sizeof *s);
        break;
    }
    pthread_mutex_unlock(&g_lock);
    return f;
}

/* Releases every call blocked by a "hang" fault at call time. */
DBL_EXPORT void hixl_double_release(void)
{
    pthread_mutex_lock(&g_lock);
    g_release_gen++;
    pthread_cond_broadcast(&g_release_cv);
    pthread_mutex_unlock(&g_lock);
}

DBL_EXPORT int hixl_double_fault_call(const char *point)
{
    dbl_fault f = hixl_double_fault_take(point);
    switch (f.action) {
    case DBL_FAULT_FAIL:
    case DBL_FAULT_SEVER:
        return hixl_double_fail(f.arg, "%s: injected failure %d", point, f.arg);
    case DBL_FAULT_DELAY:
        usleep((useconds_t)f.arg * 1000u);
        return 0;
    case DBL_FAULT_HANG: {
        pthread_mutex_lock(&g_lock);
        unsigned gen = g_release_gen;
        while (gen == g_release_gen)
            pthread_cond_wait(&g_release_cv, &g_lock);
        pthread_mutex_unlock(&g_lock);
        return hixl_double_fail(ACL_ERROR_RT_STREAM_ABORT, "%s: hang released", point);
    }
    default:
        return 0;
    }
}

/* ---------------------------------------------------------- configuration */

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 0) : dflt;
}

/* Overrides HIXL_DOUBLE_DEVICE_COUNT / HIXL_DOUBLE_DEVICE_MEM_BYTES; a
 * negative count or zero limit keeps the current value. */
DBL_EXPORT void hixl_double_configure(int device_count, uint64_t mem_limit)
{
    pthread_mutex_lock(&g_lock);
    if (device_count >= 0)
        g_device_count = device_count > MAX_DEVICES ? MAX_DEVICES : device_count;
    if (mem_limit)
        g_mem_limit = mem_limit;
    pthread_mutex_unlock(&g_lock);
}

static void read_env_locked(void)
{
    if (g_device_count < 0) {
        uint64_t n = env_u64("HIXL_DOUBLE_DEVICE_COUNT", 2);
        g_device_count = n > MAX_DEVICES ? MAX_DEVICES : (int)n;
    }
    if (!g_mem_limit)
        g_mem_limit = env_u64("HIXL_DOUBLE_DEVICE_MEM_BYTES", 1ull << 30);
    load_env_faults_locked();
}

/* Disarms every fault and releases hung calls (the test suite's teardown). */
DBL_EXPORT void hixl_double_reset(void)
{
    pthread_mutex_lock(&g_lock);
    memset(g_faults, 0, sizeof g_faults);
    g_release_gen++;
    pthread_cond_broadcast(&g_release_cv);
    pthread_mutex_unlock(&g_lock);
}

DBL_EXPORT long hixl_double_live(int kind)
{
    if (kind < 0 || kind >= DBL_LIVE_KINDS)
        return -1;
    return __atomic_load_n(&g_live[kind], __ATOMIC_SEQ_CST);
}

DBL_EXPORT void hixl_double_count(int kind, int delta)
{
    __atomic_add_fetch(&g_live[kind], delta, __ATOMIC_SEQ_CST);
}

DBL_EXPORT int hixl_double_initialized(void)
{
    return __atomic_load_n(&g_initialized, __ATOMIC_SEQ_CST);
}

DBL_EXPORT int hixl_double_current_device(void)
{
    return t_device;
}

/* ------------------------------------------------------------- lifecycle */

DBL_EXPORT aclError aclInit(const char *configPath)
{
    (void)configPath;
    int rc = hixl_double_fault_call("aclInit");
    if (rc)
        return rc;
    pthread_mutex_lock(&g_lock);
    read_env_locked();
    if (g_initialized) {
        pthread_mutex_unlock(&g_lock);
        return hixl_double_fail(ACL_ERROR_REPEAT_INITIALIZE, "aclInit: already initialized");
    }
    g_initialized = 1;
    pthread_mutex_unlock(&g_lock);
    return ACL_SUCCESS;
}

DBL_EXPORT aclError aclFinalize(void)
{
    int rc = hixl_double_fault_call("aclFinalize");
    if (rc)
        return rc;
    pthread_mutex_lock(&g_lock);
    int was = g_initialized;
    g_initialized = 0;
    pthread_mutex_unlock(&g_lock);
    return was ? ACL_SUCCESS
               : hixl_double_fail(ACL_ERROR_REPEAT_FINALIZE, "aclFinalize: not initialized");
}

DBL_EXPORT aclError aclrtGetDeviceCount(uint32_t *count)
{
    CALL_PROLOGUE("aclrtGetDeviceCount");
    if (!count)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceCount: count is NULL");
    *count = (uint32_t)g_device_count;
    return ACL_SUCCESS;
}

/* aclrtSetDevice, aclrtResetDevice, contexts and aclrtDeviceGetBareTgid:
 * acl_double_context.c. */

/* ---------------------------------------------------------------- memory */

dbl_mem *find_mem_locked(const void *p, uint64_t n, int want_base)
{
    const uint8_t *q = p;
    for (dbl_mem *m = g_mems; m; m = m->next) {
        if (want_base) {
            if (m->base == q)
                return m;
        } else if (q >= m->base && q < m->base + m->size && n <= (uint64_t)(m->base + m->size - q)) {
            return m;
        }
    }
    return NULL;
}

void unlink_mem_locked(dbl_mem *m)
{
    for (dbl_mem **pp = &g_mems; *pp; pp = &(*pp)->next) {
        if (*pp == m) {
            *pp = m->next;
            return;
        }
    }
}

DBL_EXPORT int hixl_double_is_device_range(const void *ptr, uint64_t n)
{
    pthread_mutex_lock(&g_lock);
    dbl_mem *m = find_mem_locked(ptr, n, 0);
    int ok = m && m->kind != MEM_HOST;
    pthread_mutex_unlock(&g_lock);
    return ok;
}

/* Maps `len` bytes of `fd` shared, at a 2 MiB aligned address, as a
 * device allocation would be. */
void *map_aligned(int fd, size_t len, void **map_base, size_t *map_len)
{
    size_t span = len + HUGE_PAGE;
    uint8_t *res = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED)
        return NULL;
    uintptr_t aligned = ((uintptr_t)res + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    void *p = mmap((void *)aligned, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        munmap(res, span);
        return NULL;
    }
    if (aligned > (uintptr_t)res)
        munmap(res, aligned - (uintptr_t)res);
    uint8_t *end = res + span, *tail = (uint8_t *)aligned + len;
    if (end > tail)
        munmap(tail, (size_t)(end - tail));
    *map_base = p;
    *map_len = len;
    return p;
}

size_t page_round(uint64_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (size_t)((n + page - 1) / page * page);
}

DBL_EXPORT aclError aclrtMalloc(void **devPtr, size_t size, int policy)
{
    CALL_PROLOGUE("aclrtMalloc");
    if (!devPtr || size == 0)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: devPtr is NULL or size is 0");
    if (policy < 0 || policy > 7)
        return hixl_double_fail(ACL_ERROR_RT_INVALID_MALLOC_TYPE, "aclrtMalloc: bad policy %d", policy);
    NEED_CONTEXT("aclrtMalloc");
    /* huge-page policies (all but NORMAL_ONLY: 2, 5) take whole 2 MiB pages */
    uint64_t charged = (policy == 2 || policy == 5) ? page_round(size)
                                                    : (size + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    int dev = t_device;
    pthread_mutex_lock(&g_lock);
    if (g_mem_used[dev] + charged > g_mem_limit) {
        uint64_t used = g_mem_used[dev];
        pthread_mutex_unlock(&g_lock);
        return hixl_double_fail(ACL_ERROR_RT_MEMORY_ALLOCATION,
                                "aclrtMalloc: device %d out of memory (%zu requested, %llu of %llu in use)",
                                dev, size, (unsigned long long)used, (unsigned long long)g_mem_limit);
    }
    g_mem_used[dev] += charged;
    pthread_mutex_unlock(&g_lock);

    dbl_mem *m = calloc(1, sizeof *m);
    int fd = memfd_create("cann-double-hbm", MFD_CLOEXEC);
    size_t len = page_round(size);
    void *p = NULL;
    if (m && fd >= 0 && ftruncate(fd, (off_t)len) == 0)
        p = map_aligned(fd, len, &m->map_base, &m->map_len);
    if (!p) {
        if (fd >= 0)
            close(fd);
        free(m);
        pthread_mutex_lock(&g_lock);
        g_mem_used[dev] -= charged;
        pthread_mutex_unlock(&g_lock);
        return hixl_double_fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMalloc: host mapping failed: %s",
                                strerror(errno));
    }
    m->base = p;
    m->size = size;
    m->charged = charged;
    m->fd = fd;
    m->device = dev;
    m->kind = MEM_DEVICE;
    pthread_mutex_lock(&g_lock);
    m->next = g_mems;
    g_mems = m;
    pthread_mutex_unlock(&g_lock);
    hixl_double_count(DBL_LIVE_DEVMEM, 1);
    *devPtr = p;
    return ACL_SUCCESS;
}

void release_mem(dbl_mem *m)
{
    munmap(m->map_base, m->map_len);
    if (m->fd >= 0)
        close(m->fd);
    free(m);
}

DBL_EXPORT aclError aclrtFree(void *devPtr)
{
    CALL_PROLOGUE("aclrtFree");
    if (!devPtr)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "aclrtFree: devPtr is NULL");
    NEED_CONTEXT("aclrtFree");
    pthread_mutex_lock(&g_lock);
    dbl_mem *m = find_mem_locked(devPtr, 0, 1);
    if (!m || m->kind != MEM_DEVICE) {
        pthread_mutex_unlock(&g_lock);
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID, "aclrtFree: %p is not device memory", devPtr);
    }
    unlink_mem_locked(m);
    g_mem_used[m->device] -= m->charged;
    pthread_mutex_unlock(&g_lock);
    release_mem(m);
    hixl_double_count(DBL_LIVE_DEVMEM, -1);
    return ACL_SUCCESS;
}

DBL_EXPORT aclError aclrtMallocHost(void **hostPtr, size_t size)
{
    CALL_PROLOGUE("aclrtMallocHost");
    if (!hostPtr || size == 0)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: hostPtr is NULL or size is 0");
    NEED_CONTEXT("aclrtMallocHost");
    dbl_mem *m = calloc(1, sizeof *m);
    size_t len = page_round(size);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!m || p == MAP_FAILED) {
        free(m);
        if (p != MAP_FAILED)
            munmap(p, len);
        return hixl_double_fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMallocHost: out of memory");
    }
    m->base = p;
    m->map_base = p;
    m->map_len = len;
    m->size = size;
    m->fd = -1;
    m->device = t_device;
    m->kind = MEM_HOST;
    pthread_mutex_lock(&g_lock);
    m->next = g_mems;
    g_mems = m;
    pthread_mutex_unlock(&g_lock);
    hixl_double_count(DBL_LIVE_HOSTMEM, 1);
    *hostPtr = p;
    return ACL_SUCCESS;
}

DBL_EXPORT aclError aclrtFreeHost(void *hostPtr)
{
    CALL_PROLOGUE("aclrtFreeHost");
    if (!hostPtr)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "aclrtFreeHost: hostPtr is NULL");
    pthread_mutex_lock(&g_lock);
    dbl_mem *m = find_mem_locked(hostPtr, 0, 1);
    if (!m || m->kind != MEM_HOST) {
        pthread_mutex_unlock(&g_lock);
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID, "aclrtFreeHost: %p is not host memory of aclrtMallocHost", hostPtr);
    }
    unlink_mem_locked(m);
    pthread_mutex_unlock(&g_lock);
    release_mem(m);
    hixl_double_count(DBL_LIVE_HOSTMEM, -1);
    return ACL_SUCCESS;
}

static int check_copy(const char *api, void *dst, size_t destMax, const void *src, size_t count, int kind)
{
    if (!dst || !src || count > destMax)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "%s: NULL address or count %zu > destMax %zu",
                                api, count, destMax);
    if (kind < H2H || kind > MEMCPY_DEFAULT)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "%s: bad memcpy kind %d", api, kind);
    if (kind == MEMCPY_DEFAULT || count == 0)
        return 0;
    int dst_dev = hixl_double_is_device_range(dst, count);
    int src_dev = hixl_double_is_device_range(src, count);
    int want_dst = kind == H2D || kind == D2D, want_src = kind == D2H || kind == D2D;
    if (dst_dev != want_dst || src_dev != want_src)
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID,
                                "%s: kind %d does not match the addresses (dst %s, src %s)", api, kind,
                                dst_dev ? "device" : "host", src_dev ? "device" : "host");
    return 0;
}

DBL_EXPORT aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, int kind)
{
    CALL_PROLOGUE("aclrtMemcpy");
    NEED_CONTEXT("aclrtMemcpy");
    int rc = check_copy("aclrtMemcpy", dst, destMax, src, count, kind);
    if (rc)
        return rc;
    memmove(dst, src, count);
    return ACL_SUCCESS;
}

typedef struct {
    void *dst;
    const void *src;
    size_t n;
} copy_task;

static int run_copy(void *ctx, int abort_fd, dbl_fault fault)
{
    (void)abort_fd;
    copy_task *t = ctx;
    if (fault.action == DBL_FAULT_HANG) {
        dbl_wait_fd(-1, 0, &abort_fd, 1, 0);
        return ACL_ERROR_RT_STREAM_ABORT;
    }
    if (fault.action == DBL_FAULT_SEVER)
        return fault.arg;
    memmove(t->dst, t->src, t->n);
    return 0;
}

DBL_EXPORT aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
                                     int kind, aclrtStream stream)
{
    CALL_PROLOGUE("aclrtMemcpyAsync");
    NEED_CONTEXT("aclrtMemcpyAsync");
    int rc = check_copy("aclrtMemcpyAsync", dst, destMax, src, count, kind);
    if (rc)
        return rc;
    /* CANN (Ascend EP) has no asynchronous copy within the host */
    if (kind == H2H)
        return hixl_double_fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                                "aclrtMemcpyAsync: ACL_MEMCPY_HOST_TO_HOST is not supported");
    rc = hixl_double_check_async_copy("aclrtMemcpyAsync", dst, src, count);
    if (rc && rc != COPY_SYNCHRONOUS)
        return rc;
    copy_task *t = malloc(sizeof *t);
    if (!t)
        return hixl_double_fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMemcpyAsync: out of memory");
    t->dst = dst;
    t->src = src;
    t->n = count;
    int queued = hixl_double_stream_submit(stream, "exec:aclrtMemcpyAsync", run_copy, free, t);
    if (queued || rc != COPY_SYNCHRONOUS)
        return queued;
    /* Host memory that is not page-locked is copied before the call returns
     * (acl_double_pinned.c): the caller's thread waits for the stream. */
    hixl_double_count_sync_copy();
    return hixl_double_stream_drain(stream);
}

