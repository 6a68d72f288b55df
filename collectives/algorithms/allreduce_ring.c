/*
 * allreduce_ring.c — ring all-reduce: reduce-scatter, then all-gather.
 *
 * The idea (Patarasuk & Yuan; Baidu's "ring allreduce"; NCCL's default).
 * Cut the buffer of `count` elements into p chunks as equal as possible
 * (the first count%p chunks get one more element). Two laps around the
 * ring (right = rank+1, left = rank-1):
 *
 *   1. reduce-scatter (comm_reduce_scatter_ring_phase, reduce_scatter_ring.c): each
 *      chunk walks the ring collecting one contribution per hop; after p-1
 *      steps rank r owns chunk r, fully reduced.
 *   2. all-gather (comm_allgather_ring_phase, allgather_ring.c): each owner's chunk
 *      walks the ring again, copied into every buffer it passes; after p-1
 *      more steps everyone has every chunk.
 *
 * With p = 3 and buffers x0 x1 x2 cut into chunks A B C (Σ = reduced):
 *
 *   reduce-scatter
 *     step 0   r0 ─C0──→ r1 ─A1──→ r2 ─B2──→ r0
 *     step 1   r0 ─B20─→ r1 ─C01─→ r2 ─A12─→ r0
 *     after    r0 owns ΣA, r1 ΣB, r2 ΣC
 *   all-gather
 *     step 0   r0 ─ΣA──→ r1 ─ΣB──→ r2 ─ΣC──→ r0
 *     step 1   r0 ─ΣC──→ r1 ─ΣA──→ r2 ─ΣB──→ r0
 *     after    every rank holds ΣA ΣB ΣC
 *
 * (C0 = rank 0's part of chunk C; B20 = rank 2's and rank 0's, and so on.)
 *
 * Why a ring: every rank sends and receives exactly 2(p-1)/p of the buffer,
 * whatever p is, and all links work at once. No all-reduce can move less
 * per rank, so the bandwidth term is optimal. Each chunk is further cut into
 * segments (RING_SEGMENT_BYTES) so that reducing one segment overlaps the
 * transfer of the next, and a rank forwards segment j before segment j+1
 * has arrived.
 *
 * DT_AVG is reduced as a sum; the owner of a chunk divides it
 * (dt_reduce_finish) before the all-gather, which then spreads finished
 * chunks. So each element is divided once, by one rank, and every rank
 * ends with the owner's bytes: all ranks are bitwise identical, whatever
 * the dtype. (Dividing the whole buffer on every rank after the gather
 * would give the same bytes at p times the work.)
 *
 * Cost (α-β, n bytes): 2(p-1)α + 2((p-1)/p)nβ, plus ((p-1)/p)n bytes
 * reduced, overlapped with the transfers. The 2(p-1)α latency term is why
 * small messages use recursive doubling instead (algo_select.c). Scratch:
 * 2n/p bytes.
 *
 * Invariants: in place (the buffer is both input and output); chunk
 * layout and segmentation are computed identically on every rank from
 * (count, p), so every send meets its receive; count 0 sends nothing;
 * a world of one returns its buffer unchanged (DT_AVG divides by 1).
 */
#include "algorithms.h"
#include "reduce.h"
#include "ring.h"
#include "stage_hooks.h"

dt_status comm_allreduce_ring(dt_opctx *o)
{
    const dt_op *op = o->op;
    if (op->count == 0)
        return DT_OK;
    const size_t esize = dt_dtype_size(op->dtype);
    ring_chunks k = ring_chunks_split(op->count, o->size);
    char *buf = op->recv;
    char *owned = buf + ring_chunk_offset(&k, o->rank) * esize;
    size_t owned_count = ring_chunk_count(&k, o->rank);

    dt_status st = comm_reduce_scatter_ring_phase(o, owned, buf, &k);
    if (st != DT_OK)
        return st;
    dt_reduce_finish(owned, owned_count, op->dtype, op->redop, o->size);
    stage_ready(o, owned, owned_count * esize); /* final: to the device now */
    return comm_allgather_ring_phase(o, buf, &k);
}
