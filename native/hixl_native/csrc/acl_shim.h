/*
 * hixl's ACL/HCCL shim: CANN's libascendcl.so and libhccl.so are loaded with
 * dlopen at run time, so hixl builds and imports on machines without CANN.
 *
 * The CANN declarations below are hixl's own, written from the function
 * prototypes of CANN's public headers as published for CANN 8.x to 9.0:
 * the runtime's acl/acl_rt.h, acl/acl_base_rt.h and
 * acl/error_codes/rt_error_codes.h, HCCL's hccl/hccl.h and hccl/hccl_types.h
 * (the same prototypes appear in the CANN API reference). Entry points that
 * older CANN releases lack are optional (see HIXL_ACL_HAS_*): the
 * aclrtIpcMem* family (CANN 8.2 and later; in 8.3.RC1 pre-releases the
 * import flag was still reserved, which is why hixl passes 0 there),
 * aclrtSynchronizeStreamWithTimeout, aclrtDeviceGetBareTgid,
 * HcclBatchSendRecv, aclGetRecentErrMsg and HcclGetErrorString. Enumerations
 * are declared as int: C enums are int-sized in the x86_64 and aarch64 ABIs.
 *
 * Every hixl_acl_* / hixl_hccl_* wrapper returns 0 or the native error code
 * (aclError or HcclResult) and, on failure, fills the calling thread's
 * hixl_acl_status (library, entry point, CANN's own message) for the one
 * Cython function that turns it into an exception. Device-bound wrappers
 * take the device id and make hixl's own context of that device current on
 * the calling thread for the call, restoring the thread's previous context
 * afterwards (see "device contexts" at the end of this file).
 */
#ifndef HIXL_ACL_SHIM_H
#define HIXL_ACL_SHIM_H

#include <stddef.h>
#include <stdint.h>

/* ---- CANN types ---- */
typedef int aclError;
typedef void *aclrtStream;
typedef int aclrtMemMallocPolicy; /* enum aclrtMemMallocPolicy */
typedef int aclrtMemcpyKind;      /* enum aclrtMemcpyKind */
typedef int HcclResult;           /* enum HcclResult */
typedef void *HcclComm;
typedef int HcclDataType;         /* enum HcclDataType */
typedef int HcclSendRecvType;     /* enum HcclSendRecvType */

#define HIXL_HCCL_ROOT_INFO_BYTES 4108 /* HCCL_ROOT_INFO_BYTES */
typedef struct {
    char internal[HIXL_HCCL_ROOT_INFO_BYTES];
} HcclRootInfo;

typedef struct {
    HcclSendRecvType sendRecvType;
    void *buf;
    uint64_t count;
    HcclDataType dataType;
    uint32_t remoteRank;
} HcclSendRecvItem;

enum {
    ACL_MEM_MALLOC_HUGE_FIRST = 0,
    ACL_MEM_MALLOC_HUGE_ONLY = 1,
    ACL_MEM_MALLOC_NORMAL_ONLY = 2,
};
enum {
    ACL_MEMCPY_HOST_TO_HOST = 0,
    ACL_MEMCPY_HOST_TO_DEVICE = 1,
    ACL_MEMCPY_DEVICE_TO_HOST = 2,
    ACL_MEMCPY_DEVICE_TO_DEVICE = 3,
    ACL_MEMCPY_DEFAULT = 4,
};
enum { HCCL_SEND = 0, HCCL_RECV = 1 };
enum { HCCL_DATA_TYPE_INT8 = 0 };

#define ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT 0x0UL
#define ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION 0x1UL
#define ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT 0x0UL
#define HIXL_ACL_IPC_KEY_LEN 65 /* "len: fixed at 65" in aclrtIpcMemGetExportKey's docs */

/* The few codes the shim itself produces. */
#define HIXL_ACL_ERROR_REPEAT_INITIALIZE 100002 /* ACL_ERROR_REPEAT_INITIALIZE */
#define HIXL_ACL_ERROR_UNINITIALIZE 100001      /* ACL_ERROR_UNINITIALIZE: CANN not loaded */
#define HIXL_ACL_ERROR_API_NOT_SUPPORT 200001   /* ACL_ERROR_API_NOT_SUPPORT: symbol absent */
#define HIXL_HCCL_E_NOT_SUPPORT 5               /* HCCL_E_NOT_SUPPORT: symbol absent */

/* ---- function pointer types of the entry points used ---- */
typedef aclError (*hixl_aclInit_fn)(const char *configPath);
typedef aclError (*hixl_aclFinalize_fn)(void);
typedef const char *(*hixl_aclGetRecentErrMsg_fn)(void);
typedef aclError (*hixl_aclrtGetDeviceCount_fn)(uint32_t *count);
typedef aclError (*hixl_aclrtSetDevice_fn)(int32_t deviceId);
typedef aclError (*hixl_aclrtResetDevice_fn)(int32_t deviceId);
typedef aclError (*hixl_aclrtDeviceGetBareTgid_fn)(int32_t *pid);
typedef aclError (*hixl_aclrtCreateStream_fn)(aclrtStream *stream);
typedef aclError (*hixl_aclrtDestroyStream_fn)(aclrtStream stream);
typedef aclError (*hixl_aclrtSynchronizeStream_fn)(aclrtStream stream);
typedef aclError (*hixl_aclrtSynchronizeStreamWithTimeout_fn)(aclrtStream stream, int32_t timeout);
typedef aclError (*hixl_aclrtMalloc_fn)(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
typedef aclError (*hixl_aclrtFree_fn)(void *devPtr);
typedef aclError (*hixl_aclrtMallocHost_fn)(void **hostPtr, size_t size);
typedef aclError (*hixl_aclrtFreeHost_fn)(void *hostPtr);
typedef aclError (*hixl_aclrtMemcpy_fn)(void *dst, size_t destMax, const void *src, size_t count,
                                        aclrtMemcpyKind kind);
typedef aclError (*hixl_aclrtMemcpyAsync_fn)(void *dst, size_t destMax, const void *src,
                                             size_t count, aclrtMemcpyKind kind,
                                             aclrtStream stream);
typedef aclError (*hixl_aclrtIpcMemGetExportKey_fn)(void *devPtr, size_t size, char *key,
                                                    size_t len, uint64_t flags);
typedef aclError (*hixl_aclrtIpcMemSetImportPid_fn)(const char *key, int32_t *pid, size_t num);
typedef aclError (*hixl_aclrtIpcMemImportByKey_fn)(void **devPtr, const char *key,
                                                   uint64_t flags);
typedef aclError (*hixl_aclrtIpcMemClose_fn)(const char *key);
typedef HcclResult (*hixl_HcclGetRootInfo_fn)(HcclRootInfo *rootInfo);
typedef HcclResult (*hixl_HcclCommInitRootInfo_fn)(uint32_t nRanks, const HcclRootInfo *rootInfo,
                                                   uint32_t rank, HcclComm *comm);
typedef HcclResult (*hixl_HcclSend_fn)(void *sendBuf, uint64_t count, HcclDataType dataType,
                                       uint32_t destRank, HcclComm comm, aclrtStream stream);
typedef HcclResult (*hixl_HcclRecv_fn)(void *recvBuf, uint64_t count, HcclDataType dataType,
                                       uint32_t srcRank, HcclComm comm, aclrtStream stream);
typedef HcclResult (*hixl_HcclBatchSendRecv_fn)(HcclSendRecvItem *sendRecvInfo, uint32_t itemNum,
                                                HcclComm comm, aclrtStream stream);
typedef HcclResult (*hixl_HcclCommDestroy_fn)(HcclComm comm);
typedef const char *(*hixl_HcclGetErrorString_fn)(HcclResult code);

/* ---- loading ---- */
enum { HIXL_LIB_ACL = 1, HIXL_LIB_HCCL = 2 };

/* Optional entry points (absent from some CANN versions). */
enum {
    HIXL_ACL_HAS_SYNC_TIMEOUT = 1 << 0, /* aclrtSynchronizeStreamWithTimeout */
    HIXL_ACL_HAS_IPC = 1 << 1,          /* aclrtIpcMem{GetExportKey,SetImportPid,ImportByKey,Close} */
    HIXL_ACL_HAS_BATCH = 1 << 2,        /* HcclBatchSendRecv */
    HIXL_ACL_HAS_RECENT_ERR = 1 << 3,   /* aclGetRecentErrMsg */
    HIXL_ACL_HAS_BARE_TGID = 1 << 4,    /* aclrtDeviceGetBareTgid */
    HIXL_ACL_HAS_ERR_STRING = 1 << 5,   /* HcclGetErrorString */
};

/* Loads the two libraries (paths or bare names for the default loader
 * path) and resolves the entry points. With `trial` the table is not
 * installed: only whether it would load is reported. Returns 0, or -1 with
 * the reason in `err`. Once a table is installed, loading another pair of
 * libraries fails; loading the same pair again succeeds. */
int hixl_acl_open(const char *acl_path, const char *hccl_path, int trial, char *err,
                  size_t errlen);
int hixl_acl_is_loaded(void);
/* Real path of the installed library (HIXL_LIB_*), or "" when none. */
const char *hixl_acl_loaded_path(int lib);
unsigned hixl_acl_features(void);

typedef struct {
    int code;
    int lib;          /* HIXL_LIB_* */
    const char *api;  /* entry point that failed */
    char detail[768]; /* aclGetRecentErrMsg / HcclGetErrorString text, or "" */
} hixl_acl_status;

/* The calling thread's last failure. */
const hixl_acl_status *hixl_acl_last_error(void);

/* ---- wrappers: 0 or the native error code ---- */
int hixl_acl_init(int *owned);
int hixl_acl_finalize(void);
int hixl_acl_device_count(uint32_t *count);
int hixl_acl_set_device(int32_t dev);
int hixl_acl_reset_device(int32_t dev);
int hixl_acl_bare_tgid(int32_t *pid);
int hixl_acl_malloc(int32_t dev, size_t size, aclrtMemMallocPolicy policy, void **out);
int hixl_acl_free(int32_t dev, void *ptr);
int hixl_acl_malloc_host(int32_t dev, size_t size, void **out);
int hixl_acl_free_host(int32_t dev, void *ptr);
int hixl_acl_memcpy(int32_t dev, void *dst, size_t dest_max, const void *src, size_t count,
                    aclrtMemcpyKind kind);
int hixl_acl_memcpy_async(int32_t dev, void *dst, size_t dest_max, const void *src, size_t count,
                          aclrtMemcpyKind kind, aclrtStream stream);
int hixl_acl_stream_create(int32_t dev, aclrtStream *out);
int hixl_acl_stream_destroy(int32_t dev, aclrtStream stream);
/* timeout_ms < 0 waits without a bound (aclrtSynchronizeStream). */
int hixl_acl_stream_sync(int32_t dev, aclrtStream stream, int32_t timeout_ms);
/* Exports [ptr, ptr + size). With validate_pid only processes later named
 * with hixl_acl_ipc_allow (aclrtIpcMemSetImportPid) may import it; without,
 * any process may. */
int hixl_acl_ipc_export(int32_t dev, void *ptr, size_t size, int validate_pid,
                        char key[HIXL_ACL_IPC_KEY_LEN]);
int hixl_acl_ipc_allow(int32_t dev, const char *key, int32_t *pids, size_t npids);
int hixl_acl_ipc_import(int32_t dev, const char *key, void **out);
int hixl_acl_ipc_close(int32_t dev, const char *key);
int hixl_hccl_root_info(int32_t dev, HcclRootInfo *out);
int hixl_hccl_comm_init(int32_t dev, uint32_t nranks, const HcclRootInfo *root, uint32_t rank,
                        HcclComm *out);
int hixl_hccl_send(int32_t dev, void *buf, uint64_t nbytes, uint32_t peer, HcclComm comm,
                   aclrtStream stream);
int hixl_hccl_recv(int32_t dev, void *buf, uint64_t nbytes, uint32_t peer, HcclComm comm,
                   aclrtStream stream);
int hixl_hccl_batch(int32_t dev, HcclSendRecvItem *items, uint32_t n, HcclComm comm,
                    aclrtStream stream);
int hixl_hccl_comm_destroy(int32_t dev, HcclComm comm);

/* ==== one-sided HCCL and pinned host memory (issue 18, data path) ====
 *
 * Declarations written from HCCL's hccl/hccl_one_sided_services.h and
 * hccl_mem_defs.h (CANN 8.2 and later, the hcomm repository of CANN's open
 * source) and the runtime's acl_rt.h: HcclMem {type, addr, size},
 * HcclOneSideOpDesc {localAddr, remoteAddr, count, dataType} and
 * HcclPrepareConfig {topoType, three reserved uint64}. All of them are
 * optional: HIXL_ACL_HAS_ONE_SIDED is set only when every one of the seven
 * HCCL entry points is present, HIXL_ACL_HAS_HOST_REGISTER when both
 * aclrtHostRegister and aclrtHostUnregister are.
 */
enum { HCCL_MEM_TYPE_DEVICE = 0, HCCL_MEM_TYPE_HOST = 1 };
enum { HCCL_TOPO_FULLMESH = 0 };
enum { ACL_HOST_REGISTER_MAPPED = 0 }; /* aclrtHostRegisterType */
/* "the count of HcclOneSideOpDesc exceeds specification": HCCL's
 * HcclBatchPut / HcclBatchGet refuse more descriptors per call (MAX_DESC_NUM
 * of hccl_one_sided_services.cc; HIXL's comm_channel.cc batches by the same
 * 256). */
#define HIXL_HCCL_MAX_DESC_NUM 256u

typedef struct {
    int type; /* HcclMemType */
    void *addr;
    uint64_t size;
} HcclMem;

typedef struct {
    void *localAddr;
    void *remoteAddr;
    uint64_t count;
    HcclDataType dataType;
} HcclOneSideOpDesc;

typedef struct {
    int topoType; /* HcclTopoType */
    uint64_t rsvd0;
    uint64_t rsvd1;
    uint64_t rsvd2;
} HcclPrepareConfig;

typedef HcclResult (*hixl_HcclRegisterGlobalMem_fn)(const HcclMem *mem, void **memHandle);
typedef HcclResult (*hixl_HcclDeregisterGlobalMem_fn)(void *memHandle);
typedef HcclResult (*hixl_HcclCommBindMem_fn)(HcclComm comm, void *memHandle);
typedef HcclResult (*hixl_HcclCommUnbindMem_fn)(HcclComm comm, void *memHandle);
typedef HcclResult (*hixl_HcclCommPrepare_fn)(HcclComm comm, const HcclPrepareConfig *config,
                                              int32_t timeout);
typedef HcclResult (*hixl_HcclBatchPut_fn)(HcclComm comm, uint32_t remoteRank,
                                           HcclOneSideOpDesc *desc, uint32_t descNum,
                                           aclrtStream stream);
typedef HcclResult (*hixl_HcclBatchGet_fn)(HcclComm comm, uint32_t remoteRank,
                                           HcclOneSideOpDesc *desc, uint32_t descNum,
                                           aclrtStream stream);
typedef aclError (*hixl_aclrtHostRegister_fn)(void *ptr, uint64_t size, int type, void **devPtr);
typedef aclError (*hixl_aclrtHostUnregister_fn)(void *ptr);
/* aclrtHostRegisterV2 (runtime API docs "aclrtHostRegisterV2"): flag is
 * ACL_HOST_REG_MAPPED and/or ACL_HOST_REG_PINNED; only PINNED page-locks the
 * memory. aclrtHostRegister(MAPPED) maps it for the device and does not. */
typedef aclError (*hixl_aclrtHostRegisterV2_fn)(void *ptr, uint64_t size, uint32_t flag);
#define HIXL_ACL_HOST_REG_MAPPED 0x2u
#define HIXL_ACL_HOST_REG_PINNED 0x10000000u

enum {
    HIXL_ACL_HAS_ONE_SIDED = 1 << 6,     /* HcclRegisterGlobalMem ... HcclBatchGet (all seven) */
    HIXL_ACL_HAS_HOST_REGISTER = 1 << 7, /* aclrtHostRegister, aclrtHostUnregister */
};

/* Registers [addr, addr + size) of `type` for one-sided access by any
 * communicator of the process it is later bound to. */
int hixl_hccl_register_global(int32_t dev, int type, void *addr, uint64_t size, void **handle);
int hixl_hccl_deregister_global(int32_t dev, void *handle);
int hixl_hccl_bind_mem(int32_t dev, HcclComm comm, void *handle);
int hixl_hccl_unbind_mem(int32_t dev, HcclComm comm, void *handle);
/* Makes the communicator's links ready in advance (full mesh); timeout in
 * seconds, 0 for HCCL_CONNECT_TIMEOUT. */
int hixl_hccl_prepare(int32_t dev, HcclComm comm, int32_t timeout_s);
/* Queues `n` descriptors as HcclBatchPut (put) or HcclBatchGet calls of at
 * most HIXL_HCCL_MAX_DESC_NUM each, in order, on `stream`. On failure
 * `*queued` says how many descriptors were queued before it. */
int hixl_hccl_one_sided(int32_t dev, HcclComm comm, int put, uint32_t peer,
                        HcclOneSideOpDesc *desc, size_t n, aclrtStream stream, size_t *queued);
/* Page-locks host memory with aclrtHostRegisterV2(PINNED | MAPPED)
 * (HIXL_ACL_HAS_HOST_PIN); absent, answers as an absent entry point: the
 * memory then stays unpinned and CANN copies it synchronously. */
int hixl_acl_host_register(int32_t dev, void *ptr, uint64_t size);
int hixl_acl_host_unregister(int32_t dev, void *ptr);
/* ==== end of the one-sided section ==== */

/* ==== issue 18: device contexts, stream abort, communicator configuration ====
 *
 * Device contexts. hixl_acl_set_device calls aclrtSetDevice once per
 * process and device and creates one context for it (aclrtCreateContext);
 * every device-bound wrapper makes that context current for its call
 * (aclrtSetCurrentContext) and puts the thread's previous context back
 * after it, so that a thread of the embedding process (torch_npu's, for
 * one) keeps its own. hixl_acl_reset_device destroys the context, then
 * calls aclrtResetDevice once: aclrtSetDevice is reference-counted
 * ("aclrtResetDevice", CANN 8.0 API reference, aclcppdevg_03_0040), and a
 * per-thread aclrtSetDevice would leave the count above zero.
 *
 * Communicator creation (HcclCommInitRootInfo[Config],
 * HcclCommInitClusterInfoMemConfig) is serialised by one process-wide lock:
 * the 8.0.RC2 page of HcclCommInitRootInfoConfig says it may only be called
 * serially, and HIXL (comm_channel.cc) locks around creation for the same
 * reason. Two ranks of one communicator therefore cannot both be created
 * in one process: each rank lives in its own process (as two daemons do).
 */
typedef void *aclrtContext;

/* HcclCommConfig as of configuration version 2: CANN's HcclCommConfigInit
 * (an inline function of hccl.h, not an entry point) writes the first 24
 * bytes (struct size, magic word, version, reserved), and HCCL reads the
 * fields a version defines ("HcclCommConfig", HCCL API reference: version
 * 1 holds the buffer size and the deterministic switch, version 2 adds the
 * communicator name). hixl fills exactly those. */
#define HIXL_HCCL_COMM_NAME_MAX 128 /* COMM_NAME_MAX_LENGTH */
#define HIXL_HCCL_CONFIG_MAGIC 0xf0f0f0f0u
#define HIXL_HCCL_CONFIG_VERSION 2u
#define HIXL_HCCL_CONFIG_UNSET 0xFFFFFFFFu /* HcclCommConfigInit's "not configured" */
typedef struct {
    size_t size;
    uint32_t magicWord;
    uint32_t version;
    uint64_t reserved;
    uint32_t hcclBufferSize; /* MB, >= 1 */
    uint32_t hcclDeterministic;
    char hcclCommName[HIXL_HCCL_COMM_NAME_MAX];
} HcclCommConfig;

typedef aclError (*hixl_aclrtCreateContext_fn)(aclrtContext *context, int32_t deviceId);
typedef aclError (*hixl_aclrtDestroyContext_fn)(aclrtContext context);
typedef aclError (*hixl_aclrtSetCurrentContext_fn)(aclrtContext context);
typedef aclError (*hixl_aclrtGetCurrentContext_fn)(aclrtContext *context);
typedef aclError (*hixl_aclrtStreamAbort_fn)(aclrtStream stream);
typedef aclError (*hixl_aclrtGetPhyDevIdByLogicDevId_fn)(int32_t logicDevId, int32_t *phyDevId);
/* "aclrtGetSocName": the SoC's version name (NULL when unknown);
 * "aclrtGetDeviceInfo": one int64 attribute of a device (aclrtDevAttr is a
 * C enum, passed as int32_t). HIXL reads both for A3 rank tables
 * (rank_table_generator.cc, rank_table_generator_v2.cc). */
typedef const char *(*hixl_aclrtGetSocName_fn)(void);
typedef aclError (*hixl_aclrtGetDeviceInfo_fn)(uint32_t deviceId, int32_t attr, int64_t *value);
#define HIXL_ACL_DEV_ATTR_SUPER_POD_DEVICE_ID 403 /* ACL_DEV_ATTR_SUPER_POD_DEVIDE_ID, acl_rt.h */
#define HIXL_ACL_DEV_ATTR_SUPER_POD_ID 405        /* ACL_DEV_ATTR_SUPER_POD_ID, acl_rt.h */
#define HIXL_ACL_SOC_NAME_MAX 64
/* rankTable is the rank table's JSON text itself, not a file path (HCCL's
 * op_base.h; HIXL's channel_msg_handler.cc passes the text). */
typedef HcclResult (*hixl_HcclCommInitClusterInfoMemConfig_fn)(const char *rankTable, uint32_t rank,
                                                               HcclCommConfig *config,
                                                               HcclComm *comm);
typedef HcclResult (*hixl_HcclCommInitRootInfoConfig_fn)(uint32_t nRanks,
                                                         const HcclRootInfo *rootInfo,
                                                         uint32_t rank,
                                                         const HcclCommConfig *config,
                                                         HcclComm *comm);

/* Optional entry points of this section (high bits: kept apart from the
 * bits above). */
enum {
    HIXL_ACL_HAS_STREAM_ABORT = 1 << 16, /* aclrtStreamAbort */
    HIXL_ACL_HAS_RANK_TABLE = 1 << 17,   /* HcclCommInitClusterInfoMemConfig */
    HIXL_ACL_HAS_ROOT_CONFIG = 1 << 18,  /* HcclCommInitRootInfoConfig */
    HIXL_ACL_HAS_PHY_ID = 1 << 19,       /* aclrtGetPhyDevIdByLogicDevId */
    HIXL_ACL_HAS_HOST_PIN = 1 << 20,     /* aclrtHostRegisterV2 (and aclrtHostUnregister) */
    HIXL_ACL_HAS_SOC_INFO = 1 << 21,     /* aclrtGetSocName, aclrtGetDeviceInfo */
};

#define HIXL_ACL_MAX_DEVICES 64
#define HIXL_ACL_ERROR_INVALID_DEVICEID 107001 /* ACL_ERROR_RT_INVALID_DEVICEID */
#define HIXL_ACL_ERROR_CONTEXT_NULL 107002     /* ACL_ERROR_RT_CONTEXT_NULL */

/* What a new communicator is configured with: buffer_mb 0 leaves it unset
 * (HCCL_BUFFSIZE, else HCCL's 200 MB, applies); name "" lets HCCL choose one. */
typedef struct {
    uint32_t buffer_mb;
    char name[HIXL_HCCL_COMM_NAME_MAX];
} hixl_comm_options;

/* Stops the stream's running tasks and drops its queued ones
 * (aclrtStreamAbort; HIXL_ACL_HAS_STREAM_ABORT). */
int hixl_acl_stream_abort(int32_t dev, aclrtStream stream);
/* The physical id of a logical device (what a rank table's device_id
 * holds); the logical id itself where the entry point is absent. */
int hixl_acl_physical_id(int32_t dev, int32_t *phy);
/* The SoC's name into `out` (HIXL_ACL_HAS_SOC_INFO; "" where CANN answers
 * NULL). */
int hixl_acl_soc_name(char *out, size_t len);
/* One device attribute (aclrtGetDeviceInfo; HIXL_ACL_HAS_SOC_INFO). */
int hixl_acl_device_info(int32_t dev, int32_t attr, int64_t *value);
/* HcclCommInitRootInfoConfig where present, else HcclCommInitRootInfo
 * (the buffer size then comes from HCCL_BUFFSIZE). */
int hixl_hccl_comm_init_config(int32_t dev, uint32_t nranks, const HcclRootInfo *root,
                               uint32_t rank, const hixl_comm_options *opt, HcclComm *out);
/* HcclCommInitClusterInfoMemConfig (HIXL_ACL_HAS_RANK_TABLE). */
int hixl_hccl_comm_init_rank_table(int32_t dev, const char *rank_table, uint32_t rank,
                                   const hixl_comm_options *opt, HcclComm *out);
/* Communicator creations started in this process (for tests). */
unsigned long hixl_hccl_comm_inits(void);

#endif
