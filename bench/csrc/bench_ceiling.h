/*
 * Ceilings measured by hixl-bench next to hixl's own figures.
 *
 * Both contexts own a source and a destination buffer of `cold_bytes` each,
 * pre-faulted, through which successive requests rotate so that every copy
 * reads and writes memory that is not in cache (a real KV pool is far larger
 * than the last-level cache). A "request" is `nblocks` blocks of `block`
 * bytes; `run` times `iters` requests one after the other and stores each
 * request's duration in nanoseconds.
 *
 * Every function returns 0 or a negative errno; none touches Python.
 */
#ifndef HIXL_BENCH_CEILING_H
#define HIXL_BENCH_CEILING_H

#include <stddef.h>
#include <stdint.h>

/* Single-thread memcpy, one call per block. */
typedef struct hb_mem hb_mem;

int hb_mem_open(size_t cold_bytes, hb_mem **out);
int hb_mem_run(hb_mem *m, size_t block, size_t nblocks, size_t iters, uint64_t *out_ns);
void hb_mem_close(hb_mem *m);

/*
 * Raw loopback TCP "pull": the caller sends the list of source ranges, a
 * sender thread answers with the bytes (sendmsg over iovecs of its source
 * buffer) and the caller receives them with recvmsg straight into its
 * destination buffer. With `streams` > 1 a request's bytes are split evenly
 * across that many connections, stream 0 served by the calling thread and
 * the others by receiver threads, as a multi-stream data plane does.
 */
typedef struct hb_tcp hb_tcp;

/* sockbuf: SO_SNDBUF/SO_RCVBUF bytes, or 0 for the kernel's autotuning. */
int hb_tcp_open(size_t cold_bytes, int streams, int sockbuf, hb_tcp **out);
int hb_tcp_run(hb_tcp *t, size_t block, size_t nblocks, size_t iters, uint64_t *out_ns);
void hb_tcp_close(hb_tcp *t);

#endif
