/*
 * broadcast_binomial.c — broadcast as torch 1.13's gloo runs it: a
 * binomial tree, the whole buffer on every edge (gloo/broadcast.cc).
 *
 * With v = (r - root) mod p and dim = ⌈log2 p⌉, in round i = 0..dim-1 the
 * ranks whose v has no bits above i take part: one with bit i clear sends
 * the whole buffer to v + 2^i (if that is a rank), one with bit i set
 * receives it from v - 2^i and waits for it before the next round. Sends
 * are waited for at the end. The root thus sends to v = 1, 2, 4, ….
 *
 * How it differs from dtrain's own broadcast: no segmentation and no
 * pipelined chain for large buffers; a 1 GiB tensor is one 1 GiB message
 * per edge.
 *
 * Cost (α-β): ⌈log2 p⌉(α + nβ).
 */
#include "gloo.h"

static int log2_ceil(int p)
{
    int d = 0;
    while ((1 << d) < p)
        d++;
    return d;
}

dt_status comm_gloo_broadcast(gloo_ctx *c, void *buf, size_t bytes, int root)
{
    const uint32_t tag = comm_gloo_begin(c, "broadcast", GLOO_BROADCAST);
    if (c->failed != DT_OK)
        return c->failed;
    if (root < 0 || root >= c->size)
        return comm_gloo_fail(c, DT_EINVAL, "gloo rank %d: broadcast (tag %u) from rank %d of %d",
                              c->rank, tag, root, c->size);
    const int p = c->size, v = (c->rank - root + p) % p, dim = log2_ceil(p);
    const uint64_t slot = comm_gloo_slot(GLOO_BROADCAST, tag);
    gloo_buf b = {.ptr = buf, .size = bytes};
    int sends = 0, last_to = root;
    unsigned mask = (1u << dim) - 1;
    for (int i = 0; i < dim; i++) {
        mask ^= 1u << i;
        if ((unsigned)v & mask)
            continue;
        const int vpeer = v ^ (1 << i);
        if (vpeer >= p)
            continue;
        const int peer = (vpeer + root) % p;
        if (!(v & (1 << i))) {
            comm_gloo_post_send(c, peer, slot, &b, 0, bytes);
            sends++;
            last_to = peer;
        } else {
            comm_gloo_post_recv(c, peer, slot, &b, 0, bytes);
            dt_status st = comm_gloo_wait_recv(c, &b, peer);
            if (st != DT_OK)
                return st;
        }
    }
    for (int i = 0; i < sends; i++) {
        dt_status st = comm_gloo_wait_send(c, &b, last_to);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}
