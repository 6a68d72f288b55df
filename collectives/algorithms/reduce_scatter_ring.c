/*
 * reduce_scatter_ring.c — ring reduce-scatter: rank r ends with chunk r of
 * the reduction of every rank's buffer.
 *
 * The idea. Cut the buffer into p chunks. Each chunk starts at one rank and
 * walks once around the ring (right = rank+1), picking up one contribution
 * per hop: the rank that receives a partial adds its own contribution and
 * passes it on. Chunk c starts at rank c+1 and ends, after p-1 hops, at rank
 * c, complete. All p chunks walk at the same time, so every link carries one
 * chunk per step and no link is idle. In step s (0 .. p-2) rank r sends
 * chunk r-s-1 and receives chunk r-s-2 (mod p). With p = 4, chunks A B C D:
 *
 *   step 0   r0 ─D→ r1 ─A→ r2 ─B→ r3 ─C→ r0     partials of 1 contribution
 *   step 1   r0 ─C→ r1 ─D→ r2 ─A→ r3 ─B→ r0     ... of 2
 *   step 2   r0 ─B→ r1 ─C→ r2 ─D→ r3 ─A→ r0     ... of 3
 *   after    r0 holds A (all 4), r1 B, r2 C, r3 D
 *
 * Segments. A chunk travels as segments of RING_SEGMENT_BYTES. The receives
 * of a step are all posted before the step starts; as soon as segment j has
 * arrived and been reduced it is sent on to the right, while segment j+1 is
 * still arriving. So the reduction hides behind the network instead of
 * adding to it, and the next rank starts on segment j early.
 *
 * Buffers. A partial arrives into scratch; this rank's contribution (read
 * only: reduce-scatter's send buffer is const) is reduced into it there,
 * and the scratch segment itself is what is sent on. Two scratch slots of
 * one chunk alternate by step: step s receives into slot s%2 while slot
 * (s+1)%2 still holds step s-1's partials being sent on. Only the last
 * step's result is written to `result`.
 *
 * Order of the reduction. Chunk c is combined left to right in ring order
 * starting after its owner: (((x[c+1] op x[c+2]) op ...) op x[c]), each
 * step computing `partial op mine`. One rank computes each chunk, so ranks
 * never need to agree on rounding; all-reduce copies the owner's bytes.
 *
 * Cost (α-β, n bytes in the whole buffer): (p-1) steps of one chunk each,
 * (p-1)α + ((p-1)/p)nβ, plus ((p-1)/p)n bytes reduced, overlapped with the
 * transfers. Scratch: 2 chunks = 2n/p bytes; 3·⌈chunk/segment⌉ transfers.
 *
 * Invariants:
 *   - both ends of a link compute the same chunk layout and segmentation,
 *     so sends and receives pair up one to one, in order; empty chunks
 *     have zero segments on both ends;
 *   - a slot is posted for receiving only after every send reading it has
 *     completed (the waits at the end of each step);
 *   - the transfer array is freed only after comm_xfer_drain, even on failure,
 *     because the transport may still hold the transfers it points to.
 */
#include <stdlib.h>
#include <string.h>

#include "algorithms.h"
#include "reduce.h"
#include "ring.h"
#include "stage_hooks.h"

/* Everything one reduce-scatter carries from step to step. */
typedef struct rs_state {
    dt_opctx *o;
    const ring_chunks *k;
    const char *contrib; /* [whole buffer] this rank's contributions */
    char *result;        /* [chunk rank] where chunk rank ends */
    char *slot[2];       /* [largest chunk] partials, by step parity */
    dt_xfer *recvs;      /* [segments of largest chunk] this step's receives */
    dt_xfer *sends[2];   /* [segments of largest chunk] sends, by step parity */
    size_t esize;        /* bytes per element */
    size_t seg_elems;    /* elements per segment */
    int left, right;
} rs_state;

/* Elements [lo, lo+len) of segment j of a chunk of n elements. */
static size_t segment_len(const rs_state *s, size_t n, size_t j, size_t *lo)
{
    *lo = j * s->seg_elems;
    size_t left = n - *lo;
    return left < s->seg_elems ? left : s->seg_elems;
}

/* Post the receives of step `step`: chunk rank-step-2 from the left, into
 * slot step%2, one transfer per segment. */
static void post_step_receives(rs_state *s, int step)
{
    const dt_opctx *o = s->o;
    int c = ring_mod(o->rank - step - 2, o->size);
    size_t n = ring_chunk_count(s->k, c);
    char *slot = s->slot[step % 2];
    for (size_t j = 0, nseg = ring_segments(n, s->seg_elems); j < nseg; j++) {
        size_t lo, len = segment_len(s, n, j, &lo);
        comm_xfer_recv(s->o, &s->recvs[j], s->left, slot + lo * s->esize, len * s->esize);
    }
}

/* Step 0 sends this rank's own contribution to chunk rank-1: nothing to add
 * to it yet, so it goes straight from the caller's buffer (device buffers:
 * each segment as soon as its copy to the host has landed, stage_hooks.h). */
static dt_status post_first_sends(rs_state *s)
{
    const dt_opctx *o = s->o;
    int c = ring_mod(o->rank - 1, o->size);
    size_t n = ring_chunk_count(s->k, c);
    const char *src = s->contrib + ring_chunk_offset(s->k, c) * s->esize;
    for (size_t j = 0, nseg = ring_segments(n, s->seg_elems); j < nseg; j++) {
        size_t lo, len = segment_len(s, n, j, &lo);
        dt_status st = stage_need(s->o, src + lo * s->esize, len * s->esize);
        if (st != DT_OK)
            return st;
        comm_xfer_send(s->o, &s->sends[0][j], s->right, src + lo * s->esize, len * s->esize);
    }
    return DT_OK;
}

/*
 * Step `step`: chunk c = rank-step-2 arrives from the left as a partial of
 * step+1 contributions. Add ours to each segment as it lands and send it on
 * at once (it is the next step's outgoing chunk), or, at the last step,
 * where c == rank, keep it as the result.
 */
static dt_status reduce_scatter_step(rs_state *s, int step)
{
    dt_opctx *o = s->o;
    const int p = o->size;
    const int last = step == p - 2;
    int c = ring_mod(o->rank - step - 2, p);
    size_t n = ring_chunk_count(s->k, c);
    char *slot = s->slot[step % 2];
    const char *mine = s->contrib + ring_chunk_offset(s->k, c) * s->esize;
    dt_xfer *forward = s->sends[(step + 1) % 2];

    for (size_t j = 0, nseg = ring_segments(n, s->seg_elems); j < nseg; j++) {
        dt_status st = comm_xfer_wait(o, &s->recvs[j]);
        size_t lo, len = segment_len(s, n, j, &lo);
        if (st == DT_OK)
            st = stage_need(o, mine + lo * s->esize, len * s->esize);
        if (st != DT_OK)
            return st;
        char *partial = slot + lo * s->esize;
        dt_reduce_into(partial, mine + lo * s->esize, len, o->op->dtype, o->op->redop);
        if (last)
            memcpy(s->result + lo * s->esize, partial, len * s->esize);
        else
            comm_xfer_send(o, &forward[j], s->right, partial, len * s->esize);
    }

    /* This step's sends (chunk rank-step-1) read slot (step+1)%2, which the
     * next step receives into: they must be done first. */
    int sent = ring_mod(o->rank - step - 1, p);
    size_t nsent = ring_segments(ring_chunk_count(s->k, sent), s->seg_elems);
    dt_status st = comm_xfer_wait_all(o, s->sends[step % 2], (int)nsent);
    if (st == DT_OK && !last)
        post_step_receives(s, step + 1);
    return st;
}

static size_t largest_chunk(const ring_chunks *k, int p)
{
    size_t most = 0;
    for (int c = 0; c < p; c++)
        if (ring_chunk_count(k, c) > most)
            most = ring_chunk_count(k, c);
    return most;
}

dt_status comm_reduce_scatter_ring_phase(dt_opctx *o, void *result, const void *contrib,
                                         const ring_chunks *k)
{
    const int p = o->size;
    const size_t esize = dt_dtype_size(o->op->dtype);
    if (p == 1) { /* one contribution: it is the result */
        size_t bytes = ring_chunk_count(k, 0) * esize;
        if (bytes && result != contrib)
            memmove(result, contrib, bytes);
        return DT_OK;
    }
    size_t most = largest_chunk(k, p);
    if (most == 0)
        return DT_OK; /* nothing anywhere: no rank sends anything */

    rs_state s = {
        .o = o,
        .k = k,
        .contrib = contrib,
        .result = result,
        .esize = esize,
        .seg_elems = RING_SEGMENT_BYTES / esize,
        .left = ring_mod(o->rank - 1, p),
        .right = ring_mod(o->rank + 1, p),
    };
    size_t nseg = ring_segments(most, s.seg_elems);
    s.slot[0] = comm_xfer_scratch(o, 0, most * esize);
    s.slot[1] = comm_xfer_scratch(o, 1, most * esize);
    dt_xfer *xs = calloc(3 * nseg, sizeof *xs);
    if (!s.slot[0] || !s.slot[1] || !xs) {
        free(xs);
        return DT_ENOMEM;
    }
    s.recvs = xs;
    s.sends[0] = xs + nseg;
    s.sends[1] = xs + 2 * nseg;

    post_step_receives(&s, 0);
    dt_status st = post_first_sends(&s);
    for (int step = 0; step < p - 1 && st == DT_OK; step++)
        st = reduce_scatter_step(&s, step);

    comm_xfer_drain(o); /* on failure the transport may still hold some of xs */
    free(xs);
    return st;
}

/* reduce_scatter: send [p·count] → recv [count], chunk `rank` of the
 * reduction. In place when recv == send + rank·count. */
dt_status comm_reduce_scatter_ring(dt_opctx *o)
{
    const dt_op *op = o->op;
    if (op->count == 0)
        return DT_OK;
    ring_chunks k = ring_chunks_uniform(op->count);
    dt_status st = comm_reduce_scatter_ring_phase(o, op->recv, op->send, &k);
    if (st == DT_OK)
        dt_reduce_finish(op->recv, op->count, op->dtype, op->redop, o->size);
    return st;
}
