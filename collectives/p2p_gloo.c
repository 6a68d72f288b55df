/*
 * p2p_gloo.c — tagged send/recv of a communicator on the gloo wire: posted
 * in op order, completed whenever the wire has moved them.
 *
 * They queue like collectives (the gloo context belongs to whoever runs
 * ops), but the executor only posts them (comm_gloo_p2p_start) and the
 * work stays in flight while later ops run. Whatever drives the gloo loop
 * moves them: a collective's waits, or the communicator thread's turns on
 * the wire (comm_gloo_p2p_progress: one pass of the gloo loop, with no
 * timer, which ends when bytes move or a connection ends there, or when
 * comm_wake_thread wakes it because an op was queued, the communicator
 * failed or is stopping); after each, comm_gloo_p2p_reap completes every
 * work whose message has gone or arrived. So two ranks that each send
 * before they receive (a pipeline's 1F1B) do not wait for each other, as
 * with torch's send/recv, whose messages are also not bound to the order
 * of collectives.
 *
 * A failure of the communicator (a peer's, a waiter's timeout, an abort)
 * fails the gloo context too (fail.c interrupts it), which closes every
 * connection (gloo's rule), and every work in flight completes with the
 * communicator's root cause.
 *
 * Cost: one allocation per send/recv; an op queued while one is in
 * flight costs an eventfd write to end the thread's turn (the round trip
 * of bench/p2p_pingpong.c, whose every send is queued so: bench/README.md).
 */
#include <stdlib.h>

#include "comm_internal.h"
#include "gloo/gloo.h"

/* A send or receive in flight: its work and its gloo message. */
typedef struct gloo_pending {
    struct gloo_pending *next;
    dt_work *w;
    gloo_p2p p;
} gloo_pending;

dt_status comm_gloo_p2p_start(dt_comm *c, dt_work *w)
{
    const dt_op *op = &w->op;
    gloo_pending *g = calloc(1, sizeof *g);
    if (!g)
        return DT_ENOMEM;
    const bool send = op->kind == DT_OP_SEND;
    void *buf = send ? (void *)op->send : op->recv;
    dt_status st = comm_gloo_p2p_post(c->gloo, &g->p, send, buf,
                                      op->count * dt_dtype_size(op->dtype),
                                      op->peer == DT_ANY_SOURCE ? -1 : op->peer, op->tag);
    if (st != DT_OK) {
        free(g);
        return st;
    }
    g->w = w;
    w->in_flight = true;
    g->next = c->gloo_p2p;
    c->gloo_p2p = g;
    return DT_OK;
}

void comm_gloo_p2p_reap(dt_comm *c)
{
    pthread_mutex_lock(&c->mu);
    const bool failed = c->failed;
    pthread_mutex_unlock(&c->mu);
    if (failed && c->gloo_p2p) /* tell the peers too: gloo's failure closes every pair */
        comm_gloo_fail(c->gloo, DT_EPEER, "gloo rank %d: the communicator failed", c->rank);
    for (gloo_pending **at = &c->gloo_p2p, *g; (g = *at) != NULL;) {
        dt_status st;
        if (!comm_gloo_p2p_finished(c->gloo, &g->p, &st)) {
            at = &g->next;
            continue;
        }
        if (st != DT_OK && !failed)
            comm_fail(c, st, "%s", comm_gloo_error(c->gloo));
        *at = g->next;
        pthread_mutex_lock(&c->mu);
        g->w->xfer.source = g->p.buf.recv_from;
        comm_wake_work_done(g->w, st == DT_OK ? DT_OK : c->fail_status);
        pthread_mutex_unlock(&c->mu);
        free(g);
    }
}

void comm_gloo_p2p_progress(dt_comm *c)
{
    comm_gloo_progress(c->gloo);
    comm_gloo_p2p_reap(c);
}

void comm_gloo_p2p_forget(dt_comm *c)
{
    while (c->gloo_p2p) { /* their waiters are gone with the communicator */
        gloo_pending *next = c->gloo_p2p->next;
        free(c->gloo_p2p);
        c->gloo_p2p = next;
    }
}
