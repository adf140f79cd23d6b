/*
 * TEST DOUBLE of CANN's device and context management, part of the double's
 * libascendcl.so: aclrtSetDevice / aclrtResetDevice (reference-counted per
 * process), explicit contexts (aclrtCreateContext, aclrtDestroyContext,
 * aclrtSetCurrentContext, aclrtGetCurrentContext) and the bare tgid.
 *
 * Each rule below names the CANN API reference page it follows (CANN 8.0 /
 * 8.5 "appdevgapi" pages). Nothing here talks to an accelerator.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "acl_double_internal.h"

#define CONTEXT_MAGIC 0x43545854u

typedef struct dbl_context {
    uint32_t magic;
    struct dbl_context *next;
    int device;
    int is_default;
} dbl_context;

/* The default context of each device (what aclrtSetDevice makes current). */
static dbl_context g_default_ctx[MAX_DEVICES];
/* Explicit contexts alive in the process. */
static dbl_context *g_contexts;
/* aclrtSetDevice's reference count per device, for the whole process. */
static int g_device_refs[MAX_DEVICES];

__thread dbl_context *t_context;

static int valid_device(int32_t id)
{
    return id >= 0 && id < g_device_count && id < MAX_DEVICES;
}

static void make_current(dbl_context *ctx)
{
    t_context = ctx;
    t_device = ctx ? ctx->device : -1;
}

/* "aclrtSetDevice" (aclcppdevg_03_0039) and "aclrtResetDevice"
 * (aclcppdevg_03_0040): every aclrtSetDevice adds one to the device's
 * reference count and every aclrtResetDevice takes one off; the device's
 * resources (its default context, and with it what the process made
 * there) go only when the count reaches 0. A process that sets a device
 * from many threads and resets it once keeps the device. */
DBL_EXPORT aclError aclrtSetDevice(int32_t deviceId)
{
    CALL_PROLOGUE("aclrtSetDevice");
    if (!valid_device(deviceId))
        return hixl_double_fail(ACL_ERROR_RT_INVALID_DEVICEID,
                                "aclrtSetDevice: device %d does not exist (%d devices)", deviceId,
                                g_device_count);
    pthread_mutex_lock(&g_lock);
    g_device_refs[deviceId]++;
    dbl_context *ctx = &g_default_ctx[deviceId];
    ctx->magic = CONTEXT_MAGIC;
    ctx->device = deviceId;
    ctx->is_default = 1;
    pthread_mutex_unlock(&g_lock);
    make_current(ctx);
    return ACL_SUCCESS;
}

DBL_EXPORT aclError aclrtResetDevice(int32_t deviceId)
{
    CALL_PROLOGUE("aclrtResetDevice");
    if (!valid_device(deviceId))
        return hixl_double_fail(ACL_ERROR_RT_INVALID_DEVICEID,
                                "aclrtResetDevice: device %d does not exist", deviceId);
    pthread_mutex_lock(&g_lock);
    if (g_device_refs[deviceId] > 0)
        g_device_refs[deviceId]--;
    pthread_mutex_unlock(&g_lock);
    if (t_context && t_context->device == deviceId && t_context->is_default)
        make_current(NULL);
    return ACL_SUCCESS;
}

/* "aclrtCreateContext" (CANN 8.0 API reference, Context management): an
 * explicit context of a device, current on the creating thread from then on.
 * The double requires the device to be set in the process first, as hixl
 * does (aclrtSetDevice, then aclrtCreateContext). */
DBL_EXPORT aclError aclrtCreateContext(void **context, int32_t deviceId)
{
    CALL_PROLOGUE("aclrtCreateContext");
    if (!context)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateContext: context is NULL");
    if (!valid_device(deviceId))
        return hixl_double_fail(ACL_ERROR_RT_INVALID_DEVICEID,
                                "aclrtCreateContext: device %d does not exist", deviceId);
    dbl_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return hixl_double_fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtCreateContext: out of memory");
    ctx->magic = CONTEXT_MAGIC;
    ctx->device = deviceId;
    pthread_mutex_lock(&g_lock);
    ctx->next = g_contexts;
    g_contexts = ctx;
    pthread_mutex_unlock(&g_lock);
    make_current(ctx);
    *context = ctx;
    return ACL_SUCCESS;
}

static dbl_context *find_context_locked(const void *p)
{
    for (dbl_context *c = g_contexts; c; c = c->next)
        if (c == p)
            return c;
    for (int i = 0; i < MAX_DEVICES; i++)
        if (p == &g_default_ctx[i] && g_default_ctx[i].magic == CONTEXT_MAGIC)
            return &g_default_ctx[i];
    return NULL;
}

/* "aclrtSetCurrentContext" (aclcppdevg_03_0061): the default context of a
 * device cannot be destroyed with aclrtDestroyContext. */
DBL_EXPORT aclError aclrtDestroyContext(void *context)
{
    CALL_PROLOGUE("aclrtDestroyContext");
    pthread_mutex_lock(&g_lock);
    dbl_context *ctx = find_context_locked(context);
    if (!ctx || ctx->is_default) {
        pthread_mutex_unlock(&g_lock);
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID,
                                "aclrtDestroyContext: %p is %s", context,
                                ctx ? "a default context (aclrtSetDevice's)" : "not a context");
    }
    for (dbl_context **pp = &g_contexts; *pp; pp = &(*pp)->next) {
        if (*pp == ctx) {
            *pp = ctx->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (t_context == ctx)
        make_current(NULL);
    ctx->magic = 0;
    free(ctx);
    return ACL_SUCCESS;
}

/* "aclrtSetCurrentContext" (aclcppdevg_03_0061): the context becomes the
 * thread's, and its device the thread's device; a context whose device was
 * reset must not be made current. */
DBL_EXPORT aclError aclrtSetCurrentContext(void *context)
{
    CALL_PROLOGUE("aclrtSetCurrentContext");
    pthread_mutex_lock(&g_lock);
    dbl_context *ctx = find_context_locked(context);
    int refs = ctx ? g_device_refs[ctx->device] : 0;
    pthread_mutex_unlock(&g_lock);
    if (!ctx)
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID,
                                "aclrtSetCurrentContext: %p is not a context", context);
    if (refs == 0)
        return hixl_double_fail(ACL_ERROR_RT_CONTEXT_NULL,
                                "aclrtSetCurrentContext: device %d of the context is reset",
                                ctx->device);
    make_current(ctx);
    return ACL_SUCCESS;
}

DBL_EXPORT aclError aclrtGetCurrentContext(void **context)
{
    CALL_PROLOGUE("aclrtGetCurrentContext");
    if (!context)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetCurrentContext: context is NULL");
    if (!t_context)
        return hixl_double_fail(ACL_ERROR_RT_CONTEXT_NULL,
                                "aclrtGetCurrentContext: this thread has no context");
    *context = t_context;
    return ACL_SUCCESS;
}

/* "aclrtGetPhyDevIdByLogicDevId": the double's devices are all visible, so
 * physical ids are the logical ones. */
DBL_EXPORT aclError aclrtGetPhyDevIdByLogicDevId(int32_t logicDevId, int32_t *phyDevId)
{
    CALL_PROLOGUE("aclrtGetPhyDevIdByLogicDevId");
    if (!phyDevId || !valid_device(logicDevId))
        return hixl_double_fail(ACL_ERROR_RT_INVALID_DEVICEID,
                                "aclrtGetPhyDevIdByLogicDevId: bad device %d", logicDevId);
    *phyDevId = logicDevId;
    return ACL_SUCCESS;
}

/* "aclrtDeviceGetBareTgid" / "aclrtIpcMemSetImportPid" (CANN 8.2+): the IPC
 * whitelist names processes by the id the driver knows (the bare tgid),
 * which inside a container is not getpid(). The double makes it differ
 * always, so that whitelisting getpid() is refused as it would be there. */
DBL_EXPORT int32_t hixl_double_bare_tgid_of(int32_t pid)
{
    return pid + DBL_BARE_TGID_OFFSET;
}

DBL_EXPORT aclError aclrtDeviceGetBareTgid(int32_t *pid)
{
    CALL_PROLOGUE("aclrtDeviceGetBareTgid");
    if (!pid)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "aclrtDeviceGetBareTgid: pid is NULL");
    *pid = hixl_double_bare_tgid_of((int32_t)getpid());
    return ACL_SUCCESS;
}

/* For tests: aclrtSetDevice's reference count of a device. */
DBL_EXPORT int hixl_double_device_refs(int device)
{
    if (device < 0 || device >= MAX_DEVICES)
        return -1;
    pthread_mutex_lock(&g_lock);
    int n = g_device_refs[device];
    pthread_mutex_unlock(&g_lock);
    return n;
}

void *hixl_double_current_context(void)
{
    return t_context;
}

/* "aclrtGetSocName" (CANN runtime API reference): the SoC's version name, or
 * NULL where it cannot be read. HIXL reads it to choose its rank-table
 * version (hixl rank_table_generator.cc: Ascend910_93xx names write 1.2)
 * and its SoC class (hixl hixl_utils.cc: Ascend910B* is A2). The double's
 * SoC is HIXL_DOUBLE_SOC (read on every call, so that a test can switch
 * it), Ascend910B1 by default. */
DBL_EXPORT const char *aclrtGetSocName(void)
{
    if (!hixl_double_initialized())
        return NULL;
    const char *soc = getenv("HIXL_DOUBLE_SOC");
    return soc && *soc ? soc : "Ascend910B1";
}

#define DBL_DEV_ATTR_SUPER_POD_DEVICE_ID 403 /* ACL_DEV_ATTR_SUPER_POD_DEVIDE_ID */
#define DBL_DEV_ATTR_SUPER_POD_ID 405        /* ACL_DEV_ATTR_SUPER_POD_ID */

/* "aclrtGetDeviceInfo" / "aclrtDevAttr" (CANN runtime API reference;
 * acl_rt.h: 403 super pod device id, 405 super pod id): the super-pod
 * attributes exist on Atlas A3 products only (Ascend910_93xx, whose rank
 * tables HIXL's rank_table_generator_v2.cc and hcomm's
 * topoinfo_ranktableConcise.cc fill with them); other SoCs answer
 * ACL_ERROR_RT_FEATURE_NOT_SUPPORT. On an A3 double a device's super device
 * id is HIXL_DOUBLE_SUPER_DEVICE_BASE (default 0) plus its id, and every
 * device lies in super pod HIXL_DOUBLE_SUPER_POD_ID (default 0). */
DBL_EXPORT aclError aclrtGetDeviceInfo(uint32_t deviceId, int32_t attr, int64_t *value)
{
    CALL_PROLOGUE("aclrtGetDeviceInfo");
    if (!value)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceInfo: %s", "NULL value");
    if (deviceId > INT32_MAX || !valid_device((int32_t)deviceId))
        return hixl_double_fail(ACL_ERROR_RT_INVALID_DEVICEID,
                                "aclrtGetDeviceInfo: bad device %d", (int)deviceId);
    const char *soc = aclrtGetSocName();
    int a3 = soc && strncmp(soc, "Ascend910_93", 12) == 0;
    if (attr == DBL_DEV_ATTR_SUPER_POD_DEVICE_ID || attr == DBL_DEV_ATTR_SUPER_POD_ID) {
        if (!a3)
            return hixl_double_fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                                    "aclrtGetDeviceInfo: %s has no super pod", soc);
        const char *env = getenv(attr == DBL_DEV_ATTR_SUPER_POD_ID ? "HIXL_DOUBLE_SUPER_POD_ID"
                                                                   : "HIXL_DOUBLE_SUPER_DEVICE_BASE");
        int64_t base = env && *env ? strtoll(env, NULL, 0) : 0;
        *value = attr == DBL_DEV_ATTR_SUPER_POD_ID ? base : base + (int64_t)deviceId;
        return ACL_SUCCESS;
    }
    return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceInfo: attribute %d is not "
                            "modelled by the double", (int)attr);
}
