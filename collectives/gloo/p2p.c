/*
 * p2p.c — tagged send and receive as torch 1.13's gloo runs them: the
 * user's tag is the slot itself (no prefix, no collective tag taken), one
 * message, matched like every other (match.c). A receive from any source
 * (torch's recv(src=None)) is bound to the first rank that announces a
 * send on that tag.
 *
 * dtrain's own send/recv carry the op's sequence number; these carry
 * nothing but the tag, so two messages with one tag pair up in order.
 *
 * comm_gloo_p2p_post leaves the message in flight: the communicator's
 * async send/recv post several (a pipeline stage sends its activations and
 * receives a gradient at once) and complete each when the loop, driven by
 * comm_gloo_progress or by any collective's waits, has moved it.
 *
 * Cost (α-β): α + nβ, plus the receiver's RECV_READY before the data.
 */
#include "gloo.h"

static dt_status check(gloo_ctx *c, const char *op, int peer, uint32_t tag, bool any)
{
    c->op = op;
    c->op_tag = tag;
    c->op_slot = tag;
    if (c->failed != DT_OK)
        return c->failed;
    if ((peer < 0 && !any) || peer >= c->size || peer == c->rank || (peer < 0 && c->size > 64))
        return comm_gloo_fail(c, DT_EINVAL, "gloo rank %d: %s (tag %u) with peer %d of %d", c->rank,
                              op, tag, peer, c->size);
    if (tag > 0x7fffffffu)
        return comm_gloo_fail(c, DT_EINVAL,
                              "gloo rank %d: %s tag %u is over 2^31-1, where it could meet a "
                              "collective's slot",
                              c->rank, op, tag);
    return DT_OK;
}

dt_status comm_gloo_send(gloo_ctx *c, const void *buf, size_t bytes, int peer, uint32_t tag)
{
    dt_status st = check(c, "send", peer, tag, false);
    if (st != DT_OK)
        return st;
    gloo_buf b = {.ptr = (uint8_t *)buf, .size = bytes};
    comm_gloo_post_send(c, peer, tag, &b, 0, bytes);
    return comm_gloo_wait_send(c, &b, peer);
}

dt_status comm_gloo_recv(gloo_ctx *c, void *buf, size_t bytes, int peer, uint32_t tag, int *from)
{
    dt_status st = check(c, "recv", peer, tag, true);
    if (st != DT_OK)
        return st;
    gloo_buf b = {.ptr = buf, .size = bytes};
    if (peer >= 0) {
        comm_gloo_post_recv(c, peer, tag, &b, 0, bytes);
        st = comm_gloo_wait_recv(c, &b, peer);
    } else {
        uint64_t all = (c->size >= 64 ? ~0ull : (1ull << c->size) - 1) & ~(1ull << c->rank);
        comm_gloo_post_recv_any(c, all, tag, &b, 0, bytes);
        st = comm_gloo_wait_recv(c, &b, c->rank); /* no one peer to watch */
    }
    if (st == DT_OK && from)
        *from = b.recv_from;
    return st;
}

dt_status comm_gloo_p2p_post(gloo_ctx *c, gloo_p2p *p, bool is_send, void *buf, size_t bytes,
                             int peer, uint32_t tag)
{
    *p = (gloo_p2p){.buf = {.ptr = buf, .size = bytes}, .is_send = is_send, .peer = peer};
    dt_status st = check(c, is_send ? "send" : "recv", peer, tag, !is_send);
    if (st != DT_OK)
        return st;
    if (is_send) {
        comm_gloo_post_send(c, peer, tag, &p->buf, 0, bytes);
    } else if (peer >= 0) {
        comm_gloo_post_recv(c, peer, tag, &p->buf, 0, bytes);
    } else {
        uint64_t all = (c->size >= 64 ? ~0ull : (1ull << c->size) - 1) & ~(1ull << c->rank);
        comm_gloo_post_recv_any(c, all, tag, &p->buf, 0, bytes);
    }
    return DT_OK;
}

bool comm_gloo_p2p_finished(gloo_ctx *c, const gloo_p2p *p, dt_status *st)
{
    *st = DT_OK;
    if ((p->is_send ? p->buf.sends_done : p->buf.recvs_done) > 0)
        return true;
    if (c->failed == DT_OK && p->peer >= 0 && c->pairs[p->peer].gone)
        comm_gloo_fail(c, DT_EPEER, "gloo rank %d: lost peer %d (%s) during a %s", c->rank, p->peer,
                       c->pairs[p->peer].gone, p->is_send ? "send" : "recv");
    *st = c->failed;
    return c->failed != DT_OK;
}
