/*
 * Local copies between two mappings, described by (dst_offset, src_offset,
 * length) triples of uint64 in host byte order. The triples may come from
 * any Python buffer (bytes included), so they are read without assuming
 * 8-byte alignment.
 */
#ifndef HIXL_COPY_H
#define HIXL_COPY_H

#include <stddef.h>
#include <stdint.h>

/* Returns HIXL_OK, or HIXL_E_INVAL with *bad set to the first bad triple. */
int hixl_check_triples(const uint8_t *triples, size_t n, uint64_t dst_size,
                       uint64_t src_size, size_t *bad);
/* Copies every triple; overlapping ranges are allowed (memmove semantics).
 * `request_bytes` is the size of the whole request these triples belong to
 * (a request split over threads copies like the whole); 0: their own total. */
void hixl_copy_triples(uint8_t *dst, const uint8_t *src, const uint8_t *triples, size_t n,
                       uint64_t request_bytes);

/* Reads the k-th uint64 of an unaligned array. */
static inline uint64_t hixl_load_u64(const uint8_t *base, size_t k)
{
    uint64_t v;
    __builtin_memcpy(&v, base + k * 8, 8);
    return v;
}

/* True when [off, off + len) lies inside [0, size), without overflowing. */
static inline int hixl_in_bounds(uint64_t off, uint64_t len, uint64_t size)
{
    return off <= size && len <= size - off;
}

#endif
