#define _GNU_SOURCE
#include "mapping.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hixl_common.h"

/* Defined here because every other part links against mapping.c. */
atomic_long hixl_live_counts[HIXL_LIVE_KINDS];

long hixl_live_count(int kind)
{
    if (kind < 0 || kind >= HIXL_LIVE_KINDS)
        return -1;
    return atomic_load_explicit(&hixl_live_counts[kind], memory_order_relaxed);
}

int hixl_mapping_create(int fd, uint64_t size, int populate, int owned_fd,
                        hixl_mapping **out)
{
    struct stat st;
    if (size == 0 || size > (uint64_t)INT64_MAX)
        return HIXL_E_INVAL;
    if (fstat(fd, &st) != 0)
        return HIXL_E_IO;
    /* Touching a page past the end of a file raises SIGBUS, which would kill
     * the whole daemon; refuse such a mapping up front instead. */
    if (S_ISREG(st.st_mode) && (uint64_t)st.st_size < size)
        return HIXL_E_INVAL;

    hixl_mapping *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return HIXL_E_NOMEM;
    int flags = MAP_SHARED | (populate ? MAP_POPULATE : 0);
    void *addr = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, flags, fd, 0);
    if (addr == MAP_FAILED) {
        int err = errno;
        free(m);
        errno = err;
        return err == ENOMEM ? HIXL_E_NOMEM : HIXL_E_IO;
    }
    m->addr = addr;
    m->size = size;
    m->owned_fd = owned_fd;
    atomic_init(&m->refs, 1);
    atomic_init(&m->pins, 0);
    hixl_live_add(HIXL_LIVE_MAPPINGS, 1); /* counts mapped memory */
    *out = m;
    return HIXL_OK;
}

/* Moved a piece at a time, so at most one piece is held twice. */
#define ADOPT_PIECE ((uint64_t)64 << 20)

static int write_all(int fd, const uint8_t *src, uint64_t len, uint64_t offset)
{
    while (len > 0) {
        ssize_t n = pwrite(fd, src, (size_t)len, (off_t)offset);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == ENOSPC || errno == ENOMEM ? HIXL_E_NOMEM : HIXL_E_IO;
        }
        src += n;
        len -= (uint64_t)n;
        offset += (uint64_t)n;
    }
    return HIXL_OK;
}

int hixl_mapping_adopt(void *addr, uint64_t size, int fd, hixl_mapping **out)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    struct stat st;
    if (addr == NULL || size == 0 || size > (uint64_t)INT64_MAX
            || (uintptr_t)addr % page != 0 || size % page != 0)
        return HIXL_E_INVAL;
    if (fstat(fd, &st) != 0)
        return HIXL_E_IO;
    if ((uint64_t)st.st_size < size)
        return HIXL_E_INVAL;
    hixl_mapping *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return HIXL_E_NOMEM;
    uint8_t *base = addr;
    for (uint64_t offset = 0; offset < size; offset += ADOPT_PIECE) {
        uint64_t len = size - offset < ADOPT_PIECE ? size - offset : ADOPT_PIECE;
        int rc = write_all(fd, base + offset, len, offset);
        /* MAP_POPULATE: the file's pages exist now; only the page tables fill. */
        if (rc == HIXL_OK && mmap(base + offset, (size_t)len, PROT_READ | PROT_WRITE,
                                  MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd,
                                  (off_t)offset) == MAP_FAILED)
            rc = errno == ENOMEM ? HIXL_E_NOMEM : HIXL_E_IO;
        if (rc != HIXL_OK) {
            int err = errno;
            free(m);
            errno = err;
            return rc;
        }
    }
    m->addr = base;
    m->size = size;
    m->owned_fd = -1;
    m->adopted = 1;
    atomic_init(&m->refs, 1);
    atomic_init(&m->pins, 0);
    hixl_live_add(HIXL_LIVE_MAPPINGS, 1);
    *out = m;
    return HIXL_OK;
}

void hixl_mapping_ref(hixl_mapping *m)
{
    atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
}

static void release_memory(hixl_mapping *m)
{
    if (m->addr != NULL) {
        if (!m->adopted)
            munmap(m->addr, (size_t)m->size);
        m->addr = NULL;
        hixl_live_add(HIXL_LIVE_MAPPINGS, -1);
    }
    if (m->owned_fd >= 0) {
        close(m->owned_fd);
        m->owned_fd = -1;
    }
}

void hixl_mapping_unref(hixl_mapping *m)
{
    if (atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) == 1) {
        release_memory(m);
        free(m);
    }
}

void hixl_mapping_pin(hixl_mapping *m)
{
    atomic_fetch_add_explicit(&m->pins, 1, memory_order_relaxed);
}

void hixl_mapping_unpin(hixl_mapping *m)
{
    /* Release order: the bytes a native thread moved must be visible to
     * whoever later sees the pin gone and reuses or unmaps the memory. */
    atomic_fetch_sub_explicit(&m->pins, 1, memory_order_release);
}

int hixl_mapping_pins(const hixl_mapping *m)
{
    return atomic_load_explicit(&m->pins, memory_order_acquire);
}

int hixl_mapping_unmap(hixl_mapping *m)
{
    if (hixl_mapping_pins(m) > 0)
        return HIXL_E_BUSY;
    release_memory(m);
    return HIXL_OK;
}
