/*
 * broadcast_chain.c — pipelined chain broadcast from any root, for large
 * messages.
 *
 * The idea. Line the ranks up after the root, v = (rank - root) mod p:
 * v0 → v1 → ... → v(p-1). Cut the buffer into k segments. Each rank
 * forwards segment j to the next as soon as it has arrived, while segment
 * j+1 is still coming in. Once the pipeline is full, every link carries a
 * segment at the same time. With p = 4 and segments a b c:
 *
 *   time 1   v0 ─a→ v1
 *   time 2   v0 ─b→ v1 ─a→ v2
 *   time 3   v0 ─c→ v1 ─b→ v2 ─a→ v3
 *   time 4            v1 ─c→ v2 ─b→ v3
 *   time 5                     v2 ─c→ v3
 *
 * Compared with the binomial tree (broadcast_tree.c), which sends the whole
 * buffer ⌈log2 p⌉ times along its critical path, the chain sends it about
 * once: for large n its time tends to nβ, independent of p. For small n
 * the p-1 hops of latency lose to the tree's log2 p.
 *
 * Segments are CHAIN_SEGMENT_BYTES. The last of k segments reaches the end
 * of the chain after p-2+k segment times (5 in the picture), so the best k
 * minimises (p-2+k)(α + nβ/k):
 * k* = sqrt((p-2)nβ/α). The model's α undercounts the real per-segment
 * cost (a frame, a write, a wake-up of the next rank): measured on 4
 * loopback ranks, 64 MiB went 0.92-1.11 GB/s with 256 KiB segments and
 * 1.11-1.30 GB/s with 1 MiB (and no better with 4 MiB), side by side, so
 * 1 MiB it is. Fixed, not tuned per call: simple and close enough over the
 * sizes that choose the chain (above 1 MiB, algo_select.c).
 *
 * Buffers: every receive of the op is posted up front, straight into the
 * caller's buffer; a segment is sent on only once its receive completed.
 * No scratch.
 *
 * Cost (α-β, n bytes, k segments): (p-2+k)(α + nβ/k).
 *
 * Invariants: every rank derives the same chain and segmentation from
 * (root, p, count), so sends and receives pair up in order; count 0 and
 * p = 1 send nothing; the transfer array is freed only after comm_xfer_drain.
 */
#include <stdlib.h>

#include "algorithms.h"
#include "stage_hooks.h"

#define CHAIN_SEGMENT_BYTES ((size_t)1024 * 1024)

dt_status comm_broadcast_chain(dt_opctx *o)
{
    const dt_op *op = o->op;
    const int p = o->size;
    const size_t bytes = op->count * dt_dtype_size(op->dtype);
    if (bytes == 0 || p == 1)
        return DT_OK;
    /* Segments are cut by bytes: nothing is reduced, so cutting an element
     * in two is harmless, and both ends cut alike. */
    const size_t nseg = (bytes + CHAIN_SEGMENT_BYTES - 1) / CHAIN_SEGMENT_BYTES;
    const int v = (o->rank - op->root + p) % p;
    const int prev = (o->rank - 1 + p) % p, next = (o->rank + 1) % p;
    const int has_prev = v > 0, has_next = v < p - 1;
    char *buf = op->recv;

    dt_xfer *xs = calloc(2 * nseg, sizeof *xs);
    if (!xs)
        return DT_ENOMEM;
    dt_xfer *recvs = xs, *sends = xs + nseg;

    for (size_t j = 0; j < nseg && has_prev; j++) {
        size_t lo = j * CHAIN_SEGMENT_BYTES;
        size_t len = bytes - lo < CHAIN_SEGMENT_BYTES ? bytes - lo : CHAIN_SEGMENT_BYTES;
        comm_xfer_recv(o, &recvs[j], prev, buf + lo, len);
    }
    dt_status st = DT_OK;
    for (size_t j = 0; j < nseg && st == DT_OK; j++) {
        size_t lo = j * CHAIN_SEGMENT_BYTES;
        size_t len = bytes - lo < CHAIN_SEGMENT_BYTES ? bytes - lo : CHAIN_SEGMENT_BYTES;
        if (has_prev)
            st = comm_xfer_wait(o, &recvs[j]);
        if (st == DT_OK && has_prev) /* device buffers: back to the device now */
            stage_ready(o, buf + lo, len);
        if (!has_prev) /* device buffers: the root's segment has reached the host */
            st = stage_need(o, buf + lo, len);
        if (st == DT_OK && has_next)
            comm_xfer_send(o, &sends[j], next, buf + lo, len);
    }
    if (st == DT_OK && has_next)
        st = comm_xfer_wait_all(o, sends, (int)nseg);

    comm_xfer_drain(o); /* on failure the transport may still hold some of xs */
    free(xs);
    return st;
}
