/* The ACL/HCCL shim: dlopen'ed CANN entry points behind status-returning
 * wrappers (see acl_shim.h). Contains no Python. */
#define _GNU_SOURCE
#include "acl_shim.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    hixl_aclInit_fn aclInit;
    hixl_aclFinalize_fn aclFinalize;
    hixl_aclGetRecentErrMsg_fn aclGetRecentErrMsg;
    hixl_aclrtGetDeviceCount_fn aclrtGetDeviceCount;
    hixl_aclrtSetDevice_fn aclrtSetDevice;
    hixl_aclrtResetDevice_fn aclrtResetDevice;
    hixl_aclrtDeviceGetBareTgid_fn aclrtDeviceGetBareTgid;
    hixl_aclrtCreateStream_fn aclrtCreateStream;
    hixl_aclrtDestroyStream_fn aclrtDestroyStream;
    hixl_aclrtSynchronizeStream_fn aclrtSynchronizeStream;
    hixl_aclrtSynchronizeStreamWithTimeout_fn aclrtSynchronizeStreamWithTimeout;
    hixl_aclrtMalloc_fn aclrtMalloc;
    hixl_aclrtFree_fn aclrtFree;
    hixl_aclrtMallocHost_fn aclrtMallocHost;
    hixl_aclrtFreeHost_fn aclrtFreeHost;
    hixl_aclrtMemcpy_fn aclrtMemcpy;
    hixl_aclrtMemcpyAsync_fn aclrtMemcpyAsync;
    hixl_aclrtIpcMemGetExportKey_fn aclrtIpcMemGetExportKey;
    hixl_aclrtIpcMemSetImportPid_fn aclrtIpcMemSetImportPid;
    hixl_aclrtIpcMemImportByKey_fn aclrtIpcMemImportByKey;
    hixl_aclrtIpcMemClose_fn aclrtIpcMemClose;
    hixl_HcclGetRootInfo_fn HcclGetRootInfo;
    hixl_HcclCommInitRootInfo_fn HcclCommInitRootInfo;
    hixl_HcclSend_fn HcclSend;
    hixl_HcclRecv_fn HcclRecv;
    hixl_HcclBatchSendRecv_fn HcclBatchSendRecv;
    hixl_HcclCommDestroy_fn HcclCommDestroy;
    hixl_HcclGetErrorString_fn HcclGetErrorString;
    /* issue 18: contexts, stream abort, configured communicators */
    hixl_aclrtCreateContext_fn aclrtCreateContext;
    hixl_aclrtDestroyContext_fn aclrtDestroyContext;
    hixl_aclrtSetCurrentContext_fn aclrtSetCurrentContext;
    hixl_aclrtGetCurrentContext_fn aclrtGetCurrentContext;
    hixl_aclrtStreamAbort_fn aclrtStreamAbort;
    hixl_aclrtGetPhyDevIdByLogicDevId_fn aclrtGetPhyDevIdByLogicDevId;
    hixl_aclrtGetSocName_fn aclrtGetSocName;
    hixl_aclrtGetDeviceInfo_fn aclrtGetDeviceInfo;
    hixl_HcclCommInitClusterInfoMemConfig_fn HcclCommInitClusterInfoMemConfig;
    hixl_HcclCommInitRootInfoConfig_fn HcclCommInitRootInfoConfig;
    /* one-sided HCCL and pinned host memory */
    hixl_HcclRegisterGlobalMem_fn HcclRegisterGlobalMem;
    hixl_HcclDeregisterGlobalMem_fn HcclDeregisterGlobalMem;
    hixl_HcclCommBindMem_fn HcclCommBindMem;
    hixl_HcclCommUnbindMem_fn HcclCommUnbindMem;
    hixl_HcclCommPrepare_fn HcclCommPrepare;
    hixl_HcclBatchPut_fn HcclBatchPut;
    hixl_HcclBatchGet_fn HcclBatchGet;
    hixl_aclrtHostRegister_fn aclrtHostRegister;
    hixl_aclrtHostUnregister_fn aclrtHostUnregister;
    hixl_aclrtHostRegisterV2_fn aclrtHostRegisterV2;
} cann_table;

/* One entry point: where its pointer goes, which library holds it, whether
 * it is required and which feature bit it belongs to when it is not. */
typedef struct {
    const char *name;
    size_t offset;
    int lib;
    unsigned feature; /* 0: required */
} symbol_spec;

#define SYM(n, lib, feat) {#n, offsetof(cann_table, n), lib, feat}
static const symbol_spec SYMBOLS[] = {
    SYM(aclInit, HIXL_LIB_ACL, 0),
    SYM(aclFinalize, HIXL_LIB_ACL, 0),
    SYM(aclrtGetDeviceCount, HIXL_LIB_ACL, 0),
    SYM(aclrtSetDevice, HIXL_LIB_ACL, 0),
    SYM(aclrtResetDevice, HIXL_LIB_ACL, 0),
    SYM(aclrtCreateStream, HIXL_LIB_ACL, 0),
    SYM(aclrtDestroyStream, HIXL_LIB_ACL, 0),
    SYM(aclrtSynchronizeStream, HIXL_LIB_ACL, 0),
    SYM(aclrtMalloc, HIXL_LIB_ACL, 0),
    SYM(aclrtFree, HIXL_LIB_ACL, 0),
    SYM(aclrtMallocHost, HIXL_LIB_ACL, 0),
    SYM(aclrtFreeHost, HIXL_LIB_ACL, 0),
    SYM(aclrtMemcpy, HIXL_LIB_ACL, 0),
    SYM(aclrtMemcpyAsync, HIXL_LIB_ACL, 0),
    SYM(aclGetRecentErrMsg, HIXL_LIB_ACL, HIXL_ACL_HAS_RECENT_ERR),
    SYM(aclrtSynchronizeStreamWithTimeout, HIXL_LIB_ACL, HIXL_ACL_HAS_SYNC_TIMEOUT),
    SYM(aclrtDeviceGetBareTgid, HIXL_LIB_ACL, HIXL_ACL_HAS_BARE_TGID),
    SYM(aclrtIpcMemGetExportKey, HIXL_LIB_ACL, HIXL_ACL_HAS_IPC),
    SYM(aclrtIpcMemSetImportPid, HIXL_LIB_ACL, HIXL_ACL_HAS_IPC),
    SYM(aclrtIpcMemImportByKey, HIXL_LIB_ACL, HIXL_ACL_HAS_IPC),
    SYM(aclrtIpcMemClose, HIXL_LIB_ACL, HIXL_ACL_HAS_IPC),
    SYM(HcclGetRootInfo, HIXL_LIB_HCCL, 0),
    SYM(HcclCommInitRootInfo, HIXL_LIB_HCCL, 0),
    SYM(HcclSend, HIXL_LIB_HCCL, 0),
    SYM(HcclRecv, HIXL_LIB_HCCL, 0),
    SYM(HcclCommDestroy, HIXL_LIB_HCCL, 0),
    SYM(HcclBatchSendRecv, HIXL_LIB_HCCL, HIXL_ACL_HAS_BATCH),
    SYM(HcclGetErrorString, HIXL_LIB_HCCL, HIXL_ACL_HAS_ERR_STRING),
    /* explicit contexts, safe tear-down, rank-table and configured communicators */
    SYM(aclrtCreateContext, HIXL_LIB_ACL, 0),
    SYM(aclrtDestroyContext, HIXL_LIB_ACL, 0),
    SYM(aclrtSetCurrentContext, HIXL_LIB_ACL, 0),
    SYM(aclrtGetCurrentContext, HIXL_LIB_ACL, 0),
    SYM(aclrtStreamAbort, HIXL_LIB_ACL, HIXL_ACL_HAS_STREAM_ABORT),
    SYM(aclrtGetPhyDevIdByLogicDevId, HIXL_LIB_ACL, HIXL_ACL_HAS_PHY_ID),
    SYM(aclrtGetSocName, HIXL_LIB_ACL, HIXL_ACL_HAS_SOC_INFO),
    SYM(aclrtGetDeviceInfo, HIXL_LIB_ACL, HIXL_ACL_HAS_SOC_INFO),
    SYM(HcclCommInitClusterInfoMemConfig, HIXL_LIB_HCCL, HIXL_ACL_HAS_RANK_TABLE),
    SYM(HcclCommInitRootInfoConfig, HIXL_LIB_HCCL, HIXL_ACL_HAS_ROOT_CONFIG),
    /* one-sided HCCL and pinned host memory */
    SYM(HcclRegisterGlobalMem, HIXL_LIB_HCCL, HIXL_ACL_HAS_ONE_SIDED),
    SYM(HcclDeregisterGlobalMem, HIXL_LIB_HCCL, HIXL_ACL_HAS_ONE_SIDED),
    SYM(HcclCommBindMem, HIXL_LIB_HCCL, HIXL_ACL_HAS_ONE_SIDED),
    SYM(HcclCommUnbindMem, HIXL_LIB_HCCL, HIXL_ACL_HAS_ONE_SIDED),
    SYM(HcclCommPrepare, HIXL_LIB_HCCL, HIXL_ACL_HAS_ONE_SIDED),
    SYM(HcclBatchPut, HIXL_LIB_HCCL, HIXL_ACL_HAS_ONE_SIDED),
    SYM(HcclBatchGet, HIXL_LIB_HCCL, HIXL_ACL_HAS_ONE_SIDED),
    SYM(aclrtHostRegister, HIXL_LIB_ACL, HIXL_ACL_HAS_HOST_REGISTER),
    SYM(aclrtHostUnregister, HIXL_LIB_ACL, HIXL_ACL_HAS_HOST_REGISTER),
    SYM(aclrtHostRegisterV2, HIXL_LIB_ACL, HIXL_ACL_HAS_HOST_PIN),
};
#define NSYMBOLS (sizeof SYMBOLS / sizeof SYMBOLS[0])
#define ALL_IPC_SYMBOLS 4

static pthread_mutex_t g_load_lock = PTHREAD_MUTEX_INITIALIZER;
static cann_table g;
static int g_loaded;
static unsigned g_features;
static void *g_acl_handle, *g_hccl_handle;
static char g_acl_path[PATH_MAX], g_hccl_path[PATH_MAX];
/* hixl's context of each opened device (hixl_acl_set_device), or NULL. */
static pthread_mutex_t g_device_lock = PTHREAD_MUTEX_INITIALIZER;
static aclrtContext g_contexts[HIXL_ACL_MAX_DEVICES];
/* Serialises communicator creation in the process (see acl_shim.h). */
static pthread_mutex_t g_comm_init_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long g_comm_inits;

static __thread hixl_acl_status t_status;

/* ------------------------------------------------------------ loading */

static void resolve_path(void *fn, char *out)
{
    Dl_info info;
    char real[PATH_MAX];
    out[0] = '\0';
    if (dladdr(fn, &info) && info.dli_fname)
        snprintf(out, PATH_MAX, "%s", realpath(info.dli_fname, real) ? real : info.dli_fname);
}

static int resolve_all(void *acl, void *hccl, cann_table *t, unsigned *features, char *err,
                       size_t errlen)
{
    unsigned missing = 0, ipc_found = 0, optional = 0;
    for (size_t i = 0; i < NSYMBOLS; i++) {
        const symbol_spec *s = &SYMBOLS[i];
        optional |= s->feature;
        void *p = dlsym(s->lib == HIXL_LIB_ACL ? acl : hccl, s->name);
        memcpy((char *)t + s->offset, &p, sizeof p);
        if (p && s->feature == HIXL_ACL_HAS_IPC)
            ipc_found++;
        if (p || !s->feature) {
            if (!p) {
                snprintf(err, errlen, "%s lacks the entry point %s",
                         s->lib == HIXL_LIB_ACL ? "libascendcl.so" : "libhccl.so", s->name);
                return -1;
            }
            continue;
        }
        missing |= s->feature;
    }
    /* a feature is usable only when every entry point of it was found */
    *features = optional & ~missing;
    /* IPC is usable only with all four entry points */
    if (ipc_found != ALL_IPC_SYMBOLS)
        *features &= ~(unsigned)HIXL_ACL_HAS_IPC;
    return 0;
}

int hixl_acl_open(const char *acl_path, const char *hccl_path, int trial, char *err, size_t errlen)
{
    cann_table t;
    unsigned features = 0;
    int rc = -1;
    err[0] = '\0';
    pthread_mutex_lock(&g_load_lock);
    /* Handles are never closed: unloading CANN (C++ runtimes, threads) is
     * not safe, and a failed candidate costs only its mapping. */
    void *acl = dlopen(acl_path, RTLD_NOW | RTLD_GLOBAL);
    void *hccl = acl ? dlopen(hccl_path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!acl || !hccl) {
        const char *why = dlerror();
        snprintf(err, errlen, "%s", why ? why : "dlopen failed");
    } else if (resolve_all(acl, hccl, &t, &features, err, errlen) == 0) {
        rc = 0;
        if (g_loaded && (acl != g_acl_handle || hccl != g_hccl_handle)) {
            char other[PATH_MAX];
            resolve_path((void *)t.aclInit, other);
            snprintf(err, errlen, "CANN is already loaded from %s; cannot also load %s",
                     g_acl_path, other);
            rc = -1;
        } else if (!g_loaded && !trial) {
            g = t;
            g_features = features;
            g_acl_handle = acl;
            g_hccl_handle = hccl;
            resolve_path((void *)t.aclInit, g_acl_path);
            resolve_path((void *)t.HcclSend, g_hccl_path);
            __atomic_store_n(&g_loaded, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&g_load_lock);
    return rc;
}

int hixl_acl_is_loaded(void)
{
    return __atomic_load_n(&g_loaded, __ATOMIC_ACQUIRE);
}

const char *hixl_acl_loaded_path(int lib)
{
    if (!hixl_acl_is_loaded())
        return "";
    return lib == HIXL_LIB_HCCL ? g_hccl_path : g_acl_path;
}

unsigned hixl_acl_features(void)
{
    return hixl_acl_is_loaded() ? g_features : 0;
}

/* ------------------------------------------------------------- status */

const hixl_acl_status *hixl_acl_last_error(void)
{
    return &t_status;
}

static void set_status(int code, int lib, const char *api, const char *detail)
{
    t_status.code = code;
    t_status.lib = lib;
    t_status.api = api;
    snprintf(t_status.detail, sizeof t_status.detail, "%s", detail ? detail : "");
}

/* Records a failed ACL call with CANN's message for this thread. */
static int acl_fail(int code, const char *api)
{
    const char *msg = g.aclGetRecentErrMsg ? g.aclGetRecentErrMsg() : NULL;
    set_status(code, HIXL_LIB_ACL, api, msg);
    return code;
}

static int hccl_fail(int code, const char *api)
{
    const char *name = g.HcclGetErrorString ? g.HcclGetErrorString(code) : NULL;
    /* HCCL also reports through ACL's error manager */
    const char *msg = g.aclGetRecentErrMsg ? g.aclGetRecentErrMsg() : NULL;
    char both[sizeof t_status.detail];
    snprintf(both, sizeof both, "%s%s%s", name ? name : "", name && msg ? "; " : "",
             msg ? msg : "");
    set_status(code, HIXL_LIB_HCCL, api, both);
    return code;
}

static int not_loaded(const char *api)
{
    set_status(HIXL_ACL_ERROR_UNINITIALIZE, HIXL_LIB_ACL, api, "CANN is not loaded");
    return HIXL_ACL_ERROR_UNINITIALIZE;
}

static int absent(int lib, const char *api)
{
    int code = lib == HIXL_LIB_HCCL ? HIXL_HCCL_E_NOT_SUPPORT : HIXL_ACL_ERROR_API_NOT_SUPPORT;
    char msg[160];
    snprintf(msg, sizeof msg, "%s is absent from the loaded %s", api,
             lib == HIXL_LIB_HCCL ? "libhccl.so" : "libascendcl.so");
    set_status(code, lib, api, msg);
    return code;
}

#define ACL_RET(api, call)                                  \
    do {                                                    \
        aclError rc_ = (call);                              \
        return rc_ ? acl_fail(rc_, api) : 0;                \
    } while (0)

#define HCCL_RET(api, call)                                 \
    do {                                                    \
        HcclResult rc_ = (call);                            \
        return rc_ ? hccl_fail(rc_, api) : 0;               \
    } while (0)

/* A call's switch to hixl's context of a device, undone when the wrapper
 * returns (the cleanup attribute runs ctx_restore on every return path). */
typedef struct {
    aclrtContext previous;
    int restore;
} ctx_guard;

static void ctx_restore(ctx_guard *guard)
{
    if (guard->restore)
        g.aclrtSetCurrentContext(guard->previous);
}

static int no_context(int32_t dev)
{
    char msg[120];
    snprintf(msg, sizeof msg, "device %d is not opened by hixl (hixl_acl_set_device)", (int)dev);
    set_status(HIXL_ACL_ERROR_CONTEXT_NULL, HIXL_LIB_ACL, "aclrtSetCurrentContext", msg);
    return HIXL_ACL_ERROR_CONTEXT_NULL;
}

/* Makes hixl's context of `dev` current on this thread for one call. The
 * thread's previous context (if it had one, and it is another) is put back
 * by ctx_restore: aclrtSetCurrentContext makes its context's device current
 * too ("aclrtSetCurrentContext", CANN API reference, aclcppdevg_03_0061). */
static int enter_device(int32_t dev, ctx_guard *guard)
{
    if (!hixl_acl_is_loaded())
        return not_loaded("aclrtSetCurrentContext");
    if (dev < 0 || dev >= HIXL_ACL_MAX_DEVICES)
        return no_context(dev);
    aclrtContext ctx = __atomic_load_n(&g_contexts[dev], __ATOMIC_ACQUIRE);
    if (!ctx)
        return no_context(dev);
    aclrtContext current = NULL;
    if (g.aclrtGetCurrentContext(&current) != 0)
        current = NULL; /* none yet on this thread: nothing to put back */
    if (current == ctx)
        return 0;
    aclError rc = g.aclrtSetCurrentContext(ctx);
    if (rc)
        return acl_fail(rc, "aclrtSetCurrentContext");
    guard->previous = current;
    guard->restore = current != NULL;
    return 0;
}

#define BIND(dev)                                                           \
    ctx_guard bind_guard_ __attribute__((cleanup(ctx_restore))) = {NULL, 0}; \
    do {                                                                    \
        int brc_ = enter_device(dev, &bind_guard_);                         \
        if (brc_)                                                           \
            return brc_;                                                    \
    } while (0)

#define NEED_LOADED(api)                \
    do {                                \
        if (!hixl_acl_is_loaded())      \
            return not_loaded(api);     \
    } while (0)

/* ----------------------------------------------------------- lifecycle */

int hixl_acl_init(int *owned)
{
    NEED_LOADED("aclInit");
    aclError rc = g.aclInit(NULL);
    *owned = rc == 0;
    /* Someone else in the process (torch_npu, ...) initialized ACL first. */
    if (rc == HIXL_ACL_ERROR_REPEAT_INITIALIZE)
        return 0;
    return rc ? acl_fail(rc, "aclInit") : 0;
}

int hixl_acl_finalize(void)
{
    NEED_LOADED("aclFinalize");
    ACL_RET("aclFinalize", g.aclFinalize());
}

int hixl_acl_device_count(uint32_t *count)
{
    NEED_LOADED("aclrtGetDeviceCount");
    ACL_RET("aclrtGetDeviceCount", g.aclrtGetDeviceCount(count));
}

/* Opens `dev` for the process: one aclrtSetDevice and one context
 * (idempotent while open). aclrtCreateContext also makes the new context
 * current on the calling thread, so the thread's previous one is put back. */
int hixl_acl_set_device(int32_t dev)
{
    NEED_LOADED("aclrtSetDevice");
    if (dev < 0 || dev >= HIXL_ACL_MAX_DEVICES) {
        set_status(HIXL_ACL_ERROR_INVALID_DEVICEID, HIXL_LIB_ACL, "aclrtSetDevice",
                   "device id out of range");
        return HIXL_ACL_ERROR_INVALID_DEVICEID;
    }
    int rc = 0;
    pthread_mutex_lock(&g_device_lock);
    if (!g_contexts[dev]) {
        aclrtContext previous = NULL, ctx = NULL;
        if (g.aclrtGetCurrentContext(&previous) != 0)
            previous = NULL;
        aclError arc = g.aclrtSetDevice(dev);
        if (arc) {
            rc = acl_fail(arc, "aclrtSetDevice");
        } else if ((arc = g.aclrtCreateContext(&ctx, dev)) != 0 || !ctx) {
            rc = arc ? acl_fail(arc, "aclrtCreateContext") : no_context(dev);
            g.aclrtResetDevice(dev); /* undo this call's reference */
        } else {
            __atomic_store_n(&g_contexts[dev], ctx, __ATOMIC_RELEASE);
        }
        if (previous)
            g.aclrtSetCurrentContext(previous);
    }
    pthread_mutex_unlock(&g_device_lock);
    return rc;
}

/* Destroys hixl's context of `dev`, then drops the one reference
 * hixl_acl_set_device took (aclrtResetDevice's documented order: explicit
 * streams, then contexts, then the device). */
int hixl_acl_reset_device(int32_t dev)
{
    NEED_LOADED("aclrtResetDevice");
    if (dev < 0 || dev >= HIXL_ACL_MAX_DEVICES)
        return no_context(dev);
    int rc = 0;
    pthread_mutex_lock(&g_device_lock);
    aclrtContext ctx = g_contexts[dev];
    if (ctx) {
        __atomic_store_n(&g_contexts[dev], NULL, __ATOMIC_RELEASE);
        aclError arc = g.aclrtDestroyContext(ctx);
        if (arc)
            rc = acl_fail(arc, "aclrtDestroyContext");
        arc = g.aclrtResetDevice(dev);
        if (arc && !rc)
            rc = acl_fail(arc, "aclrtResetDevice");
    }
    pthread_mutex_unlock(&g_device_lock);
    return rc;
}

int hixl_acl_bare_tgid(int32_t *pid)
{
    NEED_LOADED("aclrtDeviceGetBareTgid");
    if (!g.aclrtDeviceGetBareTgid)
        return absent(HIXL_LIB_ACL, "aclrtDeviceGetBareTgid");
    ACL_RET("aclrtDeviceGetBareTgid", g.aclrtDeviceGetBareTgid(pid));
}

/* -------------------------------------------------------------- memory */

int hixl_acl_malloc(int32_t dev, size_t size, aclrtMemMallocPolicy policy, void **out)
{
    BIND(dev);
    ACL_RET("aclrtMalloc", g.aclrtMalloc(out, size, policy));
}

int hixl_acl_free(int32_t dev, void *ptr)
{
    BIND(dev);
    ACL_RET("aclrtFree", g.aclrtFree(ptr));
}

int hixl_acl_malloc_host(int32_t dev, size_t size, void **out)
{
    BIND(dev);
    ACL_RET("aclrtMallocHost", g.aclrtMallocHost(out, size));
}

int hixl_acl_free_host(int32_t dev, void *ptr)
{
    BIND(dev);
    ACL_RET("aclrtFreeHost", g.aclrtFreeHost(ptr));
}

int hixl_acl_memcpy(int32_t dev, void *dst, size_t dest_max, const void *src, size_t count,
                    aclrtMemcpyKind kind)
{
    BIND(dev);
    ACL_RET("aclrtMemcpy", g.aclrtMemcpy(dst, dest_max, src, count, kind));
}

int hixl_acl_memcpy_async(int32_t dev, void *dst, size_t dest_max, const void *src, size_t count,
                          aclrtMemcpyKind kind, aclrtStream stream)
{
    BIND(dev);
    ACL_RET("aclrtMemcpyAsync", g.aclrtMemcpyAsync(dst, dest_max, src, count, kind, stream));
}

/* ------------------------------------------------------------- streams */

int hixl_acl_stream_create(int32_t dev, aclrtStream *out)
{
    BIND(dev);
    ACL_RET("aclrtCreateStream", g.aclrtCreateStream(out));
}

int hixl_acl_stream_destroy(int32_t dev, aclrtStream stream)
{
    BIND(dev);
    ACL_RET("aclrtDestroyStream", g.aclrtDestroyStream(stream));
}

int hixl_acl_stream_sync(int32_t dev, aclrtStream stream, int32_t timeout_ms)
{
    BIND(dev);
    if (timeout_ms < 0)
        ACL_RET("aclrtSynchronizeStream", g.aclrtSynchronizeStream(stream));
    if (!g.aclrtSynchronizeStreamWithTimeout)
        return absent(HIXL_LIB_ACL, "aclrtSynchronizeStreamWithTimeout");
    ACL_RET("aclrtSynchronizeStreamWithTimeout",
            g.aclrtSynchronizeStreamWithTimeout(stream, timeout_ms));
}

/* ----------------------------------------------------------------- IPC */

#define NEED_IPC(api)                                   \
    do {                                                \
        if (!(g_features & HIXL_ACL_HAS_IPC))           \
            return absent(HIXL_LIB_ACL, api);           \
    } while (0)

int hixl_acl_ipc_export(int32_t dev, void *ptr, size_t size, int validate_pid,
                        char key[HIXL_ACL_IPC_KEY_LEN])
{
    BIND(dev);
    NEED_IPC("aclrtIpcMemGetExportKey");
    uint64_t flags = validate_pid ? ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT
                                  : ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION;
    memset(key, 0, HIXL_ACL_IPC_KEY_LEN);
    aclError rc = g.aclrtIpcMemGetExportKey(ptr, size, key, HIXL_ACL_IPC_KEY_LEN, flags);
    key[HIXL_ACL_IPC_KEY_LEN - 1] = '\0';
    return rc ? acl_fail(rc, "aclrtIpcMemGetExportKey") : 0;
}

int hixl_acl_ipc_allow(int32_t dev, const char *key, int32_t *pids, size_t npids)
{
    BIND(dev);
    NEED_IPC("aclrtIpcMemSetImportPid");
    ACL_RET("aclrtIpcMemSetImportPid", g.aclrtIpcMemSetImportPid(key, pids, npids));
}

int hixl_acl_ipc_import(int32_t dev, const char *key, void **out)
{
    BIND(dev);
    NEED_IPC("aclrtIpcMemImportByKey");
    ACL_RET("aclrtIpcMemImportByKey",
            g.aclrtIpcMemImportByKey(out, key, ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT));
}

int hixl_acl_ipc_close(int32_t dev, const char *key)
{
    BIND(dev);
    NEED_IPC("aclrtIpcMemClose");
    ACL_RET("aclrtIpcMemClose", g.aclrtIpcMemClose(key));
}

/* ---------------------------------------------------------------- HCCL */

int hixl_hccl_root_info(int32_t dev, HcclRootInfo *out)
{
    BIND(dev);
    HCCL_RET("HcclGetRootInfo", g.HcclGetRootInfo(out));
}

int hixl_hccl_comm_init(int32_t dev, uint32_t nranks, const HcclRootInfo *root, uint32_t rank,
                        HcclComm *out)
{
    BIND(dev);
    pthread_mutex_lock(&g_comm_init_lock);
    __atomic_add_fetch(&g_comm_inits, 1, __ATOMIC_ACQ_REL);
    HcclResult rc = g.HcclCommInitRootInfo(nranks, root, rank, out);
    pthread_mutex_unlock(&g_comm_init_lock);
    return rc ? hccl_fail(rc, "HcclCommInitRootInfo") : 0;
}

/* Bytes travel as HCCL_DATA_TYPE_INT8, whose count is the byte count. */
int hixl_hccl_send(int32_t dev, void *buf, uint64_t nbytes, uint32_t peer, HcclComm comm,
                   aclrtStream stream)
{
    BIND(dev);
    HCCL_RET("HcclSend", g.HcclSend(buf, nbytes, HCCL_DATA_TYPE_INT8, peer, comm, stream));
}

int hixl_hccl_recv(int32_t dev, void *buf, uint64_t nbytes, uint32_t peer, HcclComm comm,
                   aclrtStream stream)
{
    BIND(dev);
    HCCL_RET("HcclRecv", g.HcclRecv(buf, nbytes, HCCL_DATA_TYPE_INT8, peer, comm, stream));
}

int hixl_hccl_batch(int32_t dev, HcclSendRecvItem *items, uint32_t n, HcclComm comm,
                    aclrtStream stream)
{
    BIND(dev);
    if (!g.HcclBatchSendRecv)
        return absent(HIXL_LIB_HCCL, "HcclBatchSendRecv");
    HCCL_RET("HcclBatchSendRecv", g.HcclBatchSendRecv(items, n, comm, stream));
}

int hixl_hccl_comm_destroy(int32_t dev, HcclComm comm)
{
    BIND(dev);
    HCCL_RET("HcclCommDestroy", g.HcclCommDestroy(comm));
}

/* Optional entry points answer as absent unless every symbol of their
 * feature was found (resolve_all). */
#define NEED_FEATURE(bit, lib, api)          \
    do {                                     \
        if (!(g_features & (bit)))           \
            return absent(lib, api);         \
    } while (0)

/* ============== issue 18: stream abort, configured communicators ============== */

int hixl_acl_stream_abort(int32_t dev, aclrtStream stream)
{
    BIND(dev);
    NEED_FEATURE(HIXL_ACL_HAS_STREAM_ABORT, HIXL_LIB_ACL, "aclrtStreamAbort");
    ACL_RET("aclrtStreamAbort", g.aclrtStreamAbort(stream));
}

int hixl_acl_physical_id(int32_t dev, int32_t *phy)
{
    BIND(dev);
    if (!(g_features & HIXL_ACL_HAS_PHY_ID)) {
        *phy = dev;
        return 0;
    }
    ACL_RET("aclrtGetPhyDevIdByLogicDevId", g.aclrtGetPhyDevIdByLogicDevId(dev, phy));
}

int hixl_acl_soc_name(char *out, size_t len)
{
    NEED_LOADED("aclrtGetSocName");
    NEED_FEATURE(HIXL_ACL_HAS_SOC_INFO, HIXL_LIB_ACL, "aclrtGetSocName");
    const char *name = g.aclrtGetSocName();
    snprintf(out, len, "%s", name ? name : "");
    return 0;
}

/* aclrtGetDeviceInfo takes the logical device id and needs no context
 * (HIXL calls it with the logical id, rank_table_generator_v2.cc). */
int hixl_acl_device_info(int32_t dev, int32_t attr, int64_t *value)
{
    NEED_LOADED("aclrtGetDeviceInfo");
    NEED_FEATURE(HIXL_ACL_HAS_SOC_INFO, HIXL_LIB_ACL, "aclrtGetDeviceInfo");
    if (dev < 0)
        return acl_fail(HIXL_ACL_ERROR_INVALID_DEVICEID, "aclrtGetDeviceInfo");
    ACL_RET("aclrtGetDeviceInfo", g.aclrtGetDeviceInfo((uint32_t)dev, attr, value));
}

/* What CANN's HcclCommConfigInit would write for a version-2 configuration,
 * then hixl's settings. HcclCommConfigInit leaves every field "unset"
 * (0xFFFFFFFF), which makes HCCL take HCCL_BUFFSIZE and HCCL_DETERMINISTIC
 * from the environment; a value written here would override them, so only
 * what hixl was configured with is written. */
static void comm_config(const hixl_comm_options *opt, HcclCommConfig *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->size = sizeof *cfg;
    cfg->magicWord = HIXL_HCCL_CONFIG_MAGIC;
    cfg->version = HIXL_HCCL_CONFIG_VERSION;
    cfg->hcclBufferSize = opt && opt->buffer_mb ? opt->buffer_mb : HIXL_HCCL_CONFIG_UNSET;
    cfg->hcclDeterministic = HIXL_HCCL_CONFIG_UNSET;
    if (opt)
        snprintf(cfg->hcclCommName, sizeof cfg->hcclCommName, "%s", opt->name);
}

int hixl_hccl_comm_init_config(int32_t dev, uint32_t nranks, const HcclRootInfo *root,
                               uint32_t rank, const hixl_comm_options *opt, HcclComm *out)
{
    if (!hixl_acl_is_loaded() || !(g_features & HIXL_ACL_HAS_ROOT_CONFIG))
        return hixl_hccl_comm_init(dev, nranks, root, rank, out);
    BIND(dev);
    HcclCommConfig cfg;
    comm_config(opt, &cfg);
    pthread_mutex_lock(&g_comm_init_lock);
    __atomic_add_fetch(&g_comm_inits, 1, __ATOMIC_ACQ_REL);
    HcclResult rc = g.HcclCommInitRootInfoConfig(nranks, root, rank, &cfg, out);
    pthread_mutex_unlock(&g_comm_init_lock);
    return rc ? hccl_fail(rc, "HcclCommInitRootInfoConfig") : 0;
}

int hixl_hccl_comm_init_rank_table(int32_t dev, const char *rank_table, uint32_t rank,
                                   const hixl_comm_options *opt, HcclComm *out)
{
    BIND(dev);
    NEED_FEATURE(HIXL_ACL_HAS_RANK_TABLE, HIXL_LIB_HCCL, "HcclCommInitClusterInfoMemConfig");
    HcclCommConfig cfg;
    comm_config(opt, &cfg);
    pthread_mutex_lock(&g_comm_init_lock);
    __atomic_add_fetch(&g_comm_inits, 1, __ATOMIC_ACQ_REL);
    HcclResult rc = g.HcclCommInitClusterInfoMemConfig(rank_table, rank, &cfg, out);
    pthread_mutex_unlock(&g_comm_init_lock);
    return rc ? hccl_fail(rc, "HcclCommInitClusterInfoMemConfig") : 0;
}

unsigned long hixl_hccl_comm_inits(void)
{
    return __atomic_load_n(&g_comm_inits, __ATOMIC_ACQUIRE);
}

/* ============== one-sided HCCL and pinned host memory (issue 18) ============== */

int hixl_hccl_register_global(int32_t dev, int type, void *addr, uint64_t size, void **handle)
{
    BIND(dev);
    NEED_FEATURE(HIXL_ACL_HAS_ONE_SIDED, HIXL_LIB_HCCL, "HcclRegisterGlobalMem");
    HcclMem mem = {type, addr, size};
    HCCL_RET("HcclRegisterGlobalMem", g.HcclRegisterGlobalMem(&mem, handle));
}

int hixl_hccl_deregister_global(int32_t dev, void *handle)
{
    BIND(dev);
    NEED_FEATURE(HIXL_ACL_HAS_ONE_SIDED, HIXL_LIB_HCCL, "HcclDeregisterGlobalMem");
    HCCL_RET("HcclDeregisterGlobalMem", g.HcclDeregisterGlobalMem(handle));
}

int hixl_hccl_bind_mem(int32_t dev, HcclComm comm, void *handle)
{
    BIND(dev);
    NEED_FEATURE(HIXL_ACL_HAS_ONE_SIDED, HIXL_LIB_HCCL, "HcclCommBindMem");
    HCCL_RET("HcclCommBindMem", g.HcclCommBindMem(comm, handle));
}

int hixl_hccl_unbind_mem(int32_t dev, HcclComm comm, void *handle)
{
    BIND(dev);
    NEED_FEATURE(HIXL_ACL_HAS_ONE_SIDED, HIXL_LIB_HCCL, "HcclCommUnbindMem");
    HCCL_RET("HcclCommUnbindMem", g.HcclCommUnbindMem(comm, handle));
}

int hixl_hccl_prepare(int32_t dev, HcclComm comm, int32_t timeout_s)
{
    BIND(dev);
    NEED_FEATURE(HIXL_ACL_HAS_ONE_SIDED, HIXL_LIB_HCCL, "HcclCommPrepare");
    HcclPrepareConfig config;
    memset(&config, 0, sizeof config);
    config.topoType = HCCL_TOPO_FULLMESH;
    HCCL_RET("HcclCommPrepare", g.HcclCommPrepare(comm, &config, timeout_s));
}

int hixl_hccl_one_sided(int32_t dev, HcclComm comm, int put, uint32_t peer,
                        HcclOneSideOpDesc *desc, size_t n, aclrtStream stream, size_t *queued)
{
    *queued = 0;
    BIND(dev);
    const char *api = put ? "HcclBatchPut" : "HcclBatchGet";
    NEED_FEATURE(HIXL_ACL_HAS_ONE_SIDED, HIXL_LIB_HCCL, api);
    while (*queued < n) {
        size_t left = n - *queued;
        uint32_t k = left > HIXL_HCCL_MAX_DESC_NUM ? HIXL_HCCL_MAX_DESC_NUM : (uint32_t)left;
        HcclResult rc = put ? g.HcclBatchPut(comm, peer, desc + *queued, k, stream)
                            : g.HcclBatchGet(comm, peer, desc + *queued, k, stream);
        if (rc)
            return hccl_fail(rc, api);
        *queued += k;
    }
    return 0;
}

int hixl_acl_host_register(int32_t dev, void *ptr, uint64_t size)
{
    BIND(dev);
    /* aclrtHostUnregister ends either registration; both must be there */
    if (!(g_features & HIXL_ACL_HAS_HOST_PIN) || !g.aclrtHostUnregister)
        return absent(HIXL_LIB_ACL, "aclrtHostRegisterV2");
    ACL_RET("aclrtHostRegisterV2",
            g.aclrtHostRegisterV2(ptr, size, HIXL_ACL_HOST_REG_PINNED | HIXL_ACL_HOST_REG_MAPPED));
}

int hixl_acl_host_unregister(int32_t dev, void *ptr)
{
    BIND(dev);
    if (!g.aclrtHostUnregister)
        return absent(HIXL_LIB_ACL, "aclrtHostUnregister");
    ACL_RET("aclrtHostUnregister", g.aclrtHostUnregister(ptr));
}
