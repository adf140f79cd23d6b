#define _GNU_SOURCE
#include "tcp_wire.h"

#include <endian.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "crc32c.h"
#include "hixl_common.h"

/* ---- thread helper (shared by server and link) ---- */

int hixl_spawn_thread(pthread_t *thread, void *(*fn)(void *), void *arg)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(thread, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        errno = rc;
        return rc == EAGAIN ? HIXL_E_NOMEM : HIXL_E_IO;
    }
    return HIXL_OK;
}

/* ---- header encoding ---- */

static void put16(uint8_t *b, uint16_t v) { v = htole16(v); memcpy(b, &v, 2); }
static void put32(uint8_t *b, uint32_t v) { v = htole32(v); memcpy(b, &v, 4); }
static void put64(uint8_t *b, uint64_t v) { v = htole64(v); memcpy(b, &v, 8); }
static uint16_t get16(const uint8_t *b) { uint16_t v; memcpy(&v, b, 2); return le16toh(v); }
static uint32_t get32(const uint8_t *b) { uint32_t v; memcpy(&v, b, 4); return le32toh(v); }
static uint64_t get64(const uint8_t *b) { uint64_t v; memcpy(&v, b, 8); return le64toh(v); }

static void put_prefix(uint8_t *b, uint16_t kind)
{
    put32(b, HIXL_WIRE_MAGIC);
    put16(b + 4, HIXL_WIRE_VERSION);
    put16(b + 6, kind);
}

static int check_prefix(const uint8_t *b, uint16_t kind)
{
    if (get32(b) != HIXL_WIRE_MAGIC || get16(b + 4) != HIXL_WIRE_VERSION
        || get16(b + 6) != kind)
        return HIXL_E_PROTO;
    return HIXL_OK;
}

void hixl_put_hello(uint8_t *b, uint64_t token)
{
    put_prefix(b, HIXL_MSG_HELLO);
    put64(b + 8, token);
    put64(b + 16, 0);
}

int hixl_get_hello(const uint8_t *b, uint64_t *token)
{
    *token = get64(b + 8);
    return check_prefix(b, HIXL_MSG_HELLO);
}

void hixl_put_challenge(uint8_t *b, int32_t status, const uint8_t *nonce)
{
    put_prefix(b, HIXL_MSG_CHALLENGE);
    put32(b + 8, (uint32_t)status);
    put32(b + 12, 0);
    memcpy(b + 16, nonce, HIXL_NONCE_SIZE);
}

int hixl_get_challenge(const uint8_t *b, int32_t *status, uint8_t *nonce)
{
    /* As for WELCOME: a target of another version answers E_PROTO in its
     * own version, and that status is worth reporting. */
    if (get32(b) != HIXL_WIRE_MAGIC || get16(b + 6) != HIXL_MSG_CHALLENGE)
        return HIXL_E_PROTO;
    *status = (int32_t)get32(b + 8);
    if (get16(b + 4) != HIXL_WIRE_VERSION && *status == HIXL_OK)
        return HIXL_E_PROTO;
    memcpy(nonce, b + 16, HIXL_NONCE_SIZE);
    return HIXL_OK;
}

void hixl_put_proof(uint8_t *b, const uint8_t *mac)
{
    put_prefix(b, HIXL_MSG_PROOF);
    memcpy(b + 8, mac, HIXL_MAC_SIZE);
}

int hixl_get_proof(const uint8_t *b, uint8_t *mac)
{
    memcpy(mac, b + 8, HIXL_MAC_SIZE);
    return check_prefix(b, HIXL_MSG_PROOF);
}

/* The label keeps a MAC made for the data plane from being valid for any
 * other use of the same key. */
static const char DATA_MAC_LABEL[] = "hixl-data-v2";

int hixl_data_mac(const uint8_t *key, uint64_t token, const uint8_t *nonce, uint8_t *mac)
{
    uint8_t msg[sizeof(DATA_MAC_LABEL) - 1 + 8 + HIXL_NONCE_SIZE];
    memcpy(msg, DATA_MAC_LABEL, sizeof(DATA_MAC_LABEL) - 1);
    put64(msg + sizeof(DATA_MAC_LABEL) - 1, token);
    memcpy(msg + sizeof(DATA_MAC_LABEL) - 1 + 8, nonce, HIXL_NONCE_SIZE);
    unsigned int len = 0;
    if (HMAC(EVP_sha256(), key, HIXL_KEY_SIZE, msg, sizeof(msg), mac, &len) == NULL
        || len != HIXL_MAC_SIZE)
        return HIXL_E_IO;
    return HIXL_OK;
}

int hixl_fill_random(uint8_t *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = getrandom(buf, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return HIXL_E_IO;
        }
        buf += n;
        len -= (size_t)n;
    }
    return HIXL_OK;
}

void hixl_put_welcome(uint8_t *b, int32_t status)
{
    put_prefix(b, HIXL_MSG_WELCOME);
    put32(b + 8, (uint32_t)status);
    put32(b + 12, 0);
}

int hixl_get_welcome(const uint8_t *b, int32_t *status)
{
    /* A target of another version answers with its own version and
     * E_PROTO; only the magic and kind must match to trust the status. */
    if (get32(b) != HIXL_WIRE_MAGIC || get16(b + 6) != HIXL_MSG_WELCOME)
        return HIXL_E_PROTO;
    *status = (int32_t)get32(b + 8);
    if (get16(b + 4) != HIXL_WIRE_VERSION && *status == HIXL_OK)
        return HIXL_E_PROTO;
    return HIXL_OK;
}

void hixl_put_request(uint8_t *b, const hixl_request_hdr *h)
{
    put_prefix(b, HIXL_MSG_REQUEST);
    b[8] = h->op;
    b[9] = h->flags;
    put16(b + 10, 0);
    put32(b + 12, h->nranges);
    put64(b + 16, h->tag);
    put64(b + 24, h->total_bytes);
    put32(b + 32, h->timeout_ms);
    put32(b + 36, 0);
}

int hixl_get_request(const uint8_t *b, hixl_request_hdr *h)
{
    h->op = b[8];
    h->flags = b[9];
    h->nranges = get32(b + 12);
    h->tag = get64(b + 16);
    h->total_bytes = get64(b + 24);
    h->timeout_ms = get32(b + 32);
    if (check_prefix(b, HIXL_MSG_REQUEST) != HIXL_OK)
        return HIXL_E_PROTO;
    if ((h->op != HIXL_OP_READ && h->op != HIXL_OP_WRITE) || h->nranges == 0
        || h->nranges > HIXL_WIRE_MAX_RANGES || (h->flags & ~HIXL_FLAG_CRC32C) != 0)
        return HIXL_E_PROTO;
    return HIXL_OK;
}

void hixl_put_range(uint8_t *b, uint64_t region, uint64_t offset, uint64_t length)
{
    put64(b, region);
    put64(b + 8, offset);
    put64(b + 16, length);
}

void hixl_put_reply(uint8_t *b, uint64_t tag, int32_t status, uint8_t flags)
{
    put_prefix(b, HIXL_MSG_REPLY);
    put32(b + 8, (uint32_t)status);
    put32(b + 12, 0);
    b[12] = flags;
    put64(b + 16, tag);
}

int hixl_get_reply(const uint8_t *b, uint64_t *tag, int32_t *status, uint8_t *flags)
{
    *status = (int32_t)get32(b + 8);
    *flags = b[12];
    *tag = get64(b + 16);
    return check_prefix(b, HIXL_MSG_REPLY);
}

void hixl_put_trailer(uint8_t *b, uint32_t crc) { put32(b, crc); }

uint32_t hixl_get_trailer(const uint8_t *b) { return get32(b); }

uint32_t hixl_crc32c_iov(const struct iovec *iov, size_t n)
{
    uint32_t crc = 0;
    for (size_t i = 0; i < n; i++)
        crc = hixl_crc32c(crc, iov[i].iov_base, iov[i].iov_len);
    return crc;
}

/* ---- socket I/O ---- */

static int errno_status(int err)
{
    switch (err) {
    case EPIPE:
    case ECONNRESET:
    case ENOTCONN:
    case ESHUTDOWN:
    case ECONNABORTED:
    case ETIMEDOUT: /* keepalive gave up: the peer is gone */
        return HIXL_E_CLOSED;
    default:
        errno = err;
        return HIXL_E_IO;
    }
}

int hixl_wait_fd(int fd, short events, int stop_fd, uint64_t deadline_ns)
{
    struct pollfd p[2] = {{.fd = fd, .events = events}, {.fd = stop_fd, .events = POLLIN}};
    nfds_t n = stop_fd >= 0 ? 2 : 1;
    for (;;) {
        int timeout;
        if (hixl_poll_timeout(deadline_ns, &timeout) != HIXL_OK)
            return HIXL_E_TIMEOUT;
        int rc = poll(p, n, timeout);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0)
            return errno_status(errno);
        if (n == 2 && p[1].revents)
            return HIXL_E_CANCELLED;
        /* Errors and hang-ups count as ready: the I/O call that follows
         * reports what exactly happened. */
        if (p[0].revents)
            return HIXL_OK;
    }
}

/* Checked after every syscall that made progress, not only before waits:
 * while bytes keep flowing a transfer never waits, and a slow but steady
 * stream must still end at its deadline. clock_gettime is a vDSO call. */
static int past(uint64_t deadline_ns)
{
    return deadline_ns != 0 && hixl_now_ns() >= deadline_ns;
}

/* Drops `n` consumed bytes and any empty iovecs from the front. */
static void advance(hixl_iovcur *cur, size_t n)
{
    while (cur->cnt > 0 && n >= cur->iov[0].iov_len) {
        n -= cur->iov[0].iov_len;
        cur->iov++;
        cur->cnt--;
    }
    if (cur->cnt > 0 && n > 0) {
        cur->iov[0].iov_base = (uint8_t *)cur->iov[0].iov_base + n;
        cur->iov[0].iov_len -= n;
    }
}

static size_t batch_len(const hixl_iovcur *cur)
{
    return cur->cnt > IOV_MAX ? IOV_MAX : cur->cnt;
}

int hixl_send_iov(int fd, int stop_fd, hixl_iovcur *cur, uint64_t deadline_ns)
{
    advance(cur, 0);
    while (cur->cnt > 0) {
        struct msghdr mh = {.msg_iov = cur->iov, .msg_iovlen = batch_len(cur)};
        ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0) {
            advance(cur, (size_t)n);
            if (cur->cnt > 0 && past(deadline_ns))
                return HIXL_E_TIMEOUT;
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return errno_status(errno);
        int rc = hixl_wait_fd(fd, POLLOUT, stop_fd, deadline_ns);
        if (rc != HIXL_OK)
            return rc;
    }
    return HIXL_OK;
}

int hixl_send_iov_nowait(int fd, hixl_iovcur *cur)
{
    advance(cur, 0);
    while (cur->cnt > 0) {
        struct msghdr mh = {.msg_iov = cur->iov, .msg_iovlen = batch_len(cur)};
        ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0) {
            advance(cur, (size_t)n);
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return HIXL_E_BUSY;
        return errno_status(errno);
    }
    return HIXL_OK;
}

/* Adds the `n` bytes just received at the front of `cur` to the window's CRC. */
static void crc_received(hixl_crcwin *w, const hixl_iovcur *cur, size_t n)
{
    for (size_t i = 0; n > 0 && i < cur->cnt; i++) {
        size_t take = cur->iov[i].iov_len < n ? cur->iov[i].iov_len : n;
        uint64_t lo = w->pos > w->lo ? w->pos : w->lo;
        uint64_t hi = w->pos + take < w->hi ? w->pos + take : w->hi;
        if (lo < hi)
            w->crc = hixl_crc32c(w->crc, (const uint8_t *)cur->iov[i].iov_base + (lo - w->pos),
                                 (size_t)(hi - lo));
        w->pos += take;
        n -= take;
    }
}

int hixl_recv_iov(int fd, int stop_fd, hixl_iovcur *cur, size_t want,
                  uint64_t deadline_ns, size_t *got)
{
    return hixl_recv_iov_crc(fd, stop_fd, cur, want, deadline_ns, got, NULL);
}

int hixl_recv_iov_crc(int fd, int stop_fd, hixl_iovcur *cur, size_t want,
                      uint64_t deadline_ns, size_t *got, hixl_crcwin *win)
{
    size_t done = 0;
    int rc = HIXL_OK;
    advance(cur, 0);
    while (done < want && cur->cnt > 0) {
        struct msghdr mh = {.msg_iov = cur->iov, .msg_iovlen = batch_len(cur)};
        ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT);
        if (n > 0) {
            if (win != NULL)
                crc_received(win, cur, (size_t)n);
            advance(cur, (size_t)n);
            done += (size_t)n;
            if (done < want && past(deadline_ns)) {
                rc = HIXL_E_TIMEOUT;
                break;
            }
            continue;
        }
        if (n == 0) {
            rc = HIXL_E_CLOSED;
            break;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            rc = errno_status(errno);
            break;
        }
        if ((rc = hixl_wait_fd(fd, POLLIN, stop_fd, deadline_ns)) != HIXL_OK)
            break;
    }
    if (got != NULL)
        *got += done;
    return rc;
}

int hixl_send_buf(int fd, int stop_fd, const void *buf, size_t len, uint64_t deadline_ns)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    hixl_iovcur cur = {&iov, 1};
    return hixl_send_iov(fd, stop_fd, &cur, deadline_ns);
}

int hixl_recv_buf(int fd, int stop_fd, void *buf, size_t len, uint64_t deadline_ns)
{
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    hixl_iovcur cur = {&iov, 1};
    return hixl_recv_iov(fd, stop_fd, &cur, len, deadline_ns, NULL);
}

/* ---- connections ---- */

#define HIXL_SOCKBUF (4 << 20)

static pthread_once_t sockbuf_once = PTHREAD_ONCE_INIT;
static int sockbuf_rcv, sockbuf_snd;

static long read_sysctl(const char *path)
{
    long v = 0;
    FILE *f = fopen(path, "re");
    if (f != NULL) {
        if (fscanf(f, "%ld", &v) != 1)
            v = 0;
        fclose(f);
    }
    return v;
}

/* A fixed SO_RCVBUF/SO_SNDBUF turns off the kernel's autotuning, and the
 * kernel silently caps the request at net.core.[rw]mem_max. Fixing a size
 * below what autotuning would reach only slows bulk transfers down, so set
 * one only where the host allows the full size. */
static void probe_sockbuf(void)
{
    sockbuf_rcv = read_sysctl("/proc/sys/net/core/rmem_max") >= HIXL_SOCKBUF ? HIXL_SOCKBUF : 0;
    sockbuf_snd = read_sysctl("/proc/sys/net/core/wmem_max") >= HIXL_SOCKBUF ? HIXL_SOCKBUF : 0;
}

/* Keepalive bounds of every data-plane socket (hixl_tcp_set_liveness);
 * 0 leaves the kernel's default. Set once at start, before any socket. */
static atomic_int keep_idle_s, keep_intvl_s, keep_cnt, user_timeout_ms;

void hixl_tcp_set_liveness(int idle_s, int interval_s, int count, int user_timeout)
{
    atomic_store(&keep_idle_s, idle_s);
    atomic_store(&keep_intvl_s, interval_s);
    atomic_store(&keep_cnt, count);
    atomic_store(&user_timeout_ms, user_timeout);
}

static void set_int_opt(int fd, int level, int name, int value)
{
    if (value > 0)
        (void)setsockopt(fd, level, name, &value, sizeof(value));
}

void hixl_tcp_tune(int fd)
{
    int one = 1;
    pthread_once(&sockbuf_once, probe_sockbuf);
    /* Failures only cost speed, so they are ignored. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    /* A silent peer (a partition, a stopped host) never sends EOF or RST:
     * keepalive probes find an idle connection dead, and TCP_USER_TIMEOUT
     * bounds how long sent data may stay unacknowledged, so a stream fails
     * with ETIMEDOUT within the configured bound instead of the kernel's
     * retransmission budget of many minutes. */
    set_int_opt(fd, IPPROTO_TCP, TCP_KEEPIDLE, atomic_load(&keep_idle_s));
    set_int_opt(fd, IPPROTO_TCP, TCP_KEEPINTVL, atomic_load(&keep_intvl_s));
    set_int_opt(fd, IPPROTO_TCP, TCP_KEEPCNT, atomic_load(&keep_cnt));
    set_int_opt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, atomic_load(&user_timeout_ms));
    if (sockbuf_rcv)
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf_rcv, sizeof(sockbuf_rcv));
    if (sockbuf_snd)
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf_snd, sizeof(sockbuf_snd));
}

int hixl_tcp_connect_addr(const hixl_addr *addr, int stop_fd, uint64_t deadline_ns,
                          int *fd_out)
{
    int fd = socket(addr->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return HIXL_E_IO;
    hixl_tcp_tune(fd); /* before connect, so the window scale covers the buffers */
    int rc = HIXL_OK;
    if (connect(fd, (const struct sockaddr *)&addr->ss, addr->len) != 0) {
        if (errno != EINPROGRESS)
            rc = HIXL_E_IO;
        else
            rc = hixl_wait_fd(fd, POLLOUT, stop_fd, deadline_ns);
        if (rc == HIXL_OK) {
            int err = 0;
            socklen_t len = sizeof(err);
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
                err = errno;
            if (err != 0) {
                errno = err;
                rc = HIXL_E_IO;
            }
        }
    }
    if (rc != HIXL_OK) {
        int err = errno;
        close(fd);
        errno = err;
        return rc;
    }
    *fd_out = fd;
    return HIXL_OK;
}

int hixl_tcp_connect(const char *host, uint16_t port, int stop_fd, uint64_t deadline_ns,
                     int *fd_out, hixl_addr *addr_out)
{
    char service[8];
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    snprintf(service, sizeof(service), "%u", (unsigned)port);
    if (getaddrinfo(host, service, &hints, &res) != 0) {
        errno = ENXIO;
        return HIXL_E_IO;
    }
    int rc = HIXL_E_IO;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        if (ai->ai_addrlen > sizeof(addr_out->ss))
            continue;
        memcpy(&addr_out->ss, ai->ai_addr, ai->ai_addrlen);
        addr_out->len = ai->ai_addrlen;
        rc = hixl_tcp_connect_addr(addr_out, stop_fd, deadline_ns, fd_out);
        if (rc == HIXL_OK || rc == HIXL_E_TIMEOUT || rc == HIXL_E_CANCELLED)
            break;
    }
    int err = errno;
    freeaddrinfo(res);
    errno = err;
    return rc;
}

int hixl_tcp_handshake(int fd, int stop_fd, uint64_t token, const uint8_t *key,
                       uint64_t deadline_ns)
{
    uint8_t hello[HIXL_HELLO_SIZE], challenge[HIXL_CHALLENGE_SIZE];
    uint8_t proof[HIXL_PROOF_SIZE], welcome[HIXL_WELCOME_SIZE];
    uint8_t nonce[HIXL_NONCE_SIZE], mac[HIXL_MAC_SIZE];
    int32_t status = HIXL_OK;
    hixl_put_hello(hello, token);
    int rc = hixl_send_buf(fd, stop_fd, hello, sizeof(hello), deadline_ns);
    if (rc == HIXL_OK)
        rc = hixl_recv_buf(fd, stop_fd, challenge, sizeof(challenge), deadline_ns);
    if (rc == HIXL_OK)
        rc = hixl_get_challenge(challenge, &status, nonce);
    if (rc == HIXL_OK && status != HIXL_OK)
        return status == HIXL_E_BUSY ? HIXL_E_BUSY : HIXL_E_PROTO;
    if (rc == HIXL_OK)
        rc = hixl_data_mac(key, token, nonce, mac);
    if (rc == HIXL_OK) {
        hixl_put_proof(proof, mac);
        rc = hixl_send_buf(fd, stop_fd, proof, sizeof(proof), deadline_ns);
    }
    if (rc == HIXL_OK)
        rc = hixl_recv_buf(fd, stop_fd, welcome, sizeof(welcome), deadline_ns);
    if (rc == HIXL_OK)
        rc = hixl_get_welcome(welcome, &status);
    if (rc == HIXL_OK && status != HIXL_OK)
        rc = (status == HIXL_E_REFUSED) ? HIXL_E_REFUSED : HIXL_E_PROTO;
    return rc;
}
