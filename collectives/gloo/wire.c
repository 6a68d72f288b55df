/*
 * wire.c — writing gloo's messages: a 48-byte preamble, maybe a payload.
 *
 * The preamble is six little-endian u64 (gloo's six size_t on x86-64):
 *
 *   0 nbytes   48 + payload bytes
 *   8 opcode   1 data, 2 SEND_READY, 3 RECV_READY (gloo.h)
 *  16 slot     the matching key (slot.c)
 *  24 offset   0 (only pinned-buffer sends, which torch never makes, set it)
 *  32 length   payload bytes (data) or the announced size (notifications)
 *  40 roffset  0
 *
 * Messages to one peer wait in its batch until the thread is about to
 * wait (comm_gloo_wire_flush, before and after every pass of the loop,
 * wait.c), then leave as one write: {preamble, payload, preamble, ...},
 * payloads straight from the callers' buffers (no copy); a buffer's send
 * count rises when the kernel has taken the whole write. The bytes are
 * the same as one write per message, in the order they were made, which
 * is all gloo's matching needs; what changes is the number of segments: a
 * SEND_READY and its data, or an op's announcements to one peer, arrive
 * together and wake the peer once instead of once each.
 * dt_comm_traffic counts a data message's payload when the kernel has
 * taken it (notifications carry none and are not counted).
 *
 * A pair whose peer has not proven itself yet among the connections its
 * listener holds (held.c) has its batch, notifications only, written to
 * every one of them (flush_early).
 *
 * Cost: α + (48 + n)β per message; one write(2), two allocations and a
 * wake-up of the peer per batch instead of per message.
 */
#include <stdlib.h>
#include <string.h>

#include "gloo.h"

#define PIECE_BYTES ((size_t)1 << 30)
#define MAX_PIECES 64 /* payloads up to 64 GiB */

/* One message waiting in its pair's batch. */
typedef struct gloo_msg {
    uint8_t head[GLOO_PREAMBLE_BYTES];
    gloo_buf *buf; /* NULL for a notification */
    const uint8_t *payload;
    size_t payload_len;
} gloo_msg;

struct gloo_batch {
    size_t n, cap;
    gloo_msg msg[];
};

/* One write of a batch; its data buffers are credited when it completes. */
typedef struct gloo_write {
    uv_write_t req;
    gloo_pair *pair;
    size_t n;
    gloo_msg msg[]; /* the preambles live here until the kernel took them */
} gloo_write;

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void written(uv_write_t *req, int status)
{
    gloo_write *w = req->data;
    if (status == 0) {
        for (size_t i = 0; i < w->n; i++) {
            if (!w->msg[i].buf)
                continue;
            w->msg[i].buf->sends_done++;
            gloo_ctx *c = w->pair->ctx; /* dt_comm_traffic: data messages only */
            atomic_fetch_add_explicit(&c->traffic[0], w->msg[i].payload_len, memory_order_relaxed);
            atomic_fetch_add_explicit(&c->traffic[2], 1, memory_order_relaxed);
        }
    } else if (status != UV_ECANCELED) {
        comm_gloo_pair_gone(w->pair, uv_strerror(status)); /* the waiter names the peer */
    }
    free(w);
}

/* The accepting side holds connections none of which has yet proven to
 * be the peer (held.c): its messages go to all of them (held.c keeps them
 * for one held later too). */
static bool awaits_proof(const gloo_pair *p)
{
    return p->ctx->failed == DT_OK && !p->connected && !p->gone &&
           (p->listener_open || p->nheld > 0);
}

static void write_message(gloo_pair *p, enum gloo_opcode op, uint64_t slot, size_t length,
                          gloo_buf *buf, const uint8_t *payload, size_t payload_len)
{
    gloo_ctx *c = p->ctx;
    if (c->failed != DT_OK || (!p->connected && !awaits_proof(p)))
        return; /* the op sees the failure when it waits */
    if (payload_len > MAX_PIECES * PIECE_BYTES) {
        comm_gloo_fail(c, DT_EINVAL,
                       "gloo rank %d: a message of %zu bytes to peer %d is over "
                       "the 64 GiB this wire sends at once",
                       c->rank, payload_len, p->peer);
        return;
    }
    struct gloo_batch *b = p->out;
    if (!b || b->n == b->cap) {
        size_t cap = b ? 2 * b->cap : 4;
        b = realloc(b, sizeof *b + cap * sizeof b->msg[0]);
        if (!b) {
            comm_gloo_fail(c, DT_ENOMEM, "gloo rank %d: out of memory writing to peer %d", c->rank,
                           p->peer);
            return;
        }
        if (!p->out)
            b->n = 0;
        b->cap = cap;
        p->out = b;
    }
    gloo_msg *m = &b->msg[b->n++];
    *m = (gloo_msg){.buf = buf, .payload = payload, .payload_len = payload_len};
    put_u64(m->head + 0, GLOO_PREAMBLE_BYTES + payload_len);
    put_u64(m->head + 8, op);
    put_u64(m->head + 16, slot);
    put_u64(m->head + 32, length);
    c->batched++;
}

/* Hands p's batch to libuv as one write: preambles and payloads in order. */
static void flush_pair(gloo_pair *p)
{
    gloo_ctx *c = p->ctx;
    struct gloo_batch *b = p->out;
    p->out = NULL;
    if (c->failed != DT_OK || !p->connected) {
        free(b);
        return;
    }
    size_t nparts = 0;
    for (size_t i = 0; i < b->n; i++)
        nparts += 1 + (b->msg[i].payload_len + PIECE_BYTES - 1) / PIECE_BYTES;
    gloo_write *w = malloc(sizeof *w + b->n * sizeof w->msg[0]);
    uv_buf_t *parts = malloc(nparts * sizeof *parts);
    if (!w || !parts) {
        free(w);
        free(parts);
        free(b);
        comm_gloo_fail(c, DT_ENOMEM, "gloo rank %d: out of memory writing to peer %d", c->rank,
                       p->peer);
        return;
    }
    w->req.data = w;
    w->pair = p;
    w->n = b->n;
    memcpy(w->msg, b->msg, b->n * sizeof w->msg[0]);
    free(b);
    size_t k = 0;
    for (size_t i = 0; i < w->n; i++) {
        const gloo_msg *m = &w->msg[i];
        parts[k++] = uv_buf_init((char *)m->head, GLOO_PREAMBLE_BYTES);
        for (size_t done = 0; done < m->payload_len;) { /* uv_buf_t lengths are 32-bit */
            size_t piece = m->payload_len - done < PIECE_BYTES ? m->payload_len - done
                                                               : PIECE_BYTES;
            parts[k++] = uv_buf_init((char *)m->payload + done, (unsigned)piece);
            done += piece;
        }
    }
    sigset_t old;
    comm_gloo_sigpipe_block(&old);
    int rc = uv_write(&w->req, (uv_stream_t *)p->conn, parts, (unsigned)k, written);
    comm_gloo_sigpipe_restore(&old);
    free(parts); /* libuv keeps its own copy of the list */
    if (rc != 0) {
        free(w);
        comm_gloo_pair_gone(p, uv_strerror(rc));
    }
}

/* ---- before the peer is proven: to every held connection (held.c) ---- */

typedef struct early_write {
    uv_write_t req;
    uint8_t bytes[];
} early_write;

static void early_written(uv_write_t *req, int status)
{
    (void)status; /* a held connection's failure is its reader's to see */
    free(req->data);
}

static void write_to(gloo_held *k, const uint8_t *bytes, size_t n)
{
    early_write *w = malloc(sizeof *w + n);
    if (!w)
        return; /* it will not prove itself: nothing it reads makes sense */
    memcpy(w->bytes, bytes, n);
    w->req.data = w;
    uv_buf_t buf = uv_buf_init((char *)w->bytes, (unsigned)n);
    sigset_t old;
    comm_gloo_sigpipe_block(&old);
    if (uv_write(&w->req, (uv_stream_t *)&k->tcp, &buf, 1, early_written) != 0)
        free(w);
    comm_gloo_sigpipe_restore(&old);
}

static void write_early(gloo_pair *p, const uint8_t *bytes, size_t n)
{
    if (p->early_len + n > p->early_cap) {
        size_t cap = 2 * (p->early_len + n);
        uint8_t *grown = realloc(p->early, cap);
        if (!grown) {
            comm_gloo_fail(p->ctx, DT_ENOMEM, "gloo rank %d: out of memory writing to peer %d",
                           p->ctx->rank, p->peer);
            return;
        }
        p->early = grown;
        p->early_cap = cap;
    }
    memcpy(p->early + p->early_len, bytes, n);
    p->early_len += n;
    for (int i = 0; i < GLOO_HELD_MAX; i++)
        if (p->held[i].state == GLOO_HELD_READING)
            write_to(&p->held[i], bytes, n);
}

void comm_gloo_wire_early_free(gloo_pair *p)
{
    free(p->early);
    p->early = NULL;
    p->early_len = p->early_cap = 0;
}

void comm_gloo_wire_early_replay(gloo_pair *p, gloo_held *k)
{
    if (p->early_len > 0)
        write_to(k, p->early, p->early_len);
}

/* p's batch, to every connection held for p. Only notifications can be
 * due before the peer is proven: data follows the peer's RECV_READY, and
 * any message of the peer's proves it. */
static void flush_early(gloo_pair *p)
{
    struct gloo_batch *b = p->out;
    p->out = NULL;
    uint8_t *heads = malloc(b->n * GLOO_PREAMBLE_BYTES);
    bool data = false;
    for (size_t i = 0; heads && i < b->n; i++) {
        memcpy(heads + i * GLOO_PREAMBLE_BYTES, b->msg[i].head, GLOO_PREAMBLE_BYTES);
        data = data || b->msg[i].buf;
    }
    if (!heads || data)
        comm_gloo_fail(p->ctx, heads ? DT_EPROTO : DT_ENOMEM,
                       "gloo rank %d: %s writing to peer %d before it proved itself", p->ctx->rank,
                       heads ? "data (an internal error)" : "out of memory", p->peer);
    else
        write_early(p, heads, b->n * GLOO_PREAMBLE_BYTES);
    free(heads);
    free(b);
}

void comm_gloo_wire_flush(gloo_ctx *c)
{
    if (c->batched == 0 || !c->pairs)
        return;
    c->batched = 0;
    for (int r = 0; r < c->size; r++) {
        gloo_pair *p = &c->pairs[r];
        if (p->out && awaits_proof(p))
            flush_early(p);
        else if (p->out)
            flush_pair(p);
    }
}

void comm_gloo_wire_drop(gloo_pair *p)
{
    free(p->out);
    p->out = NULL;
}

void comm_gloo_wire_notify(gloo_pair *p, enum gloo_opcode op, uint64_t slot, size_t nbytes)
{
    write_message(p, op, slot, nbytes, NULL, NULL, 0);
}

void comm_gloo_wire_data(gloo_pair *p, uint64_t slot, gloo_buf *buf, size_t offset, size_t nbytes)
{
    write_message(p, GLOO_SEND_UNBOUND, slot, nbytes, buf, buf->ptr + offset, nbytes);
}
