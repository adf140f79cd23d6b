/*
 * A page-granular allocator over an anonymous memfd.
 *
 * The memory lives in a hixl_mapping (so it outlives the allocator while
 * native users still pin it); the allocator only hands out offsets. Free
 * space is a sorted array of extents that is coalesced on every free, and
 * live allocations are a sorted array of (start, pages) used to validate
 * frees. Both are O(extents) per operation, which is fine for the few
 * thousand blocks a KV pool holds.
 */
#ifndef HIXL_POOL_H
#define HIXL_POOL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "mapping.h"

#define HIXL_POOL_MIN_PAGE_SHIFT 10
#define HIXL_POOL_MAX_PAGE_SHIFT 31 /* exclusive */

typedef struct hixl_extent {
    uint64_t start; /* in pages */
    uint64_t pages;
} hixl_extent;

typedef struct hixl_pool {
    hixl_mapping *map; /* one reference owned by the pool */
    unsigned page_shift;
    uint64_t npages;
    uint64_t used_pages;
    pthread_mutex_t mu;
    hixl_extent *free_ext;
    size_t nfree, cap_free;
    hixl_extent *live;
    size_t nlive, cap_live;
} hixl_pool;

/* `size` is rounded up to whole pages. */
int hixl_pool_create(const char *name, uint64_t size, unsigned page_shift,
                     int populate, hixl_pool **out);
void hixl_pool_destroy(hixl_pool *p);
int hixl_pool_alloc(hixl_pool *p, uint64_t nbytes, uint64_t *offset);
int hixl_pool_free(hixl_pool *p, uint64_t offset);
int hixl_pool_allocation_size(hixl_pool *p, uint64_t offset, uint64_t *size);
void hixl_pool_usage(hixl_pool *p, uint64_t *used, uint64_t *free_bytes);

#endif
