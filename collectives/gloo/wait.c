/*
 * wait.c — running a context's libuv loop until something completes.
 *
 * gloo's collectives wait "for one more receive (or send) on this buffer"
 * with the group's timeout applied to each wait, not to the whole op. The
 * waiting thread here is the one that moves the bytes: it runs the loop
 * (one pass at a time, a timer bounding the pass) until the buffer's count
 * rises, the context fails (a peer's EOF, a protocol error), or the
 * timeout passes — which fails the context with a message naming this
 * rank, the peer it waited for and the slot's op and tag, and closes every
 * connection, as gloo's timeout does.
 *
 * Another thread reaches a waiting context through its waker, an async
 * handle on the loop: comm_gloo_wake ends the pass in progress (the
 * communicator's thread waits in comm_gloo_progress while sends and
 * receives are in flight, and is woken so when it has an op to run), and
 * comm_gloo_interrupt makes the loop's own thread fail the context (an
 * abort), so the op that waits returns at once instead of at its timeout.
 *
 * Cost: no threads and no hand-off; a wait costs the loop passes it takes;
 * a wake is an eventfd write, and one more pass.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gloo.h"

/* The timer also stops the loop: libuv runs due timers at the start of a
 * UV_RUN_ONCE pass and then polls, with no timeout once no timer is left,
 * so a timer that was already due when the pass began (the loop's clock
 * is stale after time spent outside it, e.g. on the store) would leave the
 * pass blocked until some byte arrives. uv_stop makes that poll return. */
static void fired(uv_timer_t *t)
{
    gloo_ctx *c = t->data;
    c->timer_fired = true;
    uv_stop(t->loop);
}

/* One pass of the loop, with the messages posted before it, and those its
 * callbacks posted, written out (wire.c batches them per peer). */
static void pass(gloo_ctx *c)
{
    comm_gloo_wire_flush(c);
    uv_run(&c->loop, UV_RUN_ONCE);
    comm_gloo_wire_flush(c);
}

/* On the loop's thread: an interrupt asked for fails the context. */
static void woken(uv_async_t *a)
{
    gloo_ctx *c = a->data;
    dt_status st = (dt_status)atomic_exchange(&c->interrupt, DT_OK);
    if (st != DT_OK && c->failed == DT_OK)
        comm_gloo_fail(c, st, "gloo rank %d: %s (tag %u) interrupted: %s", c->rank,
                       c->op ? c->op : "no op", c->op_tag, dt_status_name(st));
}

void comm_gloo_waker_init(gloo_ctx *c)
{
    atomic_init(&c->interrupt, DT_OK);
    uv_async_init(&c->loop, &c->waker, woken);
    c->waker.data = c;
    c->waker_open = true;
}

void comm_gloo_wake(gloo_ctx *c)
{
    if (c->waker_open)
        uv_async_send(&c->waker);
}

void comm_gloo_interrupt(gloo_ctx *c, dt_status st)
{
    if (!c->waker_open || st == DT_OK)
        return;
    atomic_store(&c->interrupt, (int)st);
    uv_async_send(&c->waker);
}

/* Has peer's connection ended while this rank still waits on it: a
 * receive it has not filled, or a send it has not asked for? A peer that
 * delivered everything and then left (it finished first) is not lost: a
 * gather's root, waiting on one buffer for all, may hear its end before
 * another peer's data. */
static bool lost(const gloo_ctx *c, int peer)
{
    const gloo_pair *p = &c->pairs[peer];
    if (!p->gone)
        return false;
    for (size_t i = 0; i < p->nslots; i++)
        if (p->slots[i].recvs.head || p->slots[i].sends.head)
            return true;
    return false;
}

/* Runs the loop until *count > 0 (then takes one), or failure. `what`
 * and `peer` name the wait in a timeout's message. */
static dt_status run_until(gloo_ctx *c, int *count, const char *what, int peer)
{
    if (*count == 0 && c->failed == DT_OK) {
        c->timer_fired = false;
        uv_timer_start(&c->timer, fired, (uint64_t)ceil(c->timeout_s * 1000.0), 0);
        sigset_t old;
        comm_gloo_sigpipe_block(&old);
        while (*count == 0 && c->failed == DT_OK && !c->timer_fired && !lost(c, peer))
            pass(c);
        comm_gloo_sigpipe_restore(&old);
        uv_timer_stop(&c->timer);
    }
    if (*count > 0) {
        (*count)--;
        return DT_OK;
    }
    if (c->failed != DT_OK)
        return c->failed;
    if (lost(c, peer)) {
        char before[160] = "";
        int first = c->first_gone;
        if (first >= 0 && first != peer) /* the root cause, as this rank saw it */
            snprintf(before, sizeof before, "; before it, lost peer %d (%s)", first,
                     c->pairs[first].gone);
        return comm_gloo_fail(c, DT_EPEER,
                              "gloo rank %d: lost peer %d (%s) while waiting for %s in %s "
                              "(tag %u)%s",
                              c->rank, peer, c->pairs[peer].gone, what, c->op ? c->op : "?",
                              c->op_tag, before);
    }
    char slot[96];
    return comm_gloo_fail(c, DT_ETIMEDOUT,
                          "gloo rank %d: timed out after %g s waiting for %s %s peer %d in %s "
                          "on %s: the peer is slow, stuck, or in another collective",
                          c->rank, c->timeout_s, what, strcmp(what, "a send") ? "from" : "to", peer,
                          c->op ? c->op : "?",
                          comm_gloo_slot_describe(c->op_slot, slot, sizeof slot));
}

dt_status comm_gloo_wait_recv(gloo_ctx *c, gloo_buf *b, int peer)
{
    return run_until(c, &b->recvs_done, "a receive", peer);
}

dt_status comm_gloo_wait_send(gloo_ctx *c, gloo_buf *b, int peer)
{
    return run_until(c, &b->sends_done, "a send", peer);
}

static int unconnected(const gloo_ctx *c)
{
    for (int r = 0; r < c->size; r++)
        if (r != c->rank && !c->pairs[r].connected && !comm_gloo_held_any(&c->pairs[r]))
            return r;
    return -1;
}

dt_status comm_gloo_wait_connected(gloo_ctx *c)
{
    c->timer_fired = false;
    uv_timer_start(&c->timer, fired, (uint64_t)ceil(c->init_timeout_s * 1000.0), 0);
    while (unconnected(c) >= 0 && c->failed == DT_OK && !c->timer_fired)
        pass(c);
    uv_timer_stop(&c->timer);
    int r = unconnected(c);
    if (c->failed != DT_OK || r < 0)
        return c->failed;
    return comm_gloo_fail(c, DT_ETIMEDOUT,
                          "gloo rank %d: timed out after %g s connecting to peer %d", c->rank,
                          c->init_timeout_s, r);
}

void comm_gloo_idle(gloo_ctx *c, double seconds)
{
    if (!c->pairs || c->failed != DT_OK)
        return;
    c->timer_fired = false;
    uv_update_time(&c->loop); /* from now, not from the last pass */
    uv_timer_start(&c->timer, fired, (uint64_t)ceil(seconds * 1000.0), 0);
    sigset_t old;
    comm_gloo_sigpipe_block(&old);
    while (c->failed == DT_OK && !c->timer_fired)
        pass(c);
    comm_gloo_sigpipe_restore(&old);
    uv_timer_stop(&c->timer);
}

void comm_gloo_progress(gloo_ctx *c)
{
    if (c->failed != DT_OK)
        return;
    sigset_t old;
    comm_gloo_sigpipe_block(&old);
    pass(c);
    comm_gloo_sigpipe_restore(&old);
}
