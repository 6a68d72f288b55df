/*
 * rank_order.c — reductions summed in rank order: every element of the
 * result is x0 op x1 op ... op x(p-1), left to right, whatever p is and
 * whichever rank computes it (DT_ALGO_RANK_ORDER).
 *
 * Why. The ring sums chunk c starting after its owner, (x(c+1) + ... +
 * x(c)); the binomial tree groups as a balanced tree; recursive doubling
 * otherwise again. Floating-point addition is not associative, so each
 * algorithm (and each chunk layout, each world size) rounds its own way,
 * and a DDP all-reduce, a ZeRO reduce to an owner and one process adding
 * its micro-steps end in other last bits. One fixed order, the order in
 * which one process adds micro-steps 0, 1, ..., p-1, makes them agree
 * bit for bit (minigpt --deterministic; optim/rank_order.c).
 *
 * 16-bit floats. Because the owner holds every contribution unreduced,
 * it can add f16/bf16 pieces in an f32 accumulator and round once (after
 * an AVG's division): RNE(fl32(x0 + ... + x(p-1))), where a ring rounds
 * each partial sum to 16 bits on each of its p-1 hops. So AUTO picks this
 * algorithm for every f16/bf16 sum and average (algo_select.c). The pieces
 * travel in 16 bits: the wire carries the 16-bit type's bytes. Scratch:
 * one f32 per element of the chunk more, slot 1.
 *
 * The idea: a direct reduce-scatter. Cut the buffer into p chunks; every
 * rank sends chunk q of its buffer straight to rank q, which receives the
 * p-1 pieces of its chunk into scratch and, once all have arrived, sums
 * them with its own in rank order. With p = 3, chunks A B C:
 *
 *   r0 ─B0→ r1   r0 ─C0→ r2   r1 ─A1→ r0   r1 ─C1→ r2   r2 ─A2→ r0   r2 ─B2→ r1
 *   r0: A0 + A1 + A2    r1: (B0 + B1) + B2    r2: (C0 + C1) + C2
 *
 * All-reduce is that followed by the ring all-gather (allgather_ring.c),
 * which copies each owner's bytes everywhere. Reduce (to a root) is the
 * same reduce-scatter whose chunks are all empty but the root's: every
 * other rank sends its whole buffer to the root, and its own is left
 * unchanged.
 *
 * Cost (α-β, n bytes). Reduce-scatter: each rank sends p-1 pieces of n/p
 * bytes and receives p-1, (p-1)α + ((p-1)/p)nβ when a link carries one
 * message at a time; all-reduce adds the ring all-gather's (p-1)α +
 * ((p-1)/p)nβ: 2(p-1)α + 2((p-1)/p)nβ, the ring all-reduce's cost. What
 * it gives up is the overlap: the ring reduces segment j while j+1 is on
 * the wire, here the sum waits for the last piece, ((p-1)/p)n bytes
 * reduced after the transfers. Reduce: (p-1)(α + nβ) into the root's
 * link, the tree's ⌈log2 p⌉(α + nβ) traded for one fixed order. Scratch:
 * (p-1) pieces of the largest chunk, slot 0.
 *
 * Invariants: every rank derives the same chunks from (count, p) (or from
 * the root), so each send meets its receive; count 0 and p = 1 send
 * nothing; sends complete before return, so the caller (the all-gather
 * of an all-reduce in place) may overwrite what they read.
 */
#include <stdlib.h>
#include <string.h>

#include "algorithms.h"
#include "reduce.h"
#include "ring.h"
#include "stage_hooks.h"

/* The p pieces of this rank's chunk, summed x0 op x1 op ... into result:
 * `own` is this rank's piece, scratch holds the others' in rank order.
 * Finishes an AVG. f16/bf16 sums and averages add in an f32 accumulator
 * (scratch slot 1) and round once (reduce.h); everything else reduces in
 * its own type. */
static dt_status sum_in_rank_order(dt_opctx *o, void *result, const char *own, char *scratch,
                                   size_t mine)
{
    const int p = o->size, me = o->rank;
    const dt_op *op = o->op;
    const size_t bytes = mine * dt_dtype_size(op->dtype);
    if (dt_reduce_widens(op->dtype, op->redop)) {
        float *acc = comm_xfer_scratch(o, 1, mine * sizeof(float));
        if (!acc)
            return DT_ENOMEM;
        dt_reduce_widened_start(acc, me == 0 ? own : scratch, mine, op->dtype);
        for (int q = 1, slot = me == 0 ? 0 : 1; q < p; q++)
            dt_reduce_widened_add(acc, q == me ? own : scratch + (size_t)slot++ * bytes, mine,
                                  op->dtype);
        dt_reduce_widened_finish(result, acc, mine, op->dtype, op->redop, p);
        return DT_OK;
    }
    /* the running sum lives in x0's place (our own result on rank 0, x0's
     * scratch slot elsewhere) */
    char *acc = me == 0 ? result : scratch;
    if (me == 0 && acc != own)
        memmove(acc, own, bytes);
    for (int q = 1, slot = me == 0 ? 0 : 1; q < p; q++)
        dt_reduce_into(acc, q == me ? own : scratch + (size_t)slot++ * bytes, mine, op->dtype,
                       op->redop);
    if (acc != result)
        memcpy(result, acc, bytes);
    dt_reduce_finish(result, mine, op->dtype, op->redop, p);
    return DT_OK;
}

/* This rank's chunk of the reduction of every rank's `contrib` into
 * `result` (contrib's own chunk or apart from contrib), in rank order,
 * an AVG finished. */
static dt_status rank_order_phase(dt_opctx *o, void *result, const void *contrib,
                                  const ring_chunks *k)
{
    const int p = o->size, me = o->rank;
    const dt_op *op = o->op;
    const size_t esize = dt_dtype_size(op->dtype);
    const size_t mine = ring_chunk_count(k, me), bytes = mine * esize;
    const char *in = contrib;
    const char *own = in + ring_chunk_offset(k, me) * esize;
    char *scratch = bytes ? comm_xfer_scratch(o, 0, (size_t)(p - 1) * bytes) : NULL;
    dt_xfer *xs = calloc(2 * (size_t)p, sizeof *xs);
    if (!xs || (bytes && !scratch)) {
        free(xs);
        return DT_ENOMEM;
    }
    dt_status st = DT_OK;
    for (int q = 0, slot = 0; q < p; q++) { /* receives first, then sends */
        if (q != me && bytes)
            comm_xfer_recv(o, &xs[q], q, scratch + (size_t)slot++ * bytes, bytes);
    }
    for (int q = 0; q < p && st == DT_OK; q++) {
        size_t n = ring_chunk_count(k, q) * esize;
        const char *piece = in + ring_chunk_offset(k, q) * esize;
        if (q != me && n && (st = stage_need(o, piece, n)) == DT_OK)
            comm_xfer_send(o, &xs[p + q], q, piece, n);
    }
    for (int q = 0; q < p && st == DT_OK; q++)
        if (q != me && bytes)
            st = comm_xfer_wait(o, &xs[q]);
    if (st == DT_OK && bytes)
        st = stage_need(o, own, bytes);
    if (st == DT_OK && bytes)
        st = sum_in_rank_order(o, result, own, scratch, mine);
    for (int q = 0; q < p && st == DT_OK; q++)
        if (q != me && ring_chunk_count(k, q))
            st = comm_xfer_wait(o, &xs[p + q]);
    comm_xfer_drain(o); /* on failure the transport may still hold some of xs */
    free(xs);
    return st;
}

/* allreduce: buf in place; the owner of each chunk sums it, then the ring
 * all-gather spreads the owners' bytes. */
dt_status comm_allreduce_rank_order(dt_opctx *o)
{
    const dt_op *op = o->op;
    if (op->count == 0 || o->size == 1)
        return DT_OK;
    const size_t esize = dt_dtype_size(op->dtype);
    ring_chunks k = ring_chunks_split(op->count, o->size);
    char *buf = op->recv;
    char *owned = buf + ring_chunk_offset(&k, o->rank) * esize;
    size_t owned_count = ring_chunk_count(&k, o->rank);
    dt_status st = rank_order_phase(o, owned, buf, &k);
    if (st != DT_OK)
        return st;
    stage_ready(o, owned, owned_count * esize);
    return comm_allgather_ring_phase(o, buf, &k);
}

/* reduce_scatter: send [p·count] → recv [count], chunk `rank`. */
dt_status comm_reduce_scatter_rank_order(dt_opctx *o)
{
    const dt_op *op = o->op;
    if (op->count == 0)
        return DT_OK;
    const size_t bytes = op->count * dt_dtype_size(op->dtype);
    ring_chunks k = ring_chunks_uniform(op->count);
    dt_status st = DT_OK;
    if (o->size == 1) {
        if ((st = stage_need(o, op->send, bytes)) == DT_OK && op->recv != op->send)
            memmove(op->recv, op->send, bytes);
    } else {
        st = rank_order_phase(o, op->recv, op->send, &k);
    }
    if (st == DT_OK)
        stage_ready(o, op->recv, bytes);
    return st;
}

/* reduce: buf in place, the sum at the root; the others' unchanged. */
dt_status comm_reduce_rank_order(dt_opctx *o)
{
    const dt_op *op = o->op;
    const int p = o->size;
    if (op->count == 0 || p == 1)
        return DT_OK;
    size_t *counts = calloc((size_t)p, sizeof *counts);
    if (!counts)
        return DT_ENOMEM;
    counts[op->root] = op->count; /* every chunk empty but the root's */
    ring_chunks k = ring_chunks_given(counts);
    /* the root's chunk is the whole buffer: offset 0 */
    dt_status st = rank_order_phase(o, op->recv, op->recv, &k);
    free(counts);
    return st;
}
