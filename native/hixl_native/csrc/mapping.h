/*
 * A shared (MAP_SHARED) mapping of a file descriptor, shared between the
 * Python object that created it and native users (registered regions,
 * in-flight requests, running copies).
 *
 * Two counters keep it safe:
 *   refs  - owners of the struct; the last hixl_mapping_unref() unmaps and
 *           frees, which may happen on a native thread after the Python
 *           object is gone (a request still in flight keeps the memory).
 *   pins  - users of the *memory* (buffer views and native users); an
 *           explicit hixl_mapping_unmap() is refused while any exist.
 * Pins are only taken by callers holding the GIL, so "pins == 0" checked
 * under the GIL cannot be invalidated before the unmap that follows it.
 */
#ifndef HIXL_MAPPING_H
#define HIXL_MAPPING_H

#include <stdatomic.h>
#include <stdint.h>

typedef struct hixl_mapping {
    uint8_t *addr;      /* NULL once unmapped */
    uint64_t size;
    int owned_fd;       /* closed with the mapping; -1 if the caller owns it */
    int adopted;        /* the memory is the caller's: released, never unmapped */
    atomic_int refs;
    atomic_int pins;
} hixl_mapping;

/* Maps `size` bytes of `fd`; when owned_fd >= 0 it is closed with the mapping. */
int hixl_mapping_create(int fd, uint64_t size, int populate, int owned_fd,
                        hixl_mapping **out);
/* Moves this process's own memory [addr, addr + size) onto `fd` in place:
 * its bytes are copied into the file, then the file is mapped over them at the
 * same address (MAP_FIXED), so every pointer into the range stays valid and
 * another process that maps `fd` shares the bytes. `addr` and `size` must be
 * page-aligned and the file at least `size` long. Nothing may write the range
 * meanwhile. The mapping never unmaps the range; its owner frees it as before.
 * On failure the range keeps its bytes, partly moved. */
int hixl_mapping_adopt(void *addr, uint64_t size, int fd, hixl_mapping **out);
void hixl_mapping_ref(hixl_mapping *m);
void hixl_mapping_unref(hixl_mapping *m);
void hixl_mapping_pin(hixl_mapping *m);
void hixl_mapping_unpin(hixl_mapping *m);
int hixl_mapping_pins(const hixl_mapping *m);
/* Unmaps now; HIXL_E_BUSY while pinned. Idempotent. */
int hixl_mapping_unmap(hixl_mapping *m);

#endif
