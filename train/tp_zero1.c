/*
 * tp_zero1.c — minigpt --tp T --dp D [--pp P] --parallel zero1: ZeRO-1 on
 * the dp axis of a tensor-parallel run.
 *
 * The D ranks holding the same range of S parameters (share t, or in a 3-D
 * run stage s's contiguous part of share t: one rank per replica, the dp
 * group) hold the same parameters and, under DDP, the same AdamW moments:
 * 2S floats of optimizer state each, D times over. ZeRO-1 cuts the range
 * over them as
 * the checkpoint cuts it (dt_ckpt_partition: replica q owns [q·c, q·c + n),
 * c = ceil(S/D)): a rank keeps m, v and an fp32 master copy of its piece
 * only, so the optimizer state per rank is 3n floats instead of 2S
 * (D = 2: 3/4 of DDP's; m and v alone halve). A step:
 *
 *   reduce-scatter (mean) of the share's gradients over the dp group:
 *     each rank receives its piece of the replicas' mean
 *   AdamW on the piece (master, m, v), the piece copied into the share
 *   all-gather of the pieces over the dp group: the whole share again
 *
 * which moves what DDP's all-reduce moves (a ring all-reduce is a
 * reduce-scatter and an all-gather) but with the update split D ways.
 * On 2 replicas the mean of two gradients is the same bits in any order
 * (a + b = b + a), and AdamW is elementwise, so every parameter is bitwise
 * DDP's (the ckpt_tp and ckpt_3d suites check it). Buffers are padded to D·c floats
 * (the collectives move equal counts); copies of S floats per step.
 */
#include <stdlib.h>
#include <string.h>

#include "dt_clock.h"
#include "trainer.h"

struct mg_tp_zero1 {
    dt_tp_model *model; /* the range's parameters and gradients */
    size_t share_lo;    /* where the range starts in the tp rank's share */
    size_t S, lo, n, c; /* range, this rank's piece [lo, lo + n) of it, padded piece c */
    float *master, *m, *v;
    float *grads; /* (D·c) the share's gradients, padded */
    float *piece; /* (c) this rank's piece: mean gradient, then the sent parameters */
    float *all;   /* (D·c) the all-gathered pieces */
};

static dt_status z_fail(mg_run *r, dt_status st, const char *what, const char *detail)
{
    snprintf(r->err, sizeof r->err, "rank %d: tp zero1: %s: %s", r->rank, what,
             detail && *detail ? detail : dt_status_name(st));
    return st;
}

dt_status mg_tp_zero1_open(mg_run *r, dt_tp_model *m, size_t share_lo)
{
    mg_tp_zero1 *z = calloc(1, sizeof *z);
    if (!(r->tpz = z))
        return z_fail(r, DT_ENOMEM, "open", "out of memory");
    size_t D = (size_t)r->dp;
    z->model = m;
    z->share_lo = share_lo;
    z->S = m->num_params;
    z->c = (z->S + D - 1) / D;
    dt_ckpt_partition(z->S, r->dp, r->replica, &z->lo, &z->n);
    z->master = calloc(z->c, sizeof(float));
    z->m = calloc(z->c, sizeof(float));
    z->v = calloc(z->c, sizeof(float));
    z->grads = calloc(D * z->c, sizeof(float));
    z->piece = calloc(z->c, sizeof(float));
    z->all = calloc(D * z->c, sizeof(float));
    if (!z->master || !z->m || !z->v || !z->grads || !z->piece || !z->all)
        return z_fail(r, DT_ENOMEM, "open", "out of memory");
    memcpy(z->master, m->params_memory + z->lo, z->n * sizeof(float));
    if (r->rank == 0)
        printf("tp zero1: AdamW state per rank: m, v and master of %zu of the %s's %zu "
               "parameters, %zu bytes (DDP: m and v of all %zu, %zu bytes)\n",
               z->n, r->three_d ? "stage range" : "share", z->S, 3 * z->n * sizeof(float), z->S,
               2 * z->S * sizeof(float));
    return DT_OK;
}

void mg_tp_zero1_close(mg_run *r)
{
    mg_tp_zero1 *z = r->tpz;
    if (!z)
        return;
    free(z->master);
    free(z->m);
    free(z->v);
    free(z->grads);
    free(z->piece);
    free(z->all);
    free(z);
    r->tpz = NULL;
}

void mg_tp_zero1_state(mg_run *r, dt_ckpt_state *s)
{
    mg_tp_zero1 *z = r->tpz;
    size_t skip; /* the piece less any vocabulary padding (tp_share.c) */
    dt_ckpt_tp_range(&r->o.cfg, z->model->tp, z->model->rank, z->share_lo + z->lo, z->n, &s->opt_lo,
                     &skip, &s->opt_n);
    s->mode = DT_CKPT_ZERO1;
    s->master = z->master + skip;
    s->adam_m = z->m + skip;
    s->adam_v = z->v + skip;
}

/* A collective of the dp group, traced as the share's dp traffic. */
static dt_status dp_op(mg_run *r, bool scatter)
{
    mg_tp_zero1 *z = r->tpz;
    dt_traffic a, b;
    dt_comm_traffic(r->tp_dp_comm, &a);
    double t0 = dt_now();
    dt_status st = scatter
                       ? dt_reduce_scatter(r->tp_dp_comm, z->grads, z->piece, z->c, DT_F32, DT_AVG)
                       : dt_allgather(r->tp_dp_comm, z->piece, z->all, z->c, DT_F32);
    dt_comm_traffic(r->tp_dp_comm, &b);
    if (st == DT_OK)
        mg_trace_add_comm(r->trace, scatter ? MG_EV_TP_DP_SCATTER : MG_EV_TP_DP_GATHER, -1, -1,
                          (size_t)r->dp * z->c * sizeof(float), b.sent_bytes - a.sent_bytes, t0,
                          dt_now());
    return st;
}

dt_status mg_tp_zero1_step(mg_run *r, int step, float *loss)
{
    mg_tp_zero1 *z = r->tpz;
    dt_tp_model *m = z->model;
    memcpy(z->grads, m->grads_memory, z->S * sizeof(float)); /* the padding stays 0 */
    dt_status st = dp_op(r, true);
    if (st == DT_OK && loss)
        st = dt_allreduce(r->tp_dp_comm, loss, 1, DT_F32, DT_AVG);
    if (st != DT_OK)
        return z_fail(r, st, "gradient reduce-scatter", dt_comm_error(r->tp_dp_comm));
    double tu = dt_now();
    m->be->adamw(z->master, z->piece, z->m, z->v, z->n, step + 1, &r->h);
    mg_trace_add(r->trace, MG_EV_OPTIMIZER, -1, tu, dt_now());
    memcpy(z->piece, z->master, z->n * sizeof(float));
    if ((st = dp_op(r, false)) != DT_OK)
        return z_fail(r, st, "parameter all-gather", dt_comm_error(r->tp_dp_comm));
    for (int q = 0; q < r->dp; q++) { /* piece q of the share from rank q's c floats */
        size_t lo, n;
        dt_ckpt_partition(z->S, r->dp, q, &lo, &n);
        memcpy(m->params_memory + lo, z->all + (size_t)q * z->c, n * sizeof(float));
    }
    return DT_OK;
}
