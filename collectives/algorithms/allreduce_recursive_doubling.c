/*
 * allreduce_recursive_doubling.c — all-reduce in log2 p exchanges of the
 * whole buffer, for small messages.
 *
 * The idea. In round k (distance d = 2^k) every rank swaps its whole buffer
 * with the partner whose rank differs in bit k, and both combine the two.
 * After round k each rank holds the reduction over a group of 2^(k+1)
 * ranks, so after log2 p rounds it holds everything. With p = 4:
 *
 *   round 0 (d=1)   r0 ⇄ r1    r2 ⇄ r3     r0,r1 hold x0·x1; r2,r3 x2·x3
 *   round 1 (d=2)   r0 ⇄ r2    r1 ⇄ r3     everyone holds x0·x1·x2·x3
 *
 * Few messages (log2 p instead of the ring's 2(p-1)), but each carries the
 * whole buffer: the right trade when latency dominates, i.e. small n.
 *
 * World sizes that are not a power of two: the standard fold (MPICH's).
 * Let q be the largest power of two <= p and e = p - q. Among the first 2e
 * ranks, each even rank hands its buffer to the odd rank above it and sits
 * out; the q remaining ranks run recursive doubling (renumbered 0 .. q-1);
 * at the end each odd rank hands the result back to its even neighbour.
 * With p = 6 (q = 4, e = 2):
 *
 *   fold       r0 → r1    r2 → r3                  r1, r3 hold pairs
 *   doubling   among r1 r3 r4 r5 (renumbered 0 1 2 3), two rounds
 *   unfold     r1 → r0    r3 → r2                  everyone holds all
 *
 * Bitwise identical results. Both ranks of a pair compute the combination,
 * so they must compute it the same way: always `lower rank's data op higher
 * rank's data`. dt_reduce_into computes dst = dst op src, so the lower rank
 * reduces into its own buffer, and the higher rank reduces its own data
 * into the received copy and takes that. (IEEE addition is commutative,
 * but min/max of two signed zeros or two NaNs keep dst's, so operand order
 * can show in the bytes; a fixed order makes the question moot.) By
 * induction, after each round both halves of every group hold identical
 * bytes. DT_AVG: the q participants divide their identical sums
 * identically; the folded-out ranks receive the result.
 *
 * Cost (α-β, n bytes): log2(q)(α + nβ), plus 2(α + nβ) for the fold and
 * unfold when p is not a power of two; n bytes reduced per round, not
 * overlapped with the network. Scratch: n bytes.
 *
 * Invariants: in place; every rank derives the same pairing from (rank, p);
 * count 0 or p = 1 send nothing.
 */
#include <stdbool.h>
#include <string.h>

#include "algorithms.h"
#include "reduce.h"

/* Our buffer becomes (lower rank's data) op (higher rank's data), where
 * `theirs` holds the partner's data and is clobbered. */
static void combine_lower_first(char *mine, char *theirs, bool partner_is_lower, size_t count,
                                size_t bytes, const dt_op *op)
{
    if (!partner_is_lower) {
        dt_reduce_into(mine, theirs, count, op->dtype, op->redop);
    } else {
        dt_reduce_into(theirs, mine, count, op->dtype, op->redop);
        memcpy(mine, theirs, bytes);
    }
}

/* Send our buffer to `peer`, receive its buffer into `theirs`, combine. */
static dt_status exchange_and_combine(dt_opctx *o, int peer, char *buf, char *theirs, size_t bytes)
{
    dt_xfer xs[2];
    comm_xfer_recv(o, &xs[0], peer, theirs, bytes);
    comm_xfer_send(o, &xs[1], peer, buf, bytes);
    dt_status st = comm_xfer_wait_all(o, xs, 2);
    if (st == DT_OK)
        combine_lower_first(buf, theirs, peer < o->rank, o->op->count, bytes, o->op);
    return st;
}

/* Blocking one-way transfers for the fold. */
static dt_status send_to(dt_opctx *o, int peer, const void *buf, size_t bytes)
{
    dt_xfer x;
    comm_xfer_send(o, &x, peer, buf, bytes);
    return comm_xfer_wait(o, &x);
}

static dt_status recv_from(dt_opctx *o, int peer, void *buf, size_t bytes)
{
    dt_xfer x;
    comm_xfer_recv(o, &x, peer, buf, bytes);
    return comm_xfer_wait(o, &x);
}

/* The rank that plays number `v` in the power-of-two doubling: odd ranks
 * of the folded pairs first, then everyone above them. Increasing in v, so
 * comparing real ranks orders partners the same way as comparing v. */
static int doubling_rank(int v, int extra)
{
    return v < extra ? 2 * v + 1 : v + extra;
}

dt_status comm_allreduce_recursive_doubling(dt_opctx *o)
{
    const dt_op *op = o->op;
    const int p = o->size, r = o->rank;
    const size_t bytes = op->count * dt_dtype_size(op->dtype);
    char *buf = op->recv;
    if (bytes == 0 || p == 1)
        return DT_OK; /* one contribution is its own sum (and its own avg) */
    char *theirs = comm_xfer_scratch(o, 0, bytes);
    if (!theirs)
        return DT_ENOMEM;

    int q = 1;
    while (q * 2 <= p)
        q *= 2;
    const int extra = p - q;
    const bool folded = r < 2 * extra;
    dt_status st = DT_OK;

    /* Fold: even ranks below 2e hand over and wait for the answer. */
    if (folded && r % 2 == 0) {
        st = send_to(o, r + 1, buf, bytes);
        return st == DT_OK ? recv_from(o, r + 1, buf, bytes) : st;
    }
    if (folded) {
        st = recv_from(o, r - 1, theirs, bytes);
        if (st != DT_OK)
            return st;
        combine_lower_first(buf, theirs, true, op->count, bytes, op);
    }

    /* Recursive doubling among the q participants, numbered v. */
    const int v = folded ? r / 2 : r - extra;
    for (int d = 1; d < q && st == DT_OK; d *= 2)
        st = exchange_and_combine(o, doubling_rank(v ^ d, extra), buf, theirs, bytes);
    if (st != DT_OK)
        return st;
    dt_reduce_finish(buf, op->count, op->dtype, op->redop, p);

    /* Unfold: hand the result back to the even neighbour. */
    return folded ? send_to(o, r - 1, buf, bytes) : DT_OK;
}
