/*
 * zero1.c — ZeRO stage 1: AdamW state sharded over the ranks.
 *
 * The idea (Rajbhandari et al., "ZeRO", 2020, stage 1). Under DDP every
 * rank keeps AdamW's m and v (and, with low-precision weights, an fp32
 * master copy) for every parameter and runs the same update p times over.
 * Instead, rank r owns one 1/p shard of the flat buffer: it needs the mean
 * gradient only on that shard (a reduce-scatter, half an all-reduce), keeps
 * master, m and v only for it, updates it, and then everyone exchanges the
 * updated shards (an all-gather, the other half). Same bytes on the wire as
 * DDP's ring all-reduce; optimizer memory 12Ψ/p instead of 12Ψ.
 *
 *   grads (Ψ) --copy--> grad_pad (p·s, zero tail)
 *   reduce_scatter(avg): grad_pad -> grad_shard (s)        rank r: shard r
 *   AdamW(master, grad_shard, m, v) on the n_r valid elements
 *   allgatherv: master (n_r) -> params (Ψ) on every rank
 *
 * s = ceil(Ψ/p); the padding (p·s - Ψ < p elements) stays zero and is never
 * gathered: allgatherv sends each rank's valid count n_r = clip(Ψ - r·s),
 * so parameters are written straight into the model's flat buffer.
 *
 * Memory: master, m, v: 12·s bytes ("optimizer state"); grad_pad and
 * grad_shard: 4·(p+1)·s bytes of staging. The copy into grad_pad exists
 * because reduce-scatter needs p equal blocks and the model's gradient
 * buffer holds exactly Ψ; it costs one memcpy of 4Ψ bytes per step.
 *
 * The master copy holds the same fp32 values as the parameters it shards
 * (the model is fp32 throughout); it is kept so the shard's update is the
 * textbook one, and reads as the place where low-precision weights would
 * part from their fp32 master.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_optim.h"
#include "optim_internal.h"

struct dt_zero1 {
    dt_model *m;
    dt_comm *comm;    /* NULL: one process */
    int rank, world;
    size_t s;         /* shard size (padded) */
    size_t lo, n;     /* this rank's valid range of the flat buffer */
    size_t *counts;   /* [world]: each rank's valid count, for allgatherv */
    float *grad_pad;  /* (world * s), tail zero */
    float *grad_shard;/* (s) the mean gradient of this rank's shard */
    float *master;    /* (s) fp32 master of the shard */
    float *adam_m, *adam_v; /* (s) */
    dt_status st;
    char err[512];
};

static dt_status zero1_fail(dt_zero1 *z, dt_status st, const char *what)
{
    if (z->st == DT_OK) {
        z->st = st;
        snprintf(z->err, sizeof z->err, "zero1 (rank %d): %s: %s", z->rank,
                 what,
                 z->comm && *dt_comm_error(z->comm) ? dt_comm_error(z->comm)
                                                    : dt_status_name(st));
    }
    return st;
}

/* Valid elements of rank r's shard: [r·s, (r+1)·s) clipped to Ψ. */
static size_t shard_count(size_t num_params, size_t s, int r)
{
    size_t lo = (size_t)r * s;
    if (lo >= num_params)
        return 0;
    return num_params - lo < s ? num_params - lo : s;
}

dt_status dt_zero1_create(dt_zero1 **out, dt_model *m, dt_comm *comm)
{
    dt_zero1 *z = calloc(1, sizeof *z);
    *out = z;
    if (!z)
        return DT_ENOMEM;
    const dt_backend *be = m->be;
    z->m = m;
    z->comm = comm;
    z->rank = comm ? dt_comm_rank(comm) : 0;
    z->world = comm ? dt_comm_size(comm) : 1;
    size_t P = m->num_params, p = (size_t)z->world;
    z->s = (P + p - 1) / p;
    z->lo = (size_t)z->rank * z->s;
    z->n = shard_count(P, z->s, z->rank);
    z->counts = calloc(p, sizeof *z->counts);
    z->grad_pad = be->alloc(p * z->s * sizeof(float));
    z->grad_shard = be->alloc(z->s * sizeof(float));
    z->master = be->alloc(z->s * sizeof(float));
    z->adam_m = be->alloc(z->s * sizeof(float));
    z->adam_v = be->alloc(z->s * sizeof(float));
    if (!z->counts || !z->grad_pad || !z->grad_shard || !z->master ||
        !z->adam_m || !z->adam_v)
        return zero1_fail(z, DT_ENOMEM, "create: out of memory for the shard");
    for (int r = 0; r < z->world; r++)
        z->counts[r] = shard_count(P, z->s, r);
    if (z->world > 1) {
        dt_status st = dt_broadcast(comm, m->params_memory, P, DT_F32, 0);
        if (st != DT_OK)
            return zero1_fail(z, st, "create: broadcast of the parameters");
    }
    if (z->n > 0)
        be->copy(z->master, m->params_memory + z->lo, z->n * sizeof(float));
    return DT_OK;
}

void dt_zero1_destroy(dt_zero1 *z)
{
    if (!z)
        return;
    const dt_backend *be = z->m->be;
    void *dev[] = {z->grad_pad, z->grad_shard, z->master, z->adam_m,
                   z->adam_v};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            be->free(dev[i]);
    free(z->counts);
    free(z);
}

const char *dt_zero1_error(const dt_zero1 *z) { return z->err; }

void dt_zero1_shard(const dt_zero1 *z, size_t *lo, size_t *n)
{
    *lo = z->lo;
    *n = z->n;
}

void dt_zero1_state(dt_zero1 *z, float **master, float **m, float **v)
{
    *master = z->master;
    *m = z->adam_m;
    *v = z->adam_v;
}

size_t dt_zero1_optimizer_bytes(const dt_zero1 *z)
{
    return 3 * z->s * sizeof(float);
}

size_t dt_zero1_staging_bytes(const dt_zero1 *z)
{
    return ((size_t)z->world + 1) * z->s * sizeof(float);
}

dt_status dt_zero1_step(dt_zero1 *z, const dt_adamw_hparams *h, long step,
                        dt_comm_stats *stats)
{
    if (z->st != DT_OK)
        return z->st;
    if (step < 1)
        return zero1_fail(z, DT_EINVAL, "step: AdamW steps count from 1");
    const dt_backend *be = z->m->be;
    dt_model *m = z->m;
    double comm_s = 0, t0;
    if (z->world > 1) {
        be->copy(z->grad_pad, m->grads_memory, m->num_params * sizeof(float));
        t0 = dt_now();
        dt_status st = dt_reduce_scatter(z->comm, z->grad_pad, z->grad_shard,
                                         z->s, DT_F32, DT_AVG);
        comm_s += dt_now() - t0;
        if (st != DT_OK)
            return zero1_fail(z, st, "step: reduce-scatter of the gradients");
    } else {
        be->copy(z->grad_shard, m->grads_memory, z->n * sizeof(float));
    }
    if (z->n > 0)
        be->adamw(z->master, z->grad_shard, z->adam_m, z->adam_v, z->n, step,
                  h);
    if (z->world > 1) {
        t0 = dt_now();
        dt_status st = dt_allgatherv(z->comm, z->master, m->params_memory,
                                     z->counts, DT_F32);
        comm_s += dt_now() - t0;
        if (st != DT_OK)
            return zero1_fail(z, st, "step: all-gather of the parameters");
    } else if (z->n > 0) {
        be->copy(m->params_memory, z->master, z->n * sizeof(float));
    }
    if (stats) {
        /* blocking collectives: all of it is exposed */
        *stats = (dt_comm_stats){.ops = z->world > 1 ? 2 : 0, .hidden = -1};
        if (z->world > 1) {
            stats->comm_ms = stats->exposed_ms = 1e3 * comm_s;
            stats->hidden = 0;
        }
    }
    return DT_OK;
}
