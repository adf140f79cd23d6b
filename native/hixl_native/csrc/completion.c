#include "completion.h"

#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "hixl_common.h"

int hixl_cq_create(hixl_cq **out)
{
    hixl_cq *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return HIXL_E_NOMEM;
    q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (q->efd < 0) {
        free(q);
        return HIXL_E_IO;
    }
    pthread_mutex_init(&q->mu, NULL);
    atomic_init(&q->refs, 1);
    hixl_live_add(HIXL_LIVE_QUEUES, 1);
    *out = q;
    return HIXL_OK;
}

void hixl_cq_ref(hixl_cq *q)
{
    atomic_fetch_add_explicit(&q->refs, 1, memory_order_relaxed);
}

void hixl_cq_node_free(hixl_cq_node *node)
{
    free(node);
    hixl_live_add(HIXL_LIVE_REQUESTS, -1);
}

static void free_list(hixl_cq_node *n)
{
    while (n != NULL) {
        hixl_cq_node *next = n->next;
        hixl_cq_node_free(n);
        n = next;
    }
}

void hixl_cq_unref(hixl_cq *q)
{
    if (atomic_fetch_sub_explicit(&q->refs, 1, memory_order_acq_rel) != 1)
        return;
    hixl_cq_close(q);
    free_list(q->head);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

void hixl_cq_post(hixl_cq *q, hixl_cq_node *node)
{
    node->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->efd < 0) {
        pthread_mutex_unlock(&q->mu);
        hixl_cq_node_free(node);
        return;
    }
    int was_empty = q->head == NULL;
    if (was_empty)
        q->head = node;
    else
        q->tail->next = node;
    q->tail = node;
    /* One eventfd write per empty -> non-empty transition is enough and
     * saves a syscall per completion under load. */
    if (was_empty) {
        uint64_t one = 1;
        ssize_t rc = write(q->efd, &one, sizeof(one));
        (void)rc; /* cannot fail: the counter is 0 here, far from overflow */
    }
    pthread_mutex_unlock(&q->mu);
}

hixl_cq_node *hixl_cq_take(hixl_cq *q)
{
    pthread_mutex_lock(&q->mu);
    hixl_cq_node *list = q->head;
    q->head = q->tail = NULL;
    if (q->efd >= 0) {
        uint64_t count;
        ssize_t rc = read(q->efd, &count, sizeof(count));
        (void)rc; /* EAGAIN when nothing was pending: nothing to reset */
    }
    pthread_mutex_unlock(&q->mu);
    return list;
}

int hixl_cq_pending(hixl_cq *q)
{
    pthread_mutex_lock(&q->mu);
    int pending = q->head != NULL;
    pthread_mutex_unlock(&q->mu);
    return pending;
}

void hixl_cq_close(hixl_cq *q)
{
    pthread_mutex_lock(&q->mu);
    if (q->efd >= 0) {
        close(q->efd);
        q->efd = -1;
        hixl_live_add(HIXL_LIVE_QUEUES, -1); /* counts open queues */
    }
    pthread_mutex_unlock(&q->mu);
}

int hixl_cq_fd(hixl_cq *q)
{
    pthread_mutex_lock(&q->mu);
    int fd = q->efd;
    pthread_mutex_unlock(&q->mu);
    return fd;
}
