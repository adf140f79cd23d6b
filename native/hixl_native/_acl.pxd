# C declarations of the ACL/HCCL shim (csrc/acl_shim.h). Only what the
# Cython layer touches is declared; everything here is callable without the
# GIL.

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t


cdef extern from "acl_shim.h" nogil:
    ctypedef void *aclrtStream
    ctypedef void *hccl_comm_t "HcclComm"

    enum:
        HIXL_HCCL_ROOT_INFO_BYTES
        HIXL_ACL_IPC_KEY_LEN

    ctypedef struct HcclRootInfo:
        char internal[HIXL_HCCL_ROOT_INFO_BYTES]

    ctypedef struct HcclSendRecvItem:
        int sendRecvType
        void *buf
        uint64_t count
        int dataType
        uint32_t remoteRank

    enum:
        ACL_MEM_MALLOC_HUGE_FIRST
        ACL_MEM_MALLOC_HUGE_ONLY
        ACL_MEMCPY_HOST_TO_HOST
        ACL_MEMCPY_HOST_TO_DEVICE
        ACL_MEMCPY_DEVICE_TO_HOST
        ACL_MEMCPY_DEVICE_TO_DEVICE
        ACL_MEMCPY_DEFAULT
        HCCL_SEND
        HCCL_RECV
        HCCL_DATA_TYPE_INT8

    enum:
        HIXL_LIB_ACL
        HIXL_LIB_HCCL

    enum:
        HIXL_ACL_HAS_SYNC_TIMEOUT
        HIXL_ACL_HAS_IPC
        HIXL_ACL_HAS_BATCH
        HIXL_ACL_HAS_RECENT_ERR
        HIXL_ACL_HAS_BARE_TGID
        HIXL_ACL_HAS_ERR_STRING

    ctypedef struct hixl_acl_status:
        int code
        int lib
        const char *api
        char detail[768]

    int hixl_acl_open(const char *acl_path, const char *hccl_path, int trial, char *err,
                      size_t errlen)
    int hixl_acl_is_loaded()
    const char *hixl_acl_loaded_path(int lib)
    unsigned hixl_acl_features()
    const hixl_acl_status *hixl_acl_last_error()

    int hixl_acl_init(int *owned)
    int hixl_acl_finalize()
    int hixl_acl_device_count(uint32_t *count)
    int hixl_acl_set_device(int32_t dev)
    int hixl_acl_reset_device(int32_t dev)
    int hixl_acl_bare_tgid(int32_t *pid)
    int hixl_acl_malloc(int32_t dev, size_t size, int policy, void **out)
    int hixl_acl_free(int32_t dev, void *ptr)
    int hixl_acl_malloc_host(int32_t dev, size_t size, void **out)
    int hixl_acl_free_host(int32_t dev, void *ptr)
    int hixl_acl_memcpy(int32_t dev, void *dst, size_t dest_max, const void *src, size_t count,
                        int kind)
    int hixl_acl_memcpy_async(int32_t dev, void *dst, size_t dest_max, const void *src,
                              size_t count, int kind, aclrtStream stream)
    int hixl_acl_stream_create(int32_t dev, aclrtStream *out)
    int hixl_acl_stream_destroy(int32_t dev, aclrtStream stream)
    int hixl_acl_stream_sync(int32_t dev, aclrtStream stream, int32_t timeout_ms)
    int hixl_acl_ipc_export(int32_t dev, void *ptr, size_t size, int validate_pid, char *key)
    int hixl_acl_ipc_allow(int32_t dev, const char *key, int32_t *pids, size_t npids)
    int hixl_acl_ipc_import(int32_t dev, const char *key, void **out)
    int hixl_acl_ipc_close(int32_t dev, const char *key)
    int hixl_hccl_root_info(int32_t dev, HcclRootInfo *out)
    int hixl_hccl_comm_init(int32_t dev, uint32_t nranks, const HcclRootInfo *root,
                            uint32_t rank, hccl_comm_t *out)
    int hixl_hccl_send(int32_t dev, void *buf, uint64_t nbytes, uint32_t peer, hccl_comm_t comm,
                       aclrtStream stream)
    int hixl_hccl_recv(int32_t dev, void *buf, uint64_t nbytes, uint32_t peer, hccl_comm_t comm,
                       aclrtStream stream)
    int hixl_hccl_batch(int32_t dev, HcclSendRecvItem *items, uint32_t n, hccl_comm_t comm,
                        aclrtStream stream)
    int hixl_hccl_comm_destroy(int32_t dev, hccl_comm_t comm)

    # ---- issue 18: contexts, stream abort, configured communicators
    enum:
        HIXL_ACL_HAS_STREAM_ABORT
        HIXL_ACL_HAS_RANK_TABLE
        HIXL_ACL_HAS_ROOT_CONFIG
        HIXL_ACL_HAS_PHY_ID
        HIXL_ACL_HAS_HOST_PIN
        HIXL_ACL_HAS_SOC_INFO
        HIXL_HCCL_COMM_NAME_MAX
        HIXL_ACL_DEV_ATTR_SUPER_POD_DEVICE_ID
        HIXL_ACL_DEV_ATTR_SUPER_POD_ID
        HIXL_ACL_SOC_NAME_MAX

    ctypedef struct hixl_comm_options:
        uint32_t buffer_mb
        char name[HIXL_HCCL_COMM_NAME_MAX]

    int hixl_acl_stream_abort(int32_t dev, aclrtStream stream)
    int hixl_acl_physical_id(int32_t dev, int32_t *phy)
    int hixl_acl_soc_name(char *out, size_t len)
    int hixl_acl_device_info(int32_t dev, int32_t attr, int64_t *value)
    int hixl_hccl_comm_init_config(int32_t dev, uint32_t nranks, const HcclRootInfo *root,
                                   uint32_t rank, const hixl_comm_options *opt,
                                   hccl_comm_t *out)
    int hixl_hccl_comm_init_rank_table(int32_t dev, const char *rank_table, uint32_t rank,
                                       const hixl_comm_options *opt, hccl_comm_t *out)
    unsigned long hixl_hccl_comm_inits()


# ---- one-sided HCCL and pinned host memory (acl_shim.h, its one-sided section) ----
cdef extern from "acl_shim.h" nogil:
    enum:
        HCCL_MEM_TYPE_DEVICE
        HCCL_MEM_TYPE_HOST
        HIXL_HCCL_MAX_DESC_NUM
        HIXL_ACL_HAS_ONE_SIDED
        HIXL_ACL_HAS_HOST_REGISTER

    ctypedef struct HcclOneSideOpDesc:
        void *localAddr
        void *remoteAddr
        uint64_t count
        int dataType

    int hixl_hccl_register_global(int32_t dev, int type, void *addr, uint64_t size, void **handle)
    int hixl_hccl_deregister_global(int32_t dev, void *handle)
    int hixl_hccl_bind_mem(int32_t dev, hccl_comm_t comm, void *handle)
    int hixl_hccl_unbind_mem(int32_t dev, hccl_comm_t comm, void *handle)
    int hixl_hccl_prepare(int32_t dev, hccl_comm_t comm, int32_t timeout_s)
    int hixl_hccl_one_sided(int32_t dev, hccl_comm_t comm, int put, uint32_t peer,
                            HcclOneSideOpDesc *desc, size_t n, aclrtStream stream,
                            size_t *queued)
    int hixl_acl_host_register(int32_t dev, void *ptr, uint64_t size)
    int hixl_acl_host_unregister(int32_t dev, void *ptr)
