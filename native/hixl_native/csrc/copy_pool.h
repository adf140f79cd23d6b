/*
 * Local copies run by native threads, finished through a completion queue.
 *
 * A copy handed to Python's thread pool needs the GIL twice on its worker
 * (to start the job and to hand its result back), and with the event loop's
 * thread busy running other calls' Python it waits for it: on two cores, 16
 * local 1 MiB pulls in flight moved fewer bytes that way than copied on the
 * loop's own thread. These workers never touch the GIL, and a finished copy
 * posts its completion to the same queue as the TCP data link, whose
 * eventfd the loop already watches.
 */
#ifndef HIXL_COPY_POOL_H
#define HIXL_COPY_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "completion.h"
#include "mapping.h"

typedef struct hixl_copy_pool hixl_copy_pool;

/* Starts `threads` workers posting to `cq`. */
int hixl_copy_pool_open(int threads, hixl_cq *cq, hixl_copy_pool **out);
/*
 * Queues a copy of `n` (dst_offset, src_offset, length) triples, already
 * checked against both mappings by the caller (hixl_check_triples), and
 * returns at once; the triples are copied. Both mappings are referenced and
 * pinned until the copy ends, and exactly one completion with `request_id`
 * is posted then: HIXL_OK, or HIXL_E_CANCELLED when the pool closed before
 * the copy started. Errors (nothing posted): HIXL_E_CLOSED once the pool is
 * closing, HIXL_E_NOMEM.
 */
int hixl_copy_pool_submit(hixl_copy_pool *p, uint64_t request_id, hixl_mapping *dst,
                          hixl_mapping *src, const uint8_t *triples, size_t n,
                          uint64_t request_bytes);
/*
 * Copies `n` checked triples now, on the calling thread and one worker at
 * once, and returns when every byte is copied: the triples are cut in two
 * shares of about equal bytes (on a 4 KiB boundary of the request's byte
 * stream), the second handed to a worker. A worker wakes in some 15 us
 * here, far less than copying half of a 1 MiB request, so the request
 * takes about half the time of one thread's copy without any completion
 * to deliver. Should no worker have taken the second share by the time
 * the caller has copied the first (all busy, or the pool closing), the
 * caller copies it too: never much slower than copying alone. The caller
 * keeps both mappings pinned for the duration; no completion is posted.
 * `triples` may be modified. Errors: HIXL_E_NOMEM (nothing copied).
 *
 * The caller first takes a hold on the pool (hixl_copy_pool_hold), where
 * whatever serializes it with hixl_copy_pool_close (the GIL) covers both;
 * this call gives the hold back, and close waits for every hold to end.
 */
void hixl_copy_pool_hold(hixl_copy_pool *p);
int hixl_copy_pool_copy_helped(hixl_copy_pool *p, hixl_mapping *dst, hixl_mapping *src,
                               uint8_t *triples, size_t n);
/* Cancels queued copies, lets running ones finish, joins the workers and
 * frees the pool. */
void hixl_copy_pool_close(hixl_copy_pool *p);

#endif
