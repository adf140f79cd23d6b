#define _GNU_SOURCE
#include "pool.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hixl_common.h"

/* First index whose start is >= `start` (the array is sorted by start). */
static size_t lower_bound(const hixl_extent *v, size_t n, uint64_t start)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v[mid].start < start)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int reserve(hixl_extent **v, size_t *cap, size_t need)
{
    if (*cap >= need)
        return HIXL_OK;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < need)
        ncap *= 2;
    hixl_extent *nv = realloc(*v, ncap * sizeof(**v));
    if (nv == NULL)
        return HIXL_E_NOMEM;
    *v = nv;
    *cap = ncap;
    return HIXL_OK;
}

static void insert_at(hixl_extent *v, size_t *n, size_t i, hixl_extent e)
{
    memmove(&v[i + 1], &v[i], (*n - i) * sizeof(*v));
    v[i] = e;
    (*n)++;
}

static void remove_at(hixl_extent *v, size_t *n, size_t i)
{
    memmove(&v[i], &v[i + 1], (*n - i - 1) * sizeof(*v));
    (*n)--;
}

static int open_memfd(const char *name, uint64_t size, int *fd_out)
{
    char full[250];
    int len = snprintf(full, sizeof(full), "hixl-pool:%s", name);
    if (len < 0 || (size_t)len >= sizeof(full))
        return HIXL_E_INVAL;
    int fd = memfd_create(full, MFD_CLOEXEC);
    if (fd < 0)
        return HIXL_E_IO;
    if (ftruncate(fd, (off_t)size) != 0) {
        int err = errno;
        close(fd);
        errno = err;
        return HIXL_E_IO;
    }
    *fd_out = fd;
    return HIXL_OK;
}

int hixl_pool_create(const char *name, uint64_t size, unsigned page_shift,
                     int populate, hixl_pool **out)
{
    if (page_shift < HIXL_POOL_MIN_PAGE_SHIFT || page_shift >= HIXL_POOL_MAX_PAGE_SHIFT)
        return HIXL_E_INVAL;
    uint64_t page = 1ull << page_shift;
    if (size == 0 || size > (uint64_t)INT64_MAX - page)
        return HIXL_E_INVAL;
    uint64_t npages = (size + page - 1) >> page_shift;

    hixl_pool *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return HIXL_E_NOMEM;
    p->page_shift = page_shift;
    p->npages = npages;
    int fd = -1;
    int rc = open_memfd(name, npages << page_shift, &fd);
    if (rc == HIXL_OK) {
        rc = hixl_mapping_create(fd, npages << page_shift, populate, fd, &p->map);
        if (rc != HIXL_OK) {
            int err = errno;
            close(fd);
            errno = err;
        }
    }
    if (rc == HIXL_OK)
        rc = reserve(&p->free_ext, &p->cap_free, 2);
    if (rc != HIXL_OK) {
        if (p->map != NULL)
            hixl_mapping_unref(p->map);
        free(p->free_ext);
        free(p);
        return rc;
    }
    p->free_ext[0] = (hixl_extent){0, npages};
    p->nfree = 1;
    pthread_mutex_init(&p->mu, NULL);
    hixl_live_add(HIXL_LIVE_POOLS, 1);
    *out = p;
    return HIXL_OK;
}

void hixl_pool_destroy(hixl_pool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_destroy(&p->mu);
    hixl_mapping_unref(p->map);
    free(p->free_ext);
    free(p->live);
    free(p);
    hixl_live_add(HIXL_LIVE_POOLS, -1);
}

/* Best fit keeps large extents intact for the large blocks that need them. */
static int take_extent(hixl_pool *p, uint64_t pages, uint64_t *start)
{
    size_t best = p->nfree;
    for (size_t i = 0; i < p->nfree; i++) {
        uint64_t have = p->free_ext[i].pages;
        if (have >= pages && (best == p->nfree || have < p->free_ext[best].pages)) {
            best = i;
            if (have == pages)
                break;
        }
    }
    if (best == p->nfree)
        return HIXL_E_EXHAUSTED;
    hixl_extent *e = &p->free_ext[best];
    *start = e->start;
    if (e->pages == pages) {
        remove_at(p->free_ext, &p->nfree, best);
    } else {
        e->start += pages;
        e->pages -= pages;
    }
    return HIXL_OK;
}

int hixl_pool_alloc(hixl_pool *p, uint64_t nbytes, uint64_t *offset)
{
    if (nbytes == 0)
        return HIXL_E_INVAL;
    uint64_t page = 1ull << p->page_shift;
    if (nbytes > (p->npages << p->page_shift))
        return HIXL_E_EXHAUSTED;
    uint64_t pages = (nbytes + page - 1) >> p->page_shift;

    pthread_mutex_lock(&p->mu);
    /* Free extents are separated by live blocks, so there are at most
     * nlive + 1 of them; reserving that here means free() never allocates
     * and therefore never fails for a valid offset. */
    int rc = reserve(&p->live, &p->cap_live, p->nlive + 1);
    if (rc == HIXL_OK)
        rc = reserve(&p->free_ext, &p->cap_free, p->nlive + 2);
    uint64_t start = 0;
    if (rc == HIXL_OK)
        rc = take_extent(p, pages, &start);
    if (rc == HIXL_OK) {
        size_t i = lower_bound(p->live, p->nlive, start);
        insert_at(p->live, &p->nlive, i, (hixl_extent){start, pages});
        p->used_pages += pages;
        *offset = start << p->page_shift;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

static void give_back(hixl_pool *p, hixl_extent e)
{
    size_t j = lower_bound(p->free_ext, p->nfree, e.start);
    int merge_prev = j > 0 && p->free_ext[j - 1].start + p->free_ext[j - 1].pages == e.start;
    int merge_next = j < p->nfree && e.start + e.pages == p->free_ext[j].start;
    if (merge_prev && merge_next) {
        p->free_ext[j - 1].pages += e.pages + p->free_ext[j].pages;
        remove_at(p->free_ext, &p->nfree, j);
    } else if (merge_prev) {
        p->free_ext[j - 1].pages += e.pages;
    } else if (merge_next) {
        p->free_ext[j].start = e.start;
        p->free_ext[j].pages += e.pages;
    } else {
        insert_at(p->free_ext, &p->nfree, j, e);
    }
}

/* Index of the live allocation starting at `offset`, or nlive if none. */
static size_t find_live(hixl_pool *p, uint64_t offset)
{
    if (offset & ((1ull << p->page_shift) - 1))
        return p->nlive;
    uint64_t start = offset >> p->page_shift;
    size_t i = lower_bound(p->live, p->nlive, start);
    return (i < p->nlive && p->live[i].start == start) ? i : p->nlive;
}

int hixl_pool_free(hixl_pool *p, uint64_t offset)
{
    pthread_mutex_lock(&p->mu);
    size_t i = find_live(p, offset);
    int rc = HIXL_E_INVAL;
    if (i < p->nlive) {
        hixl_extent e = p->live[i];
        remove_at(p->live, &p->nlive, i);
        give_back(p, e);
        p->used_pages -= e.pages;
        rc = HIXL_OK;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int hixl_pool_allocation_size(hixl_pool *p, uint64_t offset, uint64_t *size)
{
    pthread_mutex_lock(&p->mu);
    size_t i = find_live(p, offset);
    int rc = HIXL_E_INVAL;
    if (i < p->nlive) {
        *size = p->live[i].pages << p->page_shift;
        rc = HIXL_OK;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void hixl_pool_usage(hixl_pool *p, uint64_t *used, uint64_t *free_bytes)
{
    pthread_mutex_lock(&p->mu);
    *used = p->used_pages << p->page_shift;
    *free_bytes = (p->npages - p->used_pages) << p->page_shift;
    pthread_mutex_unlock(&p->mu);
}
