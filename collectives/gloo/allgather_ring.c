/*
 * allgather_ring.c — all_gather as torch 1.13's gloo runs it
 * (gloo/allgather.cc): a ring going up (send to r+1, receive from r-1),
 * each rank's block of B bytes sent as two halves of ⌊B/2⌋ and B-⌊B/2⌋
 * bytes — halves of bytes, so an element may be cut in two.
 *
 * The block is first copied to out[r·B]. In step i = 0 .. 2(p-1)-1 the
 * rank sends half i&1 of block (r - ⌊i/2⌋) mod p and receives the same
 * half of the block before it; from step 2 on it first waits for one send
 * and one receive. Two of each are waited for at the end.
 *
 * How it differs from dtrain's own ring all-gather: that one sends to r-1
 * in whole blocks.
 *
 * Cost (α-β): 2(p-1)α + ((p-1)/p)nβ, n = p·B.
 */
#include <string.h>

#include "gloo.h"

dt_status comm_gloo_allgather(gloo_ctx *c, void *out, const void *in, size_t bytes)
{
    comm_gloo_begin(c, "allgather", GLOO_ALLGATHER);
    if (c->failed != DT_OK)
        return c->failed;
    const size_t p = (size_t)c->size, r = (size_t)c->rank, all = p * bytes;
    uint8_t *o = out;
    if (o + r * bytes != in)
        memmove(o + r * bytes, in, bytes);
    if (p == 1)
        return DT_OK;
    const int to = (int)((r + 1) % p), from = (int)((r + p - 1) % p);
    const uint64_t slot = comm_gloo_slot(GLOO_ALLGATHER, c->op_tag);
    const size_t half[2] = {bytes / 2, bytes - bytes / 2}, at[2] = {0, bytes / 2};
    gloo_buf b = {.ptr = o, .size = all};
    dt_status st;
    for (size_t i = 0; i < 2 * (p - 1); i++) {
        const size_t send_block = p + r - i / 2, recv_block = send_block - 1;
        if (i >= 2 && ((st = comm_gloo_wait_send(c, &b, to)) != DT_OK ||
                       (st = comm_gloo_wait_recv(c, &b, from)) != DT_OK))
            return st;
        comm_gloo_post_send(c, to, slot, &b, (send_block * bytes + at[i & 1]) % all, half[i & 1]);
        comm_gloo_post_recv(c, from, slot, &b, (recv_block * bytes + at[i & 1]) % all, half[i & 1]);
    }
    for (int i = 0; i < 2; i++)
        if ((st = comm_gloo_wait_send(c, &b, to)) != DT_OK ||
            (st = comm_gloo_wait_recv(c, &b, from)) != DT_OK)
            return st;
    return DT_OK;
}
