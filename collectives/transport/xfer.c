/*
 * xfer.c — the transfers of a collective, as its algorithm sees them
 * (xfer.h): post a send or a receive, wait for it, drain what is left.
 *
 * Posting fills the frame header with the op's identity and the next
 * message index for that peer, then hands the transfer to the transport
 * (transport.c) on this thread: no queue, no wake-up. Waiting runs the libuv
 * loop one iteration at a time until the transfer is done or failed, and
 * owns the op's progress deadline: a transfer still pending at it fails the
 * communicator (after a partial op the byte streams no longer line up). A
 * peer that went silent fails it sooner, at the liveness limit: the loop's
 * ticker checks that (heartbeat.c).
 * Cost: a post is a header fill plus, usually, one writev or nothing (a
 * receive waits in the read-ahead or for its frame); a wait is one
 * uv_run(UV_RUN_ONCE), an epoll_wait, per wake-up.
 */
#include <stdlib.h>
#include <string.h>

#include "xfer.h"

static void xfer_prepare(dt_opctx *o, dt_xfer *x, int peer, void *buf, size_t len, uint32_t index)
{
    const dt_op *op = o->op;
    memset(&x->hdr, 0, sizeof x->hdr);
    x->hdr.kind = FRAME_COLL;
    x->hdr.op = (uint8_t)op->kind;
    x->hdr.dtype = (uint8_t)op->dtype;
    x->hdr.redop = (uint8_t)op->redop;
    x->hdr.root = op->root;
    x->hdr.index = index;
    x->hdr.seq = o->seq;
    x->hdr.count = o->wire_count;
    x->hdr.length = len;
    x->buf = buf;
    x->len = len;
    x->peer = peer;
    x->owner = o;
    x->work = NULL;
}

void comm_xfer_send(dt_opctx *o, dt_xfer *x, int peer, const void *buf, size_t len)
{
    xfer_prepare(o, x, peer, (void *)buf, len, o->sent_index[peer]++);
    x->is_send = 1;
    comm_transport_post_here(o->tp, x);
}

void comm_xfer_recv(dt_opctx *o, dt_xfer *x, int peer, void *buf, size_t len)
{
    xfer_prepare(o, x, peer, buf, len, o->recv_index[peer]++);
    x->is_send = 0;
    comm_transport_post_here(o->tp, x);
}

/* The op reached its progress limit: name the ranks that have not joined
 * it (heartbeat.c knows where each peer is), not merely the one waited on. */
static void op_timed_out(dt_opctx *o, dt_xfer *x)
{
    dt_transport *t = o->tp;
    char who[DT_ERROR_MAX / 2];
    comm_heartbeat_absent(t, o->seq, x->peer, who, sizeof who);
    t->report->fail(t->owner, DT_ETIMEDOUT,
                    "rank %d: %s #%llu timed out after %.1f s (progress limit: "
                    "DT_PROGRESS_TIMEOUT or the op's timeout) waiting to %s %zu B %s rank %d: %s",
                    t->rank, dt_op_name(o->op->kind), (unsigned long long)o->seq,
                    o->op->timeout_s > 0 ? o->op->timeout_s : t->progress_timeout_s,
                    x->is_send ? "send" : "receive", x->len, x->is_send ? "to" : "from", x->peer,
                    who);
}

dt_status comm_xfer_wait(dt_opctx *o, dt_xfer *x)
{
    dt_transport *t = o->tp;
    bool fired = false;
    while (x->state == XFER_POSTED) {
        double now = dt_now();
        if (!fired && now >= o->deadline) {
            fired = true;
            op_timed_out(o, x); /* the loop then fails x along with the rest */
        }
        if (t->fail_deferred && now >= t->deferred_until)
            t->report->fail_deferred(t->owner); /* a peer's failure, held back (transport_read.c) */
        uv_run(&t->loop, UV_RUN_ONCE);
    }
    if (x->state == XFER_DONE)
        return DT_OK;
    pthread_mutex_lock(t->mu);
    dt_status st = t->report->failure_locked(t->owner, NULL, 0);
    pthread_mutex_unlock(t->mu);
    return st != DT_OK ? st : DT_EABORTED;
}

dt_status comm_xfer_wait_all(dt_opctx *o, dt_xfer *xs, int n)
{
    dt_status first = DT_OK;
    for (int i = 0; i < n; i++) {
        dt_status st = comm_xfer_wait(o, &xs[i]);
        if (st != DT_OK && first == DT_OK)
            first = st;
    }
    return first;
}

void comm_xfer_drain(dt_opctx *o)
{
    while (o->outstanding > 0)
        uv_run(&o->tp->loop, UV_RUN_ONCE);
}

void *comm_xfer_scratch(dt_opctx *o, int slot, size_t bytes)
{
    dt_transport *t = o->tp;
    if (bytes > t->scratch_cap[slot]) {
        void *p = realloc(t->scratch[slot], bytes);
        if (!p)
            return NULL;
        t->scratch[slot] = p;
        t->scratch_cap[slot] = bytes;
    }
    return t->scratch[slot];
}
