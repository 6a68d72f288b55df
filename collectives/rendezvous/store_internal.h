/*
 * store_internal.h — internal: the rendezvous store's handle, shared by
 * store.c (open, close, locks, the operations), store_ops.c (a store of
 * the caller's functions), store_log.c (the file's
 * records: replaying them, appending one), store_torch.c (PyTorch's
 * holder count) and store_reap.c (removing a dead job's file).
 */
#ifndef DT_STORE_INTERNAL_H
#define DT_STORE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "dt_comm.h"
#include "store_map.h"
#include "store_tcp.h"

#define STORE_MAX_KEY (64u << 10)   /* bytes of a record's key */
#define STORE_MAX_VALUE (64u << 20) /* bytes of a record's value */
#define STORE_MAX_READ (1ull << 30) /* bytes replayed in one go */
#define STORE_MAX_JOB_ID 256
#define STORE_POLL_NS 10000000L /* 10 ms, PyTorch's poll interval */
#define STORE_LIVENESS_OFFSET ((off_t)1 << 40)
#define STORE_OPEN_ATTEMPTS 64
#define STORE_ERR_LEN 1024
#define STORE_TCP_CONNECT_S 60.0 /* how long open waits for a tcp:// server */

/* PyTorch FileStore's counters of its handles (store_torch.c), and dtrain's
 * share of them. */
#define STORE_TORCH_REFCOUNT "refcount/"
#define STORE_TORCH_CLEANUP "cleanup/"
#define STORE_DTRAIN_REFCOUNT "refcount/dtrain"

typedef struct store_holders {
    int64_t refcount; /* "refcount/": open handles (PyTorch 2's and dtrain's) */
    int64_t cleanup;  /* "cleanup/": closed PyTorch handles, less open dtrain ones */
    int64_t dtrain;   /* "refcount/dtrain": open dtrain handles */
    bool torch_keys;  /* a record in PyTorch's key space ("/k") or a delete ("-/k") */
} store_holders;

_Static_assert(sizeof(off_t) >= 8, "the liveness byte needs a 64-bit off_t");

struct dt_store {
    int fd;            /* -1 when open failed */
    bool healthy;      /* false after a failed open or seen corruption */
    bool alive_locked; /* holds the shared liveness lock */
    bool keep_file;    /* close never removes the file (dt_store_keep_file) */
    uint64_t consumed; /* file bytes replayed into map */
    char *url;
    char *path;
    char *job_id;
    char *prefix; /* "<job_id>/" */
    size_t prefix_len;
    store_map map;
    store_tcp_client *tcp; /* tcp:// and env:// stores; NULL for file:// */
    dt_store_ops *ops;     /* a store of the caller's functions (store_ops.c), or NULL */
    void *ops_user;
    char err[STORE_ERR_LEN];
};

/* The liveness lock (store.c): set it to `type` (F_RDLCK, F_WRLCK,
 * F_UNLCK), waiting or not; 0 or errno. And whether path still names the
 * inode open as fd. */
int comm_store_liveness_lock(int fd, short type, bool wait);
bool comm_store_still_named(int fd, const char *path);

/* Sets the handle's message, "URL (job J): what", and returns st. */
__attribute__((format(printf, 3, 4))) dt_status comm_store_log_fail(dt_store *s, dt_status st,
                                                                    const char *fmt, ...);
/* The file is not (or no longer) a store: says where, stops using it. */
__attribute__((format(printf, 2, 3))) dt_status comm_store_log_corrupt(dt_store *s, const char *fmt,
                                                                       ...);

dt_status comm_store_flock(dt_store *s, int op); /* flock(op), retried on EINTR */
/* store.c: DT_OK if s is usable for `op` on `key` (else the reason in its
 * message). */
dt_status comm_store_check_usable(dt_store *s, const char *op, const char *key);
/* store_scope.c: the handle's job id (NULL: "dtrain") and key prefix,
 * false on ENOMEM; "<job>/<key>", malloc'd, for a shared store's keys
 * (NULL on ENOMEM); the scoped forms of keys[0..n) (NULL on ENOMEM), freed
 * with comm_store_scoped_free. */
bool comm_store_scope_set(dt_store *s, const char *job_id);
char *comm_store_scoped(const dt_store *s, const char *key);
char **comm_store_scoped_keys(const dt_store *s, const char *const *keys, int n);
void comm_store_scoped_free(char **k, int n);
/* The server a "tcp://HOST:PORT" or "env://" (MASTER_ADDR, MASTER_PORT) URL
 * names, split into host and port. NULL, or why there is none: not such a
 * URL, the variable env:// lacks, or not HOST:PORT. */
const char *comm_store_tcp_server(const char *url, char *host, size_t hcap, char *port,
                                  size_t pcap);
void comm_store_funlock(dt_store *s);

/* store_path.c: DT_OK if what is at s->path may become the store (nothing
 * at all, or a regular file of this user that others cannot write); the same
 * on the inode actually opened; and the message for an open(2) that failed
 * with err. Anything refused is DT_ESTORE naming what it is, left as is. */
dt_status comm_store_path_check_before_open(dt_store *s);
dt_status comm_store_path_check_opened(dt_store *s);
dt_status comm_store_path_open_failed(dt_store *s, int err);

/* Applies the records appended since the last replay. Caller holds flock. */
dt_status comm_store_log_replay(dt_store *s);
/* Checks that the whole file is records, applying none (DT_ESTORE if not),
 * and reads the holder counts into *holders (may be NULL). Caller holds
 * flock. */
dt_status comm_store_log_check(dt_store *s, store_holders *holders);
/* Appends one record of this job and applies it. Caller holds LOCK_EX and
 * has replayed to the end. */
dt_status comm_store_log_append(dt_store *s, const char *key, const uint8_t *val, size_t len);
/* Appends a record under `key` as is (no job prefix), applying nothing.
 * Caller holds LOCK_EX and has replayed to the end. */
dt_status comm_store_log_append_raw(dt_store *s, const char *key, const uint8_t *val, size_t len);

/* store_torch.c: sharing a file with PyTorch's FileStore. With LOCK_EX held
 * and replayed to the end: count this handle into (join) or out of (leave)
 * PyTorch's counters, so that a PyTorch handle closing never deletes a file
 * dtrain uses; *torch (leave) and comm_store_torch_involved: whether
 * PyTorch has used the file, so that dtrain must neither empty nor remove
 * it. */
dt_status comm_store_torch_join(dt_store *s);
dt_status comm_store_torch_leave(dt_store *s, bool *torch);
bool comm_store_torch_involved(const store_holders *h);

/* host_address.c: the IPv4 address of interface `name` (NULL if it has none
 * or is not up and running); the local address that routes to the store's
 * server of `url` (tcp:// or env://; NULL for file://, a loopback server or
 * an unresolvable host). Both malloc'd. */
char *comm_host_address_of_interface(const char *name);
char *comm_host_address_toward_store(const char *url);

/* store_host.c: a tcp:// or env:// URL's HOST:PORT that is a free address
 * of this machine (nobody else hosts the store there) gets a store server,
 * returned, with "HOST:PORT" in where; NULL when the store is someone
 * else's, or the URL not a TCP store's. Rank 0 asks, and stops the server
 * (dt_store_server_stop) once the job has started. */
dt_store_server *comm_store_host_start(const char *url, char *where, size_t n);

/* store_ops.c: each operation on a store of the caller's functions
 * (s->ops), its arguments already checked. */
dt_status comm_store_ops_set(dt_store *s, const char *key, const void *val, size_t len);
dt_status comm_store_ops_get(dt_store *s, const char *key, void **val, size_t *len,
                             double timeout_s);
dt_status comm_store_ops_wait(dt_store *s, const char *const *keys, int n, double timeout_s);
dt_status comm_store_ops_check(dt_store *s, const char *const *keys, int n, bool *all);
dt_status comm_store_ops_add(dt_store *s, const char *key, int64_t delta, int64_t *result);
dt_status comm_store_ops_compare_set(dt_store *s, const char *key, const void *expected,
                                     size_t elen, const void *desired, size_t dlen, void **now,
                                     size_t *nlen);
dt_status comm_store_ops_delete(dt_store *s, const char *key, bool *deleted);
dt_status comm_store_ops_num_keys(dt_store *s, int64_t *n);

#endif /* DT_STORE_INTERNAL_H */
