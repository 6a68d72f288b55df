/*
 * reduce_ring.c — reduce as torch 1.13's gloo runs it (gloo/reduce.cc):
 * a ring reduce-scatter, then every rank sends its chunk to the root.
 *
 * Geometry (differs from all_reduce's):
 *   segB   = roundUp(min(⌈T/2p⌉, E·⌊MAX/E⌋), E), MAX = 1 MiB
 *   numSeg = roundUp(max(⌈T/segB⌉, 2p), p), nspr = numSeg/p, chunk = nspr·segB
 * The reduce-scatter has all_reduce's offsets and direction (send to r-1)
 * but runs i = 0 .. numSeg-1, posting while i < numSeg-2: with nspr > 2 it
 * sends more than a reduce-scatter needs, so a non-root buffer ends with
 * further partial sums in it — torch leaves them there, and so does this.
 * Each arrival is reduced as out = out ⊕ received. Then the root receives
 * chunk q from every q ≠ root in ascending order; the others send theirs.
 *
 * How it differs from dtrain's own reduce (a binomial tree): it moves
 * about twice the bytes of a tree for small p, but never more than T/p per
 * link per step.
 *
 * Cost (α-β): (numSeg-2)α + ((numSeg-2)/numSeg)Tβ, then at the root
 * (p-1)α + ((p-1)/p)Tβ.
 */
#include <stdlib.h>
#include <sys/types.h>

#include "gloo.h"

#define MAX_SEGMENT ((size_t)1 << 20)

static size_t round_up(size_t v, size_t m)
{
    return (v + m - 1) / m * m;
}

static ssize_t clipped(size_t total, size_t off, size_t len)
{
    ssize_t left = (ssize_t)total - (ssize_t)off;
    return left < (ssize_t)len ? left : (ssize_t)len;
}

typedef struct geometry {
    size_t total, seg, num_seg, per_rank;
} geometry;

static dt_status scatter_phase(gloo_ctx *c, const geometry *g, gloo_buf *out, gloo_buf *tmp,
                               uint64_t slot, dt_dtype t, dt_redop op)
{
    const size_t p = (size_t)c->size, r = (size_t)c->rank, span = g->num_seg * g->seg;
    const int to = (int)((r + p - 1) % p), from = (int)((r + 1) % p);
    const size_t esize = dt_dtype_size(t);
    for (size_t i = 0; i < g->num_seg; i++) {
        if (i >= 2) {
            size_t j = i - 2, soff = (((r + 1) * g->per_rank + j) * g->seg) % span;
            size_t roff = (((r + 2) * g->per_rank + j) * g->seg) % span;
            ssize_t rlen = clipped(g->total, roff, g->seg), slen = clipped(g->total, soff, g->seg);
            dt_status st;
            if (rlen > 0) {
                if ((st = comm_gloo_wait_recv(c, tmp, from)) != DT_OK)
                    return st;
                comm_gloo_reduce(out->ptr + roff, out->ptr + roff, tmp->ptr + (i & 1) * g->seg,
                                 (size_t)rlen / esize, t, op);
            }
            if (slen > 0 && (st = comm_gloo_wait_send(c, out, to)) != DT_OK)
                return st;
        }
        if (i + 2 < g->num_seg) {
            size_t soff = (((r + 1) * g->per_rank + i) * g->seg) % span;
            size_t roff = (((r + 2) * g->per_rank + i) * g->seg) % span;
            ssize_t rlen = clipped(g->total, roff, g->seg), slen = clipped(g->total, soff, g->seg);
            if (rlen > 0)
                comm_gloo_post_recv(c, from, slot, tmp, (i & 1) * g->seg, (size_t)rlen);
            if (slen > 0)
                comm_gloo_post_send(c, to, slot, out, soff, (size_t)slen);
        }
    }
    return DT_OK;
}

static dt_status gather_phase(gloo_ctx *c, const geometry *g, gloo_buf *out, uint64_t slot,
                              int root)
{
    const size_t chunk = g->per_rank * g->seg;
    dt_status st = DT_OK;
    if (c->rank != root) {
        size_t off = (size_t)c->rank * chunk;
        ssize_t len = clipped(g->total, off, chunk);
        if (len > 0) {
            comm_gloo_post_send(c, root, slot, out, off, (size_t)len);
            st = comm_gloo_wait_send(c, out, root);
        }
        return st;
    }
    int posted = 0, last = root;
    for (int q = 0; q < c->size; q++) {
        ssize_t len = clipped(g->total, (size_t)q * chunk, chunk);
        if (q != root && len > 0) {
            comm_gloo_post_recv(c, q, slot, out, (size_t)q * chunk, (size_t)len);
            posted++;
            last = q;
        }
    }
    for (int i = 0; i < posted && st == DT_OK; i++)
        st = comm_gloo_wait_recv(c, out, last);
    return st;
}

dt_status comm_gloo_reduce_root(gloo_ctx *c, void *buf, size_t count, dt_dtype t, dt_redop op,
                                int root)
{
    const uint32_t tag = comm_gloo_begin(c, "reduce", GLOO_REDUCE);
    if (c->failed != DT_OK)
        return c->failed;
    if (!comm_gloo_reduces(t, op) || root < 0 || root >= c->size)
        return comm_gloo_fail(c, DT_EINVAL,
                              "gloo rank %d: reduce (tag %u) of %s with %s to rank %d: not a "
                              "reduction torch 1.13's gloo runs",
                              c->rank, tag, dt_dtype_name(t), dt_redop_name(op), root);
    const size_t esize = dt_dtype_size(t), total = count * esize, p = (size_t)c->size;
    if (total == 0 || p == 1)
        return DT_OK;
    geometry g = {.total = total};
    size_t max_seg = esize * (MAX_SEGMENT / esize), half = (total + 2 * p - 1) / (2 * p);
    g.seg = round_up(half < max_seg ? half : max_seg, esize);
    size_t want = (total + g.seg - 1) / g.seg;
    g.num_seg = round_up(want > 2 * p ? want : 2 * p, p);
    g.per_rank = g.num_seg / p;
    uint8_t *scratch = malloc(2 * g.seg);
    if (!scratch)
        return comm_gloo_fail(c, DT_ENOMEM, "gloo rank %d: out of memory (reduce tag %u)", c->rank,
                              tag);
    gloo_buf out = {.ptr = buf, .size = total}, tmp = {.ptr = scratch, .size = 2 * g.seg};
    const uint64_t slot = comm_gloo_slot(GLOO_REDUCE, tag);
    dt_status st = scatter_phase(c, &g, &out, &tmp, slot, t, op);
    if (st == DT_OK)
        st = gather_phase(c, &g, &out, slot, root);
    free(scratch);
    return st;
}
