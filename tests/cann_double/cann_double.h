/*
 * TEST DOUBLE of CANN (libascendcl.so + libhccl.so) for hixl's tests.
 *
 * This is NOT CANN and talks to no accelerator. It implements, over host
 * memory and local sockets, the small subset of the ACL runtime and HCCL
 * entry points that hixl's shim (native/hixl_native/csrc/acl_shim.c) loads,
 * with CANN's C signatures and its public error codes, so that the shim and
 * everything above it can be tested on any machine. The declarations below
 * are written for the double; they follow the function prototypes of the
 * public CANN headers (acl_rt.h / acl_base_rt.h / rt_error_codes.h of the
 * CANN runtime, hccl.h / hccl_types.h of CANN HCCL, 8.x-9.0 era).
 *
 * Shared between the two libraries: libhccl.so (double) links against
 * libascendcl.so (double) and uses the hixl_double_* internals exported
 * from it (streams, device memory lookup, faults, error messages).
 */
#ifndef HIXL_CANN_DOUBLE_H
#define HIXL_CANN_DOUBLE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define DBL_EXPORT __attribute__((visibility("default")))

/* ---- CANN types (ABI: enums are int-sized) ---- */
typedef int aclError;
typedef void *aclrtStream;
typedef int HcclResult;
typedef void *HcclComm;
typedef int HcclDataType;

#define DBL_ROOT_INFO_BYTES 4108
typedef struct {
    char internal[DBL_ROOT_INFO_BYTES];
} HcclRootInfo;

typedef struct {
    int sendRecvType; /* HCCL_SEND = 0, HCCL_RECV = 1 */
    void *buf;
    uint64_t count;
    HcclDataType dataType;
    uint32_t remoteRank;
} HcclSendRecvItem;

/* ---- error codes the double returns (values of the public headers) ---- */
#define ACL_SUCCESS 0
#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_UNINITIALIZE 100001
#define ACL_ERROR_REPEAT_INITIALIZE 100002
#define ACL_ERROR_REPEAT_FINALIZE 100037
#define ACL_ERROR_RT_PARAM_INVALID 107000
#define ACL_ERROR_RT_INVALID_DEVICEID 107001
#define ACL_ERROR_RT_CONTEXT_NULL 107002
#define ACL_ERROR_RT_INVALID_MALLOC_TYPE 107018
#define ACL_ERROR_RT_STREAM_ABORT 107023
#define ACL_ERROR_RT_FEATURE_NOT_SUPPORT 207000
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001
#define ACL_ERROR_RT_NO_PERMISSION 207006
#define ACL_ERROR_RT_INTERNAL_ERROR 507000
#define ACL_ERROR_RT_IPC_ERROR 507022
#define ACL_ERROR_RT_STREAM_SYNC_TIMEOUT 507046
#define ACL_ERROR_RT_SUSPECT_REMOTE_ERROR 507057

#define HCCL_SUCCESS 0
#define HCCL_E_PARA 1
#define HCCL_E_PTR 2
#define HCCL_E_MEMORY 3
#define HCCL_E_INTERNAL 4
#define HCCL_E_NOT_SUPPORT 5
#define HCCL_E_TIMEOUT 9
#define HCCL_E_TCP_CONNECT 11

/* ---- fault injection (see __init__.py for the user-facing description) ---- */
enum {
    DBL_FAULT_NONE = 0,
    DBL_FAULT_FAIL = 1,  /* return / fail the task with `arg` as the error code */
    DBL_FAULT_DELAY = 2, /* sleep `arg` milliseconds, then proceed normally */
    DBL_FAULT_HANG = 3,  /* block until released (calls) or aborted (stream tasks) */
    DBL_FAULT_SEVER = 4, /* stream tasks of HCCL: move half the bytes, cut the link, fail with `arg` */
};

typedef struct {
    int action;
    int arg;
} dbl_fault;

/* Takes one trigger of the fault armed for `point`, if any. */
DBL_EXPORT dbl_fault hixl_double_fault_take(const char *point);
/* Applies DELAY/HANG/FAIL of a fault hit at call time; returns the code to
 * return (0 to proceed). */
DBL_EXPORT int hixl_double_fault_call(const char *point);

/* ---- error messages (aclGetRecentErrMsg) ---- */
DBL_EXPORT int hixl_double_fail(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- runtime state used by the HCCL double ---- */
DBL_EXPORT int hixl_double_initialized(void);
/* Device bound to the calling thread by aclrtSetDevice, or -1. */
DBL_EXPORT int hixl_double_current_device(void);
/* 1 if [ptr, ptr + n) lies in device memory (owned or imported) of this process. */
DBL_EXPORT int hixl_double_is_device_range(const void *ptr, uint64_t n);
DBL_EXPORT void hixl_double_count(int kind, int delta);

enum { DBL_LIVE_DEVMEM, DBL_LIVE_HOSTMEM, DBL_LIVE_IMPORTS, DBL_LIVE_STREAMS, DBL_LIVE_COMMS,
       DBL_LIVE_HOST_REGS, DBL_LIVE_GLOBAL_MEMS, /* acl_double_pinned.c, hccl_double_onesided.c */
       DBL_LIVE_KINDS };

/* A stream task: runs on the stream's worker thread. `abort_fd` becomes
 * readable when the stream is destroyed; `fault` is the exec-time fault
 * drawn for this task (HANG and SEVER reach the task; the worker handles
 * FAIL and DELAY). Returns 0 or an ACL error code, which fails the stream. */
typedef int (*dbl_task_fn)(void *ctx, int abort_fd, dbl_fault fault);

DBL_EXPORT int hixl_double_stream_submit(aclrtStream stream, const char *exec_point,
                                         dbl_task_fn run, void (*release)(void *ctx), void *ctx);

/* ---- one-sided HCCL and pinned host memory (acl_double_pinned.c) ---- */
/* The device allocation (owned or imported) holding [ptr, ptr + n): its
 * base, size and a dup of its memfd (the caller closes it). 0, or -1. */
DBL_EXPORT int hixl_double_device_fd(const void *ptr, uint64_t n, uint8_t **base, uint64_t *size,
                                     int *fd);
/* 1 if [ptr, ptr + n) is page-locked host memory: aclrtMallocHost or aclrtHostRegisterV2 PINNED. */
DBL_EXPORT int hixl_double_is_pinned_host(const void *ptr, uint64_t n);

/* ---- small helpers shared by both libraries (static: each library has its own copy) ---- */
#include <poll.h>
#include <time.h>

static inline uint64_t dbl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Waits until `fd` is ready for `events` (fd < 0: only the aborts and the
 * deadline count), or any of the abort fds becomes readable, or the deadline
 * (dbl_now_ms() scale, 0 = none) passes. Returns 0 when fd is ready, 1 when
 * aborted, 2 on timeout. */
static inline int dbl_wait_fd(int fd, short events, const int *abort_fds, int nabort,
                              uint64_t deadline_ms)
{
    struct pollfd p[4];
    int n = 0;
    for (int i = 0; i < nabort && n < 3; i++) {
        if (abort_fds[i] >= 0) {
            p[n].fd = abort_fds[i];
            p[n].events = POLLIN;
            n++;
        }
    }
    int first = n;
    if (fd >= 0) {
        p[n].fd = fd;
        p[n].events = events;
        n++;
    }
    for (;;) {
        int wait = -1;
        if (deadline_ms) {
            uint64_t now = dbl_now_ms();
            if (now >= deadline_ms)
                return 2;
            wait = (int)(deadline_ms - now);
        }
        int r = poll(p, (nfds_t)n, wait);
        if (r < 0)
            continue; /* EINTR */
        for (int i = 0; i < first; i++)
            if (p[i].revents)
                return 1;
        if (fd >= 0 && p[first].revents)
            return 0;
    }
}

#endif
