#include "extents.h"

#include <stdlib.h>
#include <string.h>

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

int hixl_extents_init(hixl_extents *x, uint64_t size, unsigned page_shift)
{
    if (page_shift < HIXL_EXTENTS_MIN_PAGE_SHIFT || page_shift >= HIXL_EXTENTS_MAX_PAGE_SHIFT)
        return HIXL_E_INVAL;
    uint64_t page = 1ull << page_shift;
    /* Keeps every offset and size representable as a signed 64-bit value
     * (off_t for the memfd, Py_ssize_t for views). */
    if (size == 0 || size > (uint64_t)INT64_MAX - page)
        return HIXL_E_INVAL;
    memset(x, 0, sizeof(*x));
    x->page_shift = page_shift;
    x->npages = (size + page - 1) >> page_shift;
    int rc = reserve(&x->free_ext, &x->cap_free, 2);
    if (rc == HIXL_OK && pthread_mutex_init(&x->mu, NULL) != 0)
        rc = HIXL_E_NOMEM;
    if (rc != HIXL_OK) {
        free(x->free_ext);
        x->free_ext = NULL;
        return rc;
    }
    x->free_ext[0] = (hixl_extent){0, x->npages};
    x->nfree = 1;
    hixl_live_add(HIXL_LIVE_ALLOCATORS, 1);
    return HIXL_OK;
}

void hixl_extents_fini(hixl_extents *x)
{
    pthread_mutex_destroy(&x->mu);
    free(x->free_ext);
    free(x->live);
    x->free_ext = x->live = NULL;
    x->nfree = x->cap_free = x->nlive = x->cap_live = 0;
    hixl_live_add(HIXL_LIVE_ALLOCATORS, -1);
}

int hixl_extents_create(uint64_t size, unsigned page_shift, hixl_extents **out)
{
    hixl_extents *x = malloc(sizeof(*x));
    if (x == NULL)
        return HIXL_E_NOMEM;
    int rc = hixl_extents_init(x, size, page_shift);
    if (rc != HIXL_OK) {
        free(x);
        return rc;
    }
    *out = x;
    return HIXL_OK;
}

void hixl_extents_destroy(hixl_extents *x)
{
    if (x == NULL)
        return;
    hixl_extents_fini(x);
    free(x);
}

/* Best fit keeps large extents intact for the large blocks that need them. */
static int take_extent(hixl_extents *x, uint64_t pages, uint64_t *start)
{
    size_t best = x->nfree;
    for (size_t i = 0; i < x->nfree; i++) {
        uint64_t have = x->free_ext[i].pages;
        if (have >= pages && (best == x->nfree || have < x->free_ext[best].pages)) {
            best = i;
            if (have == pages)
                break;
        }
    }
    if (best == x->nfree)
        return HIXL_E_EXHAUSTED;
    hixl_extent *e = &x->free_ext[best];
    *start = e->start;
    if (e->pages == pages) {
        remove_at(x->free_ext, &x->nfree, best);
    } else {
        e->start += pages;
        e->pages -= pages;
    }
    return HIXL_OK;
}

int hixl_extents_alloc(hixl_extents *x, uint64_t nbytes, uint64_t *offset)
{
    if (nbytes == 0)
        return HIXL_E_INVAL;
    /* Checked before rounding, which would overflow near UINT64_MAX. */
    if (nbytes > hixl_extents_size(x))
        return HIXL_E_EXHAUSTED;
    uint64_t page = 1ull << x->page_shift;
    uint64_t pages = (nbytes + page - 1) >> x->page_shift;

    pthread_mutex_lock(&x->mu);
    /* Free extents are separated by live blocks, so there are at most
     * nlive + 1 of them; reserving that here means free() never allocates
     * and therefore never fails for a valid offset. */
    int rc = reserve(&x->live, &x->cap_live, x->nlive + 1);
    if (rc == HIXL_OK)
        rc = reserve(&x->free_ext, &x->cap_free, x->nlive + 2);
    uint64_t start = 0;
    if (rc == HIXL_OK)
        rc = take_extent(x, pages, &start);
    if (rc == HIXL_OK) {
        size_t i = lower_bound(x->live, x->nlive, start);
        insert_at(x->live, &x->nlive, i, (hixl_extent){start, pages});
        x->used_pages += pages;
        *offset = start << x->page_shift;
    }
    pthread_mutex_unlock(&x->mu);
    return rc;
}

static void give_back(hixl_extents *x, hixl_extent e)
{
    size_t j = lower_bound(x->free_ext, x->nfree, e.start);
    int merge_prev = j > 0 && x->free_ext[j - 1].start + x->free_ext[j - 1].pages == e.start;
    int merge_next = j < x->nfree && e.start + e.pages == x->free_ext[j].start;
    if (merge_prev && merge_next) {
        x->free_ext[j - 1].pages += e.pages + x->free_ext[j].pages;
        remove_at(x->free_ext, &x->nfree, j);
    } else if (merge_prev) {
        x->free_ext[j - 1].pages += e.pages;
    } else if (merge_next) {
        x->free_ext[j].start = e.start;
        x->free_ext[j].pages += e.pages;
    } else {
        insert_at(x->free_ext, &x->nfree, j, e);
    }
}

/* Index of the live allocation starting at `offset`, or nlive if none. */
static size_t find_live(hixl_extents *x, uint64_t offset)
{
    if (offset & ((1ull << x->page_shift) - 1))
        return x->nlive;
    uint64_t start = offset >> x->page_shift;
    size_t i = lower_bound(x->live, x->nlive, start);
    return (i < x->nlive && x->live[i].start == start) ? i : x->nlive;
}

int hixl_extents_free(hixl_extents *x, uint64_t offset)
{
    pthread_mutex_lock(&x->mu);
    size_t i = find_live(x, offset);
    int rc = HIXL_E_INVAL;
    if (i < x->nlive) {
        hixl_extent e = x->live[i];
        remove_at(x->live, &x->nlive, i);
        give_back(x, e);
        x->used_pages -= e.pages;
        rc = HIXL_OK;
    }
    pthread_mutex_unlock(&x->mu);
    return rc;
}

int hixl_extents_allocation_size(hixl_extents *x, uint64_t offset, uint64_t *size)
{
    pthread_mutex_lock(&x->mu);
    size_t i = find_live(x, offset);
    int rc = HIXL_E_INVAL;
    if (i < x->nlive) {
        *size = x->live[i].pages << x->page_shift;
        rc = HIXL_OK;
    }
    pthread_mutex_unlock(&x->mu);
    return rc;
}

void hixl_extents_usage(hixl_extents *x, uint64_t *used, uint64_t *free_bytes)
{
    pthread_mutex_lock(&x->mu);
    *used = x->used_pages << x->page_shift;
    *free_bytes = (x->npages - x->used_pages) << x->page_shift;
    pthread_mutex_unlock(&x->mu);
}
