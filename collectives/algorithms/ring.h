/*
 * ring.h — internal: the two phases every ring collective is built from.
 *
 * Put the p ranks on a ring, each sending only to its right neighbour
 * (rank+1) and receiving only from its left (rank-1). Cut the buffer into p
 * chunks, one per rank. Then:
 *
 *   comm_reduce_scatter_ring_phase  after p-1 steps rank r holds chunk r
 *                                   reduced over all ranks
 *                                   (reduce_scatter_ring.c)
 *   comm_allgather_ring_phase       after p-1 steps every rank holds every
 *                                   rank's chunk (allgather_ring.c)
 *
 * and all-reduce is literally the one followed by the other
 * (allreduce_ring.c). Each phase moves (p-1)/p of the buffer through every
 * link, so all p links are busy at once: the bandwidth term is optimal,
 * whatever p is. The price is p-1 latencies per phase.
 *
 * Chunks are described by a ring_chunks: equal (all-reduce: as equal as
 * possible, the first count%p chunks one element longer; reduce-scatter and
 * all-gather: `base` each) or given (all-gatherv: counts[c]). A chunk of
 * zero elements is simply never sent: both ends compute the same layout, so
 * both agree there is nothing to send or receive for it.
 *
 * Each chunk travels in segments of RING_SEGMENT_BYTES, so the work on one
 * segment (reducing it, or forwarding it) starts while the next is still on
 * the wire.
 */
#ifndef DT_RING_H
#define DT_RING_H

#include <stddef.h>

#include "xfer.h"

/* 1 MiB. Each segment costs a frame, a write and, often, a wake-up of the
 * loop's runner; on a machine where the ranks share few cores those
 * per-message costs are CPU the copies and reductions need, and they
 * outweigh the finer overlap of smaller segments. Measured, 4 ranks on 2
 * cores, busbw medians side by side (64 KiB .. 4 MiB segments): 256 KiB ->
 * 1 MiB took all-reduce 4 MiB 0.74 -> 0.93 GB/s and 16 MiB 0.83 -> 0.91,
 * all-gather 4/64 MiB 0.72/0.77 -> 0.85/0.87, reduce-scatter 0.68/0.66 ->
 * 0.80/0.77; 512 KiB and 2 MiB were within noise of 1 MiB, 64-128 KiB
 * clearly slower. A chunk smaller than a segment travels whole. Divisible
 * by every element size, so a segment never splits an element. */
#define RING_SEGMENT_BYTES ((size_t)1024 * 1024)

typedef struct ring_chunks {
    size_t base;          /* every chunk has `base` elements ...          */
    size_t extra;         /* ... and chunks c < extra one more            */
    const size_t *counts; /* or, when not NULL, chunk c has counts[c]     */
} ring_chunks;

/* count elements over p chunks, as equal as possible. */
static inline ring_chunks ring_chunks_split(size_t count, int p)
{
    ring_chunks k = {count / (size_t)p, count % (size_t)p, NULL};
    return k;
}

/* p chunks of `per_rank` elements each. */
static inline ring_chunks ring_chunks_uniform(size_t per_rank)
{
    ring_chunks k = {per_rank, 0, NULL};
    return k;
}

/* Chunk c has counts[c] elements (all-gatherv). */
static inline ring_chunks ring_chunks_given(const size_t *counts)
{
    ring_chunks k = {0, 0, counts};
    return k;
}

/* Elements in chunk c. */
static inline size_t ring_chunk_count(const ring_chunks *k, int c)
{
    if (k->counts)
        return k->counts[c];
    return k->base + ((size_t)c < k->extra ? 1 : 0);
}

/* Element offset of chunk c in the whole buffer. O(c) for given counts;
 * p is small and this is called O(p) times per op. */
static inline size_t ring_chunk_offset(const ring_chunks *k, int c)
{
    if (k->counts) {
        size_t off = 0;
        for (int i = 0; i < c; i++)
            off += k->counts[i];
        return off;
    }
    size_t before = (size_t)c < k->extra ? (size_t)c : k->extra;
    return (size_t)c * k->base + before;
}

/* a mod p in [0, p), also for negative a: ring positions wrap both ways. */
static inline int ring_mod(int a, int p)
{
    return ((a % p) + p) % p;
}

/* Segments needed for `elems` elements at `seg_elems` per segment. */
static inline size_t ring_segments(size_t elems, size_t seg_elems)
{
    return (elems + seg_elems - 1) / seg_elems;
}

/*
 * Reduce-scatter phase. `contrib` holds this rank's contribution to every
 * chunk (the whole buffer, read only); on success `result` holds chunk
 * o->rank reduced over all ranks with o->op->redop (DT_AVG still as a sum:
 * the caller finishes). `result` may be contrib + that chunk's offset (in
 * place); otherwise it must not overlap contrib. Uses both scratch slots.
 */
dt_status comm_reduce_scatter_ring_phase(dt_opctx *o, void *result, const void *contrib,
                                         const ring_chunks *k);

/*
 * All-gather phase. `buf` is the whole buffer; chunk o->rank is already in
 * place. On success every chunk is: each a bitwise copy of its owner's.
 */
dt_status comm_allgather_ring_phase(dt_opctx *o, void *buf, const ring_chunks *k);

#endif /* DT_RING_H */
