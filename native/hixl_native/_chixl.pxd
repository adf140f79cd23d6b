# C declarations of the native core (csrc/). Only what the Cython layer
# touches is declared; everything here is callable without the GIL.

from libc.stdint cimport int32_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "hixl_common.h" nogil:
    enum:
        HIXL_OK
        HIXL_E_TIMEOUT
        HIXL_E_CLOSED
        HIXL_E_REFUSED
        HIXL_E_IO
        HIXL_E_PROTO
        HIXL_E_CANCELLED
        HIXL_E_GONE
        HIXL_E_CHECKSUM
        HIXL_E_NOMEM
        HIXL_E_EXHAUSTED
        HIXL_E_INVAL
        HIXL_E_BUSY
        HIXL_E_EXISTS

    enum:
        HIXL_LIVE_MAPPINGS
        HIXL_LIVE_POOLS
        HIXL_LIVE_QUEUES
        HIXL_LIVE_REQUESTS
        HIXL_LIVE_REGIONS
        HIXL_LIVE_SERVERS
        HIXL_LIVE_CONNECTIONS
        HIXL_LIVE_LINKS
        HIXL_LIVE_ALLOCATORS
        HIXL_LIVE_XMEMS

    long hixl_live_count(int kind)
    uint64_t hixl_now_ns()


cdef extern from "mapping.h" nogil:
    ctypedef struct hixl_mapping:
        uint8_t *addr
        uint64_t size
        int owned_fd

    int hixl_mapping_create(int fd, uint64_t size, int populate, int owned_fd,
                            hixl_mapping **out)
    int hixl_mapping_adopt(void *addr, uint64_t size, int fd, hixl_mapping **out)
    void hixl_mapping_ref(hixl_mapping *m)
    void hixl_mapping_unref(hixl_mapping *m)
    void hixl_mapping_pin(hixl_mapping *m)
    void hixl_mapping_unpin(hixl_mapping *m)
    int hixl_mapping_pins(const hixl_mapping *m)
    int hixl_mapping_unmap(hixl_mapping *m)


cdef extern from "extents.h" nogil:
    enum:
        HIXL_EXTENTS_MIN_PAGE_SHIFT
        HIXL_EXTENTS_MAX_PAGE_SHIFT

    ctypedef struct hixl_extents:
        unsigned page_shift

    int hixl_extents_create(uint64_t size, unsigned page_shift, hixl_extents **out)
    void hixl_extents_destroy(hixl_extents *x)
    int hixl_extents_alloc(hixl_extents *x, uint64_t nbytes, uint64_t *offset)
    int hixl_extents_free(hixl_extents *x, uint64_t offset)
    int hixl_extents_allocation_size(hixl_extents *x, uint64_t offset, uint64_t *size)
    void hixl_extents_usage(hixl_extents *x, uint64_t *used, uint64_t *free_bytes)
    uint64_t hixl_extents_size(const hixl_extents *x)


cdef extern from "pool.h" nogil:
    ctypedef struct hixl_pool:
        hixl_mapping *map
        hixl_extents ext

    int hixl_pool_create(const char *name, uint64_t size, unsigned page_shift,
                         int populate, hixl_pool **out)
    void hixl_pool_destroy(hixl_pool *p)


cdef extern from "copy.h" nogil:
    int hixl_check_triples(const uint8_t *triples, size_t n, uint64_t dst_size,
                           uint64_t src_size, size_t *bad)
    void hixl_copy_triples(uint8_t *dst, const uint8_t *src, const uint8_t *triples,
                           size_t n, uint64_t request_bytes)
    uint64_t hixl_load_u64(const uint8_t *base, size_t k)
    int hixl_in_bounds(uint64_t off, uint64_t length, uint64_t size)


cdef extern from "copy_pool.h" nogil:
    ctypedef struct hixl_copy_pool:
        pass

    int hixl_copy_pool_open(int threads, hixl_cq *cq, hixl_copy_pool **out)
    int hixl_copy_pool_submit(hixl_copy_pool *p, uint64_t request_id, hixl_mapping *dst,
                              hixl_mapping *src, const uint8_t *triples, size_t n,
                              uint64_t request_bytes)
    void hixl_copy_pool_hold(hixl_copy_pool *p)
    int hixl_copy_pool_copy_helped(hixl_copy_pool *p, hixl_mapping *dst, hixl_mapping *src,
                                   uint8_t *triples, size_t n)
    void hixl_copy_pool_close(hixl_copy_pool *p)


cdef extern from "completion.h" nogil:
    ctypedef struct hixl_cq_node:
        hixl_cq_node *next
        uint64_t id
        int32_t status

    ctypedef struct hixl_cq:
        pass

    int hixl_cq_create(hixl_cq **out)
    void hixl_cq_unref(hixl_cq *q)
    hixl_cq_node *hixl_cq_take(hixl_cq *q)
    void hixl_cq_close(hixl_cq *q)
    void hixl_cq_node_free(hixl_cq_node *node)
    int hixl_cq_fd(hixl_cq *q)


cdef extern from "xmem.h" nogil:
    ctypedef struct hixl_bounce:
        pass

    ctypedef struct hixl_xmem:
        int pid
        uint64_t base
        uint64_t size

    int hixl_bounce_create(size_t count, size_t size, hixl_bounce **out)
    void hixl_bounce_unref(hixl_bounce *b)
    size_t hixl_bounce_size(const hixl_bounce *b)
    size_t hixl_bounce_free_count(hixl_bounce *b)
    int hixl_xmem_create(int pidfd, int pid, uint64_t base, uint64_t size, hixl_bounce *inbound,
                         hixl_bounce *outbound, hixl_xmem **out)
    void hixl_xmem_unref(hixl_xmem *x)
    void hixl_xmem_revoke(hixl_xmem *x)
    int hixl_xmem_alive(const hixl_xmem *x)
    int hixl_xmem_probe(hixl_xmem *x, const uint64_t *addrs, size_t n)
    int hixl_xmem_copy(hixl_xmem *dst, uint8_t *dst_local, hixl_xmem *src, uint8_t *src_local,
                       const uint8_t *triples, size_t n, uint64_t deadline_ns)


cdef extern from "region_table.h" nogil:
    ctypedef struct hixl_region_table:
        pass

    int hixl_regions_add(hixl_region_table *t, uint64_t id, hixl_mapping *map,
                         uint64_t offset, uint64_t length, uint64_t cluster,
                         int writable)
    int hixl_regions_add_xmem(hixl_region_table *t, uint64_t id, hixl_xmem *xmem,
                              uint64_t offset, uint64_t length, uint64_t cluster, int writable)
    void hixl_regions_remove(hixl_region_table *t, uint64_t id)
    void hixl_regions_clear(hixl_region_table *t)


cdef extern from "tcp_wire.h" nogil:
    enum:
        HIXL_OP_READ
        HIXL_OP_WRITE

    void hixl_tcp_set_liveness(int idle_s, int interval_s, int count, int user_timeout_ms)


cdef extern from "tcp_server.h" nogil:
    ctypedef struct hixl_server:
        pass

    enum:
        HIXL_SERVER_MAX_THREADS

    int hixl_server_start(const char *host, uint16_t port, size_t max_conns, int nthreads,
                          hixl_server **out)
    uint16_t hixl_server_port(const hixl_server *s)
    int hixl_server_threads(const hixl_server *s)
    uint64_t hixl_server_checksum_mismatches(hixl_server *s)
    hixl_region_table *hixl_server_regions(hixl_server *s)
    int hixl_server_authorize(hixl_server *s, uint64_t token, uint64_t cluster,
                              const uint8_t *key, int may_write)
    void hixl_server_revoke(hixl_server *s, uint64_t token)
    void hixl_server_stop(hixl_server *s)
    void hixl_server_destroy(hixl_server *s)


cdef extern from "crc32c.h" nogil:
    uint32_t hixl_crc32c(uint32_t crc, const void *buf, size_t len)
    uint32_t hixl_crc32c_table(uint32_t crc, const void *buf, size_t len)
    int hixl_crc32c_hardware()


cdef extern from "link_threads.h" nogil:
    int hixl_jobs_set_threads(int n)
    int hixl_jobs_threads()


cdef extern from "tcp_link.h" nogil:
    ctypedef struct hixl_link:
        pass

    enum:
        HIXL_SUBMIT_CRC32C

    int hixl_link_open(const char *host, uint16_t port, uint64_t token, const uint8_t *key,
                       int nstreams, hixl_cq *cq, uint64_t connect_timeout_ms, hixl_link **out)
    int hixl_link_alive(hixl_link *l)
    int hixl_link_streams_up(hixl_link *l)
    uint64_t hixl_link_stream_pieces(hixl_link *l, int stream)
    int hixl_link_submit(hixl_link *l, int op, uint64_t request_id, hixl_mapping *local,
                         const uint8_t *quads, size_t n, uint64_t timeout_ms)
    int hixl_link_submit_xmem(hixl_link *l, int op, uint64_t request_id, hixl_xmem *local,
                              const uint8_t *quads, size_t n, uint64_t timeout_ms)
    void hixl_link_close(hixl_link *l)
    void hixl_link_destroy(hixl_link *l)


cdef extern from "ring.h" nogil:
    ctypedef struct hixl_ring_shared:
        pass

    ctypedef struct hixl_ring:
        uint64_t capacity
        int producer
        int wait_fd
        int wake_fd
        int close_fd

    size_t hixl_ring_bytes(uint64_t capacity)
    size_t hixl_ring_max_frame(uint64_t capacity)
    int hixl_ring_memfd(uint64_t capacity, int *fd_out)
    int hixl_ring_map(int fd, void **mem_out, size_t *bytes_out)
    void hixl_ring_unmap(void *mem, size_t bytes)
    int hixl_ring_attach(hixl_ring *r, void *mem, size_t bytes, int producer, int wait_fd,
                         int wake_fd)
    int hixl_ring_write(hixl_ring *r, const void *buf, size_t len)
    int hixl_ring_read(hixl_ring *r, void *buf, size_t cap, size_t *len)
    int hixl_ring_readable(hixl_ring *r)
    int hixl_ring_writable(hixl_ring *r, size_t len)
    int hixl_ring_wait_readable(hixl_ring *r, uint64_t spin_ns, uint64_t deadline_ns,
                                int stop_fd)
    int hixl_ring_wait_writable(hixl_ring *r, size_t len, uint64_t spin_ns,
                                uint64_t deadline_ns, int stop_fd)
    int hixl_ring_arm(hixl_ring *r, size_t len)
    void hixl_ring_disarm(hixl_ring *r)


cdef extern from "spin.h" nogil:
    int hixl_spin_readable(int fd, uint64_t budget_ns)


cdef extern from "native_lane.h" nogil:
    ctypedef struct hixl_nl_cell:
        pass

    ctypedef struct hixl_nl_log:
        pass

    ctypedef struct hixl_nlane:
        pass

    ctypedef struct hixl_nl_record:
        uint64_t owner
        uint64_t handle
        int32_t outcome
        int32_t native_status
        uint64_t bytes
        uint64_t data_ns

    enum:
        HIXL_NL_OK
        HIXL_NL_FALLBACK
        HIXL_NL_FAILED
        HIXL_NL_CANCELLED
        HIXL_NL_CANCEL

    int hixl_nl_cell_create(uint64_t handle, uint64_t owner, int push, int checksum,
                            hixl_link *link, hixl_mapping *local, const uint64_t *quads,
                            size_t n, uint64_t src_stride, uint32_t src_slots,
                            uint64_t dst_stride, uint32_t dst_slots, uint64_t bytes,
                            uint64_t timeout_ms, hixl_nl_cell **out)
    int hixl_nl_publish(hixl_nl_cell *c)
    void hixl_nl_revoke(hixl_nl_cell *c)
    int hixl_nl_inflight(const hixl_nl_cell *c)
    void hixl_nl_cell_destroy(hixl_nl_cell *c)
    int hixl_nl_log_create(size_t capacity, hixl_nl_log **out)
    int hixl_nl_log_fd(hixl_nl_log *g)
    size_t hixl_nl_log_take(hixl_nl_log *g, hixl_nl_record *out, size_t cap, uint64_t *dropped)
    void hixl_nl_log_destroy(hixl_nl_log *g)
    int hixl_nl_start(hixl_ring *submissions, hixl_ring *completions, uint64_t owner,
                      hixl_nl_log *log, hixl_nlane **out)
    uint64_t hixl_nl_served(hixl_nlane *l)
    int hixl_nl_under_way(hixl_nlane *l)
    int hixl_nl_ended(hixl_nlane *l)
    void hixl_nl_stop(hixl_nlane *l)
