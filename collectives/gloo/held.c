/*
 * held.c — connections to a pair's listener, held until one proves itself
 * the peer.
 *
 * torch 1.13's gloo has no handshake, and its peer sends nothing until the
 * first collective that pairs them: when a connection is accepted, a
 * stranger (a port scanner, a misdirected client, a rank of another job)
 * cannot be told from the peer. gloo takes whoever connects first and
 * closes the listener, so a stranger that comes first takes the peer's
 * place and the real peer is refused. Here the accepting side keeps its
 * listener open and holds every connection (up to GLOO_HELD_MAX at once)
 * until one of them sends a first message that gloo's peer could send: a
 * 48-byte notification, SEND_READY or RECV_READY (data never comes first:
 * it moves only after this side's RECV_READY, which goes to a proven peer
 * only). That one is the peer: the listener closes, every other held
 * connection is dropped and named, and its preamble is handled like any
 * other (frame.c).
 *
 * A connection whose bytes cannot begin such a preamble is named "not a
 * gloo peer" at its first wrong byte and dropped at once, and so is one
 * that closes before proving itself while the rendezvous runs. After the
 * rendezvous, a lone held connection is the peer's (every peer connects
 * before it joins the store barrier): its end is the peer's end, and a
 * wrong first message is the peer's protocol error (frame.c), as before;
 * and a pair whose last connection ended unproven during the rendezvous,
 * with no other come since, has lost its peer.
 * Strangers are named through the context's note (the communicator logs
 * and counts them as rejected connections), never as a failure.
 *
 * What cannot be told apart: a silent stranger from the silent peer. Both
 * are held, and the rendezvous counts the pair connected with either; the
 * first to send a notification is the peer. A stranger that sends a
 * well-formed notification first is taken for the peer, as in torch: this
 * wire has no authentication. What this side writes to the pair before
 * its peer is proven goes to every held connection, and is kept and
 * written first to any connection held later: the peer reads the same
 * stream whichever connection it is (a receive from any source announces
 * nothing, so the sender's SEND_READY must reach the peer unasked). Only
 * notifications can be due then (data follows the peer's own RECV_READY,
 * which proves it): a stranger learns a slot and a size, no data.
 *
 * Cost: one read of at most 48 bytes per held connection, one line per
 * stranger; the proven connection is read by frame.c from then on.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gloo.h"

static void note(gloo_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(gloo_ctx *c, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (c->note)
        c->note(c->note_arg, line);
}

/* What the context is doing, for the lines below. */
static const char *doing(const gloo_ctx *c, char *out, size_t n)
{
    if (!c->joined)
        snprintf(out, n, "the rendezvous");
    else if (c->op)
        snprintf(out, n, "%s (tag %u)", c->op, c->op_tag);
    else
        snprintf(out, n, "no collective (between ops)");
    return out;
}

/* k's first message is a notification: k is the peer. */
static void prove(gloo_held *k)
{
    gloo_pair *p = k->pair;
    gloo_ctx *c = p->ctx;
    char what[96];
    uv_read_stop((uv_stream_t *)&k->tcp);
    p->nheld--;
    k->state = GLOO_HELD_PEER;
    comm_gloo_close_listener(p);
    for (int i = 0; i < GLOO_HELD_MAX; i++) {
        gloo_held *other = &p->held[i];
        if (other->state != GLOO_HELD_READING)
            continue;
        note(c,
             "gloo rank %d: dropped %s, held on the listener for peer %d: it sent nothing, and %s "
             "proved to be the peer during %s",
             c->rank, other->addr, p->peer, k->addr, doing(c, what, sizeof what));
        comm_gloo_held_drop(other);
    }
    comm_gloo_wire_early_free(p); /* k has had it all */
    p->conn = &k->tcp;
    p->tcp_open = true;
    memcpy(p->head, k->head, GLOO_PREAMBLE_BYTES);
    p->head_got = GLOO_PREAMBLE_BYTES;
    comm_gloo_frame_start(p);
    if (c->failed == DT_OK)
        comm_gloo_frame_preamble(p);
}

/* k ended before it proved itself. */
static void ended(gloo_held *k, const char *why)
{
    gloo_pair *p = k->pair;
    gloo_ctx *c = p->ctx;
    char what[96];
    bool last = p->nheld == 1;
    comm_gloo_held_drop(k);
    if (last && c->joined) { /* after the rendezvous, the one held connection was the peer's */
        comm_gloo_pair_gone(p, why);
        return;
    }
    if (last) /* judged when the rendezvous ends (comm_gloo_held_joined) */
        p->held_lost = why;
    note(c,
         "gloo rank %d: dropped %s, held on the listener for peer %d: it closed before its first "
         "message (%s) during %s: a stranger, or the peer died before it spoke",
         c->rank, k->addr, p->peer, why, doing(c, what, sizeof what));
}

static void held_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    (void)suggested;
    gloo_held *k = h->data;
    *b = uv_buf_init((char *)k->head + k->got, (unsigned)(GLOO_PREAMBLE_BYTES - k->got));
}

static void held_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *b)
{
    (void)b;
    gloo_held *k = s->data;
    gloo_ctx *c = k->pair->ctx;
    if (nread == 0 || k->state != GLOO_HELD_READING)
        return;
    if (nread < 0) {
        ended(k, nread == UV_EOF ? "it closed the connection" : uv_strerror((int)nread));
        return;
    }
    k->got += (size_t)nread;
    /* after the rendezvous the one connection held is the peer's, and what
     * is wrong with its first message is a protocol error (frame.c) */
    bool lone = c->joined && k->pair->nheld == 1;
    int bad = lone ? -1 : comm_gloo_frame_first_bad(k->head, k->got);
    if (bad >= 0) {
        char what[96];
        note(
            c,
            "gloo rank %d: not a gloo peer: %s, on the listener for peer %d, sent byte %d = 0x%02x "
            "where a gloo preamble cannot have it; dropped it during %s",
            c->rank, k->addr, k->pair->peer, bad, k->head[bad], doing(c, what, sizeof what));
        comm_gloo_held_drop(k);
        return;
    }
    if (k->got == GLOO_PREAMBLE_BYTES)
        prove(k);
}

static void free_refused(uv_handle_t *h)
{
    free(h);
}

/* Full: the connection is accepted only to be closed at once, and named. */
static void refuse(gloo_pair *p)
{
    gloo_ctx *c = p->ctx;
    uv_tcp_t *h = malloc(sizeof *h);
    if (!h)
        return; /* it waits in the backlog */
    uv_tcp_init(&c->loop, h);
    if (uv_accept((uv_stream_t *)&p->listener, (uv_stream_t *)h) == 0) {
        char what[96];
        note(c,
             "gloo rank %d: refused a connection on the listener for peer %d: %d unproven ones "
             "are held already (during %s)",
             c->rank, p->peer, GLOO_HELD_MAX, doing(c, what, sizeof what));
    }
    uv_close((uv_handle_t *)h, free_refused);
}

void comm_gloo_held_accept(gloo_pair *p)
{
    gloo_held *k = NULL;
    for (int i = 0; i < GLOO_HELD_MAX && !k; i++)
        if (p->held[i].state == GLOO_HELD_FREE)
            k = &p->held[i];
    if (!k) {
        refuse(p);
        return;
    }
    *k = (gloo_held){.pair = p, .state = GLOO_HELD_READING};
    uv_tcp_init(&p->ctx->loop, &k->tcp);
    k->tcp.data = k;
    p->nheld++;
    if (uv_accept((uv_stream_t *)&p->listener, (uv_stream_t *)&k->tcp) != 0) {
        comm_gloo_held_drop(k);
        return;
    }
    comm_gloo_tcp_name(&k->tcp, k->addr, sizeof k->addr);
    comm_gloo_wire_early_replay(p, k); /* what the peer must have read by now */
    if (uv_read_start((uv_stream_t *)&k->tcp, held_alloc, held_read) != 0)
        ended(k, "reading it failed");
}

bool comm_gloo_held_any(const gloo_pair *p)
{
    return p->nheld > 0 || p->held_lost;
}

void comm_gloo_held_joined(gloo_ctx *c)
{
    c->joined = true;
    if (!c->pairs || c->failed != DT_OK)
        return;
    uv_run(&c->loop, UV_RUN_NOWAIT); /* the peers' connections wait in the backlogs */
    for (int r = 0; r < c->size; r++) {
        gloo_pair *p = &c->pairs[r];
        if (r != c->rank && !p->connected && p->nheld == 0 && p->held_lost)
            comm_gloo_pair_gone(p, p->held_lost);
    }
}
