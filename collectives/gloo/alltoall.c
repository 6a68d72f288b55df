/*
 * alltoall.c — all_to_all_single (equal splits) as torch 1.13's gloo runs
 * it (gloo/alltoall.cc): copy the own block, then for i = 1..p-1 send block
 * r+i to rank r+i and receive block r-i from rank r-i, all posted at once,
 * then wait for every send and receive.
 *
 * dtrain's own pairwise exchange instead pairs r with r XOR i (or waits
 * per step); here every message is in flight together.
 *
 * Cost (α-β): (p-1)α + ((p-1)/p)nβ, n = p·block, all links busy at once.
 */
#include <string.h>

#include "gloo.h"

dt_status comm_gloo_alltoall(gloo_ctx *c, void *out, const void *in, size_t block)
{
    const uint32_t tag = comm_gloo_begin(c, "alltoall", GLOO_ALLTOALL);
    if (c->failed != DT_OK)
        return c->failed;
    const int p = c->size, r = c->rank;
    const uint64_t slot = comm_gloo_slot(GLOO_ALLTOALL, tag);
    gloo_buf src = {.ptr = (uint8_t *)in, .size = block * (size_t)p};
    gloo_buf dst = {.ptr = out, .size = block * (size_t)p};
    memcpy(dst.ptr + (size_t)r * block, src.ptr + (size_t)r * block, block);
    for (int i = 1; i < p; i++) {
        const int to = (r + i) % p, from = (r + p - i) % p;
        comm_gloo_post_send(c, to, slot, &src, (size_t)to * block, block);
        comm_gloo_post_recv(c, from, slot, &dst, (size_t)from * block, block);
    }
    for (int i = 1; i < p; i++) {
        dt_status st = comm_gloo_wait_send(c, &src, (r + i) % p);
        if (st == DT_OK)
            st = comm_gloo_wait_recv(c, &dst, (r + p - i) % p);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}
