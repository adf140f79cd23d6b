#include "copy.h"

#include <string.h>

#include "hixl_common.h"

int hixl_check_triples(const uint8_t *triples, size_t n, uint64_t dst_size,
                       uint64_t src_size, size_t *bad)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t d = hixl_load_u64(triples, 3 * i);
        uint64_t s = hixl_load_u64(triples, 3 * i + 1);
        uint64_t len = hixl_load_u64(triples, 3 * i + 2);
        if (!hixl_in_bounds(d, len, dst_size) || !hixl_in_bounds(s, len, src_size)) {
            *bad = i;
            return HIXL_E_INVAL;
        }
    }
    return HIXL_OK;
}

void hixl_copy_triples(uint8_t *dst, const uint8_t *src, const uint8_t *triples, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t d = hixl_load_u64(triples, 3 * i);
        uint64_t s = hixl_load_u64(triples, 3 * i + 1);
        uint64_t len = hixl_load_u64(triples, 3 * i + 2);
        /* memmove because dst and src may be the same mapping; glibc's
         * memmove is as fast as memcpy when the ranges do not overlap and
         * switches to non-temporal stores for large copies on its own. */
        memmove(dst + d, src + s, (size_t)len);
    }
}
