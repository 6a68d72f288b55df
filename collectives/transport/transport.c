/*
 * transport.c — frames out, and transfers posted: moving bytes from the
 * buffers ops posted onto the mesh's TCP connections, and handing each
 * posted receive to the reader (transport_read.c), on the communicator
 * thread's libuv loop.
 *
 * A send is one frame, header and payload written together (writev):
 * uv_try_write first, so a frame the socket takes at once needs no request
 * and no callback; the rest queues in a uv_write. A receive is queued for
 * the reader: a collective one per peer, in order; a tagged p2p one in the
 * communicator's list, matched by (source or any, tag), oldest first. A
 * header that arrived before its receive was posted is matched again now.
 *
 * Posting: the op's runner holds the loop and posts here directly
 * (comm_transport_post_here); any other thread (dt_submit's p2p) appends to
 * the inbox under the communicator's lock (*mu) and has the communicator
 * thread woken (comm_transport_post, report.h's wake_thread).
 *
 * Failure (mesh.c does the work): a write error, a timeout noticed by the
 * op's runner, or dt_comm_abort all end in the communicator's comm_fail
 * (the transport's through report.h's fail). The first failure is
 * recorded; the loop then lets go of every posted receive, sends each peer
 * an ABORT frame carrying the reason (comm_transport_send_control: so a
 * rank that only sees the cascade still learns the root cause), and closes
 * every connection after a short grace period, which also cancels sends
 * still in flight. A send the peer refused while its connection is still
 * being read waits for the reader's verdict: the peer's ABORT, if it sent
 * one, names the root cause better than our EPIPE.
 *
 * Cost per frame: one write of header+payload; a receive costs nothing
 * here beyond linking it into a list.
 */
#include <stdlib.h>
#include <string.h>

#include "conn.h"

/* ---- writing --------------------------------------------------------------- */

/* Is this connection being read, so that what the peer said last (an ABORT
 * naming the root cause, or its EOF) will surface by itself? */
static bool reading_now(const dt_conn *cn)
{
    return !cn->closing &&
           (cn->rx_state == RX_HEADER || cn->rx_state == RX_PAYLOAD || cn->rx_state == RX_NOTICE);
}

/* A send finished with status (0 or a libuv error): let go of it. */
static void send_finished(dt_conn *cn, dt_xfer *x, int status)
{
    dt_transport *t = cn->tp;
    if (status < 0 && status != UV_ECANCELED && !t->io_failed_done) {
        if (reading_now(cn)) {
            /* The peer closed on us. If it failed first, its ABORT frame is
             * still in our receive queue: let the reader report that root
             * cause; the send is let go of with everything else. */
            x->next = cn->failed_sends;
            cn->failed_sends = x;
            return;
        }
        t->report->fail(t->owner, DT_EPEER,
                        "rank %d: sending to rank %d (%s) failed: %s; rank %d died or "
                        "its process was killed",
                        t->rank, cn->peer, cn->addr, uv_strerror(status), cn->peer);
    }
    comm_conn_release_xfer(t, x, status == 0 ? XFER_DONE : XFER_FAILED);
}

static void on_send_done(uv_write_t *req, int status)
{
    send_finished(req->handle->data, req->data, status);
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
void comm_transport_send_control(dt_conn *cn, uint8_t kind, uint64_t seq, const void *payload,
                                 size_t len)
{
    if (cn->closing || cn->lost || !cn->authenticated)
        return;
    owned_write *w = malloc(sizeof *w + len);
    if (!w)
        return;
    memset(&w->hdr, 0, sizeof w->hdr);
    w->hdr.kind = kind;
    w->hdr.root = -1;
    w->hdr.seq = seq;
    w->hdr.length = len;
    if (len)
        memcpy(w->payload, payload, len);
    w->req.data = w;
    uv_buf_t bufs[2] = {uv_buf_init((char *)&w->hdr, sizeof w->hdr),
                        uv_buf_init(w->payload, (unsigned)len)};
    if (uv_write(&w->req, (uv_stream_t *)&cn->tcp, bufs, len ? 2 : 1, on_owned_write_done) < 0)
        free(w);
}

/* ---- posting (loop side) ------------------------------------------------- */

static dt_conn *peer_conn(dt_transport *t, dt_xfer *x, const char *what)
{
    dt_conn *cn = t->peers[x->peer];
    if (cn && !cn->lost && !cn->closing && !cn->bye)
        return cn;
    t->report->fail(t->owner, DT_EPEER, "rank %d: cannot %s rank %d: %s", t->rank, what, x->peer,
                    cn && cn->bye ? "it destroyed its communicator" : "its connection is gone");
    return NULL;
}

static void io_send(dt_transport *t, dt_xfer *x)
{
    dt_conn *cn = peer_conn(t, x, "send to");
    if (!cn) {
        comm_conn_release_xfer(t, x, XFER_FAILED);
        return;
    }
    uv_buf_t bufs[2] = {uv_buf_init((char *)&x->hdr, sizeof x->hdr),
                        uv_buf_init(x->buf, (unsigned)x->len)};
    uv_buf_t *b = bufs;
    int nb = x->len ? 2 : 1;
    /* Write what the socket takes now, without a request: a small frame
     * then needs no callback and no epoll_ctl (libuv re-arms the socket
     * after every completed request). UV_EAGAIN: nothing went, or earlier
     * writes still queue (try_write never jumps the queue). */
    int sent = uv_try_write((uv_stream_t *)&cn->tcp, b, (unsigned)nb);
    if (sent < 0 && sent != UV_EAGAIN) {
        send_finished(cn, x, sent);
        return;
    }
    for (size_t left = sent > 0 ? (size_t)sent : 0; left > 0 && nb > 0;) {
        size_t k = left < b->len ? left : b->len;
        b->base += k;
        b->len -= k;
        left -= k;
        if (b->len == 0) {
            b++;
            nb--;
        }
    }
    if (nb == 0) {
        send_finished(cn, x, 0);
        return;
    }
    x->write_req.data = x;
    int rc = uv_write(&x->write_req, (uv_stream_t *)&cn->tcp, b, (unsigned)nb, on_send_done);
    if (rc < 0) {
        t->report->fail(t->owner, DT_EPEER, "rank %d: writing to rank %d (%s) failed: %s", t->rank,
                        cn->peer, cn->addr, uv_strerror(rc));
        comm_conn_release_xfer(t, x, XFER_FAILED);
    }
}

static void io_recv(dt_transport *t, dt_xfer *x)
{
    x->next = NULL;
    if (x->hdr.kind == FRAME_P2P) {
        /* A peer that said BYE or hung up has nothing parked here (frames
         * are parsed in order, BYE last), so nothing more can ever match. */
        if (x->peer != DT_ANY_SOURCE && !peer_conn(t, x, "receive from")) {
            comm_conn_release_xfer(t, x, XFER_FAILED);
            return;
        }
        if (t->p2p_tail)
            t->p2p_tail->next = x;
        else
            t->p2p_head = x;
        t->p2p_tail = x;
        for (int p = 0; p < t->size; p++) {
            dt_conn *cn = t->peers[p];
            if (cn && cn->rx_state == RX_WAIT_MATCH && cn->rx_hdr.kind == FRAME_P2P)
                comm_transport_read_header(cn);
        }
        return;
    }
    dt_conn *cn = peer_conn(t, x, "receive from");
    if (!cn) {
        comm_conn_release_xfer(t, x, XFER_FAILED);
        return;
    }
    if (cn->coll_tail)
        cn->coll_tail->next = x;
    else
        cn->coll_head = x;
    cn->coll_tail = x;
    if (cn->rx_state == RX_WAIT_MATCH)
        comm_transport_read_header(cn);
}

void comm_transport_io_post(dt_transport *t, dt_xfer *x)
{
    x->next = NULL;
    if (t->io_failed_done || t->io_shutdown)
        comm_conn_release_xfer(t, x, XFER_FAILED);
    else if (x->is_send)
        io_send(t, x);
    else
        io_recv(t, x);
}

void comm_transport_post_here(dt_transport *t, dt_xfer *x)
{
    x->state = XFER_POSTED;
    x->done = 0;
    if (x->owner)
        x->owner->outstanding++;
    comm_transport_io_post(t, x);
}

void comm_transport_post(dt_transport *t, dt_xfer *x)
{
    x->state = XFER_POSTED;
    x->done = 0;
    x->next = NULL;
    pthread_mutex_lock(t->mu);
    if (t->inbox_tail)
        t->inbox_tail->next = x;
    else
        t->inbox_head = x;
    t->inbox_tail = x;
    pthread_mutex_unlock(t->mu);
    t->report->wake_thread(t->owner);
}
