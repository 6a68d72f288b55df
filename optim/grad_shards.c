/*
 * grad_shards.c — ZeRO stage 2's gradient path: every gradient bucket is
 * reduced into its owner's shard as backward produces it, and no rank
 * ever holds the whole gradient.
 *
 * The idea (Rajbhandari et al., "ZeRO", 2020, stage 2). After ZeRO-1 a
 * rank still keeps a full 4Ψ gradient buffer although its optimizer reads
 * only its own 1/p of it. Here the model has no gradient buffer at all
 * (dt_model_window_grads): backward writes each bucket's gradients into a
 * small buffer from a pool, the bucket is sent as soon as backward has
 * finished it (cut at shard boundaries, each piece an async reduce (avg)
 * to the rank that owns it, as in ZeRO-1), and the owner copies its piece
 * of the mean into its gradient shard. The buffer then serves a later
 * bucket. Memory: the shard (4·s bytes) plus POOL buckets in flight.
 *
 * Buckets are unions of the backward hook's units (dt_model_grad_units:
 * the tensors one layer finishes together), merged from the tail up to
 * bucket_bytes, because the window must hold everything a layer writes.
 * Backward's hook, reporting "gradients [lo, Ψ) are final", launches
 * every bucket above lo and maps the next bucket's buffer before backward
 * reaches it; if that buffer's last bucket is still on the wire, the hook
 * waits for it (the only exposed wait during backward, rare with POOL
 * buffers while the wire keeps up).
 *
 * Gradient accumulation. DDP adds the micro-steps' gradients locally and
 * reduces once; to stay bitwise equal to it, micro-steps without sync
 * (k > 1) add into a full local buffer, allocated at the first one: the
 * memory saving of stage 2 holds for k = 1 only. (DeepSpeed instead
 * reduces every micro-step into the shard: less memory, other rounding.)
 * The synced micro-step seeds each bucket from that buffer, so it adds
 * exactly as DDP's backward does, and zeroes it for the next step.
 *
 * --deterministic (rank_order.c): buckets are zeroed, not seeded, and
 * the accumulated sum is added into each just before it is launched
 * (sum + g_j); a micro-step without sync from the second on writes
 * bucket by bucket into the pool too, each bucket added into the sum as
 * backward finishes it; pieces are summed in rank order, and the shard is
 * divided by k·N after the last one.
 *
 * --grad-comm bf16 (grad_comm.c): each piece leaves as a bf16 copy (a
 * bf16 buffer beside each pool buffer), and the owner widens the mean
 * into its shard instead of copying it.
 *
 * Ordering: every rank builds the same buckets and pieces and launches
 * them in the same order (backward's), as the collectives require.
 * Timing as in zero1.c: busy = wire spans, exposed = time waited.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_optim.h"
#include "optim_internal.h"

enum { POOL = 2 }; /* bucket buffers: one filling, one on the wire */

typedef struct gpiece {
    size_t lo, n; /* elements, within one shard */
    int owner;
    dt_work *work;
    bool done;
    double t_submit, t_done;
} gpiece;

typedef struct gbucket {
    size_t lo, n; /* a union of hook units */
    int p0, np;   /* its pieces: pieces[p0 .. p0+np) */
    int buf;      /* pool buffer it was written in, -1: none yet */
} gbucket;

struct optim_grad_shards {
    dt_model *m;
    dt_comm *comm;
    int rank, world;
    size_t s, my_lo, my_n; /* shard size; this rank's valid range */
    float *shard;          /* (s) this rank's piece of the mean gradient */
    float *pool[POOL];     /* (max bucket) each; one when there is one bucket */
    int pool_owner[POOL];  /* bucket last written in each, -1: free */
    size_t max_bucket;
    float *accum; /* (Ψ) k > 1 only: the no-sync micro-steps' local sum */
    bool accum_dirty;
    gbucket *buckets;   /* [nb], tail first */
    int nb, next;       /* next: first bucket not launched this backward */
    gpiece *pieces;     /* [npieces] */
    optim_grad_comm gc; /* --grad-comm bf16: POOL × max_bucket bf16 copies */
    int npieces;
    optim_overlap_clock clock;
    optim_rank_order ro; /* --deterministic: only its on and micro */
    bool collecting;     /* a deterministic micro-step without sync */
    dt_status st;
    char err[512];
};

static dt_status gs_fail(optim_grad_shards *g, dt_status st, const char *what)
{
    if (g->st == DT_OK) {
        g->st = st;
        snprintf(g->err, sizeof g->err, "zero2 (rank %d): %s: %s", g->rank, what,
                 g->comm && *dt_comm_error(g->comm) ? dt_comm_error(g->comm) : dt_status_name(st));
    }
    return st;
}

/* Buckets from the hook's units (tail first), merged up to cap elements
 * (a bigger unit alone), each cut into pieces at shard boundaries. */
static int build_buckets(optim_grad_shards *g, size_t cap)
{
    dt_model *m = g->m;
    int nu = dt_model_grad_units(m, NULL);
    size_t *unit = calloc((size_t)nu, sizeof *unit);
    g->buckets = calloc((size_t)nu, sizeof *g->buckets);
    g->pieces = calloc((size_t)nu + (size_t)g->world, sizeof *g->pieces);
    if (!unit || !g->buckets || !g->pieces) {
        free(unit);
        return -1;
    }
    dt_model_grad_units(m, unit);
    size_t hi = m->num_params;
    for (int u = 0; u < nu; u++) {
        size_t next_lo = u + 1 < nu ? unit[u + 1] : 0;
        if (u + 1 < nu && hi - next_lo <= cap)
            continue; /* the next unit still fits this bucket */
        gbucket *b = &g->buckets[g->nb++];
        *b = (gbucket){.lo = unit[u], .n = hi - unit[u], .p0 = g->npieces, .buf = -1};
        for (size_t top = hi; top > b->lo;) {
            int owner = (int)((top - 1) / g->s);
            size_t base = (size_t)owner * g->s > b->lo ? (size_t)owner * g->s : b->lo;
            g->pieces[g->npieces++] = (gpiece){.lo = base, .n = top - base, .owner = owner};
            b->np++;
            top = base;
        }
        if (b->n > g->max_bucket)
            g->max_bucket = b->n;
        hi = unit[u];
    }
    free(unit);
    return g->nb;
}

dt_status optim_grad_shards_create(optim_grad_shards **out, dt_model *m, dt_comm *comm, size_t cap,
                                   size_t s)
{
    optim_grad_shards *g = calloc(1, sizeof *g);
    *out = g;
    if (!g)
        return DT_ENOMEM;
    g->m = m;
    g->comm = comm;
    g->rank = comm ? dt_comm_rank(comm) : 0;
    g->world = comm ? dt_comm_size(comm) : 1;
    g->s = s;
    g->my_lo = (size_t)g->rank * s;
    g->my_n = g->my_lo >= m->num_params      ? 0
              : m->num_params - g->my_lo < s ? m->num_params - g->my_lo
                                             : s;
    if (build_buckets(g, cap) < 0)
        return gs_fail(g, DT_ENOMEM, "create: out of memory for buckets");
    g->shard = m->be->alloc(s * sizeof(float));
    for (int i = 0; i < POOL; i++) {
        g->pool_owner[i] = -1;
        if (i < g->nb && !(g->pool[i] = m->be->alloc(g->max_bucket * sizeof(float))))
            return gs_fail(g, DT_ENOMEM, "create: out of memory for the bucket pool");
    }
    if (!g->shard)
        return gs_fail(g, DT_ENOMEM, "create: out of memory for the gradient shard");
    dt_model_window_grads(m, NULL, 0, 0); /* frees the model's full buffer */
    return DT_OK;
}

void optim_grad_shards_destroy(optim_grad_shards *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->npieces; i++)
        if (g->pieces[i].work)
            dt_work_wait(g->pieces[i].work);
    const dt_backend *be = g->m->be;
    void *dev[] = {g->shard, g->pool[0], g->pool[1], g->accum};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            be->free(dev[i]);
    optim_grad_comm_free(&g->gc);
    free(g->buckets);
    free(g->pieces);
    free(g);
}

const char *optim_grad_shards_error(const optim_grad_shards *g)
{
    return g->err;
}

size_t optim_grad_shards_bytes(const optim_grad_shards *g)
{
    size_t pool = g->max_bucket * (size_t)(g->nb < POOL ? g->nb : POOL);
    size_t n = g->s + pool + (g->accum ? g->m->num_params : 0);
    return n * sizeof(float) + g->gc.n * sizeof *g->gc.buf;
}

int optim_grad_shards_num_buckets(const optim_grad_shards *g)
{
    return g->nb;
}

const float *optim_grad_shards_mean(const optim_grad_shards *g)
{
    return g->shard;
}

/* Where piece pc of bucket b travels in the bf16 buffer: beside its pool
 * buffer's place. */
static size_t wire_at(const optim_grad_shards *g, const gbucket *b, const gpiece *pc)
{
    return (size_t)b->buf * g->max_bucket + (pc->lo - b->lo);
}

/* Waits for piece pc of bucket b, then keeps this rank's part of it. */
static void settle_piece(optim_grad_shards *g, const gbucket *b, gpiece *pc)
{
    if (pc->work) {
        dt_status st = optim_overlap_clock_wait(&g->clock, &pc->work, &pc->done, pc->t_submit,
                                                &pc->t_done);
        if (st != DT_OK)
            gs_fail(g, st, "reduce of a gradient piece to its owner");
    }
    if (pc->owner != g->rank || g->st != DT_OK)
        return;
    if (g->gc.on) /* the mean arrived as bf16 */
        optim_grad_comm_unpack(&g->gc, g->shard + (pc->lo - g->my_lo), wire_at(g, b, pc), pc->n);
    else
        g->m->be->copy(g->shard + (pc->lo - g->my_lo), g->pool[b->buf] + (pc->lo - b->lo),
                       pc->n * sizeof(float));
}

/* Frees pool buffer i: settles the bucket last written in it. */
static void release_buffer(optim_grad_shards *g, int i)
{
    int k = g->pool_owner[i];
    if (k < 0)
        return;
    gbucket *b = &g->buckets[k];
    for (int p = b->p0; p < b->p0 + b->np; p++)
        settle_piece(g, b, &g->pieces[p]);
    g->pool_owner[i] = -1;
}

/* Gives bucket k a pool buffer, zeroed (or seeded from the accumulated
 * micro-steps), and maps it as the model's gradient window. */
static void map_bucket(optim_grad_shards *g, int k)
{
    gbucket *b = &g->buckets[k];
    int i = k % (g->nb < POOL ? g->nb : POOL);
    release_buffer(g, i);
    b->buf = i;
    g->pool_owner[i] = k;
    const dt_backend *be = g->m->be;
    if (g->accum_dirty && !g->ro.on)
        be->copy(g->pool[i], g->accum + b->lo, b->n * sizeof(float));
    else
        be->zero(g->pool[i], b->n * sizeof(float));
    dt_model_window_grads(g->m, g->pool[i], b->lo, b->n);
}

static void launch_bucket(optim_grad_shards *g, gbucket *b)
{
    if (g->ro.on && g->accum_dirty) /* sum + g_j, just before it leaves */
        optim_rank_order_add(g->pool[b->buf], g->accum + b->lo, b->n);
    for (int p = b->p0; p < b->p0 + b->np && g->st == DT_OK && g->world > 1; p++) {
        gpiece *pc = &g->pieces[p];
        dt_op op = {.kind = DT_OP_REDUCE,
                    .recv = g->pool[b->buf] + (pc->lo - b->lo),
                    .count = pc->n,
                    .dtype = DT_F32,
                    .redop = DT_AVG,
                    .root = pc->owner};
        optim_rank_order_op(&g->ro, &op);
        optim_grad_comm_pack(&g->gc, &op, wire_at(g, b, pc));
        pc->done = false;
        pc->t_submit = dt_now();
        dt_status st = dt_submit(g->comm, &op, &pc->work);
        if (st != DT_OK) {
            pc->work = NULL;
            gs_fail(g, st, "backward: launching a gradient piece's reduce");
        }
    }
}

/* The model's backward hook: gradients [lo, Ψ) are final. */
static void on_grads_ready(void *user, size_t lo)
{
    optim_grad_shards *g = user;
    for (int p = 0; p < g->npieces; p++) /* note finished pieces, for timing */
        if (g->pieces[p].work && !g->pieces[p].done && dt_work_test(g->pieces[p].work)) {
            g->pieces[p].done = true;
            g->pieces[p].t_done = dt_now();
        }
    /* after a failure nothing is launched, but the windows are still
     * mapped: backward must have somewhere to write until it returns */
    while (g->next < g->nb && g->buckets[g->next].lo >= lo) {
        gbucket *b = &g->buckets[g->next];
        if (g->collecting) { /* into the sum, nothing sent */
            optim_rank_order_add(g->accum + b->lo, g->pool[b->buf], b->n);
            g->pool_owner[b->buf] = -1;
        } else {
            launch_bucket(g, b);
        }
        if (++g->next < g->nb)
            map_bucket(g, g->next);
    }
}

/* A micro-step without sync: into the full local sum. */
static dt_status accumulate_locally(optim_grad_shards *g, float dloss)
{
    dt_model *m = g->m;
    if (!g->accum && !(g->accum = m->be->alloc(m->num_params * sizeof(float))))
        return gs_fail(g, DT_ENOMEM, "backward: out of memory for gradient accumulation");
    dt_model_window_grads(m, g->accum, 0, m->num_params);
    dt_status st = dt_model_backward(m, dloss);
    dt_model_window_grads(m, NULL, 0, 0);
    g->accum_dirty = true;
    return st;
}

/* A backward bucket by bucket through the pool: each bucket launched (a
 * synced micro-step) or added into the sum (collecting) as backward
 * finishes it. */
static dt_status pooled_backward(optim_grad_shards *g, float dloss)
{
    dt_model *m = g->m;
    g->next = 0;
    map_bucket(g, 0);
    dt_model_set_grad_hook(m, on_grads_ready, g);
    dt_status st = dt_model_backward(m, dloss);
    dt_model_set_grad_hook(m, NULL, NULL);
    dt_model_window_grads(m, NULL, 0, 0);
    if (g->collecting) {
        g->collecting = false;
        g->next = 0;
    } else if (g->accum_dirty) {
        m->be->zero(g->accum, m->num_params * sizeof(float));
        g->accum_dirty = false;
    }
    return st;
}

dt_status optim_grad_shards_backward(optim_grad_shards *g, float dloss, bool sync)
{
    if (g->st != DT_OK)
        return g->st;
    g->collecting = !sync && g->ro.on && g->accum_dirty;
    dt_status st = !sync && !g->collecting ? accumulate_locally(g, dloss)
                                           : pooled_backward(g, dloss);
    g->ro.micro++;
    if (st != DT_OK && g->st == DT_OK) {
        g->st = st;
        snprintf(g->err, sizeof g->err, "zero2: %s", dt_model_error(g->m));
    }
    return g->st;
}

dt_status optim_grad_shards_wait(optim_grad_shards *g, double *busy_s, double *exposed_s, int *ops)
{
    if (g->st == DT_OK && g->next != g->nb)
        gs_fail(g, DT_EPROTO, "step: backward did not finish every gradient bucket");
    for (int i = 0; i < POOL; i++)
        release_buffer(g, i);
    if (g->st == DT_OK)
        optim_rank_order_divide(&g->ro, g->shard, g->my_n, g->world);
    *busy_s += g->clock.busy_s;
    *exposed_s += g->clock.exposed_s;
    *ops += g->clock.ops;
    g->clock.busy_s = g->clock.exposed_s = 0;
    g->clock.ops = 0;
    g->next = 0;
    return g->st;
}

dt_status optim_grad_shards_bf16(optim_grad_shards *g)
{
    char err[160];
    dt_status st = optim_grad_comm_enable(&g->gc, g->m, g->comm, POOL * g->max_bucket, err,
                                          sizeof err);
    return st == DT_OK ? DT_OK : gs_fail(g, st, err);
}

dt_status optim_grad_shards_deterministic(optim_grad_shards *g)
{
    char err[160];
    dt_status st = optim_rank_order_enable(&g->ro, g->m, err, sizeof err);
    return st == DT_OK ? DT_OK : gs_fail(g, st, err);
}
