#define _GNU_SOURCE
#include "link_threads.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "hixl_common.h"

#define DEFAULT_THREADS 16
#define MAX_THREADS 256
#define EVENTS_PER_WAIT 64
/* The watcher never sleeps longer than this, whatever its timers say. */
#define MAX_SLEEP_MS 1000

static struct {
    pthread_mutex_t mu; /* everything below */
    pthread_cond_t work;
    hixl_job *run_head, *run_tail;
    hixl_job *timed;      /* unordered; next_due_ns is a lower bound of its times */
    uint64_t next_due_ns;
    int want, nthreads;
    int epfd, wake_fd;    /* -1 until started */
    /* Advanced by the watcher after each batch, which it handles under
     * epoch_mu; hixl_jobs_quiesce waits for the next advance. */
    pthread_mutex_t epoch_mu;
    pthread_cond_t epoch_cv;
    uint64_t epoch;
} jobs = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .work = PTHREAD_COND_INITIALIZER,
    .next_due_ns = UINT64_MAX,
    .want = DEFAULT_THREADS,
    .epfd = -1,
    .wake_fd = -1,
    .epoch_mu = PTHREAD_MUTEX_INITIALIZER,
    .epoch_cv = PTHREAD_COND_INITIALIZER,
};

static void wake_watcher(void)
{
    uint64_t one = 1;
    ssize_t n = write(jobs.wake_fd, &one, sizeof(one));
    (void)n; /* only fails when the counter is saturated, i.e. already readable */
}

/* ---- workers ---- */

static void *worker_main(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&jobs.mu);
        while (jobs.run_head == NULL)
            pthread_cond_wait(&jobs.work, &jobs.mu);
        hixl_job *j = jobs.run_head;
        jobs.run_head = j->run_next;
        if (jobs.run_head == NULL)
            jobs.run_tail = NULL;
        j->queued = 0;
        pthread_mutex_unlock(&jobs.mu);
        j->run(j);
    }
    return NULL;
}

void hixl_jobs_run(hixl_job *j)
{
    pthread_mutex_lock(&jobs.mu);
    if (!j->queued) {
        j->queued = 1;
        j->run_next = NULL;
        if (jobs.run_tail != NULL)
            jobs.run_tail->run_next = j;
        else
            jobs.run_head = j;
        jobs.run_tail = j;
        pthread_cond_signal(&jobs.work);
    }
    pthread_mutex_unlock(&jobs.mu);
}

/* ---- timers ---- */

static void untime_locked(hixl_job *j)
{
    if (!j->timed)
        return;
    if (j->timed_prev != NULL)
        j->timed_prev->timed_next = j->timed_next;
    else
        jobs.timed = j->timed_next;
    if (j->timed_next != NULL)
        j->timed_next->timed_prev = j->timed_prev;
    j->timed = 0;
}

void hixl_jobs_time(hixl_job *j, uint64_t due_ns)
{
    pthread_mutex_lock(&jobs.mu);
    if (!j->timed) {
        j->timed = 1;
        j->timed_prev = NULL;
        j->timed_next = jobs.timed;
        if (jobs.timed != NULL)
            jobs.timed->timed_prev = j;
        jobs.timed = j;
    }
    j->due_ns = due_ns;
    int sooner = due_ns < jobs.next_due_ns;
    if (sooner)
        jobs.next_due_ns = due_ns;
    pthread_mutex_unlock(&jobs.mu);
    if (sooner && jobs.wake_fd >= 0)
        wake_watcher();
}

void hixl_jobs_untime(hixl_job *j)
{
    pthread_mutex_lock(&jobs.mu);
    untime_locked(j);
    pthread_mutex_unlock(&jobs.mu);
}

/* Takes the jobs whose time came off the list (returned through timed_next)
 * and says how long the watcher may sleep. The list is scanned only when
 * its earliest time may have come, not on every event. */
static hixl_job *take_due(int *sleep_ms)
{
    hixl_job *due = NULL;
    uint64_t now = hixl_now_ns();
    pthread_mutex_lock(&jobs.mu);
    if (now >= jobs.next_due_ns) {
        uint64_t next = UINT64_MAX;
        for (hixl_job *j = jobs.timed, *after; j != NULL; j = after) {
            after = j->timed_next;
            if (j->due_ns <= now) {
                untime_locked(j);
                j->timed_next = due;
                due = j;
            } else if (j->due_ns < next) {
                next = j->due_ns;
            }
        }
        jobs.next_due_ns = next;
    }
    uint64_t wait_ns = jobs.next_due_ns > now ? jobs.next_due_ns - now : 0;
    pthread_mutex_unlock(&jobs.mu);
    uint64_t ms = (wait_ns + 999999) / 1000000;
    *sleep_ms = ms > MAX_SLEEP_MS ? MAX_SLEEP_MS : (int)ms;
    return due;
}

/* ---- the watcher ---- */

static void *watcher_main(void *arg)
{
    (void)arg;
    struct epoll_event ev[EVENTS_PER_WAIT];
    int sleep_ms = 0;
    for (;;) {
        int n = epoll_wait(jobs.epfd, ev, EVENTS_PER_WAIT, sleep_ms);
        if (n < 0)
            n = 0; /* EINTR: every signal is blocked here, but be safe */
        pthread_mutex_lock(&jobs.epoch_mu);
        for (int i = 0; i < n; i++) {
            hixl_job *j = ev[i].data.ptr;
            if (j == NULL) {
                uint64_t count;
                ssize_t k = read(jobs.wake_fd, &count, sizeof(count));
                (void)k;
            } else {
                j->ready(j, ev[i].events);
            }
        }
        hixl_job *due = take_due(&sleep_ms);
        while (due != NULL) {
            hixl_job *next = due->timed_next;
            due->due(due);
            due = next;
        }
        /* A due() may have set a sooner timer (it woke us, so the next
         * epoll_wait returns at once). */
        jobs.epoch++;
        pthread_cond_broadcast(&jobs.epoch_cv);
        pthread_mutex_unlock(&jobs.epoch_mu);
    }
    return NULL;
}

void hixl_jobs_quiesce(void)
{
    if (jobs.wake_fd < 0)
        return;
    pthread_mutex_lock(&jobs.epoch_mu);
    uint64_t seen = jobs.epoch;
    wake_watcher();
    while (jobs.epoch == seen)
        pthread_cond_wait(&jobs.epoch_cv, &jobs.epoch_mu);
    pthread_mutex_unlock(&jobs.epoch_mu);
}

int hixl_jobs_watch(int op, int fd, uint32_t events, hixl_job *j)
{
    struct epoll_event ev = {.events = events, .data.ptr = j};
    if (epoll_ctl(jobs.epfd, op, fd, &ev) != 0)
        return HIXL_E_IO;
    return HIXL_OK;
}

/* ---- starting ---- */

/* With jobs.mu held: spawns workers up to jobs.want. */
static int spawn_workers(void)
{
    while (jobs.nthreads < jobs.want) {
        pthread_t t;
        int rc = hixl_spawn_thread(&t, worker_main, NULL);
        if (rc != HIXL_OK)
            return rc;
        pthread_detach(t);
        jobs.nthreads++;
    }
    return HIXL_OK;
}

int hixl_jobs_start(void)
{
    int rc = HIXL_OK;
    pthread_mutex_lock(&jobs.mu);
    if (jobs.epfd < 0) {
        int epfd = epoll_create1(EPOLL_CLOEXEC);
        int wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
        pthread_t t;
        if (epfd < 0 || wfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, wfd, &ev) != 0) {
            rc = HIXL_E_IO;
        } else {
            jobs.epfd = epfd;
            jobs.wake_fd = wfd;
            rc = hixl_spawn_thread(&t, watcher_main, NULL);
            if (rc == HIXL_OK) {
                pthread_detach(t);
            } else {
                jobs.epfd = jobs.wake_fd = -1;
            }
        }
        if (rc != HIXL_OK) {
            int err = errno;
            if (epfd >= 0)
                close(epfd);
            if (wfd >= 0)
                close(wfd);
            errno = err;
        }
    }
    if (rc == HIXL_OK)
        rc = spawn_workers();
    pthread_mutex_unlock(&jobs.mu);
    return rc;
}

int hixl_jobs_set_threads(int n)
{
    if (n < 1 || n > MAX_THREADS)
        return HIXL_E_INVAL;
    int rc = HIXL_OK;
    pthread_mutex_lock(&jobs.mu);
    if (n > jobs.want)
        jobs.want = n;
    else if (jobs.nthreads == 0)
        jobs.want = n;
    if (jobs.epfd >= 0)
        rc = spawn_workers();
    pthread_mutex_unlock(&jobs.mu);
    return rc;
}

int hixl_jobs_threads(void)
{
    pthread_mutex_lock(&jobs.mu);
    int n = jobs.epfd >= 0 ? jobs.nthreads : jobs.want;
    pthread_mutex_unlock(&jobs.mu);
    return n;
}
