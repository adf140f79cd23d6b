/*
 * The target side of the TCP data plane (protocol in tcp_wire.h): a fixed
 * set of worker threads sharing one epoll set of the listener and every
 * connection, and the server's region table. A worker takes whichever
 * connection is ready, runs its handshake a step at a time without
 * blocking, or serves its requests; a connection waiting for its next
 * request holds no thread. Every wait also watches the server's stop
 * eventfd, so hixl_server_stop() wakes every worker at once.
 */
#ifndef HIXL_TCP_SERVER_H
#define HIXL_TCP_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "region_table.h"

typedef struct hixl_server hixl_server;

#define HIXL_SERVER_MAX_THREADS 256

/* Binds (SO_REUSEADDR; port 0 = ephemeral), listens, starts `nthreads`
 * workers serving at most `max_conns` (>= 1) connections at a time (more
 * are refused with E_BUSY). */
int hixl_server_start(const char *host, uint16_t port, size_t max_conns, int nthreads,
                      hixl_server **out);
uint16_t hixl_server_port(const hixl_server *s);
int hixl_server_threads(const hixl_server *s);
/* Writes this server refused because their bytes did not match their CRC-32C. */
uint64_t hixl_server_checksum_mismatches(hixl_server *s);
hixl_region_table *hixl_server_regions(hixl_server *s);
/* Lets connections that prove the HIXL_KEY_SIZE-byte `key` of link `token`
 * reach regions of `cluster`, and write into its writable ones only if
 * `may_write`. HIXL_E_EXISTS when the token is already bound to another
 * cluster. */
int hixl_server_authorize(hixl_server *s, uint64_t token, uint64_t cluster,
                          const uint8_t *key, int may_write);
/* Forgets the token and shuts down the connections that presented it. */
void hixl_server_revoke(hixl_server *s, uint64_t token);
/* Stops accepting, wakes and joins every worker, closes every connection.
 * Idempotent. */
void hixl_server_stop(hixl_server *s);
/* Stops, then frees the server and its regions. */
void hixl_server_destroy(hixl_server *s);

#endif
