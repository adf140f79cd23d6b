/*
 * The regions a DataServer exposes, shared by all its connection threads.
 *
 * A request acquires every range it names in one critical section, all or
 * nothing, so it is validated completely before any byte moves; each
 * acquired range holds an in-use count on its region until released.
 * Removing a region first marks it dying (new requests are refused at once)
 * and then waits for the in-use count to drop to zero. Regions are
 * allocated one by one so that pointers held by requests stay valid while
 * the sorted index array around them is reshuffled.
 */
#ifndef HIXL_REGION_TABLE_H
#define HIXL_REGION_TABLE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "mapping.h"
#include "xmem.h"

typedef struct hixl_region {
    uint64_t id;
    hixl_mapping *map; /* referenced and pinned while registered; or NULL and: */
    hixl_xmem *xmem;   /* client-process memory (referenced): base is its address */
    uint8_t *base;
    uint64_t length;
    uint64_t cluster;
    int writable;
    int dying;
    uint64_t inuse;
} hixl_region;

typedef struct hixl_region_table {
    pthread_mutex_t mu;
    pthread_cond_t released; /* signalled when a dying region goes idle */
    hixl_region **v;         /* sorted by id */
    size_t n, cap;
} hixl_region_table;

void hixl_regions_init(hixl_region_table *t);
/* Drops every region; only once no connection thread can use the table. */
void hixl_regions_destroy(hixl_region_table *t);
int hixl_regions_add(hixl_region_table *t, uint64_t id, hixl_mapping *map,
                     uint64_t offset, uint64_t length, uint64_t cluster, int writable);
/* A region of client-process memory: [offset, offset + length) of the span. */
int hixl_regions_add_xmem(hixl_region_table *t, uint64_t id, hixl_xmem *xmem,
                          uint64_t offset, uint64_t length, uint64_t cluster, int writable);
/* Drops every region; only once no connection thread can use the table. */
void hixl_regions_clear(hixl_region_table *t);
/* Refuses new users at once, then blocks until current users are gone. */
void hixl_regions_remove(hixl_region_table *t, uint64_t id);
/*
 * Validates and pins `n` wire ranges (little-endian region, offset, length
 * triples) for a peer of `cluster`; on success fills iov[i] with the memory
 * of range i (an address in the client for a region of client-process
 * memory, never to be dereferenced here) and held[i] with its region. HIXL_E_REFUSED if any range is
 * unknown, dying, foreign, out of bounds or (for writes) read-only.
 */
int hixl_regions_acquire(hixl_region_table *t, uint64_t cluster, int for_write,
                         const uint8_t *ranges, uint32_t n, struct iovec *iov,
                         hixl_region **held);
void hixl_regions_release(hixl_region_table *t, hixl_region **held, uint32_t n);

#endif
