/*
 * executor.c — how an op runs: in order, as sequential code, on the thread
 * that holds the event loop.
 *
 * dt_submit gives each collective the next sequence number and queues it;
 * dt_run (blocking) runs it on the caller's thread instead when nothing is
 * queued and the loop is free (comm_thread.c decides who runs the loop).
 * Either way run_collective runs the algorithm as plain sequential code
 * (algorithms.h): posting a transfer hands it to the transport directly, and
 * waiting for one means running the libuv loop (uv_run, UV_RUN_ONCE) until
 * the transfer is done. Because every rank submits the same collectives in
 * the same order, op #n meets op #n.
 *
 * Why the thread that runs the op also moves its bytes, instead of an
 * executor beside an I/O thread: a transfer then costs no thread hand-off
 * (a hand-off is two futex wake-ups and, on a loaded machine, a scheduler
 * time slice each way). The price is that the loop does not read sockets
 * while a segment is being reduced; the kernel's socket buffers (autotuned,
 * several MiB on loopback) keep the bytes flowing meanwhile.
 *
 * Tagged send/recv do not queue here: they are not ordered against
 * collectives (Gloo's semantics), so dt_submit posts their one transfer
 * through the transport's inbox, and the transfer completes the work handle.
 *
 * Timeouts: the waiter owns the deadline. A collective gets op->timeout_s
 * (or the communicator's default) checked between loop iterations (the
 * loop's 20 ms ticker bounds how late); dt_work_wait does the same for p2p.
 * A missed deadline fails the communicator, because after a partial op the
 * byte streams between ranks no longer line up.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algorithms.h"
#include "comm_internal.h"
#include "staging.h"

void comm_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline)
{
    struct timespec ts;
    double whole = (double)(long long)deadline;
    ts.tv_sec = (time_t)whole;
    ts.tv_nsec = (long)((deadline - whole) * 1e9);
    pthread_cond_timedwait(cv, mu, &ts);
}

void work_complete(dt_work *w, dt_status st)
{
    w->status = st;
    w->done = true;
    if (w->op.kind == DT_OP_SEND || w->op.kind == DT_OP_RECV) w->comm->p2p_outstanding--;
    pthread_cond_broadcast(&w->comm->cv_api);
}

/* ---- transfers, as algorithms see them ------------------------------------ */

static void xfer_prepare(dt_opctx *o, dt_xfer *x, int peer, void *buf, size_t len,
                         uint32_t index)
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

void xfer_send(dt_opctx *o, dt_xfer *x, int peer, const void *buf, size_t len)
{
    xfer_prepare(o, x, peer, (void *)buf, len, o->sent_index[peer]++);
    x->is_send = 1;
    transport_post_here(o->comm, x);
}

void xfer_recv(dt_opctx *o, dt_xfer *x, int peer, void *buf, size_t len)
{
    xfer_prepare(o, x, peer, buf, len, o->recv_index[peer]++);
    x->is_send = 0;
    transport_post_here(o->comm, x);
}

static void op_timed_out(dt_opctx *o, dt_xfer *x)
{
    dt_comm *c = o->comm;
    comm_fail(c, DT_ETIMEDOUT, "rank %d: timed out after %.1f s waiting to %s %zu B %s rank "
              "%d (%s)", c->rank, o->op->timeout_s > 0 ? o->op->timeout_s : c->timeout_s,
              x->is_send ? "send" : "receive", x->len, x->is_send ? "to" : "from", x->peer,
              c->peer_addr[x->peer]);
}

dt_status xfer_wait(dt_opctx *o, dt_xfer *x)
{
    dt_comm *c = o->comm;
    bool fired = false;
    while (x->state == XFER_POSTED) {
        double now = dt_now();
        if (!fired && now >= o->deadline) {
            fired = true;
            op_timed_out(o, x); /* the loop then fails x along with the rest */
        }
        if (c->fail_deferred && now >= c->deferred_until)
            comm_fail_deferred(c); /* a peer's failure, held back (transport.c) */
        uv_run(&c->loop, UV_RUN_ONCE);
    }
    if (x->state == XFER_DONE) return DT_OK;
    pthread_mutex_lock(&c->mu);
    dt_status st = c->failed ? c->fail_status : DT_EABORTED;
    pthread_mutex_unlock(&c->mu);
    return st;
}

dt_status xfer_wait_all(dt_opctx *o, dt_xfer *xs, int n)
{
    dt_status first = DT_OK;
    for (int i = 0; i < n; i++) {
        dt_status st = xfer_wait(o, &xs[i]);
        if (st != DT_OK && first == DT_OK) first = st;
    }
    return first;
}

void xfer_drain(dt_opctx *o)
{
    while (o->outstanding > 0) uv_run(&o->comm->loop, UV_RUN_ONCE);
}

void *opctx_scratch(dt_opctx *o, int slot, size_t bytes)
{
    dt_comm *c = o->comm;
    if (bytes > c->scratch_cap[slot]) {
        void *p = realloc(c->scratch[slot], bytes);
        if (!p) return NULL;
        c->scratch[slot] = p;
        c->scratch_cap[slot] = bytes;
    }
    return c->scratch[slot];
}

/* ---- running one collective ------------------------------------------------- */

static uint64_t wire_count(const dt_comm *c, const dt_op *op)
{
    if (op->kind != DT_OP_ALLGATHERV) return op->count;
    uint64_t sum = 0;
    for (int r = 0; r < c->size; r++) sum += op->counts[r];
    return sum;
}

dt_status run_collective(dt_comm *c, dt_work *w)
{
    dt_opctx o = {
        .comm = c, .op = &w->op, .seq = w->seq, .wire_count = wire_count(c, &w->op),
        .rank = c->rank, .size = c->size,
        .deadline = dt_now() + (w->op.timeout_s > 0 ? w->op.timeout_s : c->timeout_s),
        .sent_index = c->sent_index, .recv_index = c->recv_index,
    };
    memset(c->sent_index, 0, sizeof *c->sent_index * (size_t)c->size);
    memset(c->recv_index, 0, sizeof *c->recv_index * (size_t)c->size);
    dt_status st = w->staged ? staging_run(&o) : algo_run(&o);
    if (st != DT_OK) {
        /* Peers may be waiting on us mid-op: a local failure fails the job. */
        pthread_mutex_lock(&c->mu);
        bool failed = c->failed;
        pthread_mutex_unlock(&c->mu);
        if (!failed)
            comm_fail(c, st, "rank %d: %s #%llu failed locally: %s", c->rank,
                      dt_op_name(w->op.kind), (unsigned long long)w->seq, dt_status_name(st));
    }
    xfer_drain(&o);
    if (st != DT_OK) {
        pthread_mutex_lock(&c->mu);
        st = c->fail_status;
        pthread_mutex_unlock(&c->mu);
    }
    return st;
}

/* ---- submitting and waiting (API thread) ------------------------------------- */

static void post_p2p(dt_comm *c, dt_work *w)
{
    dt_xfer *x = &w->xfer;
    const dt_op *op = &w->op;
    size_t bytes = op->count * dt_dtype_size(op->dtype);
    memset(x, 0, sizeof *x);
    x->hdr.kind = FRAME_P2P;
    x->hdr.op = (uint8_t)op->kind;
    x->hdr.dtype = (uint8_t)op->dtype;
    x->hdr.root = -1;
    x->hdr.index = op->tag;
    x->hdr.seq = w->seq;
    x->hdr.count = op->count;
    x->hdr.length = bytes;
    x->is_send = op->kind == DT_OP_SEND;
    x->buf = x->is_send ? (char *)op->send : (char *)op->recv;
    x->len = bytes;
    x->peer = op->peer;
    x->work = w;
    x->source = -1;
    transport_post(c, x);
}

dt_status comm_check_op(dt_comm *c, const dt_op *op); /* validate.c */

/* A work for op, with the fields its kind ignores normalised, so every rank
 * puts the same identity in its frame headers. */
void work_prepare(dt_comm *c, dt_work *w, const dt_op *op)
{
    w->comm = c;
    w->op = *op;
    if (op->kind != DT_OP_REDUCE && op->kind != DT_OP_ALLREDUCE &&
        op->kind != DT_OP_REDUCE_SCATTER)
        w->op.redop = DT_SUM;
    if (op->kind != DT_OP_BROADCAST && op->kind != DT_OP_REDUCE && op->kind != DT_OP_GATHER &&
        op->kind != DT_OP_SCATTER)
        w->op.root = -1;
    w->staged = staging_wants(c, op);
}

dt_status dt_submit(dt_comm *c, const dt_op *op, dt_work **work)
{
    *work = NULL;
    dt_status st = comm_check_op(c, op);
    if (st != DT_OK) return st;
    dt_work *w = calloc(1, sizeof *w);
    if (!w) return DT_ENOMEM;
    work_prepare(c, w, op);
    if (w->staged && (op->kind == DT_OP_SEND || op->kind == DT_OP_RECV) &&
        (st = staging_p2p_begin(c, w)) != DT_OK) {
        free(w);
        return st;
    }
    *work = w;
    if (op->kind == DT_OP_SEND || op->kind == DT_OP_RECV) {
        w->deadline = dt_now() + (op->timeout_s > 0 ? op->timeout_s : c->timeout_s);
        pthread_mutex_lock(&c->mu);
        w->seq = c->p2p_seq++;
        c->p2p_outstanding++;
        pthread_mutex_unlock(&c->mu);
        post_p2p(c, w);
        return DT_OK;
    }
    pthread_mutex_lock(&c->mu);
    w->seq = c->next_seq++;
    if (c->q_tail) c->q_tail->next = w;
    else c->q_head = w;
    c->q_tail = w;
    pthread_mutex_unlock(&c->mu);
    comm_kick(c);
    return DT_OK;
}

static void p2p_timed_out(dt_comm *c, dt_work *w)
{
    const dt_op *op = &w->op;
    double t = op->timeout_s > 0 ? op->timeout_s : c->timeout_s;
    if (op->kind == DT_OP_SEND)
        comm_fail(c, DT_ETIMEDOUT, "rank %d: send #%llu with tag %u to rank %d (%s) timed out "
                  "after %.1f s", c->rank, (unsigned long long)w->seq, op->tag, op->peer,
                  c->peer_addr[op->peer], t);
    else if (op->peer == DT_ANY_SOURCE)
        comm_fail(c, DT_ETIMEDOUT, "rank %d: recv #%llu with tag %u from any rank timed out "
                  "after %.1f s", c->rank, (unsigned long long)w->seq, op->tag, t);
    else
        comm_fail(c, DT_ETIMEDOUT, "rank %d: recv #%llu with tag %u from rank %d (%s) timed "
                  "out after %.1f s", c->rank, (unsigned long long)w->seq, op->tag, op->peer,
                  c->peer_addr[op->peer], t);
}

dt_status dt_work_wait(dt_work *w)
{
    dt_comm *c = w->comm;
    bool p2p = w->op.kind == DT_OP_SEND || w->op.kind == DT_OP_RECV, fired = false;
    pthread_mutex_lock(&c->mu);
    while (!w->done) {
        if (p2p && !fired && dt_now() >= w->deadline) {
            fired = true;
            pthread_mutex_unlock(&c->mu);
            p2p_timed_out(c, w);
            pthread_mutex_lock(&c->mu);
            continue;
        }
        if (p2p) comm_wait_until(&c->cv_api, &c->mu, fired ? dt_now() + 0.05 : w->deadline);
        else pthread_cond_wait(&c->cv_api, &c->mu);
    }
    dt_status st = w->status;
    pthread_mutex_unlock(&c->mu);
    if (w->op.kind == DT_OP_RECV && w->op.source) *w->op.source = w->xfer.source;
    st = staging_p2p_end(w, st);
    free(w);
    return st;
}

bool dt_work_test(dt_work *w)
{
    pthread_mutex_lock(&w->comm->mu);
    bool done = w->done;
    pthread_mutex_unlock(&w->comm->mu);
    return done;
}

/* Blocking: a collective runs on this thread when the loop is free (no
 * hand-off at all), otherwise it queues behind what is running. */
dt_status dt_run(dt_comm *c, const dt_op *op)
{
    if (op->kind != DT_OP_SEND && op->kind != DT_OP_RECV) {
        dt_status st = comm_check_op(c, op);
        if (st != DT_OK) return st;
        dt_work w = {0};
        work_prepare(c, &w, op);
        if (comm_run_inline(c, &w, &st)) return st;
    }
    dt_work *w;
    dt_status st = dt_submit(c, op, &w);
    return st == DT_OK ? dt_work_wait(w) : st;
}
