/* TEST DOUBLE: private to the HCCL double's translation units
 * (hccl_double.c, hccl_double_onesided.c). */
#ifndef HIXL_HCCL_DOUBLE_INTERNAL_H
#define HIXL_HCCL_DOUBLE_INTERNAL_H

#include "cann_double.h"

struct dbl_one_sided; /* hccl_double_onesided.c */

typedef struct dbl_comm {
    struct dbl_comm *next;
    char name[128];
    uint32_t buffer_mb;
    pthread_mutex_t mu;
    int refs;
    uint32_t rank, peer;
    int out_fd; /* our data out, acks in */
    int in_fd;  /* peer data in, acks out */
    int abort_fd;
    int linked; /* the peer links were set up by the first point-to-point call */
    struct dbl_one_sided *one_sided; /* bound memory and the peer's, once prepared */
} dbl_comm;

int hfail(int code, const char *fmt, const char *a);
int hccl_prologue(const char *api);
dbl_comm *comm_ref(HcclComm comm);
void comm_unref(dbl_comm *c);
/* 0, 2 on timeout, -1 on EOF or error (non-blocking fd, deadline in dbl_now_ms). */
int xfer_exact(int fd, void *buf, size_t n, int writing, uint64_t deadline);
uint64_t dtype_size(HcclDataType dt);
/* HCCL_CONNECT_TIMEOUT as a deadline on the dbl_now_ms() scale (see hccl_double.c). */
uint64_t dbl_connect_deadline(void);
/* Drops a communicator's one-sided state (its last reference is going). */
void dbl_one_sided_free(dbl_comm *c);
/* How many memories are bound to a communicator (0 without the one-sided API). */
int dbl_one_sided_bound(dbl_comm *c);

#endif
