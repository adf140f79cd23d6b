/*
 * A memfd-backed pool: an anonymous memfd, its shared mapping and an
 * extent allocator (extents.h) handing out offsets into it.
 *
 * The memory lives in a hixl_mapping (so it outlives the pool while native
 * users still pin it); the allocator only hands out offsets and is used
 * directly through `ext`.
 */
#ifndef HIXL_POOL_H
#define HIXL_POOL_H

#include <stdint.h>

#include "extents.h"
#include "mapping.h"

typedef struct hixl_pool {
    hixl_mapping *map; /* one reference owned by the pool */
    hixl_extents ext;  /* covers exactly map->size bytes */
} hixl_pool;

/* `size` is rounded up to whole pages; page_shift as for hixl_extents_init. */
int hixl_pool_create(const char *name, uint64_t size, unsigned page_shift,
                     int populate, hixl_pool **out);
void hixl_pool_destroy(hixl_pool *p);

#endif
