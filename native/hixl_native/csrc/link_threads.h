/*
 * The threads that run the data streams of every link of the process.
 *
 * A stream is a job. Workers (a fixed number, set before the first link
 * opens) take jobs from one run queue and run them; a job stays with its
 * worker only while it has bytes to move. One watcher thread waits in epoll
 * on the sockets of idle and waiting streams and keeps their timers, and
 * calls the job back when its socket is ready or its time has come; the
 * callback decides what to do, usually queue the job to run again. So the
 * thread count of a daemon does not grow with its links: an idle stream
 * costs its socket and nothing else.
 *
 * Lock order: a job's own lock (its owner's) before this module's lock,
 * which callers never see.
 */
#ifndef HIXL_LINK_THREADS_H
#define HIXL_LINK_THREADS_H

#include <stdint.h>

typedef struct hixl_job {
    /* Owned by this module. */
    struct hixl_job *run_next;
    struct hixl_job *timed_prev, *timed_next;
    int queued, timed;
    uint64_t due_ns;
    /* Set by the owner. */
    void (*run)(struct hixl_job *j);                     /* on a worker */
    void (*ready)(struct hixl_job *j, uint32_t events);  /* on the watcher */
    void (*due)(struct hixl_job *j);                     /* on the watcher */
} hixl_job;

/* How many workers to run (1..256); grows a running set, never shrinks it.
 * The first link starts them with the default otherwise. */
int hixl_jobs_set_threads(int n);
int hixl_jobs_threads(void);
/* Starts the watcher and workers once; HIXL_OK when they run. */
int hixl_jobs_start(void);
/* Queues the job for a worker (once: queueing a queued job does nothing). */
void hixl_jobs_run(hixl_job *j);
/* Calls j->due on the watcher at due_ns (monotonic), replacing any earlier
 * time; hixl_jobs_untime cancels it. */
void hixl_jobs_time(hixl_job *j, uint64_t due_ns);
void hixl_jobs_untime(hixl_job *j);
/* epoll_ctl on the watcher's set, the event's data being the job. */
int hixl_jobs_watch(int op, int fd, uint32_t events, hixl_job *j);
/* Returns once the watcher is done with every event and timer it fetched
 * before this call: after removing its sockets and timers, an owner may
 * free its jobs. */
void hixl_jobs_quiesce(void);

#endif
