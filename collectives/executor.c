/*
 * executor.c — how an op runs: in order, as sequential code, on the thread
 * that holds the event loop.
 *
 * dt_submit gives each collective the next sequence number and queues it;
 * dt_run (blocking) runs it on the caller's thread instead when nothing is
 * queued and the loop is free (comm_thread.c decides who runs the loop).
 * Either way comm_executor_run runs the algorithm as plain sequential code
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

/* ---- running one collective ------------------------------------------------- */

static uint64_t wire_count(const dt_comm *c, const dt_op *op)
{
    if (op->kind != DT_OP_ALLGATHERV) return op->count;
    uint64_t sum = 0;
    for (int r = 0; r < c->size; r++) sum += op->counts[r];
    return sum;
}

dt_status comm_executor_run(dt_comm *c, dt_work *w)
{
    dt_opctx o = {
        .comm = c, .op = &w->op, .seq = w->seq, .wire_count = wire_count(c, &w->op),
        .rank = c->rank, .size = c->size,
        .deadline = dt_now() + (w->op.timeout_s > 0 ? w->op.timeout_s : c->timeout_s),
        .sent_index = c->sent_index, .recv_index = c->recv_index,
    };
    memset(c->sent_index, 0, sizeof *c->sent_index * (size_t)c->size);
    memset(c->recv_index, 0, sizeof *c->recv_index * (size_t)c->size);
    dt_status st = w->staged ? comm_staging_run(&o) : comm_algo_run(&o);
    if (st != DT_OK) {
        /* Peers may be waiting on us mid-op: a local failure fails the job. */
        pthread_mutex_lock(&c->mu);
        bool failed = c->failed;
        pthread_mutex_unlock(&c->mu);
        if (!failed)
            comm_fail(c, st, "rank %d: %s #%llu failed locally: %s", c->rank,
                      dt_op_name(w->op.kind), (unsigned long long)w->seq, dt_status_name(st));
    }
    comm_xfer_drain(&o);
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
    comm_transport_post(c, x);
}


/* A work for op, with the fields its kind ignores normalised, so every rank
 * puts the same identity in its frame headers. */
void comm_executor_prepare(dt_comm *c, dt_work *w, const dt_op *op)
{
    w->comm = c;
    w->op = *op;
    if (op->kind != DT_OP_REDUCE && op->kind != DT_OP_ALLREDUCE &&
        op->kind != DT_OP_REDUCE_SCATTER)
        w->op.redop = DT_SUM;
    if (op->kind != DT_OP_BROADCAST && op->kind != DT_OP_REDUCE && op->kind != DT_OP_GATHER &&
        op->kind != DT_OP_SCATTER)
        w->op.root = -1;
    w->staged = comm_staging_wants(c, op);
}

dt_status dt_submit(dt_comm *c, const dt_op *op, dt_work **work)
{
    *work = NULL;
    dt_status st = comm_validate_op(c, op);
    if (st != DT_OK) return st;
    dt_work *w = calloc(1, sizeof *w);
    if (!w) return DT_ENOMEM;
    comm_executor_prepare(c, w, op);
    if (w->staged && (op->kind == DT_OP_SEND || op->kind == DT_OP_RECV) &&
        (st = comm_staging_p2p_begin(c, w)) != DT_OK) {
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
    comm_wake_thread(c);
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
        if (p2p) comm_wake_wait_until(&c->cv_api, &c->mu, fired ? dt_now() + 0.05 : w->deadline);
        else pthread_cond_wait(&c->cv_api, &c->mu);
    }
    dt_status st = w->status;
    pthread_mutex_unlock(&c->mu);
    if (w->op.kind == DT_OP_RECV && w->op.source) *w->op.source = w->xfer.source;
    st = comm_staging_p2p_end(w, st);
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
        dt_status st = comm_validate_op(c, op);
        if (st != DT_OK) return st;
        dt_work w = {0};
        comm_executor_prepare(c, &w, op);
        if (comm_thread_run_inline(c, &w, &st)) return st;
    }
    dt_work *w;
    dt_status st = dt_submit(c, op, &w);
    return st == DT_OK ? dt_work_wait(w) : st;
}
