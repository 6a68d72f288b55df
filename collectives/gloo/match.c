/*
 * match.c — gloo's receiver-driven matching, per (peer, slot).
 *
 * Data moves only where the receiver said it may: a sender announces a
 * send (SEND_READY), a receiver announces a posted receive (RECV_READY),
 * and the data goes out when the sender holds a RECV_READY it has not used.
 * Sends and receives of one (peer, slot) pair up in FIFO order; nothing
 * else (no sequence number, no size) identifies a message. The state per
 * (peer, slot), as gloo 5b14351 keeps it (pair.cc, context.h):
 *
 *   post send    if remote_recv > 0: use it; SEND_READY then the data at once
 *                else queue it in `sends` and write SEND_READY
 *   post recv    if remote_send > 0: use it, else expect_send++; queue it in
 *                `recvs` and write RECV_READY
 *   SEND_READY   if expect_send > 0: expect_send-- (a receive announced it);
 *                else bind a waiting receive-from-any, else remote_send++
 *   RECV_READY   if `sends` has a head: send its data; else remote_recv++
 *   data         pop the head of `recvs`; it must exist and be large enough
 *
 * A slot's state exists as soon as the first message names it, since a
 * peer may already be in the next collective; it is dropped again when
 * every counter is 0 and both queues are empty, so the table holds only
 * the few slots in flight.
 *
 * How this differs from dtrain's own wire: there a frame header names the
 * op and its size and a frame for a later op stops the socket's reading
 * (TCP backpressure); here the announcements are the flow control, and a
 * too-large message is caught only when its data arrives.
 *
 * Cost: per message O(slots in flight) to find the state, one small
 * allocation per queued send or receive.
 */
#include <stdlib.h>

#include "gloo.h"

static gloo_slot_state *find(gloo_pair *p, uint64_t slot)
{
    for (size_t i = 0; i < p->nslots; i++)
        if (p->slots[i].slot == slot)
            return &p->slots[i];
    if (p->nslots == p->slots_cap) {
        size_t cap = p->slots_cap ? 2 * p->slots_cap : 8;
        gloo_slot_state *grown = realloc(p->slots, cap * sizeof *grown);
        if (!grown) {
            comm_gloo_fail(p->ctx, DT_ENOMEM, "gloo rank %d: out of memory (slots of peer %d)",
                           p->ctx->rank, p->peer);
            return NULL;
        }
        p->slots = grown;
        p->slots_cap = cap;
    }
    gloo_slot_state *s = &p->slots[p->nslots++];
    *s = (gloo_slot_state){.slot = slot};
    return s;
}

/* Drops a state that holds nothing any more. */
static void settle(gloo_pair *p, gloo_slot_state *s)
{
    if (s->remote_recv || s->remote_send || s->expect_send || s->sends.head || s->recvs.head)
        return;
    *s = p->slots[--p->nslots];
}

static bool push(gloo_ctx *c, gloo_fifo *q, gloo_buf *buf, size_t offset, size_t nbytes)
{
    gloo_op *op = malloc(sizeof *op);
    if (!op) {
        comm_gloo_fail(c, DT_ENOMEM, "gloo rank %d: out of memory (posting an op)", c->rank);
        return false;
    }
    *op = (gloo_op){.buf = buf, .offset = offset, .nbytes = nbytes};
    if (q->tail)
        q->tail->next = op;
    else
        q->head = op;
    q->tail = op;
    return true;
}

static gloo_op pop(gloo_fifo *q)
{
    gloo_op *head = q->head, op = *head;
    q->head = head->next;
    if (!q->head)
        q->tail = NULL;
    free(head);
    return op;
}

void comm_gloo_post_send(gloo_ctx *c, int peer, uint64_t slot, gloo_buf *buf, size_t offset,
                         size_t nbytes)
{
    gloo_pair *p = &c->pairs[peer];
    gloo_slot_state *s = find(p, slot);
    if (!s)
        return;
    if (s->remote_recv > 0) {
        s->remote_recv--;
        settle(p, s);
        comm_gloo_wire_notify(p, GLOO_SEND_READY, slot, nbytes);
        comm_gloo_wire_data(p, slot, buf, offset, nbytes);
        return;
    }
    if (push(c, &s->sends, buf, offset, nbytes))
        comm_gloo_wire_notify(p, GLOO_SEND_READY, slot, nbytes);
}

/* Queues a receive and announces it; the caller did the counting. */
static void announce_recv(gloo_pair *p, gloo_slot_state *s, gloo_buf *buf, size_t offset,
                          size_t nbytes)
{
    if (push(p->ctx, &s->recvs, buf, offset, nbytes))
        comm_gloo_wire_notify(p, GLOO_RECV_READY, s->slot, nbytes);
}

void comm_gloo_post_recv(gloo_ctx *c, int peer, uint64_t slot, gloo_buf *buf, size_t offset,
                         size_t nbytes)
{
    gloo_pair *p = &c->pairs[peer];
    gloo_slot_state *s = find(p, slot);
    if (!s)
        return;
    if (s->remote_send > 0)
        s->remote_send--;
    else
        s->expect_send++;
    announce_recv(p, s, buf, offset, nbytes);
}

void comm_gloo_post_recv_any(gloo_ctx *c, uint64_t ranks, uint64_t slot, gloo_buf *buf,
                             size_t offset, size_t nbytes)
{
    for (int r = 0; r < c->size && r < 64; r++) { /* a peer already announced a send */
        if (r == c->rank || !(ranks >> r & 1))
            continue;
        gloo_pair *p = &c->pairs[r];
        for (size_t i = 0; i < p->nslots; i++) {
            gloo_slot_state *s = &p->slots[i];
            if (s->slot == slot && s->remote_send > 0) {
                s->remote_send--;
                announce_recv(p, s, buf, offset, nbytes);
                return;
            }
        }
    }
    gloo_any_recv *a = malloc(sizeof *a), **end = &c->any;
    if (!a) {
        comm_gloo_fail(c, DT_ENOMEM, "gloo rank %d: out of memory (posting a receive)", c->rank);
        return;
    }
    *a = (gloo_any_recv){.slot = slot,
                         .ranks = ranks,
                         .buf = buf,
                         .offset = offset,
                         .nbytes = nbytes};
    while (*end)
        end = &(*end)->next;
    *end = a;
}

/* Binds the oldest receive-from-any that this peer may fulfil. */
static bool bind_any(gloo_pair *p, gloo_slot_state *s)
{
    for (gloo_any_recv **at = &p->ctx->any; *at; at = &(*at)->next) {
        gloo_any_recv *a = *at;
        if (a->slot == s->slot && p->peer < 64 && (a->ranks >> p->peer & 1)) {
            *at = a->next;
            announce_recv(p, s, a->buf, a->offset, a->nbytes);
            free(a);
            return true;
        }
    }
    return false;
}

void comm_gloo_match_send_ready(gloo_pair *p, uint64_t slot)
{
    gloo_slot_state *s = find(p, slot);
    if (!s)
        return;
    if (s->expect_send > 0)
        s->expect_send--;
    else if (!bind_any(p, s))
        s->remote_send++;
    settle(p, s);
}

void comm_gloo_match_recv_ready(gloo_pair *p, uint64_t slot)
{
    gloo_slot_state *s = find(p, slot);
    if (!s)
        return;
    if (s->sends.head) {
        gloo_op op = pop(&s->sends);
        comm_gloo_wire_data(p, slot, op.buf, op.offset, op.nbytes);
    } else {
        s->remote_recv++;
    }
    settle(p, s);
}

dt_status comm_gloo_match_data(gloo_pair *p, uint64_t slot, uint64_t len, gloo_op *out)
{
    gloo_ctx *c = p->ctx;
    char name[96];
    gloo_slot_state *s = NULL;
    for (size_t i = 0; i < p->nslots && !s; i++)
        if (p->slots[i].slot == slot)
            s = &p->slots[i];
    if (!s || !s->recvs.head)
        return comm_gloo_fail(c, DT_EPROTO,
                              "gloo rank %d: peer %d sent %llu bytes of data on %s, where this "
                              "rank has posted no receive (a protocol error: data must follow "
                              "a RECV_READY)",
                              c->rank, p->peer, (unsigned long long)len,
                              comm_gloo_slot_describe(slot, name, sizeof name));
    if (len > s->recvs.head->nbytes)
        return comm_gloo_fail(c, DT_EPROTO,
                              "gloo rank %d: peer %d sent %llu bytes on %s, but this rank "
                              "posted a receive of %zu bytes there (the ranks disagree about "
                              "the size of op %s)",
                              c->rank, p->peer, (unsigned long long)len,
                              comm_gloo_slot_describe(slot, name, sizeof name),
                              s->recvs.head->nbytes, c->op ? c->op : "?");
    *out = pop(&s->recvs);
    settle(p, s);
    return DT_OK;
}

void comm_gloo_match_free(gloo_pair *p)
{
    for (size_t i = 0; i < p->nslots; i++) {
        while (p->slots[i].sends.head)
            pop(&p->slots[i].sends);
        while (p->slots[i].recvs.head)
            pop(&p->slots[i].recvs);
    }
    free(p->slots);
    p->slots = NULL;
    p->nslots = p->slots_cap = 0;
}
