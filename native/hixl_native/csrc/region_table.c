#define _GNU_SOURCE
#include "region_table.h"

#include <endian.h>
#include <stdlib.h>
#include <string.h>

#include "copy.h"
#include "hixl_common.h"

void hixl_regions_init(hixl_region_table *t)
{
    memset(t, 0, sizeof(*t));
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->released, NULL);
}

static void drop_region(hixl_region *r)
{
    if (r->map != NULL) {
        hixl_mapping_unpin(r->map);
        hixl_mapping_unref(r->map);
    } else {
        hixl_xmem_unref(r->xmem);
    }
    free(r);
    hixl_live_add(HIXL_LIVE_REGIONS, -1);
}

void hixl_regions_clear(hixl_region_table *t)
{
    pthread_mutex_lock(&t->mu);
    size_t n = t->n;
    hixl_region **v = t->v;
    t->v = NULL;
    t->n = t->cap = 0;
    pthread_mutex_unlock(&t->mu);
    for (size_t i = 0; i < n; i++)
        drop_region(v[i]);
    free(v);
}

void hixl_regions_destroy(hixl_region_table *t)
{
    hixl_regions_clear(t);
    t->v = NULL;
    t->n = t->cap = 0;
    pthread_cond_destroy(&t->released);
    pthread_mutex_destroy(&t->mu);
}

/* First index whose id is >= `id`. */
static size_t lower_bound(const hixl_region_table *t, uint64_t id)
{
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->v[mid]->id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static hixl_region *lookup(const hixl_region_table *t, uint64_t id)
{
    size_t i = lower_bound(t, id);
    return (i < t->n && t->v[i]->id == id) ? t->v[i] : NULL;
}

static int grow(hixl_region_table *t)
{
    if (t->n < t->cap)
        return HIXL_OK;
    size_t ncap = t->cap ? t->cap * 2 : 16;
    hixl_region **nv = realloc(t->v, ncap * sizeof(*nv));
    if (nv == NULL)
        return HIXL_E_NOMEM;
    t->v = nv;
    t->cap = ncap;
    return HIXL_OK;
}

static int insert(hixl_region_table *t, hixl_region *r)
{
    uint64_t id = r->id;
    pthread_mutex_lock(&t->mu);
    size_t i = lower_bound(t, id);
    int rc = (i < t->n && t->v[i]->id == id) ? HIXL_E_EXISTS : grow(t);
    if (rc == HIXL_OK) {
        memmove(&t->v[i + 1], &t->v[i], (t->n - i) * sizeof(*t->v));
        t->v[i] = r;
        t->n++;
        if (r->map != NULL) {
            hixl_mapping_ref(r->map);
            hixl_mapping_pin(r->map);
        } else {
            hixl_xmem_ref(r->xmem);
        }
        hixl_live_add(HIXL_LIVE_REGIONS, 1);
    }
    pthread_mutex_unlock(&t->mu);
    if (rc != HIXL_OK)
        free(r);
    return rc;
}

int hixl_regions_add(hixl_region_table *t, uint64_t id, hixl_mapping *map,
                     uint64_t offset, uint64_t length, uint64_t cluster, int writable)
{
    if (map->addr == NULL || !hixl_in_bounds(offset, length, map->size))
        return HIXL_E_INVAL;
    hixl_region *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return HIXL_E_NOMEM;
    *r = (hixl_region){.id = id, .map = map, .base = map->addr + offset,
                       .length = length, .cluster = cluster, .writable = writable};
    return insert(t, r);
}

int hixl_regions_add_xmem(hixl_region_table *t, uint64_t id, hixl_xmem *xmem,
                          uint64_t offset, uint64_t length, uint64_t cluster, int writable)
{
    if (!hixl_in_bounds(offset, length, xmem->size))
        return HIXL_E_INVAL;
    hixl_region *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return HIXL_E_NOMEM;
    *r = (hixl_region){.id = id, .xmem = xmem,
                       .base = (uint8_t *)(uintptr_t)(xmem->base + offset),
                       .length = length, .cluster = cluster, .writable = writable};
    return insert(t, r);
}

void hixl_regions_remove(hixl_region_table *t, uint64_t id)
{
    pthread_mutex_lock(&t->mu);
    for (;;) {
        /* Look the region up again after every wait: a concurrent remove of
         * the same id may have freed it meanwhile. */
        size_t i = lower_bound(t, id);
        if (i >= t->n || t->v[i]->id != id)
            break;
        hixl_region *r = t->v[i];
        r->dying = 1;
        if (r->inuse == 0) {
            memmove(&t->v[i], &t->v[i + 1], (t->n - i - 1) * sizeof(*t->v));
            t->n--;
            pthread_mutex_unlock(&t->mu);
            drop_region(r);
            return;
        }
        /* Users are bounded by their request deadlines and by server close,
         * so this wait ends. */
        pthread_cond_wait(&t->released, &t->mu);
    }
    pthread_mutex_unlock(&t->mu);
}

static void unhold(hixl_region_table *t, hixl_region **held, uint32_t n)
{
    int wake = 0;
    for (uint32_t i = 0; i < n; i++) {
        hixl_region *r = held[i];
        if (--r->inuse == 0 && r->dying)
            wake = 1;
    }
    if (wake)
        pthread_cond_broadcast(&t->released);
}

int hixl_regions_acquire(hixl_region_table *t, uint64_t cluster, int for_write,
                         const uint8_t *ranges, uint32_t n, struct iovec *iov,
                         hixl_region **held)
{
    hixl_region *last = NULL;
    pthread_mutex_lock(&t->mu);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t id = le64toh(hixl_load_u64(ranges, 3 * (size_t)i));
        uint64_t off = le64toh(hixl_load_u64(ranges, 3 * (size_t)i + 1));
        uint64_t len = le64toh(hixl_load_u64(ranges, 3 * (size_t)i + 2));
        /* Consecutive ranges usually hit the same region: skip the search. */
        hixl_region *r = (last != NULL && last->id == id) ? last : lookup(t, id);
        if (r == NULL || r->dying || r->cluster != cluster
            || (for_write && !r->writable) || !hixl_in_bounds(off, len, r->length)) {
            unhold(t, held, i);
            pthread_mutex_unlock(&t->mu);
            return HIXL_E_REFUSED;
        }
        r->inuse++;
        held[i] = r;
        iov[i].iov_base = r->base + off;
        iov[i].iov_len = (size_t)len;
        last = r;
    }
    pthread_mutex_unlock(&t->mu);
    return HIXL_OK;
}

void hixl_regions_release(hixl_region_table *t, hixl_region **held, uint32_t n)
{
    pthread_mutex_lock(&t->mu);
    unhold(t, held, n);
    pthread_mutex_unlock(&t->mu);
}
