/*
 * staging_pieces.c — the algorithms' side of a staged op (staging.c has
 * the picture): wait for the device-to-host copy of the input pieces an
 * algorithm is about to read (stage_need), and start the host-to-device
 * copy of output bytes the moment they are final (stage_ready).
 *
 * An op's input is copied to the host in pieces of STAGE_PIECE_BYTES, each
 * followed by an event; a piece is idle, issued (its copy enqueued) or
 * synced (its event waited for), so each is waited for at most once.
 * Output bytes copied back through stage_ready are counted, so that
 * staging.c copies back whole only an output the hooks did not cover.
 * Cost: an event wait per input piece; a copy enqueued per final segment.
 */
#include "staging_pieces.h"

dt_status comm_staging_pieces_fail(dt_stager *sg, dt_status st, const char *what)
{
    sg->report->fail(sg->owner, st, "rank %d: staging through %s: %s: %s", sg->rank,
                     dt_device_name(sg->device), what, dt_device_error(sg->device));
    return st;
}

dt_status comm_staging_pieces_wait(stage_op *so, dt_device_event *e, const char *what)
{
    dt_stager *sg = so->stager;
    const dt_opctx *o = so->o;
    /* A copy is local work: the liveness limit bounds it, as it bounds a
     * silent peer (peers hear no heartbeat from a loop that waits here). */
    double now = dt_now(), until = now + sg->timeout_s;
    if (o->deadline < until)
        until = o->deadline;
    dt_status st = dt_device_event_wait(sg->device, e, until);
    if (st == DT_ETIMEDOUT) {
        sg->report->fail(sg->owner, DT_ETIMEDOUT,
                         "rank %d: %s #%llu: %s: %s did not complete within %.1f s; "
                         "is the device hung?",
                         sg->rank, dt_op_name(o->op->kind), (unsigned long long)o->seq,
                         dt_device_name(sg->device), what, until - now);
        return st;
    }
    return st == DT_OK ? DT_OK : comm_staging_pieces_fail(sg, st, what);
}

dt_status comm_staging_pieces_sync(stage_op *so, stage_buf *b, size_t lo, size_t hi)
{
    staging *s = so->s;
    for (size_t i = lo / STAGE_PIECE_BYTES; i * STAGE_PIECE_BYTES < hi; i++) {
        unsigned char *state = &s->piece[b->piece0 + i];
        if (*state != PIECE_ISSUED)
            continue;
        dt_status st = comm_staging_pieces_wait(so, s->events[b->piece0 + i],
                                                "a device-to-host copy");
        if (st != DT_OK)
            return st;
        *state = PIECE_SYNCED;
    }
    return DT_OK;
}

dt_status comm_staging_pieces_need(dt_opctx *o, const void *p, size_t n)
{
    stage_op *so = o->stage;
    const char *q = p;
    for (int i = 0; i < 2; i++) {
        stage_buf *b = &so->b[i];
        if (!b->dev || !b->in || q < b->host || q >= b->host + b->bytes)
            continue;
        size_t lo = (size_t)(q - b->host), hi = lo + n;
        return comm_staging_pieces_sync(so, b, lo, hi < b->bytes ? hi : b->bytes);
    }
    return DT_OK; /* not a staged input: host memory, or scratch */
}

void comm_staging_pieces_ready(dt_opctx *o, const void *p, size_t n)
{
    stage_op *so = o->stage;
    stage_buf *b = &so->b[1];
    const char *q = p;
    if (!b->dev || !b->out || q < b->host || q + n > b->host + b->bytes || so->err != DT_OK)
        return;
    size_t off = (size_t)(q - b->host);
    if (dt_device_copy_h2d(so->s->dev, b->dev + off, q, n, so->s->stream) != DT_OK)
        so->err = comm_staging_pieces_fail(so->stager, DT_ESYS, "copying the result to the device");
    else
        so->out_staged += n;
}
