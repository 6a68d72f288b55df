/*
 * gather_scatter.c — gather and scatter as torch 1.13's gloo runs them
 * (gloo/gather.cc, gloo/scatter.cc): linear at the root.
 *
 * gather: each non-root sends its whole block to the root; the root posts
 * a receive from every other rank in ascending order into out[i·B], copies
 * its own block, then waits for them all. scatter is the mirror: the root
 * sends block i to each i ≠ root in ascending order, copies its own, then
 * waits; the others receive once.
 *
 * Same shape as dtrain's own linear gather/scatter, without its root
 * agreement round.
 *
 * Cost (α-β): (p-1)α + ((p-1)/p)nβ at the root, n = p·B.
 */
#include <string.h>

#include "gloo.h"

static dt_status check_root(gloo_ctx *c, int root)
{
    if (c->failed != DT_OK)
        return c->failed;
    if (root < 0 || root >= c->size)
        return comm_gloo_fail(c, DT_EINVAL, "gloo rank %d: %s (tag %u) with root %d of %d", c->rank,
                              c->op, c->op_tag, root, c->size);
    return DT_OK;
}

/* Waits for n completions of one kind on b. */
static dt_status wait_n(gloo_ctx *c, gloo_buf *b, int n, bool recv, int root)
{
    dt_status st = DT_OK;
    for (int q = 0, seen = 0; q < c->size && seen < n && st == DT_OK; q++) {
        if (q == root)
            continue;
        st = recv ? comm_gloo_wait_recv(c, b, q) : comm_gloo_wait_send(c, b, q);
        seen++;
    }
    return st;
}

dt_status comm_gloo_gather(gloo_ctx *c, void *out, const void *in, size_t bytes, int root)
{
    const uint32_t tag = comm_gloo_begin(c, "gather", GLOO_GATHER);
    dt_status st = check_root(c, root);
    if (st != DT_OK)
        return st;
    const uint64_t slot = comm_gloo_slot(GLOO_GATHER, tag);
    if (c->rank != root) {
        gloo_buf b = {.ptr = (uint8_t *)in, .size = bytes};
        comm_gloo_post_send(c, root, slot, &b, 0, bytes);
        return comm_gloo_wait_send(c, &b, root);
    }
    gloo_buf b = {.ptr = out, .size = bytes * (size_t)c->size};
    for (int q = 0; q < c->size; q++)
        if (q != root)
            comm_gloo_post_recv(c, q, slot, &b, (size_t)q * bytes, bytes);
    memmove((uint8_t *)out + (size_t)root * bytes, in, bytes);
    return wait_n(c, &b, c->size - 1, true, root);
}

dt_status comm_gloo_scatter(gloo_ctx *c, void *out, const void *in, size_t bytes, int root)
{
    const uint32_t tag = comm_gloo_begin(c, "scatter", GLOO_SCATTER);
    dt_status st = check_root(c, root);
    if (st != DT_OK)
        return st;
    const uint64_t slot = comm_gloo_slot(GLOO_SCATTER, tag);
    if (c->rank != root) {
        gloo_buf b = {.ptr = out, .size = bytes};
        comm_gloo_post_recv(c, root, slot, &b, 0, bytes);
        return comm_gloo_wait_recv(c, &b, root);
    }
    gloo_buf b = {.ptr = (uint8_t *)in, .size = bytes * (size_t)c->size};
    for (int q = 0; q < c->size; q++)
        if (q != root)
            comm_gloo_post_send(c, q, slot, &b, (size_t)q * bytes, bytes);
    memmove(out, (const uint8_t *)in + (size_t)root * bytes, bytes);
    return wait_n(c, &b, c->size - 1, false, root);
}
