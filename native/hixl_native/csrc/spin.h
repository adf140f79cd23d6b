/*
 * Bounded busy waiting, for a thread that expects its next event within
 * microseconds: looking again costs less than going to sleep and being woken,
 * which on a virtual machine takes tens of microseconds.
 *
 * Between two looks a spinning thread yields its core (sched_yield). A small
 * transfer has three parties on the path: the client, the initiating daemon
 * and the target daemon; each waits for the one before, and on a host with
 * fewer cores than waiting parties, spinners that kept their cores would
 * leave the one with work to do without a core until a time slice ended.
 * Yielding, they take turns with it instead, and whoever's event came runs
 * within one turn, without the wake-up a sleeping thread pays. Where nothing
 * else wants the core, a yield returns at once.
 *
 * A spin ends at its budget. A thread that does not yield (other work on the
 * host) keeps the core for its time slice, which soon spends the budget: the
 * spinner then sleeps, as it would have without spinning.
 */
#ifndef HIXL_SPIN_H
#define HIXL_SPIN_H

#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <sys/socket.h>

#include "hixl_common.h"

/* Between two looks: another runnable thread takes the core for its turn. */
static inline void hixl_spin_pause(void)
{
    (void)sched_yield();
}

/* 1 once a spin that should end at `until` is over. */
static inline int hixl_spin_over(uint64_t until)
{
    return hixl_now_ns() >= until;
}

/* Spins up to budget_ns until the stream socket fd has something to read
 * (bytes, an end, an error: what the next read reports): 1 it has, 0 not. */
static inline int hixl_spin_readable(int fd, uint64_t budget_ns)
{
    uint64_t until = hixl_now_ns() + budget_ns;
    char b;
    for (;;) {
        ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return 1;
        if (hixl_spin_over(until))
            return 0;
        hixl_spin_pause();
    }
}

#endif
