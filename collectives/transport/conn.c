/*
 * conn.c — what every layer of a connection shares, below the handshake
 * (handshake.c), the frames (transport_read.c, transport.c) and the mesh
 * (mesh.c): letting go of transfers, the next fixed-size unit to read,
 * stopping reads, watching the peer's host, and closing.
 *
 * A connection is closed once (comm_conn_close): its handle goes through
 * uv_close, and only in the close callback, when the loop can no longer
 * touch it, are the sends a peer refused released, its place in
 * tp->peers or tp->pending cleared and its memory freed. The last
 * handle closed during a shutdown closes the loop's own ticker and wake-up
 * handle, so the loop ends at once rather than at the next tick.
 *
 * Releasing hands a transfer back to its owner: a collective's to the op
 * running on this very thread, a p2p transfer's to its work handle, which
 * an API thread may be waiting on (under mu, with a wake-up). A transfer
 * released done is counted there, once, for dt_comm_traffic: every data
 * frame, collective or p2p, sent or received, passes through here (a send
 * once the socket has taken it whole, a receive once its payload is in).
 * Cost: nothing per frame beyond a release; one uv_close per connection.
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "conn.h"

/* A peer's host that stops answering (its link cut, its machine gone) is
 * declared dead by the kernel within about half the op timeout: keepalive
 * probes after `idle` s of silence, two more `idle` s apart, and
 * TCP_USER_TIMEOUT bounds how long sent bytes may stay unacknowledged. The
 * read then fails with ETIMEDOUT and the failure names that peer, before
 * any op's timeout could blame a healthy rank that is merely waiting behind
 * it. A live peer's kernel answers both while its process computes or is
 * stopped, so a busy rank is never taken for a dead one. Costs one 0-byte
 * probe per idle period on a silent connection. */
void comm_conn_watch_liveness(dt_conn *cn)
{
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&cn->tcp, &fd) != 0)
        return;
    double half = cn->tp->timeout_s / 2;
    int on = 1, idle = half >= 3 ? (int)(half / 3) : 1, probes = 2;
    unsigned user_ms = (unsigned)(half > 2 ? half * 1000 : 2000);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms);
}

/* Hand a transfer back to its owner. After this the loop never touches x.
 * A collective transfer's owner is the op running on this very thread; a
 * p2p transfer completes a work handle some API thread may be waiting on. */
void comm_conn_release_xfer(dt_transport *t, dt_xfer *x, int state)
{
    if (state == XFER_DONE) { /* dt_comm_traffic: a frame written or read whole */
        atomic_fetch_add_explicit(&t->traffic[x->is_send ? 0 : 1], x->len, memory_order_relaxed);
        atomic_fetch_add_explicit(&t->traffic[x->is_send ? 2 : 3], 1, memory_order_relaxed);
    }
    if (!x->work) {
        x->state = state;
        if (x->owner)
            x->owner->outstanding--;
        return;
    }
    pthread_mutex_lock(t->mu);
    x->state = state;
    dt_status st = DT_OK;
    if (state != XFER_DONE && (st = t->report->failure_locked(t->owner, NULL, 0)) == DT_OK)
        st = DT_EABORTED;
    t->report->work_done_locked(x->work, st);
    pthread_mutex_unlock(t->mu);
}

void comm_conn_release_list(dt_transport *t, dt_xfer *x)
{
    while (x) {
        dt_xfer *next = x->next;
        comm_conn_release_xfer(t, x, XFER_FAILED);
        x = next;
    }
}

void comm_conn_expect(dt_conn *cn, int state, size_t bytes)
{
    cn->rx_state = state;
    cn->rx_got = 0;
    cn->rx_need = bytes;
}

void comm_conn_stop_reading(dt_conn *cn)
{
    if (cn->closing || !cn->reading)
        return;
    cn->reading = false;
    uv_read_stop((uv_stream_t *)&cn->tcp);
}

void comm_conn_maybe_finish(dt_transport *t)
{
    if (!t->io_shutdown || t->open_handles > 0)
        return;
    if (!uv_is_closing((uv_handle_t *)&t->ticker))
        uv_close((uv_handle_t *)&t->ticker, NULL);
    if (!uv_is_closing((uv_handle_t *)&t->wake))
        uv_close((uv_handle_t *)&t->wake, NULL);
}

void comm_conn_unlink_pending(dt_conn *cn)
{
    for (dt_conn **pp = &cn->tp->pending; *pp; pp = &(*pp)->next)
        if (*pp == cn) {
            *pp = cn->next;
            break;
        }
}

static void on_conn_closed(uv_handle_t *h)
{
    dt_conn *cn = h->data;
    dt_transport *t = cn->tp;
    comm_conn_release_list(t, cn->failed_sends);
    if (cn->peer >= 0 && t->peers[cn->peer] == cn)
        t->peers[cn->peer] = NULL;
    comm_conn_unlink_pending(cn);
    t->open_handles--;
    free(cn);
    comm_conn_maybe_finish(t); /* the last one closed: a shutdown ends now, not at the next tick */
}

void comm_conn_close(dt_conn *cn)
{
    if (cn->closing)
        return;
    cn->closing = true;
    cn->rx_state = RX_STOPPED;
    if (cn->has_handle) {
        uv_close((uv_handle_t *)&cn->tcp, on_conn_closed);
        return;
    }
    /* A connection waiting to redial has no handle to close. */
    comm_conn_unlink_pending(cn);
    free(cn);
}
