/*
 * tp_checkpoint.c — minigpt --tp T [--dp D]'s checkpoints: what a rank of
 * a tensor-parallel run saves and loads.
 *
 * A tp rank's state is its share (dt_tp_model: parameters and AdamW m, v,
 * S elements each, host memory) and the checkpoint's flat buffer is the T
 * shares end to end (checkpoint/tp_share.c), so rank replica·T + t holds
 * share t's range of it, as a pipeline stage holds its range: all S of
 * the share but its vocabulary padding (dt_ckpt_tp_range), which is never
 * saved and stays the zeros it was made. Of that
 * range it saves the piece of its replica (dt_ckpt_tp_slices: share t cut
 * over the D replicas), so the T·D ranks write 1/(T·D) of the checkpoint
 * each and nothing is gathered; the manifest says "tp": T. Loading is the
 * checkpoint layer's collective load into the same share: every rank reads
 * its S elements from the pieces its replicas wrote, any D; another T is
 * refused by the load, naming the manifest (reshard with
 * dtrain-ckpt reshard --tp first).
 *
 * After a resume the assembled copy r->m (evaluation, sampling, the
 * replica check) is rebuilt from the loaded shares: one all-gather of the
 * tp group, the one a step ends with. Cost of a save: (S + 2S)·4 bytes
 * per tp group and replica set, spread over all ranks; the replicated
 * tensors are stored once per share (T - 1 extra copies of them).
 * Under --parallel zero1 a rank's optimizer state is exactly the piece it
 * saves (master, m, v), so the slices are its ZeRO-1 shard.
 */
#include <stdlib.h>

#include "trainer.h"

/* The layout of this run's checkpoints, made the first time it is asked. */
static dt_status layout(mg_run *r)
{
    if (r->ckpt_slices)
        return DT_OK;
    r->ckpt_slices = malloc(((size_t)r->world + 1) * sizeof *r->ckpt_slices);
    r->ckpt_order = malloc((size_t)r->world * sizeof *r->ckpt_order);
    if (!r->ckpt_slices || !r->ckpt_order)
        return DT_ENOMEM;
    dt_ckpt_tp_slices(r->ckpt_slices, r->ckpt_order, &r->o.cfg, r->tp->tp, r->dp);
    return DT_OK;
}

dt_status mg_tp_moments(dt_tp_model *m)
{
    size_t bytes = m->num_params * sizeof(float);
    if (m->adam_m) /* before the first step: zero, as dt_tp_update makes them */
        return DT_OK;
    m->adam_m = m->be->alloc(bytes);
    m->adam_v = m->be->alloc(bytes);
    if (!m->adam_m || !m->adam_v)
        return DT_ENOMEM;
    m->be->zero(m->adam_m, bytes);
    m->be->zero(m->adam_v, bytes);
    return DT_OK;
}

dt_status mg_tp_ckpt_state(mg_run *r, dt_ckpt_state *s)
{
    dt_tp_model *m = r->tp;
    size_t lo, skip, n; /* the share less its vocabulary padding */
    dt_ckpt_tp_range(&r->o.cfg, m->tp, m->rank, 0, m->num_params, &lo, &skip, &n);
    if (layout(r) != DT_OK || (!r->tpz && mg_tp_moments(m) != DT_OK))
        return DT_ENOMEM;
    *s = (dt_ckpt_state){.cfg = r->o.cfg,
                         .mode = DT_CKPT_DDP,
                         .rank = r->rank,
                         .world = r->world,
                         .tp = m->tp,
                         .num_params = dt_ckpt_flat_params(&r->o.cfg, m->tp),
                         .params = m->params_memory + skip,
                         .held_lo = lo,
                         .held_n = n,
                         .slices = r->ckpt_slices,
                         .slice_order = r->ckpt_order,
                         .opt_lo = lo,
                         .opt_n = n,
                         .adam_m = m->adam_m + skip,
                         .adam_v = m->adam_v + skip};
    if (r->tpz) /* ZeRO-1: the optimizer's piece of the share (tp_zero1.c) */
        mg_tp_zero1_state(r, s);
    return DT_OK;
}

void mg_tp_ckpt_free(mg_run *r)
{
    free(r->ckpt_slices);
    free(r->ckpt_order);
    r->ckpt_slices = NULL;
    r->ckpt_order = NULL;
}
