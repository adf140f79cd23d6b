/*
 * The hixl TCP data-plane protocol, version 2, and the socket helpers that
 * both ends share.
 *
 * All integers are little-endian and every header is fixed-size; there is
 * no padding and no variable-length field except the range list, whose
 * length the header announces. `status` fields carry the HIXL_E_* values of
 * hixl_common.h (0 = OK, HIXL_E_REFUSED = -3, HIXL_E_PROTO = -5, ...).
 *
 * Connection setup (initiator -> target), once per TCP connection. The
 * token names a link; the connection proves that it belongs to the link by
 * a MAC with the link's 32-byte key, which the two daemons agreed at the
 * link's Peer.Hello and which never travels on this connection. The target
 * draws a fresh nonce per connection, so a PROOF seen on one connection is
 * worthless on any other (no replay):
 *
 *   HELLO      24 bytes  u32 magic "HIXL" (0x4C584948) | u16 version (2)
 *                        | u16 kind = 1 | u64 token | u64 reserved (0)
 *   CHALLENGE  48 bytes  u32 magic | u16 version | u16 kind = 5 | i32 status
 *                        | u32 reserved | 32 bytes nonce
 *   PROOF      40 bytes  u32 magic | u16 version | u16 kind = 6
 *                        | 32 bytes HMAC-SHA256(key, "hixl-data-v2" | u64 token
 *                        | nonce)
 *   WELCOME    16 bytes  u32 magic | u16 version (the target's) | u16 kind = 2
 *                        | i32 status | u32 reserved
 *
 *   CHALLENGE status is OK, E_BUSY (the target is at its limit of
 *   concurrent data connections) or E_PROTO (bad magic or kind, other
 *   version); on anything but OK the target closes the connection. The
 *   challenge does not say whether the token is known. WELCOME status is
 *   OK, or E_REFUSED (unknown token or wrong MAC), and the target closes
 *   the connection on E_REFUSED. No request is read before an OK WELCOME.
 *
 * Then any number of requests, strictly one at a time per connection (the
 * initiator gets parallelism from several connections, not from pipelining,
 * which keeps a timed-out connection easy to discard):
 *
 *   REQUEST  40 bytes   u32 magic | u16 version | u16 kind = 3 | u8 op
 *                       (1 READ, 2 WRITE) | u8 flags (bit 0: CRC32C; other
 *                       bits must be 0, else E_PROTO) | u16 reserved
 *                       | u32 nranges | u64 tag | u64 total_bytes
 *                       | u32 timeout_ms | u32 reserved
 *   RANGE    24 bytes   u64 region_id | u64 offset in region | u64 length
 *                       (nranges of them, 1 <= nranges <= 65536, total_bytes
 *                       must equal the sum of the lengths)
 *   REPLY    24 bytes   u32 magic | u16 version | u16 kind = 4 | i32 status
 *                       | u8 flags (the request's flags the target honours)
 *                       | u8 reserved[3] | u64 tag (echoes the request)
 *   TRAILER   4 bytes   u32 CRC-32C (crc32c.h) of the request's payload,
 *                       only with the CRC32C flag (below)
 *
 *   READ:  initiator sends REQUEST + RANGEs. The target validates every
 *          range (region exists and is not being unregistered, belongs to
 *          the token's cluster, range in bounds) before touching memory and
 *          answers REPLY; if status is OK, total_bytes of payload follow at
 *          once, range after range, sent straight from region memory.
 *   WRITE: initiator sends REQUEST + RANGEs + total_bytes of payload in one
 *          go (no extra round trip waiting for an accept). The target
 *          validates as for READ (and requires writable regions); if
 *          accepted it receives the payload straight into region memory,
 *          otherwise it reads and discards it so the stream stays in sync.
 *          Then it answers REPLY, so an OK means the bytes are in place.
 *
 *   CRC32C (optional, per request): the payload is followed by a TRAILER,
 *   so bytes damaged between the two memories fail the request instead of
 *   landing silently. READ: after an OK REPLY whose flags echo CRC32C the
 *   target sends the payload and then the CRC of what it sent; the
 *   initiator computes the CRC of what it received and ends the request
 *   with E_CHECKSUM (local) on a difference. WRITE: the initiator sends the
 *   payload and then its CRC; the target receives both (a refused WRITE's
 *   trailer is discarded with its payload) and answers E_CHECKSUM if its
 *   CRC of what landed differs. The bytes have landed in the region then:
 *   the status says they cannot be trusted. Either way the byte stream
 *   stays in step. An initiator whose OK REPLY does not echo the flag (a
 *   target that predates it) fails the request with E_PROTO and drops the
 *   connection: nothing was checked, and a WRITE's trailer was not read.
 *   The sender takes its CRC of its memory just before the payload goes
 *   out, the receiver of the bytes as they arrive (so destination ranges
 *   that overlap still check); source bytes that change while the request
 *   moves them (a cache written during its own transfer) mismatch too.
 *
 *   timeout_ms is the initiator's remaining budget; the target bounds its
 *   own I/O for the request with it plus a grace period, so that the
 *   initiator is always the first to give up (clocks of two hosts are never
 *   compared). A target that sees a malformed header answers E_PROTO if it
 *   still can and closes the connection; an initiator that misses a
 *   deadline closes its connection (the byte stream is out of sync) and
 *   reconnects lazily for its next request.
 */
#ifndef HIXL_TCP_WIRE_H
#define HIXL_TCP_WIRE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define HIXL_WIRE_MAGIC 0x4C584948u
#define HIXL_WIRE_VERSION 2
#define HIXL_WIRE_MAX_RANGES 65536u

enum {
    HIXL_MSG_HELLO = 1,
    HIXL_MSG_WELCOME = 2,
    HIXL_MSG_REQUEST = 3,
    HIXL_MSG_REPLY = 4,
    HIXL_MSG_CHALLENGE = 5,
    HIXL_MSG_PROOF = 6,
};
enum { HIXL_OP_READ = 1, HIXL_OP_WRITE = 2 };
enum { HIXL_FLAG_CRC32C = 1 };
enum {
    HIXL_HELLO_SIZE = 24,
    HIXL_WELCOME_SIZE = 16,
    HIXL_REQUEST_SIZE = 40,
    HIXL_RANGE_SIZE = 24,
    HIXL_REPLY_SIZE = 24,
    HIXL_CHALLENGE_SIZE = 48,
    HIXL_PROOF_SIZE = 40,
    HIXL_TRAILER_SIZE = 4,
};
/* Sizes of a link key, a challenge nonce and a MAC. */
#define HIXL_KEY_SIZE 32
#define HIXL_NONCE_SIZE 32
#define HIXL_MAC_SIZE 32

typedef struct hixl_request_hdr {
    uint8_t op;
    uint8_t flags; /* HIXL_FLAG_* */
    uint32_t nranges;
    uint64_t tag;
    uint64_t total_bytes;
    uint32_t timeout_ms;
} hixl_request_hdr;

void hixl_put_hello(uint8_t *b, uint64_t token);
/* HIXL_E_PROTO for a foreign magic, kind or version. */
int hixl_get_hello(const uint8_t *b, uint64_t *token);
void hixl_put_challenge(uint8_t *b, int32_t status, const uint8_t *nonce);
int hixl_get_challenge(const uint8_t *b, int32_t *status, uint8_t *nonce);
void hixl_put_proof(uint8_t *b, const uint8_t *mac);
int hixl_get_proof(const uint8_t *b, uint8_t *mac);
/* The MAC a connection of link `token` answers `nonce` with. HIXL_E_IO if
 * libcrypto fails. */
int hixl_data_mac(const uint8_t *key, uint64_t token, const uint8_t *nonce, uint8_t *mac);
/* Fills `nonce` from the kernel's random source. */
int hixl_fill_random(uint8_t *buf, size_t len);
void hixl_put_welcome(uint8_t *b, int32_t status);
int hixl_get_welcome(const uint8_t *b, int32_t *status);
void hixl_put_request(uint8_t *b, const hixl_request_hdr *h);
int hixl_get_request(const uint8_t *b, hixl_request_hdr *h);
void hixl_put_range(uint8_t *b, uint64_t region, uint64_t offset, uint64_t length);
void hixl_put_reply(uint8_t *b, uint64_t tag, int32_t status, uint8_t flags);
int hixl_get_reply(const uint8_t *b, uint64_t *tag, int32_t *status, uint8_t *flags);
void hixl_put_trailer(uint8_t *b, uint32_t crc);
uint32_t hixl_get_trailer(const uint8_t *b);
/* The CRC-32C of the memory of `n` iovecs, in order. */
uint32_t hixl_crc32c_iov(const struct iovec *iov, size_t n);

/* A position in an iovec array; the array itself is advanced in place. */
typedef struct hixl_iovcur {
    struct iovec *iov;
    size_t cnt;
} hixl_iovcur;

/*
 * Socket I/O on non-blocking sockets. Every wait is a poll() on the socket
 * and on `stop_fd` (an eventfd that becomes readable when the owner shuts
 * down; -1 for none), bounded by `deadline_ns` (monotonic; 0 = no
 * deadline). Results: HIXL_OK, HIXL_E_TIMEOUT, HIXL_E_CANCELLED (stop_fd),
 * HIXL_E_CLOSED (EOF, reset, broken pipe) or HIXL_E_IO (errno kept).
 */
int hixl_wait_fd(int fd, short events, int stop_fd, uint64_t deadline_ns);
int hixl_send_iov(int fd, int stop_fd, hixl_iovcur *cur, uint64_t deadline_ns);
/* Sends what the socket takes without waiting: HIXL_OK once everything went
 * out, HIXL_E_BUSY when the socket is full (the cursor holds the rest), or
 * an error as above. */
int hixl_send_iov_nowait(int fd, hixl_iovcur *cur);
/* Receives until at least `want` bytes arrived (it may take more, up to the
 * iovecs' room); the count received is added to *got, also when it fails
 * (the cursor holds the position either way). */
int hixl_recv_iov(int fd, int stop_fd, hixl_iovcur *cur, size_t want,
                  uint64_t deadline_ns, size_t *got);
/* A CRC taken of received bytes as they arrive: those at positions [lo, hi)
 * of a cursor's stream, `pos` being the position of the cursor's next byte.
 * Taken of the wire's bytes, not of memory after the fact, so ranges that
 * overlap in the destination still check. */
typedef struct hixl_crcwin {
    uint64_t pos, lo, hi;
    uint32_t crc;
} hixl_crcwin;
/* hixl_recv_iov that updates `win` (NULL: none) with every byte received. */
int hixl_recv_iov_crc(int fd, int stop_fd, hixl_iovcur *cur, size_t want,
                      uint64_t deadline_ns, size_t *got, hixl_crcwin *win);
int hixl_send_buf(int fd, int stop_fd, const void *buf, size_t len, uint64_t deadline_ns);
int hixl_recv_buf(int fd, int stop_fd, void *buf, size_t len, uint64_t deadline_ns);

/* A resolved peer address, kept so reconnects never wait on DNS. */
typedef struct hixl_addr {
    struct sockaddr_storage ss;
    socklen_t len;
} hixl_addr;

void hixl_tcp_tune(int fd);
/* TCP keepalive (idle and interval seconds, probe count) and TCP_USER_TIMEOUT
 * (ms) for every data-plane socket made or accepted from now on; 0 keeps the
 * kernel's default for that option. */
void hixl_tcp_set_liveness(int idle_s, int interval_s, int count, int user_timeout_ms);
/* Resolves `host` and connects to the first address that answers, which is
 * stored in *addr_out for later reconnects. */
int hixl_tcp_connect(const char *host, uint16_t port, int stop_fd, uint64_t deadline_ns,
                     int *fd_out, hixl_addr *addr_out);
int hixl_tcp_connect_addr(const hixl_addr *addr, int stop_fd, uint64_t deadline_ns,
                          int *fd_out);
/* Initiator side of HELLO/CHALLENGE/PROOF/WELCOME; returns the target's
 * status (E_REFUSED, E_BUSY) or E_PROTO. */
int hixl_tcp_handshake(int fd, int stop_fd, uint64_t token, const uint8_t *key,
                       uint64_t deadline_ns);

#endif
