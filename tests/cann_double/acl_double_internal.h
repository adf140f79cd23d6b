/* Private to the ACL double's translation units (acl_double*.c). */
#ifndef HIXL_ACL_DOUBLE_INTERNAL_H
#define HIXL_ACL_DOUBLE_INTERNAL_H

#include "cann_double.h"

#define HUGE_PAGE (2u << 20)
#define MAX_DEVICES 64
#define MAX_FAULTS 32
#define MAX_PIDS 16
#define KEY_LEN 65
#define IPC_EXPORT_FLAG_DISABLE_PID_VALIDATION 0x1UL

enum { MEM_DEVICE, MEM_HOST, MEM_IMPORT };
enum { H2H, H2D, D2H, D2D, MEMCPY_DEFAULT };

typedef struct dbl_mem {
    struct dbl_mem *next;
    uint8_t *base;
    uint64_t size;     /* bytes usable from base */
    uint64_t charged;  /* bytes counted against the device limit */
    void *map_base;
    size_t map_len;
    int fd;
    int device;
    int kind;
    int exported;
    int pid_check;
    int npids;
    int32_t pids[MAX_PIDS];
    /* An export's importers (their pids) that have not closed it: CANN lets
     * the exporter close a key only after every importer did. */
    int nimporters;
    int32_t importers[MAX_PIDS];
    char key[KEY_LEN];
} dbl_mem;

typedef struct {
    char point[48];
    int action, arg, count, skip;
} fault_slot;

extern pthread_mutex_t g_lock;
extern dbl_mem *g_mems;
extern int g_initialized;
extern int g_device_count;
extern __thread int t_device;

/* The double's bare tgid of a process: its pid plus this (see
 * acl_double_context.c). */
#define DBL_BARE_TGID_OFFSET 1000000
DBL_EXPORT int32_t hixl_double_bare_tgid_of(int32_t pid);
/* The calling thread's current context (acl_double_context.c), or NULL. */
void *hixl_double_current_context(void);

dbl_mem *find_mem_locked(const void *p, uint64_t n, int want_base);
void unlink_mem_locked(dbl_mem *m);
void *map_aligned(int fd, size_t len, void **map_base, size_t *map_len);
size_t page_round(uint64_t n);
void release_mem(dbl_mem *m);
/* aclrtMemcpyAsync's operand rules (acl_double_pinned.c): 0, COPY_SYNCHRONOUS
 * (a host operand is not page-locked) or the error. */
#define COPY_SYNCHRONOUS 1
int hixl_double_check_async_copy(const char *api, const void *dst, const void *src, size_t count);
/* Waits for every task queued on the stream (acl_double_stream.c); 0 or its error. */
int hixl_double_stream_drain(aclrtStream stream);
void hixl_double_count_sync_copy(void);

#define CALL_PROLOGUE(name)                                                          \
    do {                                                                             \
        int fault_rc_ = hixl_double_fault_call(name);                                \
        if (fault_rc_)                                                               \
            return fault_rc_;                                                        \
        if (!hixl_double_initialized())                                              \
            return hixl_double_fail(ACL_ERROR_UNINITIALIZE, "%s: aclInit was not called", name); \
    } while (0)

#define NEED_CONTEXT(name)                                                           \
    do {                                                                             \
        if (t_device < 0)                                                            \
            return hixl_double_fail(ACL_ERROR_RT_CONTEXT_NULL,                       \
                                    "%s: no device is set on this thread", name);    \
    } while (0)

#endif
