/*
 * gather_scatter_linear.c — linear gather and scatter: the root talks to
 * every other rank directly.
 *
 * Gather: every rank's block of `count` elements lands at the root, block
 * q at position q of the root's recv buffer [p·count]. Scatter is the
 * mirror image: block q of the root's send buffer [p·count] goes to rank q.
 * With p = 4, root 0:
 *
 *   gather               scatter
 *   r1 ─b1→ r0           r0 ─b1→ r1
 *   r2 ─b2→ r0           r0 ─b2→ r2
 *   r3 ─b3→ r0           r0 ─b3→ r3
 *   (b0 is copied locally at the root)
 *
 * Why linear and not a tree: every byte of the result has to cross the
 * root's link anyway, (p-1)/p·n of them, and a tree would only add hops
 * (and, for gather, copies through intermediate ranks). The root posts all
 * p-1 transfers at once, so their latencies overlap and the transport
 * keeps the root's link busy. Blocks go straight between the caller's
 * buffers: no scratch.
 *
 * Cost (α-β, n = p·count·size bytes): (p-1)α + ((p-1)/p)nβ at the root,
 * the latencies overlapping in practice; α + (n/p)β at the others.
 *
 * Invariants: each non-root rank exchanges exactly one message with the
 * root, so pairing is trivial; count 0 and p = 1 send nothing (p = 1, or
 * the root's own block: a local copy, skipped when already in place).
 */
#include <stdlib.h>
#include <string.h>

#include "algorithms.h"
#include "stage_hooks.h"

/* The root's half of both: one transfer per other rank, block q to rank q
 * from `to_send` (scatter), or from rank q into block q of `to_recv`
 * (gather). The other pointer is NULL. Device buffers (stage_hooks.h): a block
 * is sent once its copy to the host has landed, and a received block goes
 * back to the device as soon as it has arrived. */
static dt_status root_exchange_all(dt_opctx *o, const char *to_send, char *to_recv,
                                   size_t block_bytes)
{
    const int p = o->size;
    dt_xfer *xs = calloc((size_t)p, sizeof *xs);
    if (!xs)
        return DT_ENOMEM;
    dt_status st = DT_OK;
    for (int q = 0; q < p && st == DT_OK; q++) {
        size_t at = (size_t)q * block_bytes;
        if (q == o->rank)
            continue;
        if (to_send && (st = stage_need(o, to_send + at, block_bytes)) == DT_OK)
            comm_xfer_send(o, &xs[q], q, to_send + at, block_bytes);
        else if (!to_send)
            comm_xfer_recv(o, &xs[q], q, to_recv + at, block_bytes);
    }
    for (int q = 0; q < p && st == DT_OK; q++) {
        if (q == o->rank)
            continue;
        st = comm_xfer_wait(o, &xs[q]);
        if (st == DT_OK && to_recv)
            stage_ready(o, to_recv + (size_t)q * block_bytes, block_bytes);
    }
    comm_xfer_drain(o); /* on failure the transport may still hold some of xs */
    free(xs);
    return st;
}

/* gather: send [count] on every rank → recv [p·count] at the root. */
dt_status comm_gather_linear(dt_opctx *o)
{
    const dt_op *op = o->op;
    const size_t bytes = op->count * dt_dtype_size(op->dtype);
    dt_xfer x;
    if (bytes == 0)
        return DT_OK;
    dt_status st = stage_need(o, op->send, bytes);
    if (st != DT_OK)
        return st;
    if (o->rank != op->root) {
        comm_xfer_send(o, &x, op->root, op->send, bytes);
        return comm_xfer_wait(o, &x);
    }
    char *mine = (char *)op->recv + (size_t)o->rank * bytes;
    if (mine != (const char *)op->send)
        memmove(mine, op->send, bytes);
    stage_ready(o, mine, bytes);
    return o->size == 1 ? DT_OK : root_exchange_all(o, NULL, op->recv, bytes);
}

/* scatter: send [p·count] at the root → recv [count] on every rank. */
dt_status comm_scatter_linear(dt_opctx *o)
{
    const dt_op *op = o->op;
    const size_t bytes = op->count * dt_dtype_size(op->dtype);
    dt_xfer x;
    if (bytes == 0)
        return DT_OK;
    if (o->rank != op->root) {
        comm_xfer_recv(o, &x, op->root, op->recv, bytes);
        return comm_xfer_wait(o, &x);
    }
    const char *mine = (const char *)op->send + (size_t)o->rank * bytes;
    dt_status st = stage_need(o, mine, bytes);
    if (st != DT_OK)
        return st;
    if (mine != (const char *)op->recv)
        memmove(op->recv, mine, bytes);
    return o->size == 1 ? DT_OK : root_exchange_all(o, op->send, NULL, bytes);
}
