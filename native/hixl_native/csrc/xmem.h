/*
 * Memory of a client process that the daemon did not map: the engine's own
 * tensors (numpy, torch, mmap, malloc), reached with process_vm_readv and
 * process_vm_writev (cross-memory attach) instead of loads and stores.
 *
 * A hixl_xmem is one registered span [base, base + size) of one process,
 * named by the pid and a pidfd taken when the client bound its session
 * (the kernel's peer credentials, never a pid the client claims). The
 * calls take a pid, which the kernel could give to a new process once the
 * client exited and was reaped; so every call is bracketed by a look at the
 * pidfd, which turns readable the moment the client exits (before it can
 * be reaped): a call is made only while the process was alive just before
 * it, and a read whose process exited by the end is reported failed, so its
 * bytes are never used. Revoking (deregistration) fails every later call.
 *
 * Bytes that go to or come from a socket pass through a bounce buffer of
 * the daemon (hixl_bounce): a fixed set of page-aligned buffers made once,
 * taken for one chunk of a request and given back, so that the bytes a
 * daemon stages are bounded whatever the load.
 */
#ifndef HIXL_XMEM_H
#define HIXL_XMEM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

typedef struct hixl_bounce hixl_bounce;

int hixl_bounce_create(size_t count, size_t size, hixl_bounce **out);
void hixl_bounce_ref(hixl_bounce *b);
void hixl_bounce_unref(hixl_bounce *b);
size_t hixl_bounce_size(const hixl_bounce *b);
size_t hixl_bounce_free_count(hixl_bounce *b);
/* A free buffer, waiting until `deadline_ns` (or *stop turning non-zero,
 * checked every 100 ms) for one; NULL then. */
uint8_t *hixl_bounce_take(hixl_bounce *b, uint64_t deadline_ns, const atomic_int *stop);
void hixl_bounce_give(hixl_bounce *b, uint8_t *buf);

typedef struct hixl_xmem {
    pid_t pid;
    int pidfd;
    uint64_t base;  /* the span's first address in the client */
    uint64_t size;
    atomic_int refs;
    atomic_int revoked;
    hixl_bounce *inbound;  /* for the data server's requests */
    hixl_bounce *outbound; /* for this daemon's own requests and copies */
} hixl_xmem;

/* Takes a duplicate of `pidfd`; references both bounce pools. */
int hixl_xmem_create(int pidfd, pid_t pid, uint64_t base, uint64_t size, hixl_bounce *inbound,
                     hixl_bounce *outbound, hixl_xmem **out);
void hixl_xmem_ref(hixl_xmem *x);
void hixl_xmem_unref(hixl_xmem *x);
/* Every later call fails with HIXL_E_GONE; calls under way finish. */
void hixl_xmem_revoke(hixl_xmem *x);
int hixl_xmem_alive(const hixl_xmem *x);

/*
 * Moves n (local, remote) pairs of equal length: process_vm_writev when
 * `to_remote`, else process_vm_readv, IOV_MAX pairs per call. Remote
 * addresses are absolute (already bounds-checked against the span).
 * HIXL_OK; HIXL_E_GONE (revoked, or the process exited); HIXL_E_REFUSED
 * (EPERM, EFAULT: not allowed, or not mapped there; errno kept).
 */
int hixl_xmem_pairs(hixl_xmem *x, int to_remote, const struct iovec *local,
                    const struct iovec *remote, size_t n);
/* As hixl_xmem_pairs, with one contiguous local buffer for all n remote
 * segments, in order. */
int hixl_xmem_flat(hixl_xmem *x, int to_remote, uint8_t *buf, const struct iovec *remote,
                   size_t n);
/* Reads one byte at each of `n` absolute addresses (a registration's
 * probe); the status as hixl_xmem_pairs. */
int hixl_xmem_probe(hixl_xmem *x, const uint64_t *addrs, size_t n);

/*
 * A walk over a request's segments (local memory, or memory of a
 * hixl_xmem when owner[i] is set; `one` owns every segment when `owner` is
 * NULL), moving bytes between them and one bounce buffer a chunk at a
 * time: hixl_segs_gather fills `buf` with up to `cap` next bytes,
 * hixl_segs_scatter stores `len` next bytes from it.
 */
typedef struct hixl_segs {
    const struct iovec *iov;
    hixl_xmem *const *owner;
    hixl_xmem *one;
    size_t n, i, off;
} hixl_segs;

int hixl_segs_gather(hixl_segs *s, uint8_t *buf, size_t cap, size_t *got);
int hixl_segs_scatter(hixl_segs *s, const uint8_t *buf, size_t len);

/*
 * Local copies with engine memory on one side or both, as (dst offset,
 * src offset, length) triples (copy.h), offsets relative to each side's
 * base: `dst_local`/`src_local` is the side's mapping address when its
 * hixl_xmem is NULL. Memory to memory of two spans passes through an
 * outbound bounce buffer, range by range and in order (ranges of one span
 * may overlap, as copy_blocks inside a cache does).
 */
int hixl_xmem_copy(hixl_xmem *dst, uint8_t *dst_local, hixl_xmem *src, uint8_t *src_local,
                   const uint8_t *triples, size_t n, uint64_t deadline_ns);

#endif
