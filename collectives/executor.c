/*
 * executor.c — how a collective runs: as sequential code, on the thread
 * that holds the event loop.
 *
 * A collective reaches comm_executor_run in submission order, on the
 * communicator thread or inline on the caller's (comm_thread.c decides who
 * runs the loop; work.c submits and waits). It runs the algorithm as plain
 * sequential code (algorithms.h): posting a transfer hands it to the
 * transport directly, and waiting for one means running the libuv loop
 * (uv_run, UV_RUN_ONCE) until the transfer is done (xfer.c). Because every
 * rank submits the same collectives in the same order, op #n meets op #n.
 *
 * Why the thread that runs the op also moves its bytes, instead of an
 * executor beside an I/O thread: a transfer then costs no thread hand-off
 * (a hand-off is two futex wake-ups and, on a loaded machine, a scheduler
 * time slice each way). The price is that the loop does not read sockets
 * while a segment is being reduced; the kernel's socket buffers (autotuned,
 * several MiB on loopback) keep the bytes flowing meanwhile.
 *
 * Timeouts: two clocks (transport/heartbeat.c). The waiter owns the progress
 * deadline: a collective gets op->timeout_s (or the communicator's
 * progress_timeout_s) checked between loop iterations (the loop's 20 ms
 * ticker bounds how late); the ticker itself fails the op sooner when a
 * peer it waits on is silent past timeout_s. A missed deadline, or any local
 * failure, fails the communicator, because after a partial op the byte
 * streams between ranks no longer line up.
 */
#include <string.h>

#include "algorithms.h"
#include "comm_internal.h"
#include "gloo/gloo.h"
#include "staging.h"

/* ---- running one collective ------------------------------------------------- */

static uint64_t wire_count(const dt_comm *c, const dt_op *op)
{
    if (op->kind != DT_OP_ALLGATHERV)
        return op->count;
    uint64_t sum = 0;
    for (int r = 0; r < c->size; r++)
        sum += op->counts[r];
    return sum;
}

dt_status comm_executor_run(dt_comm *c, dt_work *w)
{
    if (c->gloo) { /* the gloo wire: its own schedules (comm_gloo.c) */
        const bool p2p = w->op.kind == DT_OP_SEND || w->op.kind == DT_OP_RECV;
        dt_status st = p2p ? comm_gloo_p2p_start(c, w) : comm_gloo_run(c->gloo, &w->op);
        if (st != DT_OK) {
            comm_fail(c, st, "%s", comm_gloo_error(c->gloo));
            pthread_mutex_lock(&c->mu); /* the root cause (an abort interrupts the op) */
            st = c->fail_status;
            pthread_mutex_unlock(&c->mu);
        }
        comm_gloo_p2p_reap(c); /* what the op's waits have moved */
        return st;
    }
    dt_opctx o = {
        .tp = &c->tp,
        .stager = &c->stager,
        .op = &w->op,
        .seq = w->seq,
        .wire_count = wire_count(c, &w->op),
        .rank = c->rank,
        .size = c->size,
        .deadline = dt_now() + (w->op.timeout_s > 0 ? w->op.timeout_s : c->progress_timeout_s),
        .sent_index = c->tp.sent_index,
        .recv_index = c->tp.recv_index,
    };
    memset(c->tp.sent_index, 0, sizeof *c->tp.sent_index * (size_t)c->size);
    memset(c->tp.recv_index, 0, sizeof *c->tp.recv_index * (size_t)c->size);
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
