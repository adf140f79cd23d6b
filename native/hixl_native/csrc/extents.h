/*
 * A page-granular, thread-safe allocator of offsets in [0, size).
 *
 * It knows nothing about the memory behind the offsets: SharedPool puts it
 * over a memfd mapping, the device pools over device memory. Free space is
 * a sorted array of extents that is coalesced on every free, and live
 * allocations are a sorted array of (start, pages) used to validate frees.
 * Both are O(extents) per operation, which is fine for the few thousand
 * blocks a KV pool holds. One mutex guards everything, so every function
 * may be called without the GIL from any thread.
 */
#ifndef HIXL_EXTENTS_H
#define HIXL_EXTENTS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define HIXL_EXTENTS_MIN_PAGE_SHIFT 10
#define HIXL_EXTENTS_MAX_PAGE_SHIFT 31 /* exclusive */

typedef struct hixl_extent {
    uint64_t start; /* in pages */
    uint64_t pages;
} hixl_extent;

typedef struct hixl_extents {
    unsigned page_shift;
    uint64_t npages;
    uint64_t used_pages;
    pthread_mutex_t mu;
    hixl_extent *free_ext;
    size_t nfree, cap_free;
    hixl_extent *live;
    size_t nlive, cap_live;
} hixl_extents;

/*
 * Initializes an allocator embedded in another object; `size` is rounded up
 * to whole pages (hixl_extents_size() gives the result). HIXL_E_INVAL for a
 * page shift outside [MIN, MAX) or a size of 0 or near INT64_MAX.
 */
int hixl_extents_init(hixl_extents *x, uint64_t size, unsigned page_shift);
/* Releases what init allocated; no thread may be using `x` any more. */
void hixl_extents_fini(hixl_extents *x);

/* A heap-allocated allocator, for users with nothing to embed it in. */
int hixl_extents_create(uint64_t size, unsigned page_shift, hixl_extents **out);
void hixl_extents_destroy(hixl_extents *x);

/* Best fit of `nbytes` rounded up to pages; HIXL_E_EXHAUSTED if nothing fits. */
int hixl_extents_alloc(hixl_extents *x, uint64_t nbytes, uint64_t *offset);
/* HIXL_E_INVAL unless `offset` starts a live allocation; never allocates. */
int hixl_extents_free(hixl_extents *x, uint64_t offset);
int hixl_extents_allocation_size(hixl_extents *x, uint64_t offset, uint64_t *size);
void hixl_extents_usage(hixl_extents *x, uint64_t *used, uint64_t *free_bytes);

/* The managed size in bytes (whole pages); fixed at init, so no lock. */
static inline uint64_t hixl_extents_size(const hixl_extents *x)
{
    return x->npages << x->page_shift;
}

#endif
