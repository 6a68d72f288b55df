/*
 * store_tcp.h — internal: the TCP store's wire format and its client.
 *
 * The wire format is PyTorch c10d TCPStore's as of 1.13 (docs/store-tcp.md):
 * a request is one query-type byte followed by its fields; a string or byte
 * vector is a u64 length (host order, little-endian on every machine we
 * run on) and its bytes; integers are raw int64. The server
 * (store_tcp_server.c) and the client (store_tcp_client.c) share these
 * constants and limits.
 */
#ifndef DT_STORE_TCP_H
#define DT_STORE_TCP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dt_comm.h"

enum store_query {
    Q_SET = 0,
    Q_COMPARE_SET = 1,
    Q_GET = 2,
    Q_ADD = 3,
    Q_CHECK = 4,
    Q_WAIT = 5,
    Q_NUM_KEYS = 6,
    Q_WATCH_KEY = 7,
    Q_DELETE_KEY = 8,
};
enum { CHECK_READY = 0, CHECK_NOT_READY = 1, WAIT_STOP_WAITING = 0 };

#define TCP_STORE_MAX_KEY (64u << 10)   /* bytes of a key */
#define TCP_STORE_MAX_VALUE (64u << 20) /* bytes of a value */
#define TCP_STORE_MAX_KEYS 4096u        /* keys in one check or wait */

typedef struct store_tcp_client store_tcp_client;

/* Connects to "HOST:PORT" (the URL after "tcp://"), retrying until
 * timeout_s passes, so ranks may start before the server. */
dt_status comm_tcp_client_open(store_tcp_client **out, const char *hostport, double timeout_s,
                               char *err, size_t errlen);
void comm_tcp_client_close(store_tcp_client *c);
dt_status comm_tcp_client_set(store_tcp_client *c, const char *key, const void *val, size_t len,
                              char *err, size_t errlen);
/* Waits until every key exists; a timeout's message names the missing keys
 * less their first prefix_len bytes (the job scope). */
dt_status comm_tcp_client_wait(store_tcp_client *c, const char *const *keys, int n,
                               size_t prefix_len, double timeout_s, const char *op, char *err,
                               size_t errlen);
dt_status comm_tcp_client_get(store_tcp_client *c, const char *key, void **val, size_t *len,
                              char *err, size_t errlen);
dt_status comm_tcp_client_add(store_tcp_client *c, const char *key, int64_t delta, int64_t *result,
                              char *err, size_t errlen);
/* CHECK: *all = every key exists. DELETE_KEY: *deleted = it existed.
 * NUM_KEYS: every key the server holds (all jobs'). COMPARE_SET: *now, the
 * value after it (malloc'd, NUL-terminated). */
dt_status comm_tcp_client_check(store_tcp_client *c, const char *const *keys, int n, bool *all,
                                char *err, size_t errlen);
dt_status comm_tcp_client_delete(store_tcp_client *c, const char *key, bool *deleted, char *err,
                                 size_t errlen);
dt_status comm_tcp_client_num_keys(store_tcp_client *c, int64_t *n, char *err, size_t errlen);
dt_status comm_tcp_client_compare_set(store_tcp_client *c, const char *key, const void *expected,
                                      size_t elen, const void *desired, size_t dlen, void **now,
                                      size_t *nlen, char *err, size_t errlen);

#endif /* DT_STORE_TCP_H */
