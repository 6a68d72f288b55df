/*
 * store_tcp_client.c — a rank's connection to a TCP store ("tcp://HOST:PORT").
 *
 * One blocking socket per dt_store handle, one request at a time, in
 * PyTorch c10d TCPStore's format (store_tcp.h). Waiting is the server's job:
 * WAIT is answered only once every key exists, so a rank sleeps in poll()
 * instead of polling the store. A wait that times out leaves its request
 * parked on the server; the client then drops the connection (the server
 * forgets the wait) and reconnects, and asks CHECK which keys are missing
 * to name them in the message.
 *
 * Costs: set is one write; get is a WAIT round trip and a GET round trip;
 * add one round trip. Connecting retries every 10 ms until the timeout, so
 * ranks may start before the server is listening.
 */
#include "store_tcp.h"

#include "dt_clock.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct store_tcp_client {
    int fd; /* -1 after a timed-out wait: reconnect before the next request */
    char host[256];
    char port[8];
};

/* Connects fd to addr before `deadline`: a host that drops SYNs would
 * otherwise hold a blocking connect for minutes, past any timeout. Returns
 * 0 or an errno; fd is left blocking. */
static int connect_by(int fd, const struct sockaddr *addr, socklen_t len, double deadline)
{
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int err = connect(fd, addr, len) == 0 ? 0 : errno;
    while (err == EINPROGRESS || err == EINTR) {
        double left = deadline - dt_now();
        if (left <= 0)
            return ETIMEDOUT;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int n = poll(&p, 1, (int)(left * 1000) + 1);
        socklen_t sl = sizeof err;
        if (n < 0)
            err = errno;
        else if (n > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0)
            err = errno;
    }
    fcntl(fd, F_SETFL, flags);
    return err;
}

/* One try at every address of host:port before `deadline`. Returns the
 * socket, or -1 with *gai set to getaddrinfo's error (0 if the name
 * resolved) and *err to the last connect's errno. */
static int connect_once(const char *host, const char *port, double deadline, int *gai, int *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
    if ((*gai = getaddrinfo(host, port, &hints, &ai)) != 0)
        return -1;
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd >= 0 && (*err = connect_by(fd, a->ai_addr, a->ai_addrlen, deadline)) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

/* A name the resolver says does not exist will not start to exist while
 * we wait: that fails at once. A server that is not listening yet may
 * still come (ranks start in any order): that is retried until the
 * deadline, and the last refusal is named when it passes. */
static dt_status connect_until(store_tcp_client *c, double timeout_s, char *err, size_t errlen)
{
    double deadline = dt_now() + timeout_s;
    int gai = 0, last = 0, e = 0;
    while ((c->fd = connect_once(c->host, c->port, deadline, &gai, &e)) < 0) {
        if (e != ETIMEDOUT || !last) /* our own deadline cut the last try short */
            last = e;
        if (gai != 0 && gai != EAI_AGAIN) {
            snprintf(err, errlen, "cannot resolve the store host '%s': %s", c->host,
                     gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai));
            return DT_EINVAL;
        }
        if (dt_now() >= deadline) {
            snprintf(err, errlen,
                     "no store server answered at %s:%s within %g s (last try: %s; is "
                     "rank 0 or the launcher on node 0 running?)",
                     c->host, c->port, timeout_s,
                     gai    ? gai_strerror(gai)
                     : last ? strerror(last)
                            : "no address");
            return DT_ETIMEDOUT;
        }
        struct timespec nap = {0, 10000000L};
        nanosleep(&nap, NULL);
    }
    return DT_OK;
}

dt_status comm_tcp_client_open(store_tcp_client **out, const char *hostport, double timeout_s,
                               char *err, size_t errlen)
{
    *out = NULL;
    const char *colon = strrchr(hostport, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == hostport || (size_t)(colon - hostport) >= 256 || *end || port <= 0 ||
        port > 65535) {
        snprintf(err, errlen, "'%s' is not HOST:PORT", hostport);
        return DT_EINVAL;
    }
    store_tcp_client *c = calloc(1, sizeof *c);
    if (!c)
        return DT_ENOMEM;
    memcpy(c->host, hostport, (size_t)(colon - hostport));
    snprintf(c->port, sizeof c->port, "%ld", port);
    dt_status st = connect_until(c, timeout_s, err, errlen);
    if (st != DT_OK) {
        free(c);
        return st;
    }
    *out = c;
    return DT_OK;
}

void comm_tcp_client_close(store_tcp_client *c)
{
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    free(c);
}

/* ---- framing ----------------------------------------------------------------------- */

static dt_status lost(store_tcp_client *c, const char *op, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: lost the store server at %s:%s (%s)", op, c->host, c->port,
             errno ? strerror(errno)
                   : "it closed the connection: has its host, rank 0 or node 0's "
                     "launcher, stopped?");
    return DT_ESTORE;
}

static bool send_all(store_tcp_client *c, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = send(c->fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        b += w;
        n -= (size_t)w;
    }
    return true;
}

static bool send_str(store_tcp_client *c, const void *p, size_t n)
{
    uint64_t len = n;
    return send_all(c, &len, 8) && send_all(c, p, n);
}

static bool recv_all(store_tcp_client *c, void *p, size_t n)
{
    uint8_t *b = p;
    errno = 0;
    while (n > 0) {
        ssize_t r = recv(c->fd, b, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        b += r;
        n -= (size_t)r;
    }
    return true;
}

/* Reconnects after a timed-out wait dropped the connection. */
static dt_status ready(store_tcp_client *c, char *err, size_t errlen)
{
    return c->fd >= 0 ? DT_OK : connect_until(c, 5.0, err, errlen);
}

/* ---- operations ------------------------------------------------------------------------ */

dt_status comm_tcp_client_set(store_tcp_client *c, const char *key, const void *val, size_t len,
                              char *err, size_t errlen)
{
    dt_status st = ready(c, err, errlen);
    if (st != DT_OK)
        return st;
    uint8_t type = Q_SET;
    if (!send_all(c, &type, 1) || !send_str(c, key, strlen(key)) || !send_str(c, val, len))
        return lost(c, "set", err, errlen);
    return DT_OK;
}

static dt_status send_keys(store_tcp_client *c, uint8_t type, const char *const *keys, int n)
{
    uint64_t count = (uint64_t)n;
    if (!send_all(c, &type, 1) || !send_all(c, &count, 8))
        return DT_ESTORE;
    for (int i = 0; i < n; i++)
        if (!send_str(c, keys[i], strlen(keys[i])))
            return DT_ESTORE;
    return DT_OK;
}

/* After a timeout: names (up to 8 of) the keys CHECK says are missing,
 * without their job prefix; returns how many are. */
static int name_missing(store_tcp_client *c, const char *const *keys, int n, size_t prefix_len,
                        char *out, size_t cap)
{
    size_t o = 0;
    int listed = 0, missing = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        uint8_t answer = CHECK_NOT_READY;
        if (ready(c, out, cap) != DT_OK)
            return 0;
        if (send_keys(c, Q_CHECK, &keys[i], 1) != DT_OK || !recv_all(c, &answer, 1))
            return 0;
        if (answer == CHECK_READY)
            continue;
        missing++;
        if (listed < 8 && o + 80 < cap) {
            o += (size_t)snprintf(out + o, cap - o, "%s'%.60s'", listed ? ", " : "",
                                  keys[i] + prefix_len);
            listed++;
        }
    }
    if (missing > listed)
        snprintf(out + o, cap - o, " and %d more", missing - listed);
    return missing;
}

dt_status comm_tcp_client_wait(store_tcp_client *c, const char *const *keys, int n,
                               size_t prefix_len, double timeout_s, const char *op, char *err,
                               size_t errlen)
{
    dt_status st = ready(c, err, errlen);
    if (st != DT_OK)
        return st;
    if (send_keys(c, Q_WAIT, keys, n) != DT_OK)
        return lost(c, op, err, errlen);
    double deadline = dt_now() + timeout_s;
    for (;;) {
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        double left = deadline - dt_now();
        int rc = left > 0 ? poll(&p, 1, (int)(left * 1000) + 1) : 0;
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc > 0)
            break;
        if (rc == 0 && dt_now() < deadline)
            continue;
        close(c->fd); /* the server forgets the parked wait */
        c->fd = -1;
        char missing[600];
        int m = name_missing(c, keys, n, prefix_len, missing, sizeof missing);
        snprintf(err, errlen, "%s timed out after %g s waiting for key%s %s", op, timeout_s,
                 m > 1 ? "s" : "", missing);
        return DT_ETIMEDOUT;
    }
    uint8_t answer;
    if (!recv_all(c, &answer, 1))
        return lost(c, op, err, errlen);
    if (answer != WAIT_STOP_WAITING) {
        snprintf(err, errlen,
                 "%s: %s:%s answered a wait with byte %u ('%c'), which no TCPStore server "
                 "sends: is that port a dtrain or PyTorch store?",
                 op, c->host, c->port, answer, answer >= 32 && answer < 127 ? answer : '?');
        return DT_ESTORE;
    }
    return DT_OK;
}

/* A value the server sends (u64 length, bytes), NUL-terminated. */
static dt_status get_reply(store_tcp_client *c, const char *op, void **val, size_t *len, char *err,
                           size_t errlen)
{
    uint64_t n;
    if (!recv_all(c, &n, 8))
        return lost(c, op, err, errlen);
    if (n > TCP_STORE_MAX_VALUE) {
        snprintf(err, errlen, "%s: the server sent a %llu-byte value, over the 64 MiB limit", op,
                 (unsigned long long)n);
        return DT_ESTORE;
    }
    uint8_t *v = malloc((size_t)n + 1);
    if (!v)
        return DT_ENOMEM;
    if (!recv_all(c, v, (size_t)n)) {
        free(v);
        return lost(c, op, err, errlen);
    }
    v[n] = 0;
    *val = v;
    *len = (size_t)n;
    return DT_OK;
}

/* GET of a key that exists (after a wait): the value, NUL-terminated. */
dt_status comm_tcp_client_get(store_tcp_client *c, const char *key, void **val, size_t *len,
                              char *err, size_t errlen)
{
    uint8_t type = Q_GET;
    if (!send_all(c, &type, 1) || !send_str(c, key, strlen(key)))
        return lost(c, "get", err, errlen);
    return get_reply(c, "get", val, len, err, errlen);
}

dt_status comm_tcp_client_add(store_tcp_client *c, const char *key, int64_t delta, int64_t *result,
                              char *err, size_t errlen)
{
    dt_status st = ready(c, err, errlen);
    if (st != DT_OK)
        return st;
    uint8_t type = Q_ADD;
    int64_t sum;
    if (!send_all(c, &type, 1) || !send_str(c, key, strlen(key)) || !send_all(c, &delta, 8) ||
        !recv_all(c, &sum, 8))
        return lost(c, "add", err, errlen);
    if (result)
        *result = sum;
    return DT_OK;
}

dt_status comm_tcp_client_check(store_tcp_client *c, const char *const *keys, int n, bool *all,
                                char *err, size_t errlen)
{
    dt_status st = ready(c, err, errlen);
    if (st != DT_OK)
        return st;
    uint8_t answer;
    if (send_keys(c, Q_CHECK, keys, n) != DT_OK || !recv_all(c, &answer, 1))
        return lost(c, "check", err, errlen);
    *all = answer == CHECK_READY;
    return DT_OK;
}

dt_status comm_tcp_client_delete(store_tcp_client *c, const char *key, bool *deleted, char *err,
                                 size_t errlen)
{
    dt_status st = ready(c, err, errlen);
    if (st != DT_OK)
        return st;
    uint8_t type = Q_DELETE_KEY;
    int64_t n;
    if (!send_all(c, &type, 1) || !send_str(c, key, strlen(key)) || !recv_all(c, &n, 8))
        return lost(c, "delete", err, errlen);
    *deleted = n != 0;
    return DT_OK;
}

dt_status comm_tcp_client_num_keys(store_tcp_client *c, int64_t *n, char *err, size_t errlen)
{
    dt_status st = ready(c, err, errlen);
    if (st != DT_OK)
        return st;
    uint8_t type = Q_NUM_KEYS;
    if (!send_all(c, &type, 1) || !recv_all(c, n, 8))
        return lost(c, "num_keys", err, errlen);
    return DT_OK;
}

dt_status comm_tcp_client_compare_set(store_tcp_client *c, const char *key, const void *expected,
                                      size_t elen, const void *desired, size_t dlen, void **now,
                                      size_t *nlen, char *err, size_t errlen)
{
    dt_status st = ready(c, err, errlen);
    if (st != DT_OK)
        return st;
    uint8_t type = Q_COMPARE_SET;
    if (!send_all(c, &type, 1) || !send_str(c, key, strlen(key)) || !send_str(c, expected, elen) ||
        !send_str(c, desired, dlen))
        return lost(c, "compare_set", err, errlen);
    return get_reply(c, "compare_set", now, nlen, err, errlen);
}
