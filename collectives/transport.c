/*
 * transport.c — the I/O thread: one libuv loop moving frames over a full
 * mesh of TCP connections.
 *
 * The idea: nothing is ever buffered "just in case". Every frame (a 40-byte
 * header, then payload) is read straight into the buffer of the receive that
 * was posted for it. When a header arrives and no receive matches it yet —
 * the peer is ahead of us — reading that socket stops (uv_read_stop) until
 * the executor posts the matching receive. TCP's window is the flow control,
 * and memory stays bounded by what the algorithms posted.
 *
 * Matching: collective frames from one peer are matched in order against
 * the collective receives posted for that peer, and must agree exactly with
 * the receive's expected header (op, sequence number, count, dtype,
 * reduction, root, message index, length) — otherwise the ranks disagree
 * about the op, and both views go into a protocol error. Tagged p2p frames
 * are matched against posted p2p receives by (source or any, tag), oldest
 * first.
 *
 * Failure: EOF, a reset, a write error, a protocol error, a timeout noticed
 * by the executor, or dt_comm_abort all end in comm_fail. The first failure
 * is recorded; the loop then lets go of every posted receive, sends each
 * peer an ABORT frame carrying the reason (so a rank that only sees the
 * cascade still learns the root cause), and closes every connection after a
 * short grace period, which also cancels sends still in flight. A peer that
 * said BYE (destroyed its communicator) and then closes is not a failure
 * unless something was still expected from it.
 *
 * Cost per frame: one write of header+payload (writev), and on the receive
 * side one read for the header and as many as needed for the payload.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"

#define TICK_MS 20
#define HANDSHAKE_TIMEOUT_S 10.0
#define FAIL_GRACE_S 0.5
#define SHUTDOWN_GRACE_S 2.0
#define MAX_READ (1u << 30)

double dt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- letting go of transfers ------------------------------------------- */

/* Hand a transfer back to its owner. After this the loop never touches x.
 * A collective transfer's owner is the op running on this very thread; a
 * p2p transfer completes a work handle some API thread may be waiting on. */
static void xfer_release(dt_comm *c, dt_xfer *x, int state)
{
    if (!x->work) {
        x->state = state;
        if (x->owner) x->owner->outstanding--;
        return;
    }
    pthread_mutex_lock(&c->mu);
    x->state = state;
    dt_status st = DT_OK;
    if (state != XFER_DONE) st = c->failed ? c->fail_status : DT_EABORTED;
    work_complete(x->work, st);
    pthread_mutex_unlock(&c->mu);
}

static void release_list(dt_comm *c, dt_xfer *x)
{
    while (x) {
        dt_xfer *next = x->next;
        xfer_release(c, x, XFER_FAILED);
        x = next;
    }
}

/* ---- reading ------------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void close_pending(dt_comm *c);
static void c_unlink_pending(dt_conn *cn);

void conn_set_reading(dt_conn *cn, bool on)
{
    if (cn->closing) return;
    if (on) uv_read_start((uv_stream_t *)&cn->tcp, on_alloc, on_read);
    else uv_read_stop((uv_stream_t *)&cn->tcp);
}

void conn_expect(dt_conn *cn, int state, size_t bytes)
{
    cn->rx_state = state;
    cn->rx_got = 0;
    cn->rx_need = bytes;
}

static void rx_next_header(dt_conn *cn)
{
    conn_expect(cn, RX_HEADER, sizeof(dt_frame_hdr));
    cn->rx_cur = NULL;
}

static void describe_hdr(char *out, size_t n, const dt_frame_hdr *h)
{
    if (h->kind == FRAME_P2P) {
        snprintf(out, n, "send with tag %u of %llu B", h->index,
                 (unsigned long long)h->length);
        return;
    }
    char root[24] = "";
    if (h->root >= 0) snprintf(root, sizeof root, ", root %d", (int)h->root);
    snprintf(out, n, "%s #%llu message %u (%llu x %s, %s%s; %llu B)",
             h->op < DT_NUM_OP_KINDS ? dt_op_name(h->op) : "?",
             (unsigned long long)h->seq, h->index, (unsigned long long)h->count,
             h->dtype < DT_NUM_DTYPES ? dt_dtype_name(h->dtype) : "?",
             h->redop < DT_NUM_REDOPS ? dt_redop_name(h->redop) : "?", root,
             (unsigned long long)h->length);
}

static void protocol_error(dt_conn *cn, const dt_frame_hdr *expected)
{
    dt_comm *c = cn->comm;
    char got[160], want[160];
    describe_hdr(got, sizeof got, &cn->rx_hdr);
    describe_hdr(want, sizeof want, expected);
    cn->rx_state = RX_STOPPED;
    conn_set_reading(cn, false);
    comm_fail(c, DT_EPROTO,
              "rank %d: protocol mismatch: rank %d (%s) sent %s, rank %d expected %s; "
              "every rank must submit the same collectives in the same order with the same "
              "arguments", c->rank, cn->peer, cn->addr, got, c->rank, want);
}

static bool hdr_matches(const dt_frame_hdr *a, const dt_frame_hdr *b)
{
    return a->kind == b->kind && a->op == b->op && a->dtype == b->dtype &&
           a->redop == b->redop && a->root == b->root && a->index == b->index &&
           a->seq == b->seq && a->count == b->count && a->length == b->length;
}

static void rx_start_payload(dt_conn *cn, dt_xfer *x)
{
    x->source = cn->peer;
    x->next = NULL;
    if (cn->rx_hdr.length == 0) {
        xfer_release(cn->comm, x, XFER_DONE);
        rx_next_header(cn);
    } else {
        cn->rx_cur = x;
        x->done = 0;
        cn->rx_state = RX_PAYLOAD;
    }
}

/* The oldest posted p2p receive that takes (peer, tag), unlinked. */
static dt_xfer *p2p_take(dt_comm *c, int peer, uint32_t tag)
{
    dt_xfer **pp = &c->p2p_head, *prev = NULL;
    for (dt_xfer *x = c->p2p_head; x; prev = x, pp = &x->next, x = x->next) {
        if ((x->peer == peer || x->peer == DT_ANY_SOURCE) && x->hdr.index == tag) {
            *pp = x->next;
            if (c->p2p_tail == x) c->p2p_tail = prev;
            return x;
        }
    }
    return NULL;
}

static void rx_pause(dt_conn *cn)
{
    cn->rx_state = RX_WAIT_MATCH;
    conn_set_reading(cn, false);
}

/* A whole header is in cn->rx_hdr: find where its payload goes. */
static void rx_on_header(dt_conn *cn)
{
    dt_comm *c = cn->comm;
    dt_frame_hdr *h = &cn->rx_hdr;
    dt_xfer *x;
    bool was_paused = cn->rx_state == RX_WAIT_MATCH;
    switch (h->kind) {
    case FRAME_COLL:
        x = cn->coll_head;
        if (!x) { rx_pause(cn); return; }
        if (!hdr_matches(&x->hdr, h)) { protocol_error(cn, &x->hdr); return; }
        cn->coll_head = x->next;
        if (!cn->coll_head) cn->coll_tail = NULL;
        rx_start_payload(cn, x);
        break;
    case FRAME_P2P:
        x = p2p_take(c, cn->peer, h->index);
        if (!x) { rx_pause(cn); return; }
        if (x->len != h->length) {
            x->next = NULL;
            dt_frame_hdr want = x->hdr;
            xfer_release(c, x, XFER_FAILED);
            protocol_error(cn, &want);
            return;
        }
        rx_start_payload(cn, x);
        break;
    case FRAME_ABORT:
        if (h->length < 4 || h->length >= sizeof cn->notice) {
            comm_fail(c, DT_EPROTO, "rank %d: rank %d (%s) sent an ABORT frame of %llu B",
                      c->rank, cn->peer, cn->addr, (unsigned long long)h->length);
            return;
        }
        conn_expect(cn, RX_NOTICE, h->length);
        break;
    case FRAME_BYE:
        cn->bye = true;
        rx_next_header(cn);
        break;
    default:
        cn->rx_state = RX_STOPPED;
        conn_set_reading(cn, false);
        comm_fail(c, DT_EPROTO, "rank %d: rank %d (%s) sent a frame of unknown kind %u "
                  "(another protocol version?)", c->rank, cn->peer, cn->addr, h->kind);
        return;
    }
    if (was_paused) conn_set_reading(cn, true);
}

static void rx_on_notice(dt_conn *cn)
{
    dt_comm *c = cn->comm;
    uint32_t st;
    memcpy(&st, cn->notice, 4);
    cn->notice[cn->rx_need] = '\0';
    if (st == DT_OK || st > DT_ENOMEM) st = DT_EPEER;
    cn->rx_state = RX_STOPPED;
    conn_set_reading(cn, false);
    comm_fail(c, (dt_status)st, "rank %d: rank %d (%s) failed and reported: %s", c->rank,
              cn->peer, cn->addr, cn->notice + 4);
}

/* Does anything posted still wait for data from this peer? */
static bool expects_from(dt_comm *c, dt_conn *cn)
{
    if (cn->coll_head || cn->rx_cur) return true;
    for (dt_xfer *x = c->p2p_head; x; x = x->next)
        if (x->peer == cn->peer) return true;
    return false;
}

static void conn_lost(dt_conn *cn, ssize_t err)
{
    dt_comm *c = cn->comm;
    cn->lost = true;
    cn->rx_state = RX_STOPPED;
    conn_set_reading(cn, false);
    if (!cn->authenticated) {
        if (cn->outgoing)
            comm_fail(c, DT_EPEER, "rank %d: rank %d (%s) closed the connection during the "
                      "handshake (%s): is it another job, or does it hold another secret?",
                      c->rank, cn->expect_peer, cn->addr, uv_strerror((int)err));
        else
            conn_reject(cn, "closed during the handshake (%s)", uv_strerror((int)err));
        return;
    }
    if (cn->bye && !expects_from(c, cn)) {
        conn_close(cn);
        return;
    }
    if (cn->bye)
        comm_fail(c, DT_EPEER, "rank %d: rank %d (%s) destroyed its communicator while "
                  "rank %d still expected data from it", c->rank, cn->peer, cn->addr, c->rank);
    else
        comm_fail(c, DT_EPEER, "rank %d: connection to rank %d (%s) lost: %s; rank %d died "
                  "or its process was killed", c->rank, cn->peer, cn->addr,
                  err == UV_EOF ? "end of file" : uv_strerror((int)err), cn->peer);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    dt_conn *cn = h->data;
    char *base = NULL;
    size_t len = 0;
    switch (cn->rx_state) {
    case RX_HEADER:
        base = (char *)&cn->rx_hdr + cn->rx_got;
        len = sizeof(dt_frame_hdr) - cn->rx_got;
        break;
    case RX_PAYLOAD:
        base = cn->rx_cur->buf + cn->rx_cur->done;
        len = cn->rx_cur->len - cn->rx_cur->done;
        if (len > MAX_READ) len = MAX_READ;
        break;
    case RX_HANDSHAKE:
        base = (char *)cn->hs_buf + cn->rx_got;
        len = cn->rx_need - cn->rx_got;
        break;
    case RX_NOTICE:
        base = cn->notice + cn->rx_got;
        len = cn->rx_need - cn->rx_got;
        break;
    default:
        break;
    }
    *buf = uv_buf_init(base, (unsigned)len);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    dt_conn *cn = s->data;
    if (nread == 0 || nread == UV_ENOBUFS) return;
    if (nread < 0) { conn_lost(cn, nread); return; }
    if (cn->rx_state == RX_PAYLOAD) {
        dt_xfer *x = cn->rx_cur;
        x->done += (size_t)nread;
        if (x->done == x->len) {
            cn->rx_cur = NULL;
            xfer_release(cn->comm, x, XFER_DONE);
            rx_next_header(cn);
        }
        return;
    }
    cn->rx_got += (size_t)nread;
    if (cn->rx_got < cn->rx_need) return;
    switch (cn->rx_state) {
    case RX_HEADER: rx_on_header(cn); break;
    case RX_HANDSHAKE: handshake_step(cn); break;
    case RX_NOTICE: rx_on_notice(cn); break;
    default: break;
    }
}

/* ---- writing --------------------------------------------------------------- */

static void on_send_done(uv_write_t *req, int status)
{
    dt_xfer *x = req->data;
    dt_conn *cn = req->handle->data;
    dt_comm *c = cn->comm;
    if (status < 0 && status != UV_ECANCELED)
        comm_fail(c, DT_EPEER, "rank %d: sending to rank %d (%s) failed: %s; rank %d died or "
                  "its process was killed", c->rank, cn->peer, cn->addr, uv_strerror(status),
                  cn->peer);
    xfer_release(c, x, status == 0 ? XFER_DONE : XFER_FAILED);
}

typedef struct owned_write {
    uv_write_t req;
    dt_frame_hdr hdr;
    char payload[];
} owned_write;

static void on_owned_write_done(uv_write_t *req, int status)
{
    (void)status;
    free(req->data);
}

/* A frame whose bytes the loop owns (ABORT, BYE). Best effort. */
static void send_control(dt_conn *cn, uint8_t kind, const void *payload, size_t len)
{
    if (cn->closing || cn->lost || !cn->authenticated) return;
    owned_write *w = malloc(sizeof *w + len);
    if (!w) return;
    memset(&w->hdr, 0, sizeof w->hdr);
    w->hdr.kind = kind;
    w->hdr.root = -1;
    w->hdr.length = len;
    if (len) memcpy(w->payload, payload, len);
    w->req.data = w;
    uv_buf_t bufs[2] = {uv_buf_init((char *)&w->hdr, sizeof w->hdr),
                        uv_buf_init(w->payload, (unsigned)len)};
    if (uv_write(&w->req, (uv_stream_t *)&cn->tcp, bufs, len ? 2 : 1, on_owned_write_done) < 0)
        free(w);
}

static void on_hs_write_done(uv_write_t *req, int status)
{
    dt_conn *cn = req->data;
    if (status < 0 && status != UV_ECANCELED && !cn->authenticated && !cn->closing)
        conn_lost(cn, status);
}

void conn_write(dt_conn *cn, uv_write_t *req, const void *buf, size_t len)
{
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
    req->data = cn;
    int rc = uv_write(req, (uv_stream_t *)&cn->tcp, &b, 1, on_hs_write_done);
    if (rc < 0) conn_lost(cn, rc);
}

/* ---- posting (loop side) ------------------------------------------------- */

static dt_conn *peer_conn(dt_comm *c, dt_xfer *x, const char *what)
{
    dt_conn *cn = c->peers[x->peer];
    if (cn && !cn->lost && !cn->closing && !cn->bye) return cn;
    comm_fail(c, DT_EPEER, "rank %d: cannot %s rank %d: %s", c->rank, what, x->peer,
              cn && cn->bye ? "it destroyed its communicator" : "its connection is gone");
    return NULL;
}

static void io_send(dt_comm *c, dt_xfer *x)
{
    dt_conn *cn = peer_conn(c, x, "send to");
    if (!cn) { xfer_release(c, x, XFER_FAILED); return; }
    uv_buf_t bufs[2] = {uv_buf_init((char *)&x->hdr, sizeof x->hdr),
                        uv_buf_init(x->buf, (unsigned)x->len)};
    x->write_req.data = x;
    int rc = uv_write(&x->write_req, (uv_stream_t *)&cn->tcp, bufs, x->len ? 2 : 1,
                      on_send_done);
    if (rc < 0) {
        comm_fail(c, DT_EPEER, "rank %d: writing to rank %d (%s) failed: %s", c->rank,
                  cn->peer, cn->addr, uv_strerror(rc));
        xfer_release(c, x, XFER_FAILED);
    }
}

static void io_recv(dt_comm *c, dt_xfer *x)
{
    x->next = NULL;
    if (x->hdr.kind == FRAME_P2P) {
        if (c->p2p_tail) c->p2p_tail->next = x;
        else c->p2p_head = x;
        c->p2p_tail = x;
        for (int p = 0; p < c->size; p++) {
            dt_conn *cn = c->peers[p];
            if (cn && cn->rx_state == RX_WAIT_MATCH && cn->rx_hdr.kind == FRAME_P2P)
                rx_on_header(cn);
        }
        return;
    }
    dt_conn *cn = peer_conn(c, x, "receive from");
    if (!cn) { xfer_release(c, x, XFER_FAILED); return; }
    if (cn->coll_tail) cn->coll_tail->next = x;
    else cn->coll_head = x;
    cn->coll_tail = x;
    if (cn->rx_state == RX_WAIT_MATCH) rx_on_header(cn);
}

static void io_post(dt_comm *c, dt_xfer *x)
{
    x->next = NULL;
    if (c->io_failed_done || c->io_shutdown) xfer_release(c, x, XFER_FAILED);
    else if (x->is_send) io_send(c, x);
    else io_recv(c, x);
}

void transport_post_here(dt_comm *c, dt_xfer *x)
{
    x->state = XFER_POSTED;
    x->done = 0;
    if (x->owner) x->owner->outstanding++;
    io_post(c, x);
}

void transport_post(dt_comm *c, dt_xfer *x)
{
    x->state = XFER_POSTED;
    x->done = 0;
    x->next = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->inbox_tail) c->inbox_tail->next = x;
    else c->inbox_head = x;
    c->inbox_tail = x;
    pthread_mutex_unlock(&c->mu);
    uv_async_send(&c->wake);
}

/* ---- failure and shutdown -------------------------------------------------- */

static void c_unlink_pending(dt_conn *cn)
{
    for (dt_conn **pp = &cn->comm->pending; *pp; pp = &(*pp)->next)
        if (*pp == cn) { *pp = cn->next; break; }
}

static void on_conn_closed(uv_handle_t *h)
{
    dt_conn *cn = h->data;
    dt_comm *c = cn->comm;
    if (cn->peer >= 0 && c->peers[cn->peer] == cn) c->peers[cn->peer] = NULL;
    c_unlink_pending(cn);
    c->open_handles--;
    free(cn);
}

void conn_close(dt_conn *cn)
{
    if (cn->closing) return;
    cn->closing = true;
    cn->rx_state = RX_STOPPED;
    if (cn->has_handle) {
        uv_close((uv_handle_t *)&cn->tcp, on_conn_closed);
        return;
    }
    /* A connection waiting to redial has no handle to close. */
    c_unlink_pending(cn);
    free(cn);
}

/* Let go of every receive, tell the peers why, close after a grace period. */
static void io_fail_cleanup(dt_comm *c)
{
    if (c->io_failed_done) return;
    c->io_failed_done = true;
    char text[sizeof(((dt_conn *)0)->notice)];
    uint32_t st;
    pthread_mutex_lock(&c->mu);
    st = c->fail_status;
    snprintf(text + 4, sizeof text - 4, "%s", c->error);
    pthread_mutex_unlock(&c->mu);
    memcpy(text, &st, 4);
    for (int p = 0; p < c->size; p++) {
        dt_conn *cn = c->peers[p];
        if (!cn) continue;
        cn->rx_state = RX_STOPPED;
        conn_set_reading(cn, false);
        if (cn->rx_cur) xfer_release(c, cn->rx_cur, XFER_FAILED);
        cn->rx_cur = NULL;
        release_list(c, cn->coll_head);
        cn->coll_head = cn->coll_tail = NULL;
        send_control(cn, FRAME_ABORT, text, 4 + strlen(text + 4));
    }
    release_list(c, c->p2p_head);
    c->p2p_head = c->p2p_tail = NULL;
    close_pending(c);
    c->close_at = dt_now() + FAIL_GRACE_S;
}

static void close_pending(dt_comm *c)
{
    for (dt_conn *cn = c->pending, *next; cn; cn = next) {
        next = cn->next;
        conn_close(cn);
    }
}

static void on_shutdown_done(uv_shutdown_t *req, int status)
{
    (void)status;
    dt_conn *cn = req->data;
    free(req);
    conn_close(cn);
}

static void io_shutdown(dt_comm *c)
{
    if (c->io_shutdown) return;
    c->io_shutdown = true;
    for (int p = 0; p < c->size; p++) {
        dt_conn *cn = c->peers[p];
        if (!cn) continue;
        if (cn->rx_cur) xfer_release(c, cn->rx_cur, XFER_FAILED);
        cn->rx_cur = NULL;
        release_list(c, cn->coll_head);
        cn->coll_head = cn->coll_tail = NULL;
        if (cn->closing) continue;
        send_control(cn, FRAME_BYE, NULL, 0);
        uv_shutdown_t *req = malloc(sizeof *req);
        if (req) req->data = cn;
        if (!req || uv_shutdown(req, (uv_stream_t *)&cn->tcp, on_shutdown_done) < 0) {
            free(req);
            conn_close(cn);
        }
    }
    release_list(c, c->p2p_head);
    c->p2p_head = c->p2p_tail = NULL;
    close_pending(c);
    if (c->listener_open) {
        c->listener_open = false;
        uv_close((uv_handle_t *)&c->listener, NULL);
    }
    double t = dt_now() + SHUTDOWN_GRACE_S;
    if (c->close_at == 0 || c->close_at > t) c->close_at = t;
}

static void close_all_conns(dt_comm *c)
{
    for (int p = 0; p < c->size; p++)
        if (c->peers[p]) conn_close(c->peers[p]);
    close_pending(c);
}

/* The handshake succeeded: cn now carries frames to and from `peer`. */
void conn_authenticated(dt_conn *cn, int peer)
{
    dt_comm *c = cn->comm;
    cn->authenticated = true;
    cn->peer = peer;
    c_unlink_pending(cn);
    cn->next = NULL;
    c->peers[peer] = cn;
    rx_next_header(cn);
    conn_set_reading(cn, true);
    pthread_mutex_lock(&c->mu);
    if (++c->connected == c->size - 1) {
        c->mesh_ready = true;
        pthread_cond_broadcast(&c->cv_api);
    }
    pthread_mutex_unlock(&c->mu);
}

/* ---- connecting ------------------------------------------------------------ */

static dt_conn *conn_new(dt_comm *c)
{
    dt_conn *cn = calloc(1, sizeof *cn);
    if (!cn) return NULL;
    cn->comm = c;
    cn->peer = -1;
    cn->expect_peer = -1;
    cn->tcp.data = cn;
    cn->next = c->pending;
    c->pending = cn;
    return cn;
}

static void tune_socket(dt_comm *c, dt_conn *cn)
{
    int size = (int)c->socket_buffer;
    uv_tcp_nodelay(&cn->tcp, 1);
    uv_tcp_keepalive(&cn->tcp, 1, 10);
    uv_send_buffer_size((uv_handle_t *)&cn->tcp, &size);
    size = (int)c->socket_buffer;
    uv_recv_buffer_size((uv_handle_t *)&cn->tcp, &size);
}

static void format_addr(const struct sockaddr *sa, char *out, size_t n)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const void *)sa;
        uv_ip4_name(in, ip, sizeof ip);
        port = ntohs(in->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const void *)sa;
        uv_ip6_name(in6, ip, sizeof ip);
        port = ntohs(in6->sin6_port);
    }
    snprintf(out, n, "%s:%d", ip, port);
}

static void on_connected(uv_connect_t *req, int status)
{
    dt_conn *cn = req->data;
    dt_comm *c = cn->comm;
    if (cn->closing) return;
    if (status < 0) {
        /* Not listening yet, or a transient refusal: dial again soon. */
        cn->retry_at = dt_now() + 0.1;
        cn->rx_state = RX_STOPPED;
        conn_close(cn);
        dt_conn *again = conn_new(c);
        if (!again) { comm_fail(c, DT_ENOMEM, "rank %d: out of memory", c->rank); return; }
        again->outgoing = true;
        again->expect_peer = cn->expect_peer;
        again->dial_addr = cn->dial_addr;
        again->retry_at = cn->retry_at;
        again->deadline = cn->deadline;
        snprintf(again->addr, sizeof again->addr, "%s", cn->addr);
        return;
    }
    tune_socket(c, cn);
    handshake_start_outgoing(cn);
}

static void io_dial(dt_conn *cn)
{
    dt_comm *c = cn->comm;
    cn->retry_at = 0;
    uv_tcp_init(&c->loop, &cn->tcp);
    cn->has_handle = true;
    c->open_handles++;
    cn->connect_req.data = cn;
    int rc = uv_tcp_connect(&cn->connect_req, &cn->tcp, (struct sockaddr *)&cn->dial_addr,
                            on_connected);
    if (rc < 0) {
        comm_fail(c, DT_ESYS, "rank %d: connecting to rank %d (%s): %s", c->rank,
                  cn->expect_peer, cn->addr, uv_strerror(rc));
        conn_close(cn);
    }
}

static void io_connect_all(dt_comm *c)
{
    double deadline = dt_now() + c->init_timeout_s;
    for (int j = 0; j < c->rank; j++) {
        dt_conn *cn = conn_new(c);
        if (!cn) { comm_fail(c, DT_ENOMEM, "rank %d: out of memory", c->rank); return; }
        cn->outgoing = true;
        cn->expect_peer = j;
        cn->dial_addr = c->dial[j];
        cn->deadline = deadline;
        format_addr((struct sockaddr *)&cn->dial_addr, cn->addr, sizeof cn->addr);
        io_dial(cn);
    }
}

static void on_connection(uv_stream_t *server, int status)
{
    dt_comm *c = server->data;
    if (status < 0) return;
    dt_conn *cn = conn_new(c);
    if (!cn) return;
    uv_tcp_init(&c->loop, &cn->tcp);
    cn->has_handle = true;
    c->open_handles++;
    if (uv_accept(server, (uv_stream_t *)&cn->tcp) < 0) { conn_close(cn); return; }
    struct sockaddr_storage sa;
    int len = sizeof sa;
    if (uv_tcp_getpeername(&cn->tcp, (struct sockaddr *)&sa, &len) == 0)
        format_addr((struct sockaddr *)&sa, cn->addr, sizeof cn->addr);
    if (c->io_shutdown || c->io_failed_done) { conn_close(cn); return; }
    tune_socket(c, cn);
    cn->deadline = dt_now() + HANDSHAKE_TIMEOUT_S;
    handshake_start_incoming(cn);
}

/* ---- the loop's wake-ups ----------------------------------------------------- */

static void maybe_finish(dt_comm *c)
{
    if (!c->io_shutdown || c->open_handles > 0) return;
    if (!uv_is_closing((uv_handle_t *)&c->ticker)) uv_close((uv_handle_t *)&c->ticker, NULL);
    if (!uv_is_closing((uv_handle_t *)&c->wake)) uv_close((uv_handle_t *)&c->wake, NULL);
}

static void on_tick(uv_timer_t *t)
{
    dt_comm *c = t->data;
    double now = dt_now();
    for (dt_conn *cn = c->pending, *next; cn; cn = next) {
        next = cn->next;
        if (cn->closing) continue;
        if (cn->retry_at > 0 && now >= cn->retry_at && !c->io_failed_done) {
            if (now >= cn->deadline)
                comm_fail(c, DT_ETIMEDOUT, "rank %d: could not connect to rank %d at %s "
                          "within %.1f s", c->rank, cn->expect_peer, cn->addr,
                          c->init_timeout_s);
            else io_dial(cn);
        } else if (cn->retry_at == 0 && now >= cn->deadline) {
            if (cn->outgoing)
                comm_fail(c, DT_ETIMEDOUT, "rank %d: handshake with rank %d at %s did not "
                          "finish in time", c->rank, cn->expect_peer, cn->addr);
            else conn_reject(cn, "handshake not completed within %.0f s", HANDSHAKE_TIMEOUT_S);
        }
    }
    if (c->close_at > 0 && now >= c->close_at) close_all_conns(c);
    maybe_finish(c);
}

static void on_wake(uv_async_t *a)
{
    dt_comm *c = a->data;
    pthread_mutex_lock(&c->mu);
    dt_xfer *list = c->inbox_head;
    c->inbox_head = c->inbox_tail = NULL;
    bool connect = c->want_connect, fail = c->want_fail;
    c->want_connect = false;
    pthread_mutex_unlock(&c->mu);
    if (connect && !c->io_failed_done) io_connect_all(c);
    if (fail) io_fail_cleanup(c);
    while (list) {
        dt_xfer *x = list;
        list = x->next;
        io_post(c, x);
    }
    maybe_finish(c);
}

/* Called by the communicator thread as it exits: say BYE, close everything,
 * and run the loop until the last handle is closed. */
void transport_shutdown(dt_comm *c)
{
    io_shutdown(c);
    maybe_finish(c);
    uv_run(&c->loop, UV_RUN_DEFAULT);
}

/* ---- start and stop (API thread) ------------------------------------------- */

static dt_status bind_listener(dt_comm *c)
{
    struct sockaddr_storage sa;
    int rc = uv_ip4_addr(c->host, 0, (struct sockaddr_in *)&sa);
    if (rc < 0) rc = uv_ip6_addr(c->host, 0, (struct sockaddr_in6 *)&sa);
    if (rc < 0) {
        comm_fail(c, DT_EINVAL, "rank %d: host '%s' is not an IPv4 or IPv6 address", c->rank,
                  c->host);
        return DT_EINVAL;
    }
    uv_tcp_init(&c->loop, &c->listener);
    c->listener.data = c;
    c->listener_open = true;
    rc = uv_tcp_bind(&c->listener, (struct sockaddr *)&sa, 0);
    if (rc == 0) rc = uv_listen((uv_stream_t *)&c->listener, 128, on_connection);
    if (rc < 0) {
        comm_fail(c, DT_ESYS, "rank %d: cannot listen on %s: %s", c->rank, c->host,
                  uv_strerror(rc));
        return DT_ESYS;
    }
    int len = sizeof sa;
    uv_tcp_getsockname(&c->listener, (struct sockaddr *)&sa, &len);
    c->port = ntohs(sa.ss_family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port
                                             : ((struct sockaddr_in6 *)&sa)->sin6_port);
    return DT_OK;
}

dt_status transport_start(dt_comm *c)
{
    int rc = uv_loop_init(&c->loop);
    if (rc < 0) {
        comm_fail(c, DT_ESYS, "rank %d: uv_loop_init: %s", c->rank, uv_strerror(rc));
        return DT_ESYS;
    }
    c->loop_ready = true;
    uv_async_init(&c->loop, &c->wake, on_wake);
    c->wake.data = c;
    uv_timer_init(&c->loop, &c->ticker);
    c->ticker.data = c;
    uv_timer_start(&c->ticker, on_tick, TICK_MS, TICK_MS);
    dt_status st = c->size > 1 ? bind_listener(c) : DT_OK;
    atomic_store(&c->io_running, true); /* before the thread can fail anything */
    rc = uv_thread_create(&c->thread, comm_thread_main, c);
    if (rc < 0) {
        atomic_store(&c->io_running, false);
        comm_fail(c, DT_ESYS, "rank %d: cannot start the communicator thread: %s", c->rank,
                  uv_strerror(rc));
        return DT_ESYS;
    }
    return st;
}

void transport_connect(dt_comm *c)
{
    pthread_mutex_lock(&c->mu);
    c->want_connect = true;
    pthread_mutex_unlock(&c->mu);
    uv_async_send(&c->wake);
}

static void close_any(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

void transport_stop(dt_comm *c)
{
    if (atomic_load(&c->io_running)) {
        pthread_mutex_lock(&c->mu);
        c->stopping = true;
        pthread_mutex_unlock(&c->mu);
        uv_async_send(&c->wake);
        uv_thread_join(&c->thread);
        atomic_store(&c->io_running, false);
    }
    if (c->loop_ready) {
        /* Normally every handle is closed by now; if the thread never ran,
         * close what start created and let the loop finish the closes. */
        uv_walk(&c->loop, close_any, NULL);
        uv_run(&c->loop, UV_RUN_DEFAULT);
        uv_loop_close(&c->loop);
        c->loop_ready = false;
    }
}
