/*
 * frame.c — reading gloo's messages off one connection.
 *
 * A connection carries a stream of messages: a 48-byte preamble (wire.c
 * lists its fields), then, for data, `length` payload bytes. The reader is
 * a two-state machine driven by libuv: it asks for exactly the bytes of
 * the piece it is in (the rest of a preamble, or the rest of a payload),
 * so a message may straddle any number of reads and no read runs into the
 * next message. A payload is read straight into the receive it matched
 * (match.c): no staging copy, no buffer for unexpected messages, since
 * data never arrives unannounced.
 *
 * Everything read is checked before it is believed: the opcode, that
 * nbytes agrees with the opcode and length, that offset and roffset are 0
 * (torch's CPU collectives never set them), and — in match.c — that a
 * receive was posted and is large enough. A message that fails is a
 * protocol error naming the peer, the slot and its tag; gloo itself would
 * abort the process there. A connection's first message, while the
 * accepting side cannot yet tell its peer from a stranger, is vetted
 * byte by byte (comm_gloo_frame_first_bad, for held.c).
 *
 * Cost: one read(2) per preamble and one or more per payload.
 */
#include <stdlib.h>

#include "gloo.h"

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

void comm_gloo_frame_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    (void)suggested;
    gloo_pair *p = h->data;
    if (p->rx_dest) {
        size_t n = p->rx_left < ((size_t)1 << 30) ? p->rx_left : ((size_t)1 << 30);
        *b = uv_buf_init((char *)p->rx_dest, (unsigned)n);
    } else {
        *b = uv_buf_init((char *)p->head + p->head_got, GLOO_PREAMBLE_BYTES - p->head_got);
    }
}

static dt_status bad_preamble(gloo_pair *p, const char *what, uint64_t opcode, uint64_t slot)
{
    char name[96];
    gloo_ctx *c = p->ctx;
    return comm_gloo_fail(c, DT_EPROTO,
                          "gloo rank %d: peer %d sent a malformed message (opcode %llu, %s): %s",
                          c->rank, p->peer, (unsigned long long)opcode,
                          comm_gloo_slot_describe(slot, name, sizeof name), what);
}

/* A payload has been read in full: one more receive done on its buffer. */
static void payload_done(gloo_pair *p)
{
    gloo_ctx *c = p->ctx; /* dt_comm_traffic */
    atomic_fetch_add_explicit(&c->traffic[1], p->rx_len, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->traffic[3], 1, memory_order_relaxed);
    p->rx_buf->recvs_done++;
    p->rx_buf->recv_from = p->peer;
    p->rx_buf = NULL;
    p->rx_dest = NULL;
}

/* A connection's first message is a notification: data moves only after
 * the receiver's RECV_READY, which this side sends only to a proven peer.
 * So byte by byte: nbytes 48, opcode 2 or 3, any slot, offset 0, a length
 * under 2^48, roffset 0. */
int comm_gloo_frame_first_bad(const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n && i < GLOO_PREAMBLE_BYTES; i++) {
        bool ok;
        if (i == 0)
            ok = b[i] == GLOO_PREAMBLE_BYTES;
        else if (i == 8)
            ok = b[i] == GLOO_SEND_READY || b[i] == GLOO_RECV_READY;
        else if (i >= 16 && i < 24)
            ok = true; /* the slot */
        else if (i >= 32 && i < 38)
            ok = true; /* the announced length's low bytes */
        else
            ok = b[i] == 0;
        if (!ok)
            return (int)i;
    }
    return -1;
}

/* A whole preamble is in p->head: act on it. */
void comm_gloo_frame_preamble(gloo_pair *p)
{
    const uint64_t nbytes = get_u64(p->head), opcode = get_u64(p->head + 8);
    const uint64_t slot = get_u64(p->head + 16), offset = get_u64(p->head + 24);
    const uint64_t length = get_u64(p->head + 32), roffset = get_u64(p->head + 40);
    p->head_got = 0;
    if (offset != 0 || roffset != 0) {
        bad_preamble(p, "non-zero offset or remote offset", opcode, slot);
        return;
    }
    switch (opcode) {
    case GLOO_SEND_READY:
    case GLOO_RECV_READY:
        if (nbytes != GLOO_PREAMBLE_BYTES) {
            bad_preamble(p, "a notification with a payload", opcode, slot);
            return;
        }
        if (opcode == GLOO_SEND_READY)
            comm_gloo_match_send_ready(p, slot);
        else
            comm_gloo_match_recv_ready(p, slot);
        return;
    case GLOO_SEND_UNBOUND: {
        if (nbytes < GLOO_PREAMBLE_BYTES || nbytes - GLOO_PREAMBLE_BYTES != length) {
            bad_preamble(p, "nbytes disagrees with length", opcode, slot);
            return;
        }
        gloo_op op;
        if (comm_gloo_match_data(p, slot, length, &op) != DT_OK)
            return;
        p->rx_buf = op.buf;
        p->rx_dest = op.buf->ptr + op.offset;
        p->rx_left = length;
        p->rx_len = length;
        if (length == 0)
            payload_done(p);
        return;
    }
    default: bad_preamble(p, "an opcode torch 1.13's CPU collectives never send", opcode, slot);
    }
}

void comm_gloo_frame_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *b)
{
    (void)b;
    gloo_pair *p = s->data;
    gloo_ctx *c = p->ctx;
    if (nread == 0 || c->failed != DT_OK)
        return;
    if (nread < 0) { /* fails the ops that wait for this peer (wait.c) */
        comm_gloo_pair_gone(p, nread == UV_EOF ? "it closed the connection: it exited or failed"
                                               : uv_strerror((int)nread));
        return;
    }
    if (p->rx_dest) {
        p->rx_dest += nread;
        p->rx_left -= (size_t)nread;
        if (p->rx_left == 0)
            payload_done(p);
        return;
    }
    p->head_got += (size_t)nread;
    if (p->head_got == GLOO_PREAMBLE_BYTES)
        comm_gloo_frame_preamble(p);
}

void comm_gloo_frame_start(gloo_pair *p)
{
    uv_tcp_nodelay(p->conn, 1);
    p->conn->data = p;
    p->connected = true;
    int rc = uv_read_start((uv_stream_t *)p->conn, comm_gloo_frame_alloc, comm_gloo_frame_read);
    if (rc != 0)
        comm_gloo_fail(p->ctx, DT_EPEER, "gloo rank %d: cannot read from peer %d: %s", p->ctx->rank,
                       p->peer, uv_strerror(rc));
}
