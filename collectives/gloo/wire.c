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
 * A data message goes out as one write of {preamble, payload}, the payload
 * straight from the caller's buffer (no copy); the buffer's send count
 * rises when the kernel has taken all of it, and dt_comm_traffic counts
 * the payload then (notifications carry none and are not counted). Writes to one peer leave in
 * the order they were made, which is all gloo's matching needs.
 *
 * Cost: α + (48 + n)β per message; one allocation of 80 bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "gloo.h"

#define PIECE_BYTES ((size_t)1 << 30)
#define MAX_PIECES 64 /* payloads up to 64 GiB */

typedef struct gloo_write {
    uv_write_t req;
    gloo_pair *pair;
    gloo_buf *buf; /* NULL for a notification */
    size_t payload_len;
    uint8_t head[GLOO_PREAMBLE_BYTES];
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
        if (w->buf) {
            w->buf->sends_done++;
            gloo_ctx *c = w->pair->ctx; /* dt_comm_traffic: data messages only */
            atomic_fetch_add_explicit(&c->traffic[0], w->payload_len, memory_order_relaxed);
            atomic_fetch_add_explicit(&c->traffic[2], 1, memory_order_relaxed);
        }
    } else if (status != UV_ECANCELED) {
        comm_gloo_pair_gone(w->pair, uv_strerror(status)); /* the waiter names the peer */
    }
    free(w);
}

static void write_message(gloo_pair *p, enum gloo_opcode op, uint64_t slot, size_t length,
                          gloo_buf *buf, const uint8_t *payload, size_t payload_len)
{
    gloo_ctx *c = p->ctx;
    if (c->failed != DT_OK || !p->connected)
        return; /* the op sees the failure when it waits */
    if (payload_len > MAX_PIECES * PIECE_BYTES) {
        comm_gloo_fail(c, DT_EINVAL,
                       "gloo rank %d: a message of %zu bytes to peer %d is over "
                       "the 64 GiB this wire sends at once",
                       c->rank, payload_len, p->peer);
        return;
    }
    gloo_write *w = calloc(1, sizeof *w);
    if (!w) {
        comm_gloo_fail(c, DT_ENOMEM, "gloo rank %d: out of memory writing to peer %d", c->rank,
                       p->peer);
        return;
    }
    w->req.data = w;
    w->pair = p;
    w->buf = buf;
    w->payload_len = payload_len;
    put_u64(w->head + 0, GLOO_PREAMBLE_BYTES + payload_len);
    put_u64(w->head + 8, op);
    put_u64(w->head + 16, slot);
    put_u64(w->head + 32, length);
    uv_buf_t parts[1 + MAX_PIECES] = {uv_buf_init((char *)w->head, GLOO_PREAMBLE_BYTES)};
    unsigned nparts = 1;
    for (size_t done = 0; done < payload_len; nparts++) { /* uv_buf_t lengths are 32-bit */
        size_t piece = payload_len - done < PIECE_BYTES ? payload_len - done : PIECE_BYTES;
        parts[nparts] = uv_buf_init((char *)payload + done, (unsigned)piece);
        done += piece;
    }
    sigset_t old;
    comm_gloo_sigpipe_block(&old);
    int rc = uv_write(&w->req, (uv_stream_t *)&p->tcp, parts, nparts, written);
    comm_gloo_sigpipe_restore(&old);
    if (rc != 0) {
        free(w);
        comm_gloo_pair_gone(p, uv_strerror(rc));
    }
}

void comm_gloo_wire_notify(gloo_pair *p, enum gloo_opcode op, uint64_t slot, size_t nbytes)
{
    write_message(p, op, slot, nbytes, NULL, NULL, 0);
}

void comm_gloo_wire_data(gloo_pair *p, uint64_t slot, gloo_buf *buf, size_t offset, size_t nbytes)
{
    write_message(p, GLOO_SEND_UNBOUND, slot, nbytes, buf, buf->ptr + offset, nbytes);
}
