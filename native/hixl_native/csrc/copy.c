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

/* A request moving at least this many bytes goes around the caches: its
 * destination would only evict the cache's contents and be evicted in turn
 * (a KV pool is far larger than any cache), so streaming stores that skip
 * the read-for-ownership move the same bytes in less memory traffic. glibc
 * makes that choice per call, and only for single copies of several MiB; a
 * request of many 64 KiB blocks never qualifies there. */
#define NT_MIN_REQUEST_BYTES (512u << 10)
/* Blocks smaller than this are copied with memmove (the stores would not pay). */
#define NT_MIN_RANGE_BYTES 4096u

#if defined(__SSE2__)
#include <emmintrin.h>

/* Copies with 16-byte streaming stores; the destination's unaligned head and
 * the tail go through memcpy. The ranges must not overlap. */
static void copy_streaming(uint8_t *dst, const uint8_t *src, size_t len)
{
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    memcpy(dst, src, head);
    dst += head, src += head, len -= head;
    size_t body = len & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    memcpy(dst + body, src + body, len - body);
}
#define HAVE_STREAMING 1
#else
#define HAVE_STREAMING 0
#endif

static int disjoint(const uint8_t *a, const uint8_t *b, uint64_t len)
{
    return a + len <= b || b + len <= a;
}

void hixl_copy_triples(uint8_t *dst, const uint8_t *src, const uint8_t *triples, size_t n,
                       uint64_t request_bytes)
{
    uint64_t total = request_bytes;
    for (size_t i = 0; HAVE_STREAMING && request_bytes == 0 && i < n; i++)
        total += hixl_load_u64(triples, 3 * i + 2);
    int stream = HAVE_STREAMING && total >= NT_MIN_REQUEST_BYTES;
    for (size_t i = 0; i < n; i++) {
        uint64_t d = hixl_load_u64(triples, 3 * i);
        uint64_t s = hixl_load_u64(triples, 3 * i + 1);
        uint64_t len = hixl_load_u64(triples, 3 * i + 2);
#if HAVE_STREAMING
        if (stream && len >= NT_MIN_RANGE_BYTES && disjoint(dst + d, src + s, len)) {
            copy_streaming(dst + d, src + s, (size_t)len);
            continue;
        }
#endif
        /* memmove because dst and src may be the same mapping. */
        memmove(dst + d, src + s, (size_t)len);
    }
#if HAVE_STREAMING
    if (stream)
        _mm_sfence(); /* streaming stores are weakly ordered: publish them before returning */
#endif
}
