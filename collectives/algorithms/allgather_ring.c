/*
 * allgather_ring.c — ring all-gather and all-gatherv: every rank ends with
 * every rank's chunk.
 *
 * The idea. Each rank's chunk walks once around the ring (right = rank+1),
 * being copied into every buffer it passes through: in step s (0 .. p-2)
 * rank r sends chunk r-s to the right and receives chunk r-s-1 from the
 * left, which it sends on in step s+1. All p chunks move at once, so every
 * link is busy every step. With p = 4 and rank r's chunk called r:
 *
 *   step 0   r0 ─0→ r1 ─1→ r2 ─2→ r3 ─3→ r0
 *   step 1   r0 ─3→ r1 ─0→ r2 ─1→ r3 ─2→ r0
 *   step 2   r0 ─2→ r1 ─3→ r2 ─0→ r3 ─1→ r0
 *   after    every rank holds 0 1 2 3
 *
 * All-gatherv is the same walk with chunks of different sizes (counts[c],
 * zeros allowed: an empty chunk is never sent, and both ends know it).
 *
 * Segments and buffers. Nothing is reduced, so everything is received
 * straight into its final place in the output buffer: every receive of the
 * whole op is posted up front, and each segment is sent on to the right
 * the moment it has landed, while the next is still arriving. No scratch.
 * Since a chunk only ever travels as a copy of its owner's bytes, every
 * rank ends bitwise identical (all-reduce relies on this).
 *
 * Cost (α-β, n bytes in the whole output): (p-1)α + ((p-1)/p)nβ for equal
 * chunks; for all-gatherv the step time is set by the largest chunk, so
 * (p-1)(α + max_c bytes(c)·β). Memory: one transfer per segment of the
 * output (~n / RING_SEGMENT_BYTES, a few hundred bytes each).
 *
 * Invariants:
 *   - sends and receives pair up one to one per link, in the same order,
 *     because both ends walk the same chunks in the same order with the
 *     same segmentation;
 *   - a segment is sent on only after its receive completed (its bytes are
 *     in the output buffer);
 *   - the transfer array is freed only after comm_xfer_drain, even on failure.
 */
#include <stdlib.h>
#include <string.h>

#include "algorithms.h"
#include "ring.h"
#include "stage_hooks.h"

/* Count the segments of all chunks but `skip`. */
static size_t segments_except(const ring_chunks *k, int p, int skip, size_t seg_elems)
{
    size_t total = 0;
    for (int c = 0; c < p; c++)
        if (c != skip)
            total += ring_segments(ring_chunk_count(k, c), seg_elems);
    return total;
}

/* Post one transfer per segment of chunk c of `buf`, starting at xs[*next];
 * advances *next. */
static void post_chunk(dt_opctx *o, dt_xfer *xs, size_t *next, int is_send, int peer, char *buf,
                       const ring_chunks *k, int c, size_t esize, size_t seg_elems)
{
    size_t n = ring_chunk_count(k, c);
    char *base = buf + ring_chunk_offset(k, c) * esize;
    for (size_t lo = 0; lo < n; lo += seg_elems) {
        size_t len = n - lo < seg_elems ? n - lo : seg_elems;
        if (is_send)
            comm_xfer_send(o, &xs[(*next)++], peer, base + lo * esize, len * esize);
        else
            comm_xfer_recv(o, &xs[(*next)++], peer, base + lo * esize, len * esize);
    }
}

dt_status comm_allgather_ring_phase(dt_opctx *o, void *buf, const ring_chunks *k)
{
    const int p = o->size, r = o->rank;
    const int left = ring_mod(r - 1, p), right = ring_mod(r + 1, p);
    const size_t esize = dt_dtype_size(o->op->dtype);
    const size_t seg_elems = RING_SEGMENT_BYTES / esize;
    if (p == 1)
        return DT_OK;
    /* This rank receives every chunk but its own and sends every chunk but
     * its right neighbour's (which would come home). */
    size_t nrecv = segments_except(k, p, r, seg_elems);
    size_t nsend = segments_except(k, p, right, seg_elems);
    if (nrecv + nsend == 0)
        return DT_OK;
    dt_xfer *xs = calloc(nrecv + nsend, sizeof *xs);
    if (!xs)
        return DT_ENOMEM;
    dt_xfer *recvs = xs, *sends = xs + nrecv;

    size_t posted_recv = 0, posted_send = 0;
    for (int step = 0; step < p - 1; step++)
        post_chunk(o, recvs, &posted_recv, 0, left, buf, k, ring_mod(r - step - 1, p), esize,
                   seg_elems);
    post_chunk(o, sends, &posted_send, 1, right, buf, k, r, esize, seg_elems);

    /* Walk the receives in posting order; after each lands, pass it on,
     * except in the last step, whose chunk has finished its lap. */
    dt_status st = DT_OK;
    size_t waited = 0;
    for (int step = 0; step < p - 1 && st == DT_OK; step++) {
        int c = ring_mod(r - step - 1, p);
        size_t n = ring_chunk_count(k, c);
        char *base = (char *)buf + ring_chunk_offset(k, c) * esize;
        for (size_t lo = 0; lo < n && st == DT_OK; lo += seg_elems) {
            size_t len = n - lo < seg_elems ? n - lo : seg_elems;
            st = comm_xfer_wait(o, &recvs[waited++]);
            if (st == DT_OK) /* final: device buffers copy it back now */
                stage_ready(o, base + lo * esize, len * esize);
            if (st == DT_OK && step < p - 2)
                comm_xfer_send(o, &sends[posted_send++], right, base + lo * esize, len * esize);
        }
    }
    if (st == DT_OK)
        st = comm_xfer_wait_all(o, sends, (int)posted_send);

    comm_xfer_drain(o); /* on failure the transport may still hold some of xs */
    free(xs);
    return st;
}

/* allgather: send [count] → recv [p·count]; allgatherv: send [counts[rank]]
 * → recv [Σ counts]. In place when send == this rank's place in recv. */
dt_status comm_allgather_ring(dt_opctx *o)
{
    const dt_op *op = o->op;
    ring_chunks k = op->kind == DT_OP_ALLGATHERV ? ring_chunks_given(op->counts)
                                                 : ring_chunks_uniform(op->count);
    const size_t esize = dt_dtype_size(op->dtype);
    char *mine = (char *)op->recv + ring_chunk_offset(&k, o->rank) * esize;
    size_t bytes = ring_chunk_count(&k, o->rank) * esize;
    if (bytes && mine != (const char *)op->send)
        memmove(mine, op->send, bytes);
    stage_ready(o, mine, bytes);
    return comm_allgather_ring_phase(o, op->recv, &k);
}
