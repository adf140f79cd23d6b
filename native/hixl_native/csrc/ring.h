/*
 * A one-way frame ring in memory shared by two processes: one producer, one
 * consumer, no lock and no system call while both are busy.
 *
 * The shared part (hixl_ring_shared) holds the two positions and two
 * "asleep" flags; each side also keeps a private hixl_ring handle with the
 * ring's size, its own position and the eventfds. A side that finds nothing
 * to do spins for a bounded time, then sets its flag and sleeps on its
 * eventfd; the other side writes that eventfd only when it sees the flag set,
 * so a side that keeps up with the traffic is never woken by the kernel.
 * (Dekker's pattern: each side stores, then fences, then loads the other's
 * word, so at least one of the two sees the other's store.)
 *
 * The other process is not trusted. A handle never reads the ring's size
 * from shared memory after attaching, keeps its own position privately, and
 * checks every position and length the other side wrote before using it: a
 * corrupt ring fails with HIXL_E_PROTO, never reads or writes outside the
 * mapping. The consumer copies each frame out before looking at it, so the
 * producer cannot change a frame after it was checked.
 *
 * Frames are a 4-byte length, the bytes, padding to 8. A frame never wraps:
 * when the space left before the end is too short, the producer writes a pad
 * marker there and starts at the beginning.
 */
#ifndef HIXL_RING_H
#define HIXL_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "hixl_common.h"

#define HIXL_RING_LINE 64

typedef struct hixl_ring_shared {
    uint64_t magic;
    uint64_t capacity; /* bytes of data[], a power of two */
    uint8_t pad0[HIXL_RING_LINE - 16];
    _Atomic uint64_t tail;            /* written by the producer */
    _Atomic uint32_t producer_asleep; /* waiting for space */
    uint8_t pad1[HIXL_RING_LINE - 12];
    _Atomic uint64_t head;            /* written by the consumer */
    _Atomic uint32_t consumer_asleep; /* waiting for frames */
    uint8_t pad2[HIXL_RING_LINE - 12];
    uint8_t data[];
} hixl_ring_shared;

typedef struct hixl_ring {
    hixl_ring_shared *shared;
    uint64_t capacity;
    uint64_t pos;  /* the producer's tail or the consumer's head: this side's own */
    int producer;
    int wait_fd;   /* read end (non-blocking) of the pipe this side sleeps on */
    int wake_fd;   /* write end (non-blocking) of the pipe the other side sleeps on */
    int close_fd;  /* readable once this side is closing: every wait returns (-1: none) */
} hixl_ring;

/* The bytes a ring of `capacity` data bytes needs in shared memory. */
size_t hixl_ring_bytes(uint64_t capacity);
/* The largest frame a ring of `capacity` takes (a quarter of it). */
size_t hixl_ring_max_frame(uint64_t capacity);
/* Lays out a fresh ring in `mem` (hixl_ring_bytes(capacity) long, zeroed);
 * HIXL_E_INVAL unless capacity is a power of two of 4 KiB to 1 GiB. */
int hixl_ring_init(void *mem, size_t bytes, uint64_t capacity);
/* A sealed memfd (it can neither shrink nor grow) holding a fresh ring. */
int hixl_ring_memfd(uint64_t capacity, int *fd_out);
/* Maps a ring's memfd, refusing one not sealed against shrinking. */
int hixl_ring_map(int fd, void **mem_out, size_t *bytes_out);
void hixl_ring_unmap(void *mem, size_t bytes);

/* A handle on a ring in `mem` of `bytes` (mapped by this process); the
 * capacity is read once and checked against `bytes`. `producer` says which
 * side this handle is. The fds stay the caller's and must be non-blocking. */
int hixl_ring_attach(hixl_ring *r, void *mem, size_t bytes, int producer, int wait_fd,
                     int wake_fd);

/* Producer: appends one frame. HIXL_E_BUSY: no room now; HIXL_E_INVAL: longer
 * than hixl_ring_max_frame; HIXL_E_PROTO: the consumer's position is corrupt. */
int hixl_ring_write(hixl_ring *r, const void *buf, size_t len);
/* Consumer: copies the oldest frame into buf and drops it from the ring.
 * HIXL_E_BUSY: none; HIXL_E_EXHAUSTED: buf (cap bytes) is too short, *len
 * says how long it is and the frame stays; HIXL_E_PROTO: corrupt ring. */
int hixl_ring_read(hixl_ring *r, void *buf, size_t cap, size_t *len);
/* 1 when a frame is waiting (for the consumer), or room for a frame of len
 * bytes (for the producer); 0 otherwise; HIXL_E_PROTO on a corrupt ring. */
int hixl_ring_readable(hixl_ring *r);
int hixl_ring_writable(hixl_ring *r, size_t len);

/* Waits until readable (consumer) or writable for len bytes (producer):
 * spins up to spin_ns, then sleeps on wait_fd until deadline_ns (0: no
 * deadline) or stop_fd or close_fd (-1: none) is readable. HIXL_OK,
 * HIXL_E_TIMEOUT, HIXL_E_CANCELLED (stop_fd), HIXL_E_CLOSED (close_fd),
 * HIXL_E_PROTO, HIXL_E_IO. */
int hixl_ring_wait_readable(hixl_ring *r, uint64_t spin_ns, uint64_t deadline_ns, int stop_fd);
int hixl_ring_wait_writable(hixl_ring *r, size_t len, uint64_t spin_ns, uint64_t deadline_ns,
                            int stop_fd);

/* For a side that waits in an event loop instead (wait_fd registered with
 * it): arm says it is going to sleep and returns 1, or 0 (flag cleared) when
 * it is readable (consumer) or writable for len bytes (producer) already;
 * disarm, once wait_fd was readable or the wait is given up, clears the
 * flag and empties the pipe. */
int hixl_ring_arm(hixl_ring *r, size_t len);
void hixl_ring_disarm(hixl_ring *r);

#endif
