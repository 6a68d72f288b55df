/*
 * work.c — a work handle's life on the API thread: submitted, run inline,
 * waited for (dt_submit, dt_run, dt_work_wait, dt_work_test).
 *
 * dt_submit checks the op (validate.c), gives each collective the next
 * sequence number and queues it for the communicator thread; dt_run
 * (blocking) runs it on the caller's thread instead when nothing is queued
 * and the loop is free (comm_thread.c), which saves the two hand-offs of
 * submitting and completing. Either way the op runs in comm_executor_run
 * (executor.c), in submission order.
 *
 * Tagged send/recv do not queue: they are not ordered against collectives
 * (Gloo's semantics), so dt_submit posts their one transfer (post_p2p):
 * itself when the loop is free, else through the transport's inbox
 * (comm_thread_post_p2p), and the transfer completes the work handle.
 * On the gloo wire they queue, and the executor only posts them
 * (p2p_gloo.c): the gloo context belongs to whoever runs ops.
 * Their waiter owns the deadline: dt_work_wait fails the communicator when
 * it passes, as an op's runner does for a collective.
 *
 * Cost: one allocation per submitted op (none for dt_run inline), a mutex
 * or two, and a wake-up of the communicator thread for a queued one.
 */
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "staging.h"

/* How long a send or receive may wait: the op's own timeout, else the
 * progress limit (a stopped peer is named sooner, by the liveness clock);
 * the gloo wire has no heartbeat and so one clock only, DT_TIMEOUT. */
static double p2p_limit(const dt_comm *c, const dt_op *op)
{
    if (op->timeout_s > 0)
        return op->timeout_s;
    return c->gloo_wire ? c->timeout_s : c->progress_timeout_s;
}

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
    comm_thread_post_p2p(c, x);
}

/* A work for op, with the fields its kind ignores normalised, so every rank
 * puts the same identity in its frame headers. */
static void prepare(dt_comm *c, dt_work *w, const dt_op *op)
{
    w->comm = c;
    w->op = *op;
    if (op->kind != DT_OP_REDUCE && op->kind != DT_OP_ALLREDUCE && op->kind != DT_OP_REDUCE_SCATTER)
        w->op.redop = DT_SUM;
    if (op->kind != DT_OP_BROADCAST && op->kind != DT_OP_REDUCE && op->kind != DT_OP_GATHER &&
        op->kind != DT_OP_SCATTER)
        w->op.root = -1;
    w->staged = comm_staging_wants(&c->stager, op);
}

/* Appends w to the executor's queue; unlocks mu (held on entry). */
static void queue(dt_comm *c, dt_work *w)
{
    if (c->q_tail)
        c->q_tail->next = w;
    else
        c->q_head = w;
    c->q_tail = w;
    pthread_mutex_unlock(&c->mu);
    comm_wake_thread(c);
}

dt_status dt_submit(dt_comm *c, const dt_op *op, dt_work **work)
{
    *work = NULL;
    dt_status st = comm_validate_op(c, op);
    if (st != DT_OK)
        return st;
    dt_work *w = calloc(1, sizeof *w);
    if (!w)
        return DT_ENOMEM;
    prepare(c, w, op);
    if (w->staged && (op->kind == DT_OP_SEND || op->kind == DT_OP_RECV) &&
        (st = comm_staging_p2p_begin(&c->stager, &w->op, &w->staged, &w->p2p_device)) != DT_OK) {
        free(w);
        return st;
    }
    *work = w;
    if (op->kind == DT_OP_SEND || op->kind == DT_OP_RECV) {
        w->deadline = dt_now() + p2p_limit(c, op);
        pthread_mutex_lock(&c->mu);
        w->seq = c->p2p_seq++;
        c->p2p_outstanding++;
        if (c->gloo) { /* in order with the ops: the executor posts it (p2p_gloo.c) */
            queue(c, w);
            return DT_OK;
        }
        pthread_mutex_unlock(&c->mu);
        post_p2p(c, w);
        return DT_OK;
    }
    pthread_mutex_lock(&c->mu);
    w->seq = c->next_seq++;
    queue(c, w);
    return DT_OK;
}

/* A send or receive reached its progress limit. A peer that is stopped or
 * gone is named sooner, at the liveness limit (transport/heartbeat.c), so
 * the one named here was alive and did not post its side. */
static void p2p_timed_out(dt_comm *c, dt_work *w)
{
    const dt_op *op = &w->op;
    double t = p2p_limit(c, op);
    const char *limit = op->timeout_s > 0 ? "the op's timeout"
                        : c->gloo_wire    ? "DT_TIMEOUT: the gloo wire's one clock"
                                          : "progress limit: DT_PROGRESS_TIMEOUT";
    if (op->kind == DT_OP_SEND)
        comm_fail(c, DT_ETIMEDOUT,
                  "rank %d: send #%llu with tag %u to rank %d (%s) timed out after %.1f s (%s): "
                  "rank %d never posted the matching receive",
                  c->rank, (unsigned long long)w->seq, op->tag, op->peer, c->tp.peer_addr[op->peer],
                  t, limit, op->peer);
    else if (op->peer == DT_ANY_SOURCE)
        comm_fail(c, DT_ETIMEDOUT,
                  "rank %d: recv #%llu with tag %u from any rank timed out after %.1f s (%s): "
                  "no rank sent it",
                  c->rank, (unsigned long long)w->seq, op->tag, t, limit);
    else
        comm_fail(c, DT_ETIMEDOUT,
                  "rank %d: recv #%llu with tag %u from rank %d (%s) timed out after %.1f s "
                  "(%s): rank %d never sent it",
                  c->rank, (unsigned long long)w->seq, op->tag, op->peer, c->tp.peer_addr[op->peer],
                  t, limit, op->peer);
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
        if (p2p)
            comm_wake_wait_until(&c->cv_api, &c->mu, fired ? dt_now() + 0.05 : w->deadline);
        else
            pthread_cond_wait(&c->cv_api, &c->mu);
    }
    dt_status st = w->status;
    pthread_mutex_unlock(&c->mu);
    if (w->op.kind == DT_OP_RECV && w->op.source)
        *w->op.source = w->xfer.source;
    st = comm_staging_p2p_end(&c->stager, &w->op, w->staged, w->p2p_device, st);
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
        if (st != DT_OK)
            return st;
        dt_work w = {0};
        prepare(c, &w, op);
        if (comm_thread_run_inline(c, &w, &st))
            return st;
    }
    dt_work *w;
    dt_status st = dt_submit(c, op, &w);
    return st == DT_OK ? dt_work_wait(w) : st;
}
