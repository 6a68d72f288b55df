/*
 * fail.c — the first error of a gloo context, and what failing does.
 *
 * As in gloo (a timeout signals the context, which closes every pair), a
 * failure here closes every connection of the group at once: the peers see
 * their connection end and fail too, instead of waiting for their own
 * timeouts, and no libuv callback can reach the memory of an op that has
 * returned. The first message is kept; every later op returns it.
 *
 * A connection that ends (EOF, reset, a failed write) is not yet a failure
 * of the context: it marks its pair gone, and the first op that waits for
 * that peer fails naming it (wait.c). So a rank names the peer it was
 * waiting for — the one that left — rather than whichever neighbour
 * happened to close first because of it.
 *
 * Cost: one close per connection, once.
 */
#include <stdarg.h>
#include <stdio.h>

#include "gloo.h"

static void close_handle(uv_tcp_t *h, bool *open)
{
    if (*open && !uv_is_closing((uv_handle_t *)h))
        uv_close((uv_handle_t *)h, NULL);
    *open = false;
}

void comm_gloo_close_listener(gloo_pair *p)
{
    close_handle(&p->listener, &p->listener_open);
}

static void held_closed(uv_handle_t *h)
{
    gloo_held *k = h->data;
    k->state = GLOO_HELD_FREE;
}

void comm_gloo_held_drop(gloo_held *k)
{
    if (k->state == GLOO_HELD_READING)
        k->pair->nheld--;
    k->state = GLOO_HELD_CLOSING;
    k->tcp.data = k;
    uv_close((uv_handle_t *)&k->tcp, held_closed);
}

void comm_gloo_close_all(gloo_ctx *c)
{
    if (!c->pairs)
        return;
    for (int r = 0; r < c->size; r++) {
        gloo_pair *p = &c->pairs[r];
        close_handle(&p->listener, &p->listener_open);
        if (p->conn)
            close_handle(p->conn, &p->tcp_open);
        for (int i = 0; i < GLOO_HELD_MAX; i++)
            if (p->held[i].state == GLOO_HELD_READING)
                comm_gloo_held_drop(&p->held[i]);
        p->connected = false;
    }
}

void comm_gloo_pair_gone(gloo_pair *p, const char *why)
{
    if (!p->gone)
        p->gone = why;
    if (p->ctx->first_gone < 0)
        p->ctx->first_gone = p->peer;
    if (p->conn)
        close_handle(p->conn, &p->tcp_open);
    p->connected = false;
}

dt_status comm_gloo_fail(gloo_ctx *c, dt_status st, const char *fmt, ...)
{
    if (c->failed != DT_OK)
        return c->failed;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    c->failed = st;
    comm_gloo_close_all(c);
    return st;
}
