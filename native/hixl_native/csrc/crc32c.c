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

static uint32_t table[256];
static int use_hw;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        table[i] = c;
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

#if defined(__x86_64__)
__attribute__((target("sse4.2")))
static uint32_t by_cpu(uint32_t c, const uint8_t *p, size_t len)
{
    uint64_t c64 = c;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8); /* unaligned payloads are normal */
        c64 = _mm_crc32_u64(c64, w);
        p += 8;
        len -= 8;
    }
    c = (uint32_t)c64;
    while (len--)
        c = _mm_crc32_u8(c, *p++);
    return c;
}
#elif defined(__aarch64__)
__attribute__((target("+crc")))
static uint32_t by_cpu(uint32_t c, const uint8_t *p, size_t len)
{
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __crc32cd(c, w);
        p += 8;
        len -= 8;
    }
    while (len--)
        c = __crc32cb(c, *p++);
    return c;
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
