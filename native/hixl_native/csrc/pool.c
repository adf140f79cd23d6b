#define _GNU_SOURCE
#include "pool.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hixl_common.h"

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
    hixl_pool *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return HIXL_E_NOMEM;
    /* First, so a bad size or page shift fails before any memfd exists. */
    int rc = hixl_extents_init(&p->ext, size, page_shift);
    if (rc != HIXL_OK) {
        free(p);
        return rc;
    }
    uint64_t bytes = hixl_extents_size(&p->ext);
    int fd = -1;
    rc = open_memfd(name, bytes, &fd);
    if (rc == HIXL_OK) {
        rc = hixl_mapping_create(fd, bytes, populate, fd, &p->map);
        if (rc != HIXL_OK) {
            int err = errno;
            close(fd);
            errno = err;
        }
    }
    if (rc != HIXL_OK) {
        int err = errno; /* the caller reports it for HIXL_E_IO */
        hixl_extents_fini(&p->ext);
        free(p);
        errno = err;
        return rc;
    }
    hixl_live_add(HIXL_LIVE_POOLS, 1);
    *out = p;
    return HIXL_OK;
}

void hixl_pool_destroy(hixl_pool *p)
{
    if (p == NULL)
        return;
    hixl_mapping_unref(p->map);
    hixl_extents_fini(&p->ext);
    free(p);
    hixl_live_add(HIXL_LIVE_POOLS, -1);
}
