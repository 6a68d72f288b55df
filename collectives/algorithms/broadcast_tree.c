/*
 * broadcast_tree.c — binomial-tree broadcast from any root, for small
 * messages.
 *
 * The idea. Every rank that already has the data sends it to one rank that
 * has not, so the number of holders doubles each round: ⌈log2 p⌉ rounds.
 * Number ranks relative to the root, v = (rank - root) mod p. Rank v
 * receives from its parent v - lowbit(v) (v with its lowest set bit
 * cleared), then sends to v + m for each m = lowbit(v)/2, /4, ..., 1 with
 * v + m < p — biggest subtree first, as it has the most work ahead. The
 * root (v = 0) starts at the largest power of two below p. With p = 8:
 *
 *   round 0   0 → 4
 *   round 1   0 → 2          4 → 6
 *   round 2   0 → 1   2 → 3  4 → 5   6 → 7
 *
 *        0
 *      / | \
 *     4  2  1          children of v: v+4, v+2, v+1 (those < p
 *    / \  \            and below v's lowest set bit)
 *   6   5  3
 *   |
 *   7
 *
 * Each message is the whole buffer, received straight into the caller's
 * buffer, and a rank sends only after it has received all of it: no
 * pipelining. That is right for small n, where latency dominates; large
 * buffers go through the pipelined chain (broadcast_chain.c).
 *
 * Cost (α-β, n bytes): ⌈log2 p⌉(α + nβ) on the critical path. No scratch.
 *
 * Invariants: every rank derives the same tree from (root, p), so each
 * parent's send meets its child's receive; count 0 and p = 1 send nothing.
 */
#include "algorithms.h"

/* Real rank of relative rank v. */
static int real_rank(long v, int root, int p)
{
    return (int)((v + root) % p);
}

dt_status comm_broadcast_tree(dt_opctx *o)
{
    const dt_op *op = o->op;
    const int p = o->size;
    const size_t bytes = op->count * dt_dtype_size(op->dtype);
    if (bytes == 0 || p == 1)
        return DT_OK;
    const long v = ((long)o->rank - op->root + p) % p;

    /* Receive from the parent: the first set bit of v, from the bottom. */
    long mask = 1;
    for (; mask < p; mask <<= 1) {
        if (v & mask) {
            dt_xfer x;
            comm_xfer_recv(o, &x, real_rank(v - mask, op->root, p), op->recv, bytes);
            dt_status st = comm_xfer_wait(o, &x);
            if (st != DT_OK)
                return st;
            break;
        }
    }

    /* Send to the children, biggest subtree first, one after the other:
     * posted together they would share this rank's link, and the child
     * with the most work ahead would get its data last. */
    for (long m = mask >> 1; m > 0; m >>= 1) {
        if (v + m >= p)
            continue;
        dt_xfer x;
        comm_xfer_send(o, &x, real_rank(v + m, op->root, p), op->recv, bytes);
        dt_status st = comm_xfer_wait(o, &x);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}
