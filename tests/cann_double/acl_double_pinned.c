/*
 * TEST DOUBLE of CANN's ACL runtime: page-locked host memory and the rules
 * of asynchronous copies (part of libascendcl.so, see build.py).
 *
 * aclrtHostRegister / aclrtHostUnregister keep a table of registered host
 * ranges (the double maps nothing: the "device address" is the host
 * address). aclrtMemcpyAsync refuses, before queueing, what CANN documents
 * as not allowed or unpredictable, so that hixl's tests fail where hixl
 * would rely on it:
 *
 * - both addresses must be 64-byte aligned: CANN 8.0 aclrtMemcpyAsync page
 *   (aclcppdevg_03_0106, restrictions for all models: "The source address
 *   and destination address passed to this call must be 64-byte aligned");
 * - host memory must be page-locked (aclrtMallocHost or aclrtHostRegister):
 *   the same page warns that host memory not from aclrtMallocHost gives
 *   "unpredictable errors" on training and inference products, and CANN 8.5
 *   and later copy unlocked memory synchronously, so an "asynchronous" copy
 *   of it would block the caller.
 *
 * Both refusals return ACL_ERROR_RT_PARAM_INVALID (107000) and say which
 * rule was broken.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "acl_double_internal.h"

#define COPY_ALIGNMENT 64u
#define REGISTER_ALIGNMENT 4096u

typedef struct host_reg {
    struct host_reg *next;
    const uint8_t *base;
    uint64_t size;
} host_reg;

static host_reg *g_regs; /* under g_lock */

static host_reg *find_reg_locked(const void *p, uint64_t n, int want_base)
{
    const uint8_t *q = p;
    for (host_reg *r = g_regs; r; r = r->next) {
        if (want_base ? r->base == q
                      : (q >= r->base && q < r->base + r->size &&
                         n <= (uint64_t)(r->base + r->size - q)))
            return r;
    }
    return NULL;
}

static int overlaps_reg_locked(const uint8_t *p, uint64_t n)
{
    for (host_reg *r = g_regs; r; r = r->next)
        if (p < r->base + r->size && r->base < p + n)
            return 1;
    return 0;
}

/* aclrtHostRegister (CANN 8.2+, runtime API reference aclcppdevg_03_1804):
 * ptr must be 4 KiB page aligned; ACL_HOST_REGISTER_MAPPED (0) is the one
 * type; devPtr receives the device-visible address. */
DBL_EXPORT aclError aclrtHostRegister(void *ptr, uint64_t size, int type, void **devPtr)
{
    CALL_PROLOGUE("aclrtHostRegister");
    NEED_CONTEXT("aclrtHostRegister");
    if (!ptr || !devPtr || size == 0)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM,
                                "aclrtHostRegister: NULL pointer or size 0");
    if (type != 0)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM,
                                "aclrtHostRegister: type %d (only ACL_HOST_REGISTER_MAPPED)", type);
    if ((uintptr_t)ptr % REGISTER_ALIGNMENT)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM,
                                "aclrtHostRegister: %p is not 4K page aligned", ptr);
    if (hixl_double_is_device_range(ptr, 1))
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM,
                                "aclrtHostRegister: %p is device memory", ptr);
    host_reg *r = calloc(1, sizeof *r);
    if (!r)
        return hixl_double_fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtHostRegister: out of memory");
    pthread_mutex_lock(&g_lock);
    if (overlaps_reg_locked(ptr, size)) {
        pthread_mutex_unlock(&g_lock);
        free(r);
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID,
                                "aclrtHostRegister: [%p, +%llu) overlaps a registered range", ptr,
                                (unsigned long long)size);
    }
    r->base = ptr;
    r->size = size;
    r->next = g_regs;
    g_regs = r;
    pthread_mutex_unlock(&g_lock);
    hixl_double_count(DBL_LIVE_HOST_REGS, 1);
    *devPtr = ptr;
    return ACL_SUCCESS;
}

DBL_EXPORT aclError aclrtHostUnregister(void *ptr)
{
    CALL_PROLOGUE("aclrtHostUnregister");
    NEED_CONTEXT("aclrtHostUnregister");
    pthread_mutex_lock(&g_lock);
    host_reg *r = ptr ? find_reg_locked(ptr, 0, 1) : NULL;
    if (r) {
        for (host_reg **pp = &g_regs; *pp; pp = &(*pp)->next) {
            if (*pp == r) {
                *pp = r->next;
                break;
            }
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (!r)
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID,
                                "aclrtHostUnregister: %p was not registered", ptr);
    free(r);
    hixl_double_count(DBL_LIVE_HOST_REGS, -1);
    return ACL_SUCCESS;
}

DBL_EXPORT int hixl_double_is_pinned_host(const void *ptr, uint64_t n)
{
    pthread_mutex_lock(&g_lock);
    dbl_mem *m = find_mem_locked(ptr, n, 0);
    int ok = (m && m->kind == MEM_HOST) || find_reg_locked(ptr, n, 0) != NULL;
    pthread_mutex_unlock(&g_lock);
    return ok;
}

int hixl_double_check_async_copy(const char *api, const void *dst, const void *src, size_t count)
{
    if (count == 0)
        return 0;
    if ((uintptr_t)dst % COPY_ALIGNMENT || (uintptr_t)src % COPY_ALIGNMENT)
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID,
                                "%s: dst %p and src %p must both be 64-byte aligned", api, dst,
                                src);
    const void *ends[2] = {dst, src};
    for (int i = 0; i < 2; i++) {
        if (hixl_double_is_device_range(ends[i], count))
            continue;
        if (!hixl_double_is_pinned_host(ends[i], count))
            return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID,
                                    "%s: host %s %p (+%zu) is not page-locked (aclrtMallocHost or "
                                    "aclrtHostRegister)", api, i ? "src" : "dst", ends[i], count);
    }
    return 0;
}

DBL_EXPORT int hixl_double_device_fd(const void *ptr, uint64_t n, uint8_t **base, uint64_t *size,
                                     int *fd)
{
    pthread_mutex_lock(&g_lock);
    dbl_mem *m = find_mem_locked(ptr, n, 0);
    int ok = m && m->kind != MEM_HOST && m->fd >= 0;
    if (ok) {
        *base = m->base;
        *size = m->size;
        *fd = dup(m->fd);
        ok = *fd >= 0;
    }
    pthread_mutex_unlock(&g_lock);
    return ok ? 0 : -1;
}
