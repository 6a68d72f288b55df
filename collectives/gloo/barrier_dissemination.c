/*
 * barrier_dissemination.c — barrier as torch 1.13's gloo runs it
 * (gloo/barrier.cc): for d = 1, 2, 4, … < p, receive a 0-byte message from
 * r-d, send one to r+d, wait for the receive, then for the send. Each
 * message is a bare 48-byte preamble.
 *
 * Same schedule as dtrain's own dissemination barrier; what differs is the
 * wire: here nothing in the message says which op it belongs to beyond
 * the slot, so a rank in another collective just never matches.
 *
 * Cost (α-β): ⌈log2 p⌉α.
 */
#include "gloo.h"

dt_status comm_gloo_barrier(gloo_ctx *c)
{
    const uint32_t tag = comm_gloo_begin(c, "barrier", GLOO_BARRIER);
    if (c->failed != DT_OK)
        return c->failed;
    const int p = c->size, r = c->rank;
    const uint64_t slot = comm_gloo_slot(GLOO_BARRIER, tag);
    uint8_t nothing = 0;
    gloo_buf b = {.ptr = &nothing, .size = 0};
    for (int d = 1; d < p; d *= 2) {
        const int from = (r - d + p) % p, to = (r + d) % p;
        comm_gloo_post_recv(c, from, slot, &b, 0, 0);
        comm_gloo_post_send(c, to, slot, &b, 0, 0);
        dt_status st = comm_gloo_wait_recv(c, &b, from);
        if (st == DT_OK)
            st = comm_gloo_wait_send(c, &b, to);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}
