/*
 * staging.c — collectives on device buffers: copy out through pinned host
 * memory, run the host algorithm, copy back, with the copies hidden behind
 * the wire.
 *
 * Why stage. The algorithms compute on the CPU and the transport writes
 * from host memory, so device bytes must cross to the host and back. The
 * copy engine moves page-locked ("pinned") memory by DMA at full PCIe speed
 * and asynchronously; pageable memory goes through a driver bounce buffer at
 * about half the speed, synchronously. Pinned memory is slow to allocate
 * (it locks pages), so each communicator allocates one arena once, grows it
 * only when an op needs more, and reuses it for every op.
 *
 * How an op finds out it is staged. The communicator's options name a
 * device (dt_comm_options.device); for every op on such a communicator the
 * executor asks the device whether the send and receive buffers are its
 * memory (a pointer query: cudaPointerGetAttributes, ~1 µs). So every
 * collective and p2p op, typed wrappers included, takes device buffers with
 * no new API and no flag to get wrong; a communicator without a device pays
 * nothing. Mixed ops (host send, device receive) stage only the device side.
 *
 * The pipeline, for a ring all-reduce of 4 chunks on rank 0 (chunk c is
 * reduced first by rank c+1, so rank 0 needs chunk 3 first, then 2, 1, 0;
 * pieces are STAGE_PIECE_BYTES, each with an event):
 *
 *   copy engine  D2H 3a 3b 2a 2b 1a 1b 0a 0b            H2D 0 ..1a 1b 2a ..
 *   wire              send 3a 3b  recv 2a+2a ... (reduce-scatter) | all-gather
 *   CPU                        wait(2a) reduce 2a, wait(2b) ...   | each segment
 *                                                                  final -> H2D
 *
 * The D2H copies are issued up front in the order the algorithm will read
 * them, and the algorithm waits (stage_need) only for the piece it is about
 * to read, so the copy of piece i+1 runs while piece i is on the wire. On
 * the way back, each segment is copied to the device the moment it is final
 * (stage_ready): in the all-gather phase that is as soon as it arrives, so
 * the H2D copies run while later segments are still on the wire and only
 * the last segment's copy is exposed. This is the shape of Gloo's chunked
 * CUDA ring all-reduce; PyTorch's Gloo backend instead copies the whole
 * tensor out, runs the host all-reduce, and copies it all back, paying both
 * copies in full on top of the transfer.
 *
 * Why an arena the size of the op, not a ring of a few 1 MiB slots: a ring
 * algorithm keeps reading its contributions until its last step and
 * receives into every chunk, so a slot could only be reused by splitting the
 * op into windows, each its own smaller collective — which changes which
 * rank reduces which element in which order, so float results would no
 * longer be bitwise those of the same op on host buffers. The arena is
 * reused across ops; the pieces, not the arena, are 1 MiB. (Gloo's CUDA ring
 * likewise stages into a pinned buffer of the whole op.)
 *
 * Pipelined (hooks in the algorithm, served by staging_pieces.c): ring all-reduce, ring reduce-scatter
 * (input side), ring all-gather(v) (output side), chain broadcast, linear
 * gather and scatter, pairwise all-to-all. Every other op (recursive
 * doubling and the trees, which are for small messages; p2p; any op in a
 * world of one) copies all its input in, runs, and copies all its output
 * back: correct, not overlapped. Whatever the hooks did, an
 * output whose bytes were not all staged out through stage_ready is copied
 * back whole at the end, so a missed hook costs time, never correctness.
 *
 * Failure. If a pinned allocation fails, the arena falls back to pageable
 * memory with one warning in the log. Whatever the op's outcome, comm_staging_run
 * waits for every copy it enqueued before returning, so the copy engine
 * never writes into an arena that a later op (or dt_comm_destroy) reuses.
 *
 * Send and receive stage differently, through a pool of reused buffers
 * (staging_p2p.c).
 *
 * Contract: device buffers must hold their input when the op is submitted
 * (synchronize the stream that wrote them first) and hold the result when
 * dt_work_wait returns.
 */
#include <stdlib.h>
#include <string.h>

#include "algorithms.h"
#include "dt_device.h"
#include "ring.h"
#include "staging_pieces.h"

#define ARENA_ALIGN ((size_t)64)

static size_t round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* ---- which bytes of an op are input and output on this rank ---------------- */

static size_t sum_counts(const dt_op *op, int p)
{
    size_t n = 0;
    for (int r = 0; r < p; r++)
        n += op->counts[r];
    return n;
}

/* Fill b[0] (send) and b[1] (recv): bytes and direction, host pointers. */
static void describe(const dt_stager *sg, const dt_op *op, stage_buf b[2])
{
    const size_t e = dt_dtype_size(op->dtype), n = op->count * e, p = (size_t)sg->size;
    const bool root = op->root == sg->rank;
    memset(b, 0, 2 * sizeof *b);
    b[0].host = (char *)op->send;
    b[1].host = op->recv;
    switch (op->kind) {
    case DT_OP_ALLREDUCE:
        b[1].bytes = n;
        b[1].in = b[1].out = true;
        break;
    case DT_OP_REDUCE_SCATTER:
        b[0].bytes = p * n;
        b[0].in = true;
        b[1].bytes = n;
        b[1].out = true;
        break;
    case DT_OP_ALLGATHER:
        b[0].bytes = n;
        b[0].in = true;
        b[1].bytes = p * n;
        b[1].out = true;
        break;
    case DT_OP_ALLGATHERV:
        b[0].bytes = op->counts[sg->rank] * e;
        b[0].in = true;
        b[1].bytes = sum_counts(op, sg->size) * e;
        b[1].out = true;
        break;
    case DT_OP_BROADCAST:
        b[1].bytes = n;
        b[1].in = root;
        b[1].out = !root;
        break;
    case DT_OP_REDUCE:
        b[1].bytes = n;
        b[1].in = true;
        b[1].out = root;
        break;
    case DT_OP_GATHER:
        b[0].bytes = n;
        b[0].in = true;
        b[1].bytes = root ? p * n : 0;
        b[1].out = root;
        break;
    case DT_OP_SCATTER:
        b[0].bytes = root ? p * n : 0;
        b[0].in = root;
        b[1].bytes = n;
        b[1].out = true;
        break;
    case DT_OP_ALLTOALL:
        b[0].bytes = b[1].bytes = p * n;
        b[0].in = b[1].out = true;
        break;
    default: break; /* barrier; send and recv stage in staging_p2p_* */
    }
    for (int i = 0; i < 2; i++)
        if (!b[i].host || b[i].bytes == 0)
            b[i] = (stage_buf){0};
}

bool comm_staging_wants(const dt_stager *sg, const dt_op *op)
{
    if (!sg->device || op->kind == DT_OP_BARRIER)
        return false;
    return dt_device_owns(sg->device, op->send) || dt_device_owns(sg->device, op->recv);
}

/* ---- the per-communicator state ----------------------------------------------- */

static dt_status staging_get(dt_stager *sg, staging **out)
{
    if (!sg->staging) {
        staging *s = calloc(1, sizeof *s);
        if (!s)
            return DT_ENOMEM;
        s->dev = sg->device;
        sg->staging = s;
        if (dt_device_stream_create(s->dev, &s->stream) != DT_OK ||
            dt_device_event_create(s->dev, &s->done) != DT_OK)
            return comm_staging_pieces_fail(sg, DT_ESYS, "cannot create the copy stream");
    }
    *out = sg->staging;
    return DT_OK;
}

static void arena_free(staging *s)
{
    if (s->pinned)
        dt_device_pinned_free(s->dev, s->arena);
    else
        free(s->arena);
    s->arena = NULL;
    s->cap = 0;
}

/* At least `bytes` of host memory: pinned if the device gives it, else
 * pageable with a warning (copies from pageable memory are about half as
 * fast and not asynchronous on CUDA). */
static dt_status arena_reserve(dt_stager *sg, staging *s, size_t bytes)
{
    if (bytes <= s->cap)
        return DT_OK;
    arena_free(s);
    size_t want = round_up(bytes, STAGE_PIECE_BYTES);
    void *p;
    if (dt_device_pinned_alloc(s->dev, &p, want) == DT_OK) {
        s->pinned = true;
    } else {
        sg->report->log(sg->owner,
                        "rank %d: warning: %s: no pinned host memory for staging (%s); using "
                        "pageable memory, copies will be slower",
                        sg->rank, dt_device_name(s->dev), dt_device_error(s->dev));
        s->pinned = false;
        p = malloc(want);
        if (!p)
            return DT_ENOMEM;
    }
    s->arena = p;
    s->cap = want;
    return DT_OK;
}

static dt_status pieces_reserve(dt_stager *sg, staging *s, size_t n)
{
    if (n <= s->cap_pieces)
        return DT_OK;
    dt_device_event **ev = realloc(s->events, n * sizeof *ev);
    if (!ev)
        return DT_ENOMEM;
    s->events = ev;
    unsigned char *st = realloc(s->piece, n);
    if (!st)
        return DT_ENOMEM;
    s->piece = st;
    for (size_t i = s->cap_pieces; i < n; i++) {
        s->events[i] = NULL;
        if (dt_device_event_create(s->dev, &s->events[i]) != DT_OK) {
            s->cap_pieces = i;
            return comm_staging_pieces_fail(sg, DT_ESYS, "cannot create an event");
        }
    }
    s->cap_pieces = n;
    return DT_OK;
}

void comm_staging_destroy(dt_stager *sg)
{
    comm_staging_p2p_destroy(sg);
    staging *s = sg->staging;
    if (!s)
        return;
    arena_free(s);
    for (size_t i = 0; i < s->cap_pieces; i++)
        dt_device_event_destroy(s->dev, s->events[i]);
    free(s->events);
    free(s->piece);
    dt_device_event_destroy(s->dev, s->done);
    dt_device_stream_destroy(s->dev, s->stream);
    free(s);
    sg->staging = NULL;
}

/* ---- one op ------------------------------------------------------------------------ */

/* Give each device buffer its host view: a place in the arena, or, when it
 * lies inside the other buffer (an in-place op), the same place in that
 * buffer's view. */
static dt_status layout(dt_stager *sg, stage_op *so)
{
    stage_buf *b = so->b;
    bool alias[2] = {false, false};
    for (int i = 0; i < 2; i++) {
        stage_buf *o = &b[1 - i];
        alias[i] = b[i].dev && o->dev && b[i].dev >= o->dev &&
                   b[i].dev + b[i].bytes <= o->dev + o->bytes && !alias[1 - i];
    }
    size_t need = 0, at[2] = {0, 0};
    for (int i = 0; i < 2; i++)
        if (b[i].dev && !alias[i]) {
            at[i] = need;
            need += round_up(b[i].bytes, ARENA_ALIGN);
        }
    dt_status st = arena_reserve(sg, so->s, need);
    if (st != DT_OK)
        return st;
    for (int i = 0; i < 2; i++)
        if (b[i].dev && !alias[i])
            b[i].host = so->s->arena + at[i];
    for (int i = 0; i < 2; i++)
        if (alias[i])
            b[i].host = b[1 - i].host + (b[i].dev - b[1 - i].dev);
    return DT_OK;
}

/* Enqueue the D2H copies of the input pieces overlapping bytes [lo, hi) of
 * buffer b that are not enqueued yet, each followed by its event. */
static dt_status issue_range(stage_op *so, stage_buf *b, size_t lo, size_t hi)
{
    staging *s = so->s;
    for (size_t i = lo / STAGE_PIECE_BYTES; i * STAGE_PIECE_BYTES < hi; i++) {
        if (s->piece[b->piece0 + i] != PIECE_IDLE)
            continue;
        size_t off = i * STAGE_PIECE_BYTES;
        size_t len = b->bytes - off < STAGE_PIECE_BYTES ? b->bytes - off : STAGE_PIECE_BYTES;
        if (dt_device_copy_d2h(s->dev, b->host + off, b->dev + off, len, s->stream) != DT_OK ||
            dt_device_event_record(s->dev, s->events[b->piece0 + i], s->stream) != DT_OK)
            return comm_staging_pieces_fail(so->stager, DT_ESYS, "copying the input to the host");
        s->piece[b->piece0 + i] = PIECE_ISSUED;
    }
    return DT_OK;
}

/* Enqueue every input piece, in the order the algorithm will read them: for
 * the ring reductions chunk rank-1 first, then rank-2, ... (ring.h), for
 * everything else from the start. */
static dt_status issue_inputs(stage_op *so, const dt_op *op, int rank, int p)
{
    const size_t e = dt_dtype_size(op->dtype);
    bool ring = p > 1 && (op->kind == DT_OP_REDUCE_SCATTER ||
                          (op->kind == DT_OP_ALLREDUCE && comm_algo_chosen(op, p) == DT_ALGO_RING));
    size_t npieces = 0;
    for (int i = 0; i < 2; i++) {
        so->b[i].piece0 = npieces;
        if (so->b[i].dev && so->b[i].in)
            npieces += round_up(so->b[i].bytes, STAGE_PIECE_BYTES) / STAGE_PIECE_BYTES;
    }
    dt_status st = pieces_reserve(so->stager, so->s, npieces);
    if (st != DT_OK)
        return st;
    memset(so->s->piece, PIECE_IDLE, npieces);
    stage_buf *in = &so->b[op->kind == DT_OP_ALLREDUCE ? 1 : 0];
    if (ring && in->dev) {
        ring_chunks k = op->kind == DT_OP_ALLREDUCE ? ring_chunks_split(op->count, p)
                                                    : ring_chunks_uniform(op->count);
        for (int step = 1; step <= p && st == DT_OK; step++) {
            int ch = ring_mod(rank - step, p);
            size_t lo = ring_chunk_offset(&k, ch) * e;
            st = issue_range(so, in, lo, lo + ring_chunk_count(&k, ch) * e);
        }
    }
    for (int i = 0; i < 2 && st == DT_OK; i++)
        if (so->b[i].dev && so->b[i].in)
            st = issue_range(so, &so->b[i], 0, so->b[i].bytes);
    return st;
}

/* Do the algorithm's hooks cover every read of its input? (See the list in
 * the head comment; a world of one takes shortcuts that read the input
 * without asking.) */
static bool inputs_hooked(const dt_op *op, int p)
{
    if (p == 1)
        return false;
    switch (op->kind) {
    case DT_OP_ALLREDUCE: return comm_algo_chosen(op, p) == DT_ALGO_RING;
    case DT_OP_REDUCE_SCATTER:
    case DT_OP_GATHER:
    case DT_OP_SCATTER:
    case DT_OP_ALLTOALL: return true;
    case DT_OP_BROADCAST: return comm_algo_chosen(op, p) == DT_ALGO_CHAIN;
    default: return false;
    }
}

/* After the algorithm: the output bytes no hook copied back, then wait for
 * every copy this op enqueued (on failure too: the arena must be idle). */
static dt_status finish(stage_op *so, dt_status st)
{
    staging *s = so->s;
    stage_buf *b = &so->b[1];
    if (st == DT_OK && so->err == DT_OK && b->dev && b->out && so->out_staged != b->bytes &&
        dt_device_copy_h2d(s->dev, b->dev, b->host, b->bytes, s->stream) != DT_OK)
        so->err = comm_staging_pieces_fail(so->stager, DT_ESYS, "copying the result to the device");
    if (dt_device_event_record(s->dev, s->done, s->stream) != DT_OK)
        return comm_staging_pieces_fail(so->stager, DT_ESYS, "waiting for the copies of this op");
    dt_status waited = comm_staging_pieces_wait(so, s->done, "the copies of this op");
    if (waited != DT_OK)
        return waited;
    return st != DT_OK ? st : so->err;
}

/* What the pipelined algorithms call on a staged op (stage_hooks.h). */
static const stage_hooks hooks = {
    .need = comm_staging_pieces_need,
    .ready = comm_staging_pieces_ready,
};

dt_status comm_staging_run(dt_opctx *o)
{
    dt_stager *sg = o->stager;
    const dt_op *user = o->op;
    stage_op so = {.stager = sg, .o = o};
    dt_status st = staging_get(sg, &so.s);
    if (st != DT_OK)
        return st;
    describe(sg, user, so.b);
    for (int i = 0; i < 2; i++)
        if (so.b[i].host && dt_device_owns(sg->device, so.b[i].host))
            so.b[i].dev = so.b[i].host;
    if ((st = layout(sg, &so)) != DT_OK ||
        (st = issue_inputs(&so, user, sg->rank, sg->size)) != DT_OK)
        return finish(&so, st);
    if (!inputs_hooked(user, sg->size))
        for (int i = 0; i < 2 && st == DT_OK; i++)
            if (so.b[i].dev && so.b[i].in)
                st = comm_staging_pieces_sync(&so, &so.b[i], 0, so.b[i].bytes);
    if (st != DT_OK)
        return finish(&so, st);

    dt_op host = *user;
    if (so.b[0].dev)
        host.send = so.b[0].host;
    if (so.b[1].dev)
        host.recv = so.b[1].host;
    o->op = &host;
    o->stage = &so;
    o->stage_hooks = &hooks;
    st = comm_algo_run(o);
    o->op = user;
    o->stage = NULL;
    return finish(&so, st);
}
