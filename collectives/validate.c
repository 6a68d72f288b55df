/*
 * validate.c — reject a malformed op before anything is sent.
 *
 * An op that fails here never reaches the wire, so it does not fail the
 * communicator: dt_submit returns DT_EINVAL and dt_comm_error says which
 * argument was wrong. Everything an algorithm relies on is checked here once
 * (buffers present where the op table in dt_comm.h needs them, ranks in
 * range, the reduction defined for the dtype, sizes that do not overflow),
 * so the algorithms can stay free of argument checks.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "algorithms.h"
#include "comm_internal.h"

static dt_status bad(dt_comm *c, const dt_op *op, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static dt_status bad(dt_comm *c, const dt_op *op, const char *fmt, ...)
{
    char why[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->mu);
    snprintf(c->arg_error, sizeof c->arg_error, "rank %d: %s: %s", c->rank,
             op->kind < DT_NUM_OP_KINDS ? dt_op_name(op->kind) : "op", why);
    pthread_mutex_unlock(&c->mu);
    return DT_EINVAL;
}

static bool is_reduction(dt_op_kind k)
{
    return k == DT_OP_ALLREDUCE || k == DT_OP_REDUCE_SCATTER || k == DT_OP_REDUCE;
}

static bool is_rooted(dt_op_kind k)
{
    return k == DT_OP_BROADCAST || k == DT_OP_REDUCE || k == DT_OP_GATHER || k == DT_OP_SCATTER;
}

/* Which buffers the op needs on this rank: send, recv. */
static void needs(const dt_comm *c, const dt_op *op, bool *send, bool *recv)
{
    bool root = op->root == c->rank;
    *send = *recv = false;
    switch (op->kind) {
    case DT_OP_ALLREDUCE:
    case DT_OP_BROADCAST:
    case DT_OP_REDUCE: *recv = true; break;
    case DT_OP_REDUCE_SCATTER:
    case DT_OP_ALLGATHER:
    case DT_OP_ALLGATHERV:
    case DT_OP_ALLTOALL: *send = *recv = true; break;
    case DT_OP_GATHER:
        *send = true;
        *recv = root;
        break;
    case DT_OP_SCATTER:
        *send = root;
        *recv = true;
        break;
    case DT_OP_SEND: *send = true; break;
    case DT_OP_RECV: *recv = true; break;
    default: break;
    }
}

static dt_status check_counts(dt_comm *c, const dt_op *op, size_t esize)
{
    size_t total = op->count;
    if (op->kind == DT_OP_ALLGATHERV) {
        if (!op->counts)
            return bad(c, op, "counts is NULL (allgatherv needs one per rank)");
        total = 0;
        for (int r = 0; r < c->size; r++) {
            if (op->counts[r] > SIZE_MAX / 2 - total)
                return bad(c, op, "the counts add up to more than memory can hold");
            total += op->counts[r];
        }
    }
    size_t mult = (op->kind == DT_OP_REDUCE_SCATTER || op->kind == DT_OP_ALLGATHER ||
                   op->kind == DT_OP_GATHER || op->kind == DT_OP_SCATTER ||
                   op->kind == DT_OP_ALLTOALL)
                      ? (size_t)c->size
                      : 1;
    if (total > SIZE_MAX / esize / mult)
        return bad(c, op, "count %zu x %zu B x %zu overflows", total, esize, mult);
    return DT_OK;
}

dt_status comm_validate_op(dt_comm *c, const dt_op *op)
{
    if ((unsigned)op->kind >= DT_NUM_OP_KINDS)
        return bad(c, op, "unknown op kind %d", op->kind);
    if (op->kind != DT_OP_BARRIER && (unsigned)op->dtype >= DT_NUM_DTYPES)
        return bad(c, op, "unknown dtype %d", op->dtype);
    if (is_reduction(op->kind) && !dt_redop_supports(op->redop, op->dtype))
        return bad(c, op, "reduction %d is not defined for %s", op->redop,
                   dt_dtype_name(op->dtype));
    if (is_rooted(op->kind) && (op->root < 0 || op->root >= c->size))
        return bad(c, op, "root %d is not a rank of this world of %d", op->root, c->size);
    if (op->kind == DT_OP_SEND && (op->peer < 0 || op->peer >= c->size || op->peer == c->rank))
        return bad(c, op, "destination %d is not another rank of this world of %d", op->peer,
                   c->size);
    if (op->kind == DT_OP_RECV && op->peer != DT_ANY_SOURCE &&
        (op->peer < 0 || op->peer >= c->size || op->peer == c->rank))
        return bad(c, op,
                   "source %d is not another rank of this world of %d (or "
                   "DT_ANY_SOURCE)",
                   op->peer, c->size);
    if (c->gloo && (op->kind == DT_OP_SEND || op->kind == DT_OP_RECV) && op->tag > 0x7fffffffu)
        return bad(c, op,
                   "tag %u is over 2^31-1: on the gloo wire the tag is the slot, and could "
                   "meet a collective's",
                   op->tag);
    if (!(op->timeout_s >= 0))
        return bad(c, op, "timeout %g s is negative", op->timeout_s);
    if (!comm_algo_applies(op->kind, op->algo))
        return bad(c, op, "algorithm %d does not apply to this op", op->algo);
    if (op->kind == DT_OP_BARRIER)
        return DT_OK;
    size_t esize = dt_dtype_size(op->dtype);
    dt_status st = check_counts(c, op, esize);
    if (st != DT_OK)
        return st;
    bool any = op->count > 0 || op->kind == DT_OP_ALLGATHERV;
    bool need_send, need_recv;
    needs(c, op, &need_send, &need_recv);
    if (any && need_send && !op->send)
        return bad(c, op, "send buffer is NULL");
    if (any && need_recv && !op->recv)
        return bad(c, op, "receive buffer is NULL");
    return DT_OK;
}
