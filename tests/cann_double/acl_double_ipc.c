/*
 * TEST DOUBLE of CANN's IPC memory sharing (aclrtIpcMem*), part of the
 * double's libascendcl.so.
 *
 * An export key names a device allocation (a memfd) of the exporting
 * process: "cann-double:<pid>:<serial>". The exporter serves its keys on an
 * abstract unix socket ("cann-double-ipc-<pid>") from one thread started on
 * the first export; an importer connects, sends the key and receives the
 * memfd (SCM_RIGHTS), which it maps at a 2 MiB aligned address. The pid
 * whitelist of aclrtIpcMemSetImportPid is checked against the peer
 * credentials of that connection. An importer's aclrtIpcMemClose tells the
 * exporter (the key prefixed with CLOSE_MARK on the same socket), and the
 * exporter's own aclrtIpcMemClose fails while a live importer has not
 * closed the key, the order CANN's documentation of aclrtIpcMemClose
 * requires.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "acl_double_internal.h"

typedef struct {
    int32_t status;
    uint32_t reserved;
    uint64_t size;
} ipc_reply;

/* First byte of an importer's "I closed this key" notice. */
#define CLOSE_MARK '-'

static pthread_once_t g_ipc_once = PTHREAD_ONCE_INIT;
static int g_ipc_listener = -1;
static unsigned g_key_serial;

static socklen_t ipc_address(int pid, struct sockaddr_un *a)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "cann-double-ipc-%d", pid);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static void send_reply(int conn, int32_t status, uint64_t size, int fd)
{
    ipc_reply r = {status, 0, size};
    struct iovec iov = {&r, sizeof r};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (fd >= 0) {
        msg.msg_control = u.buf;
        msg.msg_controllen = sizeof u.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    (void)sendmsg(conn, &msg, MSG_NOSIGNAL);
}

static void serve_one(int conn)
{
    char key[KEY_LEN] = {0};
    struct ucred cred;
    socklen_t clen = sizeof cred;
    struct timeval tv = {2, 0};
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (recv(conn, key, sizeof key, MSG_WAITALL) != (ssize_t)sizeof key ||
        getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0)
        return;
    key[KEY_LEN - 1] = '\0';
    int closing = key[0] == CLOSE_MARK;
    const char *name = closing ? key + 1 : key;
    pthread_mutex_lock(&g_lock);
    dbl_mem *m = g_mems;
    for (; m; m = m->next)
        if (m->kind == MEM_DEVICE && m->exported && !strcmp(m->key, name))
            break;
    if (!m) {
        pthread_mutex_unlock(&g_lock);
        send_reply(conn, ACL_ERROR_RT_PARAM_INVALID, 0, -1);
        return;
    }
    if (closing) {
        for (int i = 0; i < m->nimporters; i++)
            if (m->importers[i] == (int32_t)cred.pid) {
                m->importers[i] = m->importers[--m->nimporters];
                break;
            }
        pthread_mutex_unlock(&g_lock);
        send_reply(conn, 0, 0, -1);
        return;
    }
    int allowed = !m->pid_check;
    for (int i = 0; i < m->npids && !allowed; i++)
        /* "aclrtIpcMemSetImportPid": the whitelist holds bare tgids */
        allowed = m->pids[i] == hixl_double_bare_tgid_of((int32_t)cred.pid);
    if (allowed && m->nimporters < MAX_PIDS)
        m->importers[m->nimporters++] = (int32_t)cred.pid;
    if (allowed)
        send_reply(conn, 0, m->size, m->fd);
    else
        send_reply(conn, ACL_ERROR_RT_NO_PERMISSION, 0, -1);
    pthread_mutex_unlock(&g_lock);
}

static void *ipc_server(void *arg)
{
    (void)arg;
    for (;;) {
        int conn = accept4(g_ipc_listener, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return NULL;
        }
        serve_one(conn);
        close(conn);
    }
}

static void ipc_start(void)
{
    struct sockaddr_un a;
    socklen_t len = ipc_address((int)getpid(), &a);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return;
    if (bind(s, (struct sockaddr *)&a, len) != 0 || listen(s, 64) != 0) {
        close(s);
        return;
    }
    pthread_t th;
    g_ipc_listener = s;
    if (pthread_create(&th, NULL, ipc_server, NULL) != 0) {
        close(s);
        g_ipc_listener = -1;
        return;
    }
    pthread_detach(th);
}

static dbl_mem *find_export_locked(const char *key)
{
    for (dbl_mem *m = g_mems; m; m = m->next)
        if (m->kind == MEM_DEVICE && m->exported && !strcmp(m->key, key))
            return m;
    return NULL;
}

static dbl_mem *find_import_locked(const char *key)
{
    for (dbl_mem *m = g_mems; m; m = m->next)
        if (m->kind == MEM_IMPORT && !strcmp(m->key, key))
            return m;
    return NULL;
}

DBL_EXPORT aclError aclrtIpcMemGetExportKey(void *devPtr, size_t size, char *key, size_t len,
                                            uint64_t flags)
{
    CALL_PROLOGUE("aclrtIpcMemGetExportKey");
    if (!devPtr || !key || len < KEY_LEN || size == 0)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM,
                                "aclrtIpcMemGetExportKey: NULL argument, size 0 or key length %zu < 65", len);
    NEED_CONTEXT("aclrtIpcMemGetExportKey");
    pthread_once(&g_ipc_once, ipc_start);
    if (g_ipc_listener < 0)
        return hixl_double_fail(ACL_ERROR_RT_IPC_ERROR, "aclrtIpcMemGetExportKey: cannot serve keys");
    pthread_mutex_lock(&g_lock);
    dbl_mem *m = find_mem_locked(devPtr, 0, 1);
    if (!m || m->kind != MEM_DEVICE || size > m->size) {
        pthread_mutex_unlock(&g_lock);
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID,
                                "aclrtIpcMemGetExportKey: %p (+%zu) is not an allocation of aclrtMalloc",
                                devPtr, size);
    }
    if (!m->exported) {
        snprintf(m->key, sizeof m->key, "cann-double:%d:%u", (int)getpid(), ++g_key_serial);
        m->exported = 1;
        m->npids = 0;
    }
    m->pid_check = !(flags & IPC_EXPORT_FLAG_DISABLE_PID_VALIDATION);
    memcpy(key, m->key, KEY_LEN);
    pthread_mutex_unlock(&g_lock);
    return ACL_SUCCESS;
}

DBL_EXPORT aclError aclrtIpcMemSetImportPid(const char *key, int32_t *pid, size_t num)
{
    CALL_PROLOGUE("aclrtIpcMemSetImportPid");
    if (!key || !pid || num == 0)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "aclrtIpcMemSetImportPid: NULL argument or num 0");
    pthread_mutex_lock(&g_lock);
    dbl_mem *m = find_export_locked(key);
    if (!m || m->npids + num > MAX_PIDS) {
        pthread_mutex_unlock(&g_lock);
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID,
                                "aclrtIpcMemSetImportPid: unknown key %s or more than %d pids", key, MAX_PIDS);
    }
    for (size_t i = 0; i < num; i++)
        m->pids[m->npids++] = pid[i];
    pthread_mutex_unlock(&g_lock);
    return ACL_SUCCESS;
}

/* The exporter's pid in a key, or -1. */
static int exporter_of(const char *key)
{
    int pid;
    unsigned serial;
    char tail;
    return sscanf(key, "cann-double:%d:%u%c", &pid, &serial, &tail) == 2 ? pid : -1;
}

/* Tell the exporter of an imported key that this process closed it (best
 * effort: an exporter that is gone has nothing left to check). */
static void tell_exporter_closed(const char *key)
{
    int pid = exporter_of(key);
    struct sockaddr_un a;
    socklen_t alen = ipc_address(pid, &a);
    int s = pid < 0 ? -1 : socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return;
    struct timeval tv = {2, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char req[KEY_LEN] = {0};
    snprintf(req, sizeof req, "%c%s", CLOSE_MARK, key);
    ipc_reply r;
    if (connect(s, (struct sockaddr *)&a, alen) == 0 &&
        send(s, req, sizeof req, MSG_NOSIGNAL) == (ssize_t)sizeof req)
        (void)recv(s, &r, sizeof r, MSG_WAITALL);
    close(s);
}

/* Importers of export m that have not closed it and are still alive. */
static int live_importers_locked(dbl_mem *m)
{
    for (int i = 0; i < m->nimporters;)
        if (kill(m->importers[i], 0) != 0 && errno == ESRCH)
            m->importers[i] = m->importers[--m->nimporters];
        else
            i++;
    return m->nimporters;
}

static int ask_exporter(const char *key, int *fd_out)
{
    int pid = exporter_of(key);
    if (pid < 0)
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID, "aclrtIpcMemImportByKey: malformed key %s", key);
    struct sockaddr_un a;
    socklen_t alen = ipc_address(pid, &a);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&a, alen) != 0) {
        if (s >= 0)
            close(s);
        return hixl_double_fail(ACL_ERROR_RT_IPC_ERROR,
                                "aclrtIpcMemImportByKey: exporter %d is unreachable", pid);
    }
    char req[KEY_LEN] = {0};
    snprintf(req, sizeof req, "%s", key);
    ipc_reply r = {ACL_ERROR_RT_IPC_ERROR, 0, 0};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = {&r, sizeof r};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = u.buf;
    msg.msg_controllen = sizeof u.buf;
    int fd = -1;
    if (send(s, req, sizeof req, MSG_NOSIGNAL) == (ssize_t)sizeof req &&
        recvmsg(s, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC) == (ssize_t)sizeof r) {
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        if (c && c->cmsg_type == SCM_RIGHTS)
            memcpy(&fd, CMSG_DATA(c), sizeof fd);
    }
    close(s);
    if (r.status != 0 || fd < 0) {
        if (fd >= 0)
            close(fd);
        int code = r.status ? r.status : ACL_ERROR_RT_IPC_ERROR;
        return hixl_double_fail(code, "aclrtIpcMemImportByKey: exporter refused key %s (%d)", key, code);
    }
    *fd_out = fd;
    return 0;
}

DBL_EXPORT aclError aclrtIpcMemImportByKey(void **devPtr, const char *key, uint64_t flags)
{
    (void)flags;
    CALL_PROLOGUE("aclrtIpcMemImportByKey");
    if (!devPtr || !key)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "aclrtIpcMemImportByKey: NULL argument");
    NEED_CONTEXT("aclrtIpcMemImportByKey");
    pthread_mutex_lock(&g_lock);
    int dup_import = find_import_locked(key) != NULL;
    pthread_mutex_unlock(&g_lock);
    if (dup_import)
        return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID, "aclrtIpcMemImportByKey: %s is already imported", key);
    int fd = -1, rc = ask_exporter(key, &fd);
    if (rc)
        return rc;
    struct stat st;
    dbl_mem *m = calloc(1, sizeof *m);
    void *p = NULL;
    if (m && fstat(fd, &st) == 0)
        p = map_aligned(fd, (size_t)st.st_size, &m->map_base, &m->map_len);
    if (!p) {
        close(fd);
        free(m);
        return hixl_double_fail(ACL_ERROR_RT_IPC_ERROR, "aclrtIpcMemImportByKey: cannot map %s", key);
    }
    m->base = p;
    m->size = (uint64_t)st.st_size;
    m->fd = fd;
    m->device = t_device;
    m->kind = MEM_IMPORT;
    snprintf(m->key, sizeof m->key, "%s", key);
    pthread_mutex_lock(&g_lock);
    m->next = g_mems;
    g_mems = m;
    pthread_mutex_unlock(&g_lock);
    hixl_double_count(DBL_LIVE_IMPORTS, 1);
    *devPtr = p;
    return ACL_SUCCESS;
}

DBL_EXPORT aclError aclrtIpcMemClose(const char *key)
{
    CALL_PROLOGUE("aclrtIpcMemClose");
    if (!key)
        return hixl_double_fail(ACL_ERROR_INVALID_PARAM, "aclrtIpcMemClose: key is NULL");
    pthread_mutex_lock(&g_lock);
    dbl_mem *m = find_import_locked(key);
    if (m) {
        unlink_mem_locked(m);
        pthread_mutex_unlock(&g_lock);
        release_mem(m);
        hixl_double_count(DBL_LIVE_IMPORTS, -1);
        tell_exporter_closed(key);
        return ACL_SUCCESS;
    }
    m = find_export_locked(key);
    if (m) {
        if (live_importers_locked(m)) {
            int importer = m->importers[0];
            pthread_mutex_unlock(&g_lock);
            return hixl_double_fail(ACL_ERROR_RT_IPC_ERROR,
                                    "aclrtIpcMemClose: %s is still imported by process %d; "
                                    "every importer must close it before its exporter", key,
                                    importer);
        }
        m->exported = 0;
        m->key[0] = '\0';
        pthread_mutex_unlock(&g_lock);
        return ACL_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return hixl_double_fail(ACL_ERROR_RT_PARAM_INVALID, "aclrtIpcMemClose: unknown key %s", key);
}
