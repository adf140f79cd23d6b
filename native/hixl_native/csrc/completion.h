/*
 * Completions from native threads to one consumer (the asyncio loop).
 *
 * Posting never allocates: the producer hands over a node it allocated when
 * the work was submitted, so "exactly one completion per request" cannot be
 * broken by an out-of-memory at completion time. The eventfd is readable
 * exactly while the list is non-empty, because both the list and the
 * eventfd counter are changed under the same mutex; the consumer therefore
 * needs no polling, only add_reader(fd).
 *
 * The queue is reference counted so that a link that still posts keeps it
 * alive even if the Python object is collected first.
 */
#ifndef HIXL_COMPLETION_H
#define HIXL_COMPLETION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

typedef struct hixl_cq_node {
    struct hixl_cq_node *next;
    uint64_t id;
    int32_t status;
} hixl_cq_node;

typedef struct hixl_cq {
    pthread_mutex_t mu;
    int efd;        /* -1 once closed */
    hixl_cq_node *head, *tail;
    atomic_int refs;
} hixl_cq;

int hixl_cq_create(hixl_cq **out);
void hixl_cq_ref(hixl_cq *q);
void hixl_cq_unref(hixl_cq *q);
/* Takes ownership of a malloc'd node counted as a live request; after close
 * the node is freed at once. */
void hixl_cq_post(hixl_cq *q, hixl_cq_node *node);
/* Resets the eventfd and returns every pending node, oldest first. The caller
 * frees each node with hixl_cq_node_free(). */
hixl_cq_node *hixl_cq_take(hixl_cq *q);
/* Nonzero while nodes wait (a look without a system call, for a spinning consumer). */
int hixl_cq_pending(hixl_cq *q);
void hixl_cq_close(hixl_cq *q);
/* Frees a node handed out by hixl_cq_take (it may be a whole request). */
void hixl_cq_node_free(hixl_cq_node *node);
int hixl_cq_fd(hixl_cq *q);

#endif
