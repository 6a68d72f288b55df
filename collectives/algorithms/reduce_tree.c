/*
 * reduce_tree.c — binomial-tree reduce: the reduction of every rank's
 * buffer arrives at the root; every other rank's buffer is left unchanged.
 *
 * The idea: the binomial broadcast tree (broadcast_tree.c) run backwards.
 * Number ranks relative to the root, v = (rank - root) mod p. In round k
 * (m = 2^k) a rank whose bit k is set sends its partial result to v - m and
 * is done; a rank whose bits 0..k are clear receives from v + m (if that
 * exists) and folds it in. Each round halves the number of ranks still
 * holding partials. With p = 8:
 *
 *   round 0 (m=1)   1→0  3→2  5→4  7→6
 *   round 1 (m=2)   2→0  6→4
 *   round 2 (m=4)   4→0            the root holds x0·x1·…·x7
 *
 * Buffers. A non-root rank must not touch its buffer, so its partial lives
 * in scratch slot 0 (copied from the buffer when the first child's data
 * arrives; a leaf sends its buffer as is). The root accumulates in its own
 * buffer, which is where the result goes. Children's data arrive in
 * scratch slot 1.
 *
 * Order. A rank folds children in increasing m, each child holding the
 * partial of the ranks v+m .. v+2m-1, as `partial op child`. So the root
 * computes x0·x1·…·x(p-1) in relative-rank order, grouped as a balanced
 * tree: deterministic for a given (root, p). DT_AVG: the root divides.
 *
 * Cost (α-β, n bytes): ⌈log2 p⌉(α + nβ) on the critical path, plus n bytes
 * reduced per round. Scratch: 2n bytes on ranks with children.
 *
 * Invariants: every rank derives the same tree from (root, p); count 0 and
 * p = 1 send nothing (p = 1: the buffer is the result, avg divides by 1).
 */
#include <string.h>

#include "algorithms.h"
#include "reduce.h"

static int real_rank(long v, int root, int p)
{
    return (int)((v + root) % p);
}

dt_status comm_reduce_tree(dt_opctx *o)
{
    const dt_op *op = o->op;
    const int p = o->size, root = op->root;
    const size_t bytes = op->count * dt_dtype_size(op->dtype);
    char *buf = op->recv;
    if (bytes == 0 || p == 1)
        return DT_OK;
    const long v = ((long)o->rank - root + p) % p;
    char *partial = v == 0 ? buf : NULL; /* non-root: made on first child */
    char *incoming = NULL;

    for (long m = 1; m < p; m <<= 1) {
        dt_xfer x;
        if (v & m) { /* hand the partial to the parent; done */
            comm_xfer_send(o, &x, real_rank(v - m, root, p), partial ? partial : buf, bytes);
            return comm_xfer_wait(o, &x);
        }
        if (v + m >= p)
            continue;    /* no child at this distance */
        if (!incoming) { /* the first child: set up the buffers */
            incoming = comm_xfer_scratch(o, 1, bytes);
            if (v != 0) {
                partial = comm_xfer_scratch(o, 0, bytes);
                if (partial)
                    memcpy(partial, buf, bytes);
            }
            if (!partial || !incoming)
                return DT_ENOMEM;
        }
        comm_xfer_recv(o, &x, real_rank(v + m, root, p), incoming, bytes);
        dt_status st = comm_xfer_wait(o, &x);
        if (st != DT_OK)
            return st;
        dt_reduce_into(partial, incoming, op->count, op->dtype, op->redop);
    }
    /* Only the root gets here: every other v has a set bit below p. */
    dt_reduce_finish(buf, op->count, op->dtype, op->redop, p);
    return DT_OK;
}
