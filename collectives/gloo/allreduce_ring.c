/*
 * allreduce_ring.c — all_reduce as torch 1.13's gloo runs it: always the
 * ring (gloo::allreduce, algorithm UNSPECIFIED), bit for bit.
 *
 * Geometry, with E bytes per element, T bytes in all, p ranks, MAX = 1 MiB:
 *   maxSeg = E·max(1, ⌊MAX/E⌋)
 *   numSeg = roundUp(max(⌈T/maxSeg⌉, 2p), p), nspr = numSeg/p (≥ 2)
 *   segB   = roundUp(⌈T/numSeg⌉, E)
 * Rank c owns chunk c = nspr segments; offsets past T shorten or drop a
 * message. Data flows down the ring: send to r-1, receive from r+1.
 *
 * Phase 1 (reduce-scatter), i = 0 .. numSeg-nspr+1: at i ≥ 2 wait for the
 * segment received two iterations ago into one of two scratch halves and
 * reduce it as out = out ⊕ received (local first: the order is the
 * result), then wait for that iteration's send; while i < numSeg-nspr,
 * post the receive from r+1 into scratch half i&1, then the send to r-1.
 * Phase 2 (all-gather) has the same shape on `out` alone. Every element of
 * chunk c ends as x_c ⊕ (x_c+1 ⊕ (… ⊕ (x_c-2 ⊕ x_c-1))), indices mod p.
 *
 * How it differs from dtrain's own ring (allreduce_ring.c one folder up):
 * that one sends to r+1, cuts chunks by element and pipelines its own
 * segments; the association order differs, so the bits differ.
 *
 * Cost (α-β): 2(numSeg-nspr)α + 2((p-1)/p)Tβ, plus T/p reductions' time;
 * at least 2(p-1) messages per phase, more once T > 2p MiB.
 */
#include <stdlib.h>
#include <sys/types.h>

#include "gloo.h"

#define MAX_SEGMENT ((size_t)1 << 20)

typedef struct ring_geometry {
    size_t total, num_seg, per_rank, seg;
} ring_geometry;

typedef struct segment {
    size_t send_off, recv_off;
    ssize_t send_len, recv_len;
} segment;

static size_t round_up(size_t v, size_t m)
{
    return (v + m - 1) / m * m;
}

static segment offsets(const ring_geometry *g, size_t send_chunk, size_t recv_chunk, size_t i)
{
    const size_t span = g->num_seg * g->seg;
    segment s;
    s.send_off = ((send_chunk * g->per_rank + i) * g->seg) % span;
    s.recv_off = ((recv_chunk * g->per_rank + i) * g->seg) % span;
    s.send_len = (ssize_t)g->total - (ssize_t)s.send_off;
    s.recv_len = (ssize_t)g->total - (ssize_t)s.recv_off;
    if (s.send_len > (ssize_t)g->seg)
        s.send_len = (ssize_t)g->seg;
    if (s.recv_len > (ssize_t)g->seg)
        s.recv_len = (ssize_t)g->seg;
    return s;
}

static dt_status reduce_scatter(gloo_ctx *c, const ring_geometry *g, gloo_buf *out, gloo_buf *tmp,
                                uint64_t slot, dt_dtype t, dt_redop op)
{
    const int p = c->size, r = c->rank, to = (r + p - 1) % p, from = (r + 1) % p;
    const size_t esize = dt_dtype_size(t), steps = g->num_seg - g->per_rank;
    dt_status st = DT_OK;
    for (size_t i = 0; i < steps + 2 && st == DT_OK; i++) {
        if (i >= 2) {
            segment prev = offsets(g, (size_t)r + 1, (size_t)r + 2, i - 2);
            if (prev.recv_len > 0) {
                if ((st = comm_gloo_wait_recv(c, tmp, from)) != DT_OK)
                    break;
                uint8_t *at = out->ptr + prev.recv_off;
                comm_gloo_reduce(at, at, tmp->ptr + (i & 1) * g->seg, (size_t)prev.recv_len / esize,
                                 t, op);
            }
            if (prev.send_len > 0 && (st = comm_gloo_wait_send(c, out, to)) != DT_OK)
                break;
        }
        if (i < steps) {
            segment cur = offsets(g, (size_t)r + 1, (size_t)r + 2, i);
            if (cur.recv_len > 0)
                comm_gloo_post_recv(c, from, slot, tmp, (i & 1) * g->seg, (size_t)cur.recv_len);
            if (cur.send_len > 0)
                comm_gloo_post_send(c, to, slot, out, cur.send_off, (size_t)cur.send_len);
        }
    }
    return st;
}

static dt_status all_gather(gloo_ctx *c, const ring_geometry *g, gloo_buf *out, uint64_t slot)
{
    const int p = c->size, r = c->rank, to = (r + p - 1) % p, from = (r + 1) % p;
    const size_t steps = g->num_seg - g->per_rank;
    for (size_t i = 0; i < steps + 2; i++) {
        if (i >= 2) {
            segment prev = offsets(g, (size_t)r, (size_t)r + 1, i - 2);
            dt_status st;
            if (prev.recv_len > 0 && (st = comm_gloo_wait_recv(c, out, from)) != DT_OK)
                return st;
            if (prev.send_len > 0 && (st = comm_gloo_wait_send(c, out, to)) != DT_OK)
                return st;
        }
        if (i < steps) {
            segment cur = offsets(g, (size_t)r, (size_t)r + 1, i);
            if (cur.recv_len > 0)
                comm_gloo_post_recv(c, from, slot, out, cur.recv_off, (size_t)cur.recv_len);
            if (cur.send_len > 0)
                comm_gloo_post_send(c, to, slot, out, cur.send_off, (size_t)cur.send_len);
        }
    }
    return DT_OK;
}

dt_status comm_gloo_allreduce(gloo_ctx *c, void *buf, size_t count, dt_dtype t, dt_redop op)
{
    const uint32_t tag = comm_gloo_begin(c, "allreduce", GLOO_ALLREDUCE);
    if (c->failed != DT_OK)
        return c->failed;
    if (!comm_gloo_reduces(t, op))
        return comm_gloo_fail(c, DT_EINVAL,
                              "gloo rank %d: allreduce (tag %u): torch 1.13's gloo "
                              "does not reduce %s with %s",
                              c->rank, tag, dt_dtype_name(t), dt_redop_name(op));
    const size_t esize = dt_dtype_size(t), total = count * esize;
    if (total == 0 || c->size == 1)
        return DT_OK;
    const size_t p = (size_t)c->size,
                 max_seg = esize * (MAX_SEGMENT / esize ? MAX_SEGMENT / esize : 1);
    ring_geometry g = {.total = total};
    size_t want = (total + max_seg - 1) / max_seg;
    g.num_seg = round_up(want > 2 * p ? want : 2 * p, p);
    g.per_rank = g.num_seg / p;
    g.seg = round_up((total + g.num_seg - 1) / g.num_seg, esize);
    uint8_t *scratch = malloc(2 * g.seg);
    if (!scratch)
        return comm_gloo_fail(c, DT_ENOMEM, "gloo rank %d: out of memory (allreduce tag %u)",
                              c->rank, tag);
    gloo_buf out = {.ptr = buf, .size = total}, tmp = {.ptr = scratch, .size = 2 * g.seg};
    const uint64_t slot = comm_gloo_slot(GLOO_ALLREDUCE, tag);
    dt_status st = reduce_scatter(c, &g, &out, &tmp, slot, t, op);
    if (st == DT_OK)
        st = all_gather(c, &g, &out, slot);
    free(scratch);
    return st;
}
