/*
 * store_tcp_server.c — the TCP store's server: one key-value table in
 * memory, served on a libuv loop in its own thread.
 *
 * Ranks on machines without a shared filesystem meet here instead of in a
 * file: rank 0 (or the launcher on node 0) starts a server, every rank is a
 * client (store_tcp_client.c). The wire format is PyTorch c10d TCPStore's
 * (store_tcp.h, docs/store-tcp.md), so torch's clients can use it too.
 *
 * Each connection has a receive buffer; whole requests are parsed from it
 * and answered in order. A WAIT whose keys are not all there parks the
 * connection (no further requests are read from it, as a client sends
 * none until answered) and every write that creates a key re-checks the
 * parked ones. Strangers are not trusted: an unknown query type, a length
 * over the limits (64 KiB keys, 64 MiB values, 4096 keys per wait) or a
 * GET of a missing key closes that connection and only that one; a client
 * that disconnects is forgotten with its parked wait. There is no
 * authentication (PyTorch's has none either): keep secrets out of it.
 *
 * Costs: a request is parsed once; key lookup is a linear scan, since a
 * job's store holds a few dozen keys. Memory: the table plus one receive
 * buffer per connection, at most one request (about 64 MiB) long.
 * Invariants: only the loop thread touches the table and the connections;
 * the owner thread only starts and stops the loop.
 */
#include "store_tcp.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

typedef struct entry {
    char *key;
    size_t key_len;
    uint8_t *val;
    size_t len;
} entry;

typedef struct conn {
    uv_tcp_t tcp; /* first: the handle's address is the conn's */
    struct dt_store_server *srv;
    uint8_t *buf; /* [cap], len bytes received, not yet parsed */
    size_t len, cap;
    uint8_t *waiting; /* the parked WAIT request's keys part, or NULL */
    size_t waiting_len;
    bool closing;
    struct conn *next;
} conn;

struct dt_store_server {
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_async_t stop;
    pthread_t thread;
    int port;
    entry *table;
    size_t n, cap;
    conn *conns;
};

/* ---- the table ---------------------------------------------------------------- */

static entry *find(dt_store_server *s, const uint8_t *key, size_t n)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->table[i].key_len == n && memcmp(s->table[i].key, key, n) == 0)
            return &s->table[i];
    return NULL;
}

/* Sets key to a copy of val. False on ENOMEM. */
static bool put(dt_store_server *s, const uint8_t *key, size_t kn, const uint8_t *val, size_t n)
{
    uint8_t *copy = malloc(n + 1);
    if (!copy)
        return false;
    memcpy(copy, val, n);
    copy[n] = 0;
    entry *e = find(s, key, kn);
    if (!e) {
        if (s->n == s->cap) {
            size_t cap = s->cap ? 2 * s->cap : 16;
            entry *t = realloc(s->table, cap * sizeof *t);
            if (!t) {
                free(copy);
                return false;
            }
            s->table = t;
            s->cap = cap;
        }
        char *k = malloc(kn + 1);
        if (!k) {
            free(copy);
            return false;
        }
        memcpy(k, key, kn);
        k[kn] = 0;
        e = &s->table[s->n++];
        *e = (entry){.key = k, .key_len = kn};
    } else {
        free(e->val);
    }
    e->val = copy;
    e->len = n;
    return true;
}

static bool erase(dt_store_server *s, const uint8_t *key, size_t kn)
{
    entry *e = find(s, key, kn);
    if (!e)
        return false;
    free(e->key);
    free(e->val);
    *e = s->table[--s->n];
    return true;
}

/* ---- parsing a request ------------------------------------------------------------ */

typedef enum { PARSE_OK, PARSE_MORE, PARSE_BAD } parse_result;

typedef struct reader {
    const uint8_t *p;
    size_t n, off;
} reader;

static parse_result read_u64(reader *r, uint64_t *v)
{
    if (r->n - r->off < 8)
        return PARSE_MORE;
    memcpy(v, r->p + r->off, 8);
    r->off += 8;
    return PARSE_OK;
}

/* A length-prefixed byte string of at most `limit` bytes, pointed into. */
static parse_result read_bytes(reader *r, size_t limit, const uint8_t **b, size_t *n)
{
    uint64_t len;
    parse_result pr = read_u64(r, &len);
    if (pr != PARSE_OK)
        return pr;
    if (len > limit)
        return PARSE_BAD;
    if (r->n - r->off < len)
        return PARSE_MORE;
    *b = r->p + r->off;
    *n = (size_t)len;
    r->off += (size_t)len;
    return PARSE_OK;
}

/* ---- replies ------------------------------------------------------------------------- */

typedef struct reply {
    uv_write_t req;
    uint8_t data[];
} reply;

static void on_written(uv_write_t *req, int status)
{
    (void)status; /* a failed write shows up as a read error and closes */
    free(req);
}

static void conn_close(conn *c);

static void send_bytes(conn *c, const void *a, size_t an, const void *b, size_t bn)
{
    reply *r = malloc(sizeof *r + an + bn);
    if (!r) {
        conn_close(c);
        return;
    }
    memcpy(r->data, a, an);
    if (bn)
        memcpy(r->data + an, b, bn);
    uv_buf_t buf = uv_buf_init((char *)r->data, (unsigned)(an + bn));
    if (uv_write(&r->req, (uv_stream_t *)&c->tcp, &buf, 1, on_written) != 0) {
        free(r);
        conn_close(c);
    }
}

static void send_vector(conn *c, const uint8_t *v, size_t n)
{
    uint64_t len = n;
    send_bytes(c, &len, 8, v, n);
}

static void send_i64(conn *c, int64_t v)
{
    send_bytes(c, &v, 8, NULL, 0);
}
static void send_u8(conn *c, uint8_t v)
{
    send_bytes(c, &v, 1, NULL, 0);
}

/* ---- the queries --------------------------------------------------------------------- */

/* Parses "u64 count, count keys"; *present says whether all exist. */
static parse_result parse_keys(dt_store_server *s, reader *r, bool *present)
{
    uint64_t count;
    parse_result pr = read_u64(r, &count);
    if (pr != PARSE_OK)
        return pr;
    if (count > TCP_STORE_MAX_KEYS)
        return PARSE_BAD;
    *present = true;
    for (uint64_t i = 0; i < count; i++) {
        const uint8_t *k;
        size_t kn;
        if ((pr = read_bytes(r, TCP_STORE_MAX_KEY, &k, &kn)) != PARSE_OK)
            return pr;
        if (!find(s, k, kn))
            *present = false;
    }
    return PARSE_OK;
}

static void wake_waiters(dt_store_server *s);

/* Parses "u64 old, digits" and adds: ADD's arithmetic on a decimal value. */
static bool add_to(dt_store_server *s, const uint8_t *k, size_t kn, int64_t delta, int64_t *sum)
{
    int64_t now = 0;
    entry *e = find(s, k, kn);
    if (e) {
        char *end;
        if (e->len == 0 || e->len > 20)
            return false;
        now = strtoll((const char *)e->val, &end, 10);
        if (end != (const char *)e->val + e->len)
            return false;
    }
    if (__builtin_add_overflow(now, delta, sum))
        return false;
    char text[24];
    int n = snprintf(text, sizeof text, "%lld", (long long)*sum);
    return put(s, k, kn, (const uint8_t *)text, (size_t)n);
}

/* Handles one request at r; PARSE_OK when it was whole and answered. */
static parse_result handle(conn *c, reader *r)
{
    dt_store_server *s = c->srv;
    if (r->n < 1)
        return PARSE_MORE;
    uint8_t type = r->p[r->off++];
    const uint8_t *k, *v, *w;
    size_t kn, vn, wn;
    parse_result pr;
    bool present;
    switch (type) {
    case Q_SET:
        if ((pr = read_bytes(r, TCP_STORE_MAX_KEY, &k, &kn)) != PARSE_OK)
            return pr;
        if ((pr = read_bytes(r, TCP_STORE_MAX_VALUE, &v, &vn)) != PARSE_OK)
            return pr;
        if (!put(s, k, kn, v, vn))
            return PARSE_BAD;
        wake_waiters(s);
        return PARSE_OK;
    case Q_COMPARE_SET: {
        if ((pr = read_bytes(r, TCP_STORE_MAX_KEY, &k, &kn)) != PARSE_OK)
            return pr;
        if ((pr = read_bytes(r, TCP_STORE_MAX_VALUE, &v, &vn)) != PARSE_OK)
            return pr;
        if ((pr = read_bytes(r, TCP_STORE_MAX_VALUE, &w, &wn)) != PARSE_OK)
            return pr;
        entry *e = find(s, k, kn);
        if (e ? (e->len == vn && memcmp(e->val, v, vn) == 0) : vn == 0) {
            if (!put(s, k, kn, w, wn))
                return PARSE_BAD;
            wake_waiters(s);
            e = find(s, k, kn);
        }
        if (e)
            send_vector(c, e->val, e->len);
        else
            send_vector(c, v, vn); /* absent, expected not empty: torch's answer */
        return PARSE_OK;
    }
    case Q_GET: {
        if ((pr = read_bytes(r, TCP_STORE_MAX_KEY, &k, &kn)) != PARSE_OK)
            return pr;
        entry *e = find(s, k, kn);
        if (!e)
            return PARSE_BAD;
        send_vector(c, e->val, e->len);
        return PARSE_OK;
    }
    case Q_ADD: {
        uint64_t delta;
        int64_t sum;
        if ((pr = read_bytes(r, TCP_STORE_MAX_KEY, &k, &kn)) != PARSE_OK)
            return pr;
        if ((pr = read_u64(r, &delta)) != PARSE_OK)
            return pr;
        if (!add_to(s, k, kn, (int64_t)delta, &sum))
            return PARSE_BAD;
        send_i64(c, sum);
        wake_waiters(s);
        return PARSE_OK;
    }
    case Q_CHECK:
        if ((pr = parse_keys(s, r, &present)) != PARSE_OK)
            return pr;
        send_u8(c, present ? CHECK_READY : CHECK_NOT_READY);
        return PARSE_OK;
    case Q_WAIT: {
        size_t start = r->off;
        if ((pr = parse_keys(s, r, &present)) != PARSE_OK)
            return pr;
        if (present) {
            send_u8(c, WAIT_STOP_WAITING);
            return PARSE_OK;
        }
        c->waiting = malloc(r->off - start);
        if (!c->waiting)
            return PARSE_BAD;
        memcpy(c->waiting, r->p + start, r->off - start);
        c->waiting_len = r->off - start;
        return PARSE_OK;
    }
    case Q_NUM_KEYS: send_i64(c, (int64_t)s->n); return PARSE_OK;
    case Q_DELETE_KEY:
        if ((pr = read_bytes(r, TCP_STORE_MAX_KEY, &k, &kn)) != PARSE_OK)
            return pr;
        send_i64(c, erase(s, k, kn) ? 1 : 0);
        return PARSE_OK;
    default: /* includes WATCH_KEY: not served */ return PARSE_BAD;
    }
}

/* Answers every whole request in the buffer, unless parked on a wait. */
static void process(conn *c)
{
    size_t done = 0;
    while (!c->closing && !c->waiting && done < c->len) {
        reader r = {c->buf + done, c->len - done, 0};
        parse_result pr = handle(c, &r);
        if (pr == PARSE_MORE)
            break;
        if (pr == PARSE_BAD) {
            conn_close(c);
            return;
        }
        done += r.off;
    }
    memmove(c->buf, c->buf + done, c->len - done);
    c->len -= done;
}

static void wake_waiters(dt_store_server *s)
{
    for (conn *c = s->conns; c; c = c->next) {
        if (!c->waiting || c->closing)
            continue;
        reader r = {c->waiting, c->waiting_len, 0};
        bool present = false;
        (void)parse_keys(s, &r, &present);
        if (!present)
            continue;
        free(c->waiting);
        c->waiting = NULL;
        send_u8(c, WAIT_STOP_WAITING);
        process(c); /* nested wakes see c->waiting cleared */
    }
}

/* ---- connections ---------------------------------------------------------------------- */

static void on_conn_closed(uv_handle_t *h)
{
    conn *c = (conn *)h;
    for (conn **p = &c->srv->conns; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    free(c->buf);
    free(c->waiting);
    free(c);
}

static void conn_close(conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

/* Room for the next read: the buffer grows as a request needs, up to one
 * maximal request; the limits in handle() stop anything longer. */
static void on_alloc(uv_handle_t *h, size_t want, uv_buf_t *buf)
{
    conn *c = (conn *)h;
    (void)want;
    if (c->cap - c->len < 65536) {
        size_t cap = c->cap ? 2 * c->cap : 65536;
        uint8_t *b = realloc(c->buf, cap);
        if (b) {
            c->buf = b;
            c->cap = cap;
        }
    }
    *buf = uv_buf_init((char *)c->buf + c->len, (unsigned)(c->cap - c->len));
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    conn *c = (conn *)st;
    (void)buf;
    if (n < 0 || c->cap - c->len == 0) {
        conn_close(c);
        return;
    }
    c->len += (size_t)n;
    process(c);
}

static void on_connection(uv_stream_t *listener, int status)
{
    dt_store_server *s = listener->data;
    if (status != 0)
        return;
    conn *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->srv = s;
    uv_tcp_init(&s->loop, &c->tcp);
    c->next = s->conns;
    s->conns = c;
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0 ||
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
        conn_close(c);
}

/* ---- life cycle -------------------------------------------------------------------------- */

static void close_everything(uv_async_t *a)
{
    dt_store_server *s = a->data;
    for (conn *c = s->conns; c; c = c->next)
        conn_close(c);
    uv_close((uv_handle_t *)&s->listener, NULL);
    uv_close((uv_handle_t *)&s->stop, NULL);
}

static void *serve(void *arg)
{
    dt_store_server *s = arg;
    uv_run(&s->loop, UV_RUN_DEFAULT);
    return NULL;
}

static dt_status listen_on(dt_store_server *s, const char *host, int port, char *err, size_t errlen)
{
    struct sockaddr_storage addr;
    int rc = uv_ip4_addr(host, port, (struct sockaddr_in *)&addr);
    if (rc != 0)
        rc = uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr);
    if (rc != 0) {
        snprintf(err, errlen, "store server: '%s' is not an IP address", host);
        return DT_EINVAL;
    }
    uv_tcp_init(&s->loop, &s->listener);
    s->listener.data = s;
    if ((rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&addr, 0)) == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, 1024, on_connection);
    if (rc != 0) {
        snprintf(err, errlen, "store server: listening on %s:%d: %s", host, port, uv_strerror(rc));
        return DT_ESYS;
    }
    int len = sizeof addr;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&addr, &len);
    s->port = ntohs(addr.ss_family == AF_INET ? ((struct sockaddr_in *)&addr)->sin_port
                                              : ((struct sockaddr_in6 *)&addr)->sin6_port);
    return DT_OK;
}

dt_status dt_store_server_start(dt_store_server **out, const char *host, int port, char *err,
                                size_t errlen)
{
    *out = NULL;
    dt_store_server *s = calloc(1, sizeof *s);
    if (!s)
        return DT_ENOMEM;
    if (uv_loop_init(&s->loop) != 0) {
        free(s);
        return DT_ESYS;
    }
    dt_status st = listen_on(s, host, port, err, errlen);
    if (st == DT_OK) {
        uv_async_init(&s->loop, &s->stop, close_everything);
        s->stop.data = s;
        if (pthread_create(&s->thread, NULL, serve, s) != 0) {
            snprintf(err, errlen, "store server: cannot start its thread");
            uv_close((uv_handle_t *)&s->stop, NULL);
            st = DT_ESYS;
        }
    }
    if (st != DT_OK) {
        uv_close((uv_handle_t *)&s->listener, NULL);
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
        free(s);
        return st;
    }
    *out = s;
    return DT_OK;
}

int dt_store_server_port(const dt_store_server *s)
{
    return s ? s->port : 0;
}

void dt_store_server_stop(dt_store_server *s)
{
    if (!s)
        return;
    uv_async_send(&s->stop);
    pthread_join(s->thread, NULL);
    uv_loop_close(&s->loop);
    for (size_t i = 0; i < s->n; i++) {
        free(s->table[i].key);
        free(s->table[i].val);
    }
    free(s->table);
    free(s);
}
