/*
 * Definitions shared by every part of the hixl native core.
 *
 * Every C function reports failure through one of these negative codes and
 * never through errno alone: the Cython layer turns a code (plus errno, when
 * the code is HIXL_E_IO or HIXL_E_NOMEM) into a Python exception in exactly
 * one place. The first block of codes also travels on the wire and in
 * completions, so their values are part of the protocol and must not change.
 */
#ifndef HIXL_COMMON_H
#define HIXL_COMMON_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

enum {
    HIXL_OK = 0,
    /* Public statuses: on the wire, in completions, exported to Python. */
    HIXL_E_TIMEOUT = -1,
    HIXL_E_CLOSED = -2,
    HIXL_E_REFUSED = -3,
    HIXL_E_IO = -4,
    HIXL_E_PROTO = -5,
    HIXL_E_CANCELLED = -6,
    /* Client-process memory (xmem.h) revoked, or its process exited;
     * posted in completions, never sent by a data server (which refuses). */
    HIXL_E_GONE = -7,
    /* A request's CRC-32C trailer (tcp_wire.h) did not match its payload. */
    HIXL_E_CHECKSUM = -8,
    /* Local API errors only; never sent to a peer nor posted. */
    HIXL_E_NOMEM = -20,
    HIXL_E_EXHAUSTED = -21,
    HIXL_E_INVAL = -22,
    HIXL_E_BUSY = -23,
    HIXL_E_EXISTS = -24,
};

/*
 * Live-resource counters: one atomic add per acquire/release, cheap enough
 * to stay on in every build. They count what close() gives back (mapped
 * memory, open queues, running servers and links, registered regions,
 * extent allocators, on their own or inside a pool) and
 * native memory freed on its own schedule (requests until drained, server
 * connections until reaped), so tests can assert after each case that
 * nothing leaked. Defined in mapping.c.
 */
enum {
    HIXL_LIVE_MAPPINGS,
    HIXL_LIVE_POOLS,
    HIXL_LIVE_QUEUES,
    HIXL_LIVE_REQUESTS,
    HIXL_LIVE_REGIONS,
    HIXL_LIVE_SERVERS,
    HIXL_LIVE_CONNECTIONS,
    HIXL_LIVE_LINKS,
    HIXL_LIVE_ALLOCATORS,
    HIXL_LIVE_XMEMS,
    HIXL_LIVE_KINDS
};

extern atomic_long hixl_live_counts[HIXL_LIVE_KINDS];

static inline void hixl_live_add(int kind, long delta)
{
    atomic_fetch_add_explicit(&hixl_live_counts[kind], delta, memory_order_relaxed);
}

long hixl_live_count(int kind);

/* Monotonic time: deadlines must not jump with wall-clock adjustments. */
static inline uint64_t hixl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t hixl_deadline_after_ms(uint64_t ms)
{
    return hixl_now_ns() + ms * 1000000ull;
}

/* poll's timeout for waiting until deadline_ns (0: none, -1), rounded up to a
 * whole ms; HIXL_E_TIMEOUT once the deadline passed. */
static inline int hixl_poll_timeout(uint64_t deadline_ns, int *timeout_ms)
{
    *timeout_ms = -1;
    if (deadline_ns == 0)
        return HIXL_OK;
    uint64_t now = hixl_now_ns();
    if (now >= deadline_ns)
        return HIXL_E_TIMEOUT;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    *timeout_ms = ms > INT_MAX ? INT_MAX : (int)ms;
    return HIXL_OK;
}

/*
 * Starts a native thread with every signal blocked, so that signals keep
 * reaching the interpreter's main thread (CPython only acts on them there)
 * and our syscalls are not interrupted by them.
 */
int hixl_spawn_thread(pthread_t *thread, void *(*fn)(void *), void *arg);

#endif
