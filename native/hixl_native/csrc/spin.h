/*
 * Bounded busy waiting, for a thread that expects its next event within
 * microseconds: looking again costs less than going to sleep and being woken,
 * which on a virtual machine takes tens of microseconds. A spin ends at its
 * budget, and early when the thread lost its CPU (a long gap between two
 * looks): another thread wants the core, and spinning on only delays it.
 */
#ifndef HIXL_SPIN_H
#define HIXL_SPIN_H

#include <errno.h>
#include <stdint.h>
#include <sys/socket.h>

#include "hixl_common.h"

#define HIXL_PREEMPTED_NS 20000ull

static inline void hixl_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* 1 once a spin that started with *last = its start should stop looking:
 * `until` passed, or this thread was off its CPU since the last look. */
static inline int hixl_spin_over(uint64_t *last, uint64_t until)
{
    uint64_t now = hixl_now_ns();
    int over = now >= until || now - *last > HIXL_PREEMPTED_NS;
    *last = now;
    return over;
}

/* Spins up to budget_ns until the stream socket fd has something to read
 * (bytes, an end, an error: what the next read reports): 1 it has, 0 not. */
static inline int hixl_spin_readable(int fd, uint64_t budget_ns)
{
    uint64_t last = hixl_now_ns(), until = last + budget_ns;
    char b;
    for (;;) {
        ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return 1;
        if (hixl_spin_over(&last, until))
            return 0;
        hixl_cpu_relax();
    }
}

#endif
