/*
 * TEST DOUBLE of CANN streams, part of the double's libascendcl.so.
 *
 * A stream is a worker thread running its tasks in submission order. A
 * failed task fails the stream: the tasks queued behind it are dropped and
 * the next synchronize returns the task's error code (once).
 *
 * "aclrtDestroyStream" (CANN API reference, aclcppdevg_03_0070): a stream
 * with unfinished tasks is destroyed only after they complete, so the
 * double's destroy waits for them, without a bound: a destroy behind a
 * receive whose peer never sends hangs, as on CANN. The stream must be in
 * the current context. "aclrtStreamAbort" (aclcppdevg_03_1777) stops the
 * running task (its waits watch the stream's abort eventfd) and drops the
 * queued ones; a synchronize after it reports ACL_ERROR_RT_STREAM_ABORT.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "acl_double_internal.h"

#define STREAM_MAGIC 0x5354524du

typedef struct dbl_task {
    struct dbl_task *next;
    dbl_task_fn run;
    void (*release)(void *ctx);
    void *ctx;
    char point[48];
} dbl_task;

typedef struct dbl_stream {
    uint32_t magic;
    struct dbl_stream *next;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dbl_task *head, *tail;
    int busy;
    int error;
    int stopping;
    int abort_fd;
    int aborting;
    void *context; /* current when the stream was created */
    pthread_t thread;
} dbl_stream;

static pthread_mutex_t g_streams_lock = PTHREAD_MUTEX_INITIALIZER;
static dbl_stream *g_streams;

static int stream_known(dbl_stream *s)
{
    pthread_mutex_lock(&g_streams_lock);
    dbl_stream *it = g_streams;
    while (it && it != s)
        it = it->next;
    pthread_mutex_unlock(&g_streams_lock);
    return it != NULL;
}

static void drop_tasks_locked(dbl_stream *s)
{
    while (s->head) {
        dbl_task *t = s->head;
        s->head = t->next;
        if (t->release)
            t->release(t->ctx);
        free(t);
    }
    s->tail = NULL;
}

static int run_task(dbl_stream *s, dbl_task *t)
{
    dbl_fault f = hixl_double_fault_take(t->point);
    int fds[1] = {s->abort_fd};
    switch (f.action) {
    case DBL_FAULT_FAIL:
        return f.arg;
    case DBL_FAULT_DELAY:
        if (dbl_wait_fd(-1, 0, fds, 1, dbl_now_ms() + (uint64_t)f.arg) == 1)
            return ACL_ERROR_RT_STREAM_ABORT;
        f.action = DBL_FAULT_NONE;
        break;
    default: /* HANG and SEVER are the task's to act out */
        break;
    }
    return t->run(t->ctx, s->abort_fd, f);
}

static void *stream_worker(void *arg)
{
    dbl_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stopping)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->stopping) {
            drop_tasks_locked(s);
            break;
        }
        dbl_task *t = s->head;
        s->head = t->next;
        if (!s->head)
            s->tail = NULL;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);
        int rc = run_task(s, t);
        if (t->release)
            t->release(t->ctx);
        free(t);
        pthread_mutex_lock(&s->mu);
        s->busy = 0;
        if (rc && !s->error) {
            s->error = rc;
            drop_tasks_locked(s);
        }
        pthread_cond_broadcast(&s->cv);
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

DBL_EXPORT aclError aclrtCreateStream(aclrtStream *stream)
{
    CALL_PROLOGUE("aclrtCreateStream");
    if (!stream)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateStream: stream is NULL");
    NEED_CONTEXT("aclrtCreateStream");
    dbl_stream *s = calloc(1, sizeof *s);
    if (!s)
        return hixl_double_fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtCreateStream: out of memory");
    s->magic = STREAM_MAGIC;
    s->context = hixl_double_current_context();
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->abort_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->abort_fd < 0 || pthread_create(&s->thread, NULL, stream_worker, s) != 0) {
        if (s->abort_fd >= 0)
            close(s->abort_fd);
        free(s);
        return hixl_double_fail(ACL_ERROR_RT_INTERNAL_ERROR, "aclrtCreateStream: no worker thread");
    }
    pthread_mutex_lock(&g_streams_lock);
    s->next = g_streams;
    g_streams = s;
    pthread_mutex_unlock(&g_streams_lock);
    hixl_double_count(DBL_LIVE_STREAMS, 1);
    *stream = s;
    return ACL_SUCCESS;
}

DBL_EXPORT aclError aclrtDestroyStream(aclrtStream stream)
{
    CALL_PROLOGUE("aclrtDestroyStream");
    dbl_stream *s = stream;
    if (!s || !stream_known(s))
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID, "aclrtDestroyStream: unknown stream %p", stream);
    if (s->context != hixl_double_current_context())
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID,
                                "aclrtDestroyStream: stream %p is not in the current context", stream);
    /* unfinished tasks complete first (only an abort from another thread
     * cuts this short) */
    pthread_mutex_lock(&s->mu);
    while (s->head || s->busy)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    int found = 0;
    pthread_mutex_lock(&g_streams_lock);
    for (dbl_stream **pp = &g_streams; *pp; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&g_streams_lock);
    if (!found)
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID, "aclrtDestroyStream: unknown stream %p", stream);
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    close(s->abort_fd);
    s->magic = 0;
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    hixl_double_count(DBL_LIVE_STREAMS, -1);
    return ACL_SUCCESS;
}

static aclError sync_stream(const char *api, aclrtStream stream, int32_t timeout)
{
    dbl_stream *s = stream;
    if (!s || !stream_known(s))
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID, "%s: unknown stream %p", api, stream);
    struct timespec until;
    if (timeout > 0) {
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += timeout / 1000;
        until.tv_nsec += (long)(timeout % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&s->mu);
    while (s->head || s->busy) {
        int expired = timeout == 0;
        if (timeout < 0)
            pthread_cond_wait(&s->cv, &s->mu);
        else if (timeout > 0)
            expired = pthread_cond_timedwait(&s->cv, &s->mu, &until) == ETIMEDOUT &&
                      (s->head || s->busy);
        if (expired) {
            pthread_mutex_unlock(&s->mu);
            return hixl_double_fail(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                                    "%s: stream %p not done within %d ms", api, stream, timeout);
        }
    }
    int rc = s->error;
    s->error = 0;
    pthread_mutex_unlock(&s->mu);
    if (rc)
        return hixl_double_fail(rc, "%s: a task of stream %p failed with %d", api, stream, rc);
    return ACL_SUCCESS;
}

/* Waits until every task queued on the stream so far has run (for copies the
 * runtime performs synchronously; acl_double_pinned.c). */
int hixl_double_stream_drain(aclrtStream stream)
{
    return sync_stream("aclrtMemcpyAsync", stream, -1);
}

DBL_EXPORT aclError aclrtSynchronizeStream(aclrtStream stream)
{
    CALL_PROLOGUE("aclrtSynchronizeStream");
    return sync_stream("aclrtSynchronizeStream", stream, -1);
}

DBL_EXPORT aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout)
{
    CALL_PROLOGUE("aclrtSynchronizeStreamWithTimeout");
    if (timeout < -1)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM,
                                "aclrtSynchronizeStreamWithTimeout: bad timeout %d", timeout);
    return sync_stream("aclrtSynchronizeStreamWithTimeout", stream, timeout);
}

DBL_EXPORT int hixl_double_stream_submit(aclrtStream stream, const char *exec_point, dbl_task_fn run,
                                         void (*release)(void *ctx), void *ctx)
{
    dbl_stream *s = stream;
    if (!s || !stream_known(s)) {
        if (release)
            release(ctx);
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID, "unknown stream %p", stream);
    }
    dbl_task *t = calloc(1, sizeof *t);
    if (!t) {
        if (release)
            release(ctx);
        return hixl_double_fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of memory");
    }
    t->run = run;
    t->release = release;
    t->ctx = ctx;
    snprintf(t->point, sizeof t->point, "%s", exec_point);
    pthread_mutex_lock(&s->mu);
    if (s->aborting) {
        pthread_mutex_unlock(&s->mu);
        if (release)
            release(ctx);
        free(t);
        return ACL_SUCCESS; /* aclrtStreamAbort: new tasks do not take effect meanwhile */
    }
    if (s->tail)
        s->tail->next = t;
    else
        s->head = t;
    s->tail = t;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return ACL_SUCCESS;
}

/* "aclrtStreamAbort" (aclcppdevg_03_1777): stops the running task, drops
 * the queued ones; tasks submitted meanwhile do not take effect. Returns
 * once the running task has ended. */
DBL_EXPORT aclError aclrtStreamAbort(aclrtStream stream)
{
    CALL_PROLOGUE("aclrtStreamAbort");
    dbl_stream *s = stream;
    if (!s || !stream_known(s))
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID, "aclrtStreamAbort: unknown stream %p",
                                stream);
    pthread_mutex_lock(&s->mu);
    int had_work = s->head != NULL || s->busy;
    s->aborting = 1;
    drop_tasks_locked(s);
    uint64_t one = 1, drained;
    (void)!write(s->abort_fd, &one, sizeof one);
    while (s->busy)
        pthread_cond_wait(&s->cv, &s->mu);
    drop_tasks_locked(s);
    (void)!read(s->abort_fd, &drained, sizeof drained);
    s->aborting = 0;
    if (had_work && !s->error)
        s->error = ACL_ERROR_RT_STREAM_ABORT;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return ACL_SUCCESS;
}
