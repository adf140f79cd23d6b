#include "copy_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "copy.h"
#include "hixl_common.h"

#define MAX_THREADS 64

typedef struct copy_job {
    hixl_cq_node node; /* first: the queue's consumer frees the job via it */
    struct copy_job *next;
    hixl_mapping *dst, *src;
    uint64_t request_bytes;
    size_t n;
    uint8_t triples[]; /* n * 24 bytes */
} copy_job;

struct hixl_copy_pool {
    hixl_cq *cq;
    pthread_mutex_t mu;
    pthread_cond_t work;
    copy_job *head, *tail;
    int closing;
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
        pthread_mutex_unlock(&p->mu);
        hixl_copy_triples(j->dst->addr, j->src->addr, j->triples, j->n, j->request_bytes);
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
    if (p->tail != NULL)
        p->tail->next = j;
    else
        p->head = j;
    p->tail = j;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
    return HIXL_OK;
}

void hixl_copy_pool_close(hixl_copy_pool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    p->closing = 1;
    copy_job *queued = p->head;
    p->head = p->tail = NULL;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    while (queued != NULL) {
        copy_job *next = queued->next;
        finish(p, queued, HIXL_E_CANCELLED);
        queued = next;
    }
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    hixl_cq_unref(p->cq);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
