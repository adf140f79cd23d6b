/*
 * The native submission path of repeated transfers (issue 32).
 *
 * A client process that repeats a transfer shape (a pull or push whose
 * daemon-side plan is kept as a "prepared transfer") writes each repeat as
 * one fixed-size submission into a ring it shares with its daemon
 * (ring.h). A native thread of the daemon, one per client connection, reads
 * the submissions, finds the shape's published cell, shifts the cell's
 * planned ranges to the two slots named, runs the request on the cell's TCP
 * link (tcp_link.h) on that same thread, and writes one completion into the
 * second ring. No Python runs on the way; the daemon's event loop learns of
 * every completion afterwards, through the log below.
 *
 * What may run natively is decided by Python. A cell is published only for
 * a plan Python has just run successfully, and is revoked (taken out of the
 * table) at every event that could make the plan stale: the local cache
 * freed, the link changed, the daemon's settings reloaded or its drain. A
 * lane thread takes a cell only under the table's lock and counts itself in
 * the cell's `inflight` there, so once a revocation returned no new use can
 * start, and Python waits for `inflight` to reach zero before it frees what
 * the cell names. Whatever the thread cannot run (no such cell, a slot out
 * of range, a link down, a far side that refused a region it no longer has)
 * completes with HIXL_NL_FALLBACK and nothing moved: the client then sends
 * the same repeat through the ordinary lane, where Python gives the full
 * call's answer.
 */
#ifndef HIXL_NATIVE_LANE_H
#define HIXL_NATIVE_LANE_H

#include <stddef.h>
#include <stdint.h>

#include "mapping.h"
#include "ring.h"
#include "tcp_link.h"

/* One submission: 32 bytes, little-endian (the wire format of
 * hixl_wire/rings.py's SUBMISSION). */
typedef struct hixl_nl_submission {
    uint64_t call_id;
    uint64_t handle;
    uint32_t src_batch;
    uint32_t dst_batch;
    uint32_t timeout_ms; /* the client's; the cell's own timeout bounds the transfer */
    uint32_t kind;       /* HIXL_NL_PULL, HIXL_NL_PUSH or HIXL_NL_CANCEL (of call_id) */
} hixl_nl_submission;

/* One completion: 32 bytes (COMPLETION in hixl_wire/rings.py). */
typedef struct hixl_nl_completion {
    uint64_t call_id;
    int32_t outcome;       /* HIXL_NL_OK, _FALLBACK, _FAILED or _CANCELLED */
    int32_t native_status; /* with _FAILED: the request's HIXL_E_* */
    uint64_t bytes;
    uint32_t data_us;
    uint32_t reserved;
} hixl_nl_completion;

enum { HIXL_NL_PULL = 1, HIXL_NL_PUSH = 2, HIXL_NL_CANCEL = 3 };
enum { HIXL_NL_OK = 0, HIXL_NL_FALLBACK = 1, HIXL_NL_FAILED = 2, HIXL_NL_CANCELLED = 3 };
/* Transfers a lane has out at once (hixl_wire.rings.MAX_IN_FLIGHT); more
 * wait in the ring. */
#define HIXL_NL_MAX_PENDING 256

/* ---- cells: the published prepared transfers ---- */

typedef struct hixl_nl_cell hixl_nl_cell;

/*
 * A cell for `handle` (unique in the daemon's lifetime) of the client
 * connection group `owner`: `n` (region, remote offset, local offset,
 * length) quads planned between slots 0 and 0, which a repeat shifts by
 * src_batch * src_stride and dst_batch * dst_stride (remote and local as the
 * direction says). `link` must outlive the cell (its owner keeps it), the
 * mapping is referenced by the cell. `timeout_ms` bounds each transfer.
 */
int hixl_nl_cell_create(uint64_t handle, uint64_t owner, int push, int checksum,
                        hixl_link *link, hixl_mapping *local, const uint64_t *quads, size_t n,
                        uint64_t src_stride, uint32_t src_slots, uint64_t dst_stride,
                        uint32_t dst_slots, uint64_t bytes, uint64_t timeout_ms,
                        hixl_nl_cell **out);
/* Puts the cell in the table (HIXL_E_EXISTS: its handle is there already). */
int hixl_nl_publish(hixl_nl_cell *c);
/* Takes the cell out of the table: no lane starts it again. Idempotent. */
void hixl_nl_revoke(hixl_nl_cell *c);
/* Lane threads running the cell's transfer now. */
int hixl_nl_inflight(const hixl_nl_cell *c);
/* Revokes, waits until no transfer of it runs (each ends by its timeout),
 * then frees. */
void hixl_nl_cell_destroy(hixl_nl_cell *c);

/* ---- the log: completions as the event loop learns of them ---- */

typedef struct hixl_nl_record {
    uint64_t owner;
    uint64_t handle;
    int32_t outcome;
    int32_t native_status;
    uint64_t bytes;
    uint64_t data_ns;
} hixl_nl_record;

typedef struct hixl_nl_log hixl_nl_log;

/* A log of at most `capacity` records; records beyond it are counted, not kept. */
int hixl_nl_log_create(size_t capacity, hixl_nl_log **out);
/* An eventfd readable while records wait. */
int hixl_nl_log_fd(hixl_nl_log *g);
/* Moves up to `cap` records into out (oldest first), returns how many;
 * *dropped gets the records lost to a full log since the last take. */
size_t hixl_nl_log_take(hixl_nl_log *g, hixl_nl_record *out, size_t cap, uint64_t *dropped);
void hixl_nl_log_destroy(hixl_nl_log *g);

/* ---- lanes: one thread per client connection ---- */

typedef struct hixl_nlane hixl_nlane;

/*
 * Starts a lane thread reading `submissions` (the consumer side) and writing
 * `completions` (the producer side), for cells of `owner`, logging to `log`.
 * The rings and the log must outlive the lane (hixl_nl_stop first).
 *
 * Each submission is sent, and its reply awaited for a short while, on the
 * lane's thread, which spares the hand-offs to and from a link worker; a
 * reply that takes longer comes back through the lane's own completion
 * queue while the lane goes on, so a slow far side holds up the requests
 * behind it by that short wait only. A CANCEL
 * submission answers its call at once (HIXL_NL_CANCELLED); the transfer runs
 * to its end, as a cancelled call's does on the ordinary lane.
 */
int hixl_nl_start(hixl_ring *submissions, hixl_ring *completions, uint64_t owner,
                  hixl_nl_log *log, hixl_nlane **out);
/* Submissions served so far (any outcome, cancels too). */
uint64_t hixl_nl_served(hixl_nlane *l);
/* Transfers it has out now (not cancelled). */
int hixl_nl_under_way(hixl_nlane *l);
/* Nonzero once the thread ended on its own: a corrupt ring, or its client
 * stopped reading completions. */
int hixl_nl_ended(hixl_nlane *l);
/* Ends the thread (transfers out first run to their end, each bounded by its
 * deadline) and frees the lane. */
void hixl_nl_stop(hixl_nlane *l);

#endif
