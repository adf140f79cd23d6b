#include "copy_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "copy.h"
#include "hixl_common.h"

#define MAX_THREADS 64
/* A helped copy cuts its shares on this boundary of the request's bytes. */
#define SHARE_ALIGN 4096u
/* How long a helped copy's caller polls for the worker's share before it
 * sleeps: the two shares are of equal size, so the worker usually ends
 * within its wake-up time (some 15 us) of the caller, and sleeping would
 * add a wake-up of the caller's own. */
#define HELPED_SPIN_NS 50000u

/* Where a helped share stands; changed under the pool's mutex. */
enum { SHARE_QUEUED, SHARE_RUNNING, SHARE_DONE, SHARE_RETURNED };

typedef struct copy_job {
    hixl_cq_node node; /* first: the queue's consumer frees the job via it */
    struct copy_job *next;
    hixl_mapping *dst, *src;
    uint64_t request_bytes;
    size_t n;
    const uint8_t *share; /* the triples to copy: `triples`, or a helped caller's */
    /* A helped share (hixl_copy_pool_copy_helped) lives on its caller's
     * stack: no completion, no references; `state` tells the caller. */
    int helped;
    int state;
    uint8_t triples[]; /* n * 24 bytes (none for a helped share) */
} copy_job;

struct hixl_copy_pool {
    hixl_cq *cq;
    pthread_mutex_t mu;
    pthread_cond_t work;
    pthread_cond_t share_done; /* a helped share or a hold ended */
    copy_job *head, *tail;
    int closing;
    int holds; /* helped copies under way: close waits for them */
    int nthreads;
    pthread_t threads[];
};

static void release(copy_job *j)
{
    hixl_mapping_unpin(j->dst);
    hixl_mapping_unpin(j->src);
    hixl_mapping_unref(j->dst);
    hixl_mapping_unref(j->src);
}

/* Ends a job: its mappings go back, its completion is posted (the queue's
 * consumer frees it from then on). */
static void finish(hixl_copy_pool *p, copy_job *j, int status)
{
    release(j);
    j->node.status = status;
    hixl_cq_post(p->cq, &j->node);
}

static void *worker_main(void *arg)
{
    hixl_copy_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->head == NULL && !p->closing)
            pthread_cond_wait(&p->work, &p->mu);
        copy_job *j = p->head;
        if (j == NULL) /* closing, and nothing left */
            break;
        p->head = j->next;
        if (p->head == NULL)
            p->tail = NULL;
        if (j->helped)
            j->state = SHARE_RUNNING;
        pthread_mutex_unlock(&p->mu);
        hixl_copy_triples(j->dst->addr, j->src->addr, j->share, j->n, j->request_bytes);
        if (j->helped) {
            pthread_mutex_lock(&p->mu);
            /* Release: the caller may read the copied bytes once it sees DONE,
             * and may return (freeing j) at once, so j is not touched after. */
            __atomic_store_n(&j->state, SHARE_DONE, __ATOMIC_RELEASE);
            pthread_cond_broadcast(&p->share_done);
            continue;
        }
        finish(p, j, HIXL_OK);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int hixl_copy_pool_open(int threads, hixl_cq *cq, hixl_copy_pool **out)
{
    if (threads < 1 || threads > MAX_THREADS)
        return HIXL_E_INVAL;
    hixl_copy_pool *p = calloc(1, sizeof(*p) + (size_t)threads * sizeof(pthread_t));
    if (p == NULL)
        return HIXL_E_NOMEM;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->share_done, NULL);
    p->cq = cq;
    hixl_cq_ref(cq);
    for (int i = 0; i < threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
            hixl_copy_pool_close(p);
            return HIXL_E_NOMEM;
        }
        p->nthreads++;
    }
    *out = p;
    return HIXL_OK;
}

/* Appends j to the queue and wakes a worker; the caller holds the mutex. */
static void enqueue(hixl_copy_pool *p, copy_job *j)
{
    j->next = NULL;
    if (p->tail != NULL)
        p->tail->next = j;
    else
        p->head = j;
    p->tail = j;
    pthread_cond_signal(&p->work);
}

int hixl_copy_pool_submit(hixl_copy_pool *p, uint64_t request_id, hixl_mapping *dst,
                          hixl_mapping *src, const uint8_t *triples, size_t n,
                          uint64_t request_bytes)
{
    if (n > (SIZE_MAX - sizeof(copy_job)) / 24)
        return HIXL_E_NOMEM;
    copy_job *j = malloc(sizeof(*j) + n * 24);
    if (j == NULL)
        return HIXL_E_NOMEM;
    memset(j, 0, sizeof(*j));
    memcpy(j->triples, triples, n * 24);
    j->share = j->triples;
    j->node.id = request_id;
    j->n = n;
    j->request_bytes = request_bytes;
    j->dst = dst;
    j->src = src;
    pthread_mutex_lock(&p->mu);
    if (p->closing) {
        pthread_mutex_unlock(&p->mu);
        free(j);
        return HIXL_E_CLOSED;
    }
    hixl_live_add(HIXL_LIVE_REQUESTS, 1); /* freed via hixl_cq_node_free */
    hixl_mapping_ref(dst);
    hixl_mapping_ref(src);
    hixl_mapping_pin(dst);
    hixl_mapping_pin(src);
    enqueue(p, j);
    pthread_mutex_unlock(&p->mu);
    return HIXL_OK;
}

static uint64_t triples_bytes(const uint8_t *triples, size_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += hixl_load_u64(triples, 3 * i + 2);
    return total;
}

static void store_u64(uint8_t *base, size_t k, uint64_t v)
{
    memcpy(base + k * 8, &v, 8);
}

/* Takes a still queued job back out of the queue; returns 0 if a worker has it. */
static int take_back(hixl_copy_pool *p, copy_job *j)
{
    copy_job *prev = NULL;
    for (copy_job *q = p->head; q != NULL; prev = q, q = q->next) {
        if (q != j)
            continue;
        if (prev != NULL)
            prev->next = j->next;
        else
            p->head = j->next;
        if (p->tail == j)
            p->tail = prev;
        return 1;
    }
    return 0;
}

/* Waits until a worker has copied the helped share j. */
static void wait_share(hixl_copy_pool *p, copy_job *j)
{
    uint64_t until = hixl_now_ns() + HELPED_SPIN_NS;
    for (unsigned i = 0;; i++) {
        if (__atomic_load_n(&j->state, __ATOMIC_ACQUIRE) == SHARE_DONE)
            return;
        if (i % 64 == 63 && hixl_now_ns() >= until)
            break;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    pthread_mutex_lock(&p->mu);
    while (__atomic_load_n(&j->state, __ATOMIC_ACQUIRE) != SHARE_DONE)
        pthread_cond_wait(&p->share_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void hixl_copy_pool_hold(hixl_copy_pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->holds++;
    pthread_mutex_unlock(&p->mu);
}

static void release_hold(hixl_copy_pool *p)
{
    pthread_mutex_lock(&p->mu);
    if (--p->holds == 0 && p->closing)
        pthread_cond_broadcast(&p->share_done);
    pthread_mutex_unlock(&p->mu);
}

static int copy_helped(hixl_copy_pool *p, hixl_mapping *dst, hixl_mapping *src,
                       uint8_t *triples, size_t n)
{
    uint64_t total = triples_bytes(triples, n);
    uint64_t cut = total / 2 / SHARE_ALIGN * SHARE_ALIGN;
    if (cut == 0) {
        hixl_copy_triples(dst->addr, src->addr, triples, n, total);
        return HIXL_OK;
    }
    /* Triple k holds the cut: its first `head` bytes belong to the first share. */
    size_t k = 0;
    uint64_t start = 0;
    for (; k < n; k++) {
        uint64_t len = hixl_load_u64(triples, 3 * k + 2);
        if (start + len > cut)
            break;
        start += len;
    }
    uint64_t head = cut - start;
    size_t rest = n - k; /* >= 1, since cut < total */
    uint8_t *second = malloc(rest * 24);
    if (second == NULL)
        return HIXL_E_NOMEM;
    memcpy(second, triples + k * 24, rest * 24);
    store_u64(second, 0, hixl_load_u64(second, 0) + head);
    store_u64(second, 1, hixl_load_u64(second, 1) + head);
    store_u64(second, 2, hixl_load_u64(second, 2) - head);
    size_t first = k;
    if (head != 0) {
        store_u64(triples, 3 * k + 2, head);
        first = k + 1;
    }

    copy_job job;
    memset(&job, 0, sizeof(job));
    job.dst = dst;
    job.src = src;
    job.request_bytes = total; /* streaming stores or not, as for the whole */
    job.n = rest;
    job.share = second;
    job.helped = 1;
    job.state = SHARE_QUEUED;
    int handed = 0;
    pthread_mutex_lock(&p->mu);
    if (!p->closing) {
        enqueue(p, &job);
        handed = 1;
    }
    pthread_mutex_unlock(&p->mu);

    hixl_copy_triples(dst->addr, src->addr, triples, first, total);

    if (handed) {
        pthread_mutex_lock(&p->mu);
        if (job.state == SHARE_RETURNED || (job.state == SHARE_QUEUED && take_back(p, &job)))
            handed = 0; /* no worker came: copied here after all */
        pthread_mutex_unlock(&p->mu);
    }
    if (handed)
        wait_share(p, &job);
    else
        hixl_copy_triples(dst->addr, src->addr, second, rest, total);
    free(second);
    return HIXL_OK;
}

int hixl_copy_pool_copy_helped(hixl_copy_pool *p, hixl_mapping *dst, hixl_mapping *src,
                               uint8_t *triples, size_t n)
{
    int rc = copy_helped(p, dst, src, triples, n);
    release_hold(p);
    return rc;
}

void hixl_copy_pool_close(hixl_copy_pool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    p->closing = 1;
    copy_job *queued = p->head, *cancelled = NULL;
    p->head = p->tail = NULL;
    while (queued != NULL) {
        copy_job *next = queued->next;
        if (queued->helped) { /* its caller copies it after all */
            queued->state = SHARE_RETURNED;
        } else {
            queued->next = cancelled;
            cancelled = queued;
        }
        queued = next;
    }
    pthread_cond_broadcast(&p->work);
    pthread_cond_broadcast(&p->share_done);
    while (p->holds > 0) /* helped copies still use the pool */
        pthread_cond_wait(&p->share_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    while (cancelled != NULL) {
        copy_job *next = cancelled->next;
        finish(p, cancelled, HIXL_E_CANCELLED);
        cancelled = next;
    }
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    hixl_cq_unref(p->cq);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->share_done);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
