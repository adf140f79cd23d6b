#define _GNU_SOURCE
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#elif defined(__aarch64__)
#include <arm_acle.h>
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#endif

#define POLY 0x82F63B78u
/* The instruction takes three cycles and accepts one a cycle: three lanes
 * of LANE bytes each, interleaved, keep it busy, and their CRCs are joined
 * with `shift` (the CRC register advanced over LANE zero bytes). */
#define LANE 4096

static uint32_t table[256];
static uint32_t shift[4][256];
static int use_hw;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static uint32_t by_table(uint32_t c, const uint8_t *p, size_t len);

/* The register `c` advanced over LANE zero bytes, from the tables. */
static uint32_t shift_lane(uint32_t c)
{
    return shift[0][c & 0xff] ^ shift[1][(c >> 8) & 0xff] ^ shift[2][(c >> 16) & 0xff]
           ^ shift[3][c >> 24];
}

static void init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        table[i] = c;
    }
    /* Advancing over zeros is linear in the register: the images of the 32
     * unit registers give it for any register, a byte of it at a time. */
    static const uint8_t zeros[LANE];
    uint32_t unit[32];
    for (int bit = 0; bit < 32; bit++)
        unit[bit] = by_table(1u << bit, zeros, LANE);
    for (int k = 0; k < 4; k++)
        for (uint32_t v = 0; v < 256; v++) {
            uint32_t img = 0;
            for (int bit = 0; bit < 8; bit++)
                if (v & (1u << bit))
                    img ^= unit[8 * k + bit];
            shift[k][v] = img;
        }
#if defined(__x86_64__)
    __builtin_cpu_init();
    use_hw = __builtin_cpu_supports("sse4.2");
#elif defined(__aarch64__)
    use_hw = (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
#endif
}

static uint32_t by_table(uint32_t c, const uint8_t *p, size_t len)
{
    while (len--)
        c = table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

static inline uint64_t load64(const uint8_t *p)
{
    uint64_t w;
    memcpy(&w, p, 8); /* unaligned payloads are normal */
    return w;
}

/* The body shared by both instruction sets: STEP64 and STEP8 advance a
 * register over a word or a byte. Three lanes while a whole stripe is left,
 * then one. */
#define BY_CPU_BODY(STEP64, STEP8)                                               \
    while (len >= 3 * LANE) {                                                    \
        uint32_t c1 = 0, c2 = 0;                                                 \
        for (size_t i = 0; i < LANE; i += 8) {                                   \
            c = STEP64(c, load64(p + i));                                        \
            c1 = STEP64(c1, load64(p + LANE + i));                               \
            c2 = STEP64(c2, load64(p + 2 * LANE + i));                           \
        }                                                                        \
        c = shift_lane(shift_lane(c) ^ c1) ^ c2;                                 \
        p += 3 * LANE;                                                           \
        len -= 3 * LANE;                                                         \
    }                                                                            \
    for (; len >= 8; p += 8, len -= 8)                                           \
        c = STEP64(c, load64(p));                                                \
    while (len--)                                                                \
        c = STEP8(c, *p++);                                                      \
    return c;

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static inline uint32_t step64(uint32_t c, uint64_t w)
{
    return (uint32_t)_mm_crc32_u64(c, w);
}

__attribute__((target("sse4.2"))) static inline uint32_t step8(uint32_t c, uint8_t b)
{
    return _mm_crc32_u8(c, b);
}

__attribute__((target("sse4.2")))
static uint32_t by_cpu(uint32_t c, const uint8_t *p, size_t len)
{
    BY_CPU_BODY(step64, step8)
}
#elif defined(__aarch64__)
__attribute__((target("+crc"))) static inline uint32_t step64(uint32_t c, uint64_t w)
{
    return __crc32cd(c, w);
}

__attribute__((target("+crc"))) static inline uint32_t step8(uint32_t c, uint8_t b)
{
    return __crc32cb(c, b);
}

__attribute__((target("+crc")))
static uint32_t by_cpu(uint32_t c, const uint8_t *p, size_t len)
{
    BY_CPU_BODY(step64, step8)
}
#else
static uint32_t by_cpu(uint32_t c, const uint8_t *p, size_t len) { return by_table(c, p, len); }
#endif

uint32_t hixl_crc32c(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&once, init);
    uint32_t c = ~crc;
    c = use_hw ? by_cpu(c, buf, len) : by_table(c, buf, len);
    return ~c;
}

uint32_t hixl_crc32c_table(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&once, init);
    return ~by_table(~crc, buf, len);
}

int hixl_crc32c_hardware(void)
{
    pthread_once(&once, init);
    return use_hw;
}
