/*
 * three_d_checkpoint.c — minigpt --dp D --tp T --pp P's checkpoints: what
 * a rank of a 3-D run saves and loads.
 *
 * A rank's state is its tp rank's share of its stage (dt_tp_stage: the
 * range [lo, hi) of the share, parameters and AdamW m, v, host memory).
 * The checkpoint's flat buffer is a tp checkpoint's (the T shares end to
 * end, "tp": T in the manifest, nothing else new), so rank (stage s,
 * replica q, tp rank t) holds [t·S + lo, t·S + hi) of it and saves its
 * replica's piece of that range (dt_ckpt_grid_slices): the D·T·P ranks
 * write about 1/(D·T·P) of the checkpoint each and nothing is gathered.
 * Loading is the checkpoint layer's collective load into the same range:
 * any D and any P of the same T read their ranges from whatever pieces
 * were written; another T is refused by the load, naming the manifest and
 * the dtrain-ckpt reshard to run.
 *
 * After a resume the assembled copy r->m (evaluation, sampling, the
 * replica check) is rebuilt from the loaded ranges: mg_3d_assemble's two
 * all-gathers, which a save does not need. Cost of a save: (S + 2S)·4
 * bytes per share and replica set, spread over all ranks; the replicated
 * tensors are stored once per share, as in a tp checkpoint. Under
 * --parallel zero1 the saved piece is the rank's optimizer shard (master,
 * m, v: tp_zero1.c), so its state is saved and loaded where it lies.
 *
 * This file stands below three_d.c: three_d.c calls the layout at open,
 * and the caller of mg_3d_ckpt_state hands it the stage (mg_3d_stage), so
 * nothing here calls back up.
 */
#include <stdlib.h>

#include "dt_tp_stage.h"
#include "trainer.h"

dt_status mg_3d_ckpt_layout(mg_run *r, const int *blocks)
{
    r->ckpt_slices = malloc(((size_t)r->world + 1) * sizeof *r->ckpt_slices);
    r->ckpt_order = malloc((size_t)r->world * sizeof *r->ckpt_order);
    if (!r->ckpt_slices || !r->ckpt_order)
        return DT_ENOMEM;
    return dt_ckpt_grid_slices(r->ckpt_slices, r->ckpt_order, &r->o.cfg, r->o.tp, r->o.pp, r->dp,
                               blocks);
}

dt_status mg_3d_ckpt_state(mg_run *r, dt_tp_stage *st, dt_ckpt_state *s)
{
    dt_tp_model *m = &st->core;
    size_t lo, skip, n; /* the stage's range of the share less its padding */
    dt_ckpt_tp_range(&r->o.cfg, m->tp, m->rank, st->lo, m->num_params, &lo, &skip, &n);
    dt_status rc = r->tpz ? DT_OK : mg_tp_moments(m);
    if (rc != DT_OK)
        return rc;
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
    if (r->tpz) /* ZeRO-1: the optimizer's piece of the range (tp_zero1.c) */
        mg_tp_zero1_state(r, s);
    return DT_OK;
}
