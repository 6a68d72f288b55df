/*
 * alltoall_pairwise.c — pairwise-exchange all-to-all: block q of rank r's
 * send buffer becomes block r of rank q's receive buffer.
 *
 * The idea. p-1 steps; in step k (1 .. p-1) rank r sends its block for
 * rank r+k and receives the block from rank r-k (mod p). Every rank sends
 * one block and receives one block per step, and in each step the
 * "send to r+k" edges form a permutation, so no rank is the target of two
 * senders at once (a linear all-to-all, everyone posting everything, makes
 * every link compete with every other). With p = 4:
 *
 *   step 1 (k=1)   0→1  1→2  2→3  3→0
 *   step 2 (k=2)   0→2  1→3  2→0  3→1
 *   step 3 (k=3)   0→3  1→0  2→1  3→2
 *   block r→r is a local copy
 *
 * Each step waits for its send and its receive before the next starts:
 * that is what keeps the steps' permutations apart.
 *
 * Buffers: blocks go straight from the caller's send buffer into its
 * receive buffer. If the two overlap (in place), the send buffer is first
 * copied to scratch, so no block is overwritten before it has been sent.
 *
 * Cost (α-β, n = p·count·size bytes per rank): (p-1)(α + (n/p)β) =
 * (p-1)α + ((p-1)/p)nβ.
 *
 * Invariants: in step k rank r's send meets rank (r+k)'s receive from
 * (r+k)-k = r, and steps run in the same order everywhere; count 0 sends
 * nothing; p = 1 is the local copy.
 */
#include <stdint.h>
#include <string.h>

#include "algorithms.h"
#include "stage_hooks.h"

static int ranges_overlap(const void *a, const void *b, size_t bytes)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + bytes && y < x + bytes;
}

dt_status comm_alltoall_pairwise(dt_opctx *o)
{
    const dt_op *op = o->op;
    const int p = o->size, r = o->rank;
    const size_t block = op->count * dt_dtype_size(op->dtype);
    const size_t total = block * (size_t)p;
    char *out = op->recv;
    const char *in = op->send;
    if (block == 0)
        return DT_OK;
    /* Device buffers (stage_hooks.h): each block waits for its copy to the host
     * before it is read, and goes back to the device once it has arrived. */
    dt_status st = DT_OK;
    if (ranges_overlap(in, out, total)) {
        if ((st = stage_need(o, in, total)) != DT_OK)
            return st;
        char *copy = comm_xfer_scratch(o, 0, total);
        if (!copy)
            return DT_ENOMEM;
        memcpy(copy, in, total);
        in = copy;
    }
    if ((st = stage_need(o, in + (size_t)r * block, block)) != DT_OK)
        return st;
    memcpy(out + (size_t)r * block, in + (size_t)r * block, block);
    stage_ready(o, out + (size_t)r * block, block);

    for (int k = 1; k < p; k++) {
        int to = (r + k) % p, from = (r - k + p) % p;
        dt_xfer xs[2];
        if ((st = stage_need(o, in + (size_t)to * block, block)) != DT_OK)
            return st;
        comm_xfer_recv(o, &xs[0], from, out + (size_t)from * block, block);
        comm_xfer_send(o, &xs[1], to, in + (size_t)to * block, block);
        st = comm_xfer_wait_all(o, xs, 2);
        if (st != DT_OK)
            return st;
        stage_ready(o, out + (size_t)from * block, block);
    }
    return DT_OK;
}
