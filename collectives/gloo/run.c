/*
 * run.c — a dtrain op (dt_op) on the gloo wire: which gloo collective, or
 * which composition of them, runs it.
 *
 * Most ops are one torch 1.13 collective, so a mixed dtrain/torch job
 * agrees on every message when both sides call them in the same order:
 *
 *   allreduce, broadcast, allgather, barrier, gather, scatter, alltoall
 *                  the gloo collective of the same name
 *   reduce         gloo's reduce; a non-root rank runs it on a copy, since
 *                  gloo leaves partial sums in non-root buffers and dtrain
 *                  promises them unchanged (one copy of n bytes)
 *   avg            a sum, then dtrain's division by p (torch 1.13's gloo
 *                  has no AVG)
 *
 * Torch 1.13's gloo has no reduce-scatter and no all-gather-v; here they
 * are compositions, each one gloo collective on the wire:
 *
 *   reduce_scatter an allreduce of a copy of all p blocks, then this rank's
 *                  block is kept: 2((p-1)/p)nβ instead of a ring
 *                  reduce-scatter's ((p-1)/p)nβ, n = p·count·size; the
 *                  bits are those of the allreduce
 *   allgatherv     an allgather of blocks padded to the largest count, then
 *                  compacted: ((p-1)/p)·p·max·β instead of Σ counts
 *
 * Tagged send/recv are not ordered against collectives (dtrain's and
 * gloo's semantics alike) and so cannot run from this in-order path; on
 * this wire they are refused for now (DT_EINVAL naming the op).
 *
 * Cost: the collective's, plus the copies named above.
 */
#include <stdlib.h>
#include <string.h>

#include "gloo.h"
#include "reduce.h"

static dt_status refuse(gloo_ctx *c, const dt_op *op, const char *why)
{
    return comm_gloo_fail(c, DT_EINVAL, "gloo rank %d: %s of %s on the gloo wire: %s", c->rank,
                          dt_op_name(op->kind), dt_dtype_name(op->dtype), why);
}

static dt_status allreduce(gloo_ctx *c, void *buf, size_t count, dt_dtype t, dt_redop r)
{
    dt_status st = comm_gloo_allreduce(c, buf, count, t, r == DT_AVG ? DT_SUM : r);
    if (st == DT_OK)
        dt_reduce_finish(buf, count, t, r, c->size);
    return st;
}

/* dtrain's reduce: the result at the root, every other buffer unchanged. */
static dt_status reduce(gloo_ctx *c, const dt_op *op, size_t bytes)
{
    const dt_redop r = op->redop == DT_AVG ? DT_SUM : op->redop;
    if (c->rank == op->root) {
        dt_status st = comm_gloo_reduce_root(c, op->recv, op->count, op->dtype, r, op->root);
        if (st == DT_OK)
            dt_reduce_finish(op->recv, op->count, op->dtype, op->redop, c->size);
        return st;
    }
    void *copy = malloc(bytes ? bytes : 1);
    if (!copy)
        return comm_gloo_fail(c, DT_ENOMEM, "gloo rank %d: out of memory (reduce)", c->rank);
    memcpy(copy, op->recv, bytes);
    dt_status st = comm_gloo_reduce_root(c, copy, op->count, op->dtype, r, op->root);
    free(copy);
    return st;
}

static dt_status reduce_scatter(gloo_ctx *c, const dt_op *op, size_t block)
{
    const size_t all = block * (size_t)c->size;
    uint8_t *copy = malloc(all ? all : 1);
    if (!copy)
        return comm_gloo_fail(c, DT_ENOMEM, "gloo rank %d: out of memory (reduce_scatter)",
                              c->rank);
    memcpy(copy, op->send, all);
    dt_status st = allreduce(c, copy, op->count * (size_t)c->size, op->dtype, op->redop);
    if (st == DT_OK)
        memcpy(op->recv, copy + (size_t)c->rank * block, block);
    free(copy);
    return st;
}

static dt_status allgatherv(gloo_ctx *c, const dt_op *op, size_t esize)
{
    size_t max = 0;
    for (int r = 0; r < c->size; r++)
        max = op->counts[r] > max ? op->counts[r] : max;
    const size_t block = max * esize;
    uint8_t *padded = calloc((size_t)c->size, block ? block : 1);
    if (!padded)
        return comm_gloo_fail(c, DT_ENOMEM, "gloo rank %d: out of memory (allgatherv)", c->rank);
    memcpy(padded + (size_t)c->rank * block, op->send, op->counts[c->rank] * esize);
    dt_status st = comm_gloo_allgather(c, padded, padded + (size_t)c->rank * block, block);
    for (int r = 0, at = 0; st == DT_OK && r < c->size; r++) {
        memcpy((uint8_t *)op->recv + (size_t)at * esize, padded + (size_t)r * block,
               op->counts[r] * esize);
        at += (int)op->counts[r];
    }
    free(padded);
    return st;
}

dt_status comm_gloo_run(gloo_ctx *c, const dt_op *op)
{
    const size_t esize = dt_dtype_size(op->dtype), bytes = op->count * esize;
    if (op->dtype == DT_BF16)
        return refuse(c, op, "torch 1.13's gloo has no bfloat16");
    switch (op->kind) {
    case DT_OP_ALLREDUCE: return allreduce(c, op->recv, op->count, op->dtype, op->redop);
    case DT_OP_REDUCE_SCATTER: return reduce_scatter(c, op, bytes);
    case DT_OP_ALLGATHER: return comm_gloo_allgather(c, op->recv, op->send, bytes);
    case DT_OP_ALLGATHERV: return allgatherv(c, op, esize);
    case DT_OP_BROADCAST: return comm_gloo_broadcast(c, op->recv, bytes, op->root);
    case DT_OP_BARRIER: return comm_gloo_barrier(c);
    case DT_OP_REDUCE: return reduce(c, op, bytes);
    case DT_OP_GATHER: return comm_gloo_gather(c, op->recv, op->send, bytes, op->root);
    case DT_OP_SCATTER: return comm_gloo_scatter(c, op->recv, op->send, bytes, op->root);
    case DT_OP_ALLTOALL: return comm_gloo_alltoall(c, op->recv, op->send, bytes);
    default: return refuse(c, op, "tagged send/recv are not on this wire yet");
    }
}
