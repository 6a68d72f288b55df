/*
 * zero_layout.c — where ZeRO's shards and collectives lie in the flat
 * buffer: the layout zero1.c (and the checkpoints, and resharding) rely
 * on, computed once at creation.
 *
 * Shards: s = ceil(Ψ/p); rank r owns [r·s, (r+1)·s) clipped to Ψ (0
 * elements on the last ranks when Ψ < p). Reduce pieces: DDP's buckets
 * cut again at shard boundaries, each reduced to the one rank owning it.
 * Gather pieces: the stages forward reads, neighbours merged, each with
 * its intersection with every shard (an allgatherv's counts).
 *
 * Cost: O(tensors + p) pieces, O(stages · p) counts, once; nothing per
 * step.
 */
#include <stdlib.h>

#include "optim_internal.h"

/* Valid elements of rank r's shard: [r·s, (r+1)·s) clipped to Ψ. */
size_t optim_zero_shard_count(size_t num_params, size_t s, int r)
{
    size_t lo = (size_t)r * s;
    if (lo >= num_params)
        return 0;
    return num_params - lo < s ? num_params - lo : s;
}

/* Reduce pieces: DDP's buckets (whole tensors from the tail, at most cap
 * elements, a bigger tensor alone), each cut at shard boundaries, in the
 * order backward finishes them. Returns the count, -1 on ENOMEM. */
int optim_zero_reduces(optim_zero_piece **out, const dt_model *m, size_t cap, size_t s, int world)
{
    optim_zero_piece *b = calloc((size_t)m->num_tensors + (size_t)world, sizeof *b);
    *out = b;
    if (!b)
        return -1;
    int nb = 0;
    size_t hi = m->num_params;
    for (int t = m->num_tensors - 1; t >= 0; t--) {
        size_t lo = m->tensors[t].offset;
        size_t next_lo = t == 0 ? 0 : m->tensors[t - 1].offset;
        if (t > 0 && hi - next_lo <= cap)
            continue;                      /* the next tensor still fits this bucket */
        for (size_t top = hi; top > lo;) { /* [lo, hi) cut at shards */
            int owner = (int)((top - 1) / s);
            size_t base = (size_t)owner * s > lo ? (size_t)owner * s : lo;
            b[nb++] = (optim_zero_piece){.lo = base, .n = top - base, .owner = owner};
            top = base;
        }
        hi = lo;
    }
    return nb;
}

/* Gather pieces: the stages forward reads in order, [0, block 0), each
 * block, [ln_f, Ψ) (of a pipeline stage: those it holds), neighbours merged while they fit in cap elements
 * (DeepSpeed's prefetch bucket: fewer, larger collectives, each still
 * waited just before forward needs it); counts[r] = the piece ∩ rank r's
 * shard. Returns the count, -1 on ENOMEM. */
int optim_zero_gathers(optim_zero_piece **out, size_t **counts_out, const dt_model *m, size_t cap,
                       size_t s, const size_t *shard_counts, int world)
{
    /* a pipeline stage holds blocks [l0, l1) and the embeddings or the
     * head only at its ends, so its bounds are those it has */
    int nstages = 0, ng = 0;
    size_t bound[m->l1 - m->l0 + 3];
    bound[0] = 0;
    /* offsets from the tensor table: a sharded model has no buffer */
    for (int l = m->l0; l < m->l1; l++) {
        size_t at = m->tensors[(m->l0 == 0 ? 2 : 0) + 10 * (l - m->l0)].offset; /* ln1 */
        if (at > bound[nstages])
            bound[++nstages] = at;
    }
    if (m->l1 == m->cfg.L)
        bound[++nstages] = m->tensors[m->num_tensors - 3].offset; /* ln_f */
    if (m->num_params > bound[nstages])
        bound[++nstages] = m->num_params;
    optim_zero_piece *gathers = *out = calloc((size_t)nstages, sizeof *gathers);
    size_t *counts = *counts_out = calloc((size_t)nstages * (size_t)world, sizeof(size_t));
    if (!gathers || !counts)
        return -1;
    for (int k = 0; k < nstages;) {
        int end = k + 1; /* merge stages [k, end) */
        while (end < nstages && bound[end + 1] - bound[k] <= cap)
            end++;
        optim_zero_piece *g = &gathers[ng];
        *g = (optim_zero_piece){.lo = bound[k],
                                .n = bound[end] - bound[k],
                                .counts = counts + (size_t)ng * (size_t)world};
        for (int r = 0; r < world; r++) {
            size_t a = (size_t)r * s, b = a + shard_counts[r];
            a = a > g->lo ? a : g->lo;
            b = b < g->lo + g->n ? b : g->lo + g->n;
            g->counts[r] = b > a ? b - a : 0;
        }
        ng++;
        k = end;
    }
    return ng;
}
