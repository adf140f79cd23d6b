/*
 * TEST DOUBLE of CANN's ACL runtime: host memory registration and the rules
 * of asynchronous copies (part of libascendcl.so, see build.py).
 *
 * Registration keeps a table of registered host ranges (the double maps
 * nothing: the "device address" is the host address), each remembering
 * whether it was page-locked. What the runtime does, and where it says so:
 *
 * - aclrtHostRegister(ptr, size, ACL_HOST_REGISTER_MAPPED, &devPtr) maps
 *   host memory for the device and does not page-lock it; only
 *   aclrtHostRegisterV2 with ACL_HOST_REG_PINNED (0x10000000) does, alone or
 *   with ACL_HOST_REG_MAPPED (0x2) (runtime API docs "aclrtHostRegisterV2"
 *   and the guide's "recommended APIs and typical scenarios"; HostRegisterV2
 *   in the runtime's api_impl.cc). Both want a 4 KiB aligned address; a
 *   range overlapping a registered one is refused.
 * - aclrtMemcpyAsync: both addresses 64-byte aligned (CANN 8.0
 *   aclrtMemcpyAsync page, aclcppdevg_03_0106: "must be 64-byte aligned"),
 *   else 107000. Host memory that is not page-locked (neither
 *   aclrtMallocHost nor a PINNED registration) is accepted and copied
 *   synchronously: the call returns once the copy is done (CANN 8.5 and
 *   later; the same page). `hixl_double_sync_copies` counts such copies, so
 *   tests can tell an asynchronous copy from a synchronous one.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "acl_double_internal.h"

#define COPY_ALIGNMENT 64u
#define REGISTER_ALIGNMENT 4096u
#define ACL_HOST_REG_MAPPED 0x2u
#define ACL_HOST_REG_PINNED 0x10000000u

typedef struct host_reg {
    struct host_reg *next;
    const uint8_t *base;
    uint64_t size;
    int pinned;
} host_reg;

static host_reg *g_regs; /* under g_lock */
static long g_sync_copies;

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

static aclError register_host(const char *api, void *ptr, uint64_t size, int pinned)
{
    if ((uintptr_t)ptr % REGISTER_ALIGNMENT)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "%s: %p is not 4K page aligned", api,
                                ptr);
    if (hixl_double_is_device_range(ptr, 1))
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "%s: %p is device memory", api, ptr);
    host_reg *r = calloc(1, sizeof *r);
    if (!r)
        return hixl_double_fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: out of memory", api);
    pthread_mutex_lock(&g_lock);
    if (overlaps_reg_locked(ptr, size)) {
        pthread_mutex_unlock(&g_lock);
        free(r);
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID,
                                "%s: [%p, +%llu) overlaps a registered range", api, ptr,
                                (unsigned long long)size);
    }
    r->base = ptr;
    r->size = size;
    r->pinned = pinned;
    r->next = g_regs;
    g_regs = r;
    pthread_mutex_unlock(&g_lock);
    hixl_double_count(DBL_LIVE_HOST_REGS, 1);
    return ACL_SUCCESS;
}

/* aclrtHostRegister (CANN 8.2+, runtime API reference aclcppdevg_03_1804):
 * ACL_HOST_REGISTER_MAPPED (0) is the one type; devPtr receives the
 * device-visible address. The memory is mapped, not page-locked. */
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
    aclError rc = register_host("aclrtHostRegister", ptr, size, 0);
    if (!rc)
        *devPtr = ptr;
    return rc;
}

/* aclrtHostRegisterV2(ptr, size, flag) (runtime API docs "aclrtHostRegisterV2"):
 * flag is ACL_HOST_REG_MAPPED, ACL_HOST_REG_PINNED or both; PINNED page-locks. */
DBL_EXPORT aclError aclrtHostRegisterV2(void *ptr, uint64_t size, uint32_t flag)
{
    CALL_PROLOGUE("aclrtHostRegisterV2");
    NEED_CONTEXT("aclrtHostRegisterV2");
    if (!ptr || size == 0)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM,
                                "aclrtHostRegisterV2: NULL pointer or size 0");
    if (!flag || (flag & ~(ACL_HOST_REG_MAPPED | ACL_HOST_REG_PINNED)))
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "aclrtHostRegisterV2: flag %#x", flag);
    return register_host("aclrtHostRegisterV2", ptr, size, (flag & ACL_HOST_REG_PINNED) != 0);
}

void hixl_double_count_sync_copy(void)
{
    __atomic_add_fetch(&g_sync_copies, 1, __ATOMIC_SEQ_CST);
}

/* For tests: copies aclrtMemcpyAsync made synchronously (unpinned host memory). */
DBL_EXPORT long hixl_double_sync_copies(void)
{
    return __atomic_load_n(&g_sync_copies, __ATOMIC_SEQ_CST);
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
    host_reg *r = find_reg_locked(ptr, n, 0);
    int ok = (m && m->kind == MEM_HOST) || (r && r->pinned);
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
            return COPY_SYNCHRONOUS;
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
