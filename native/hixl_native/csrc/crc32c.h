/*
 * CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
 * the data plane's optional per-request trailer (tcp_wire.h).
 *
 * Computed with the CPU's instruction where it has one (SSE4.2 crc32 on
 * x86-64, the CRC32 extension on aarch64), chosen once at run time, and
 * with a byte table elsewhere. The three give the same value.
 */
#ifndef HIXL_CRC32C_H
#define HIXL_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* Continues `crc` (0 to start) over `len` bytes: hixl_crc32c(hixl_crc32c(0,
 * a, n), b, m) equals the CRC of a followed by b. */
uint32_t hixl_crc32c(uint32_t crc, const void *buf, size_t len);
/* The table-only path, for tests that compare it with the fast one. */
uint32_t hixl_crc32c_table(uint32_t crc, const void *buf, size_t len);
/* Whether hixl_crc32c uses the CPU's instruction. */
int hixl_crc32c_hardware(void);

#endif
