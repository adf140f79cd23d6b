/*
 * The initiator side of the TCP data plane (protocol in tcp_wire.h): a link
 * is `nstreams` connections to one DataServer, each with its own queue of
 * request pieces. Streams hold no thread: the shared workers of
 * link_threads.h move a stream's pieces while it has any, and a piece whose
 * socket goes quiet waits in the watcher without a thread, so a daemon's
 * thread count does not grow with its links.
 *
 * A request's ranges are cut by bytes into at most one piece per stream
 * (more only when a piece would exceed the wire's range limit), splitting a
 * range where a cut falls inside it, so that all streams move bytes in
 * parallel. A small piece is sent by the submitting thread itself when a
 * stream is idle (a worker, woken meanwhile, only receives the reply),
 * and hixl_link_submit_wait may even send a small request whole and receive
 * its reply there, sparing both thread handoffs of the round trip; it tries
 * the stream that carried the last such request first. The
 * request, its pieces, their wire ranges and iovecs live in a single
 * allocation made at submit time; its first member is the completion node,
 * so finishing a request posts it to the completion queue without
 * allocating (the queue's consumer frees it).
 */
#ifndef HIXL_TCP_LINK_H
#define HIXL_TCP_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "completion.h"
#include "mapping.h"
#include "xmem.h"

typedef struct hixl_link hixl_link;

/* Connects and handshakes every stream within connect_timeout_ms; each
 * proves with the link's HIXL_KEY_SIZE-byte `key` that it belongs to the
 * link `token` (tcp_wire.h). */
int hixl_link_open(const char *host, uint16_t port, uint64_t token, const uint8_t *key,
                   int nstreams, hixl_cq *cq, uint64_t connect_timeout_ms, hixl_link **out);
int hixl_link_alive(hixl_link *l);
/* How many streams hold an open connection now (a lost one is reopened in
 * the background, with a growing pause between tries). */
int hixl_link_streams_up(hixl_link *l);
/* How many request pieces `stream` was given so far (0 for no such stream). */
uint64_t hixl_link_stream_pieces(hixl_link *l, int stream);
/* Or'ed into a submit's `op`: the request carries a CRC-32C of its payload
 * (tcp_wire.h) and ends with HIXL_E_CHECKSUM when the payload differs. */
#define HIXL_SUBMIT_CRC32C 0x100

/*
 * Queues a READ or WRITE (HIXL_OP_*, maybe with HIXL_SUBMIT_CRC32C) and
 * returns at once. `quads` holds n
 * (remote_region, remote_offset, local_offset, length) uint64 quads in host
 * order, already bounds-checked against `local` by the caller. Exactly one
 * completion is posted later; HIXL_E_CLOSED (nothing posted) once the link
 * was closed locally, HIXL_E_NOMEM/HIXL_E_INVAL (nothing posted) when the
 * request cannot be built.
 */
int hixl_link_submit(hixl_link *l, int op, uint64_t request_id, hixl_mapping *local,
                     const uint8_t *quads, size_t n, uint64_t timeout_ms);
/* hixl_link_submit of client-process memory: `quads`' local offsets are
 * relative to the span's base (bounds-checked by the caller); each piece
 * moves through one of the span's outbound bounce buffers on a worker. */
int hixl_link_submit_xmem(hixl_link *l, int op, uint64_t request_id, hixl_xmem *local,
                          const uint8_t *quads, size_t n, uint64_t timeout_ms);
/*
 * hixl_link_submit that may finish the request on the calling thread: a
 * request of at most 512 KiB, when a stream is idle, goes out whole on it
 * from here and its reply is awaited for up to `wait_us` plus 1 us per 2000
 * bytes it moves (the calling thread blocks that long at most; a later reply
 * is left to a worker). *status is then its final status and
 * nothing is posted; otherwise *status is 1 and exactly one completion is
 * posted as for hixl_link_submit. Errors (nothing posted, *status 1) as
 * hixl_link_submit.
 */
int hixl_link_submit_wait(hixl_link *l, int op, uint64_t request_id, hixl_mapping *local,
                          const uint8_t *quads, size_t n, uint64_t timeout_ms,
                          uint64_t wait_us, int32_t *status);
/* hixl_link_submit_wait whose completion, when one is posted, goes to `cq`
 * (which must outlive the request) rather than the link's queue: for a
 * thread that waits for its own requests (native_lane.h). */
int hixl_link_submit_wait_to(hixl_link *l, int op, uint64_t request_id, hixl_mapping *local,
                             const uint8_t *quads, size_t n, uint64_t timeout_ms,
                             uint64_t wait_us, int32_t *status, hixl_cq *cq);
/* Cancels queued and in-flight pieces and returns once no thread uses the
 * link any more. Idempotent. */
void hixl_link_close(hixl_link *l);
void hixl_link_destroy(hixl_link *l);

#endif
