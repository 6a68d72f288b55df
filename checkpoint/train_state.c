/*
 * train_state.c — a live model and its optimizer, seen as a checkpoint
 * state: pointers into their memory, no copies.
 *
 * Under DDP the state is the model's full replica and its AdamW moments
 * (allocated here, zero, if no step has run yet, exactly as the first
 * dt_model_update would); under ZeRO-1, the replica plus this rank's
 * master/m/v shard. A pipeline stage holds only its range of the flat
 * buffer (held_lo, held_n), and so do its optimizer arrays. ZeRO-3, whose
 * model has no whole buffer, holds its shard: the parameters it saves
 * and loads are its master, [opt_lo, opt_lo + opt_n), so a checkpoint
 * streams from and into the shard with no whole-model copy (ZeRO-1's
 * files, byte for byte). Saving reads through these pointers and loading writes
 * through them, so after a load the model and the optimizer are the saved
 * ones with nothing to copy back. Host memory: the CPU backend's.
 */
#include "ckpt_internal.h"
#include "dt_ckpt_train.h"

dt_status dt_ckpt_state_of(dt_ckpt_state *s, dt_model *m, dt_zero1 *z, int rank, int world)
{
    size_t full = dt_config_num_params(&m->cfg);
    *s = (dt_ckpt_state){.cfg = m->cfg,
                         .rank = rank,
                         .world = world,
                         .num_params = full,
                         .params = m->params_memory,
                         .held_lo = m->param_lo,
                         .held_n = m->num_params == full ? 0 : m->num_params};
    if (z) {
        s->mode = DT_CKPT_ZERO1;
        dt_zero1_shard(z, &s->opt_lo, &s->opt_n);
        s->opt_lo += m->param_lo;
        dt_zero1_state(z, &s->master, &s->adam_m, &s->adam_v);
        if (!m->params_memory && s->opt_n > 0) { /* ZeRO-3, not held: the shard is all */
            s->params = s->master;
            s->held_lo = s->opt_lo;
            s->held_n = s->opt_n;
        }
        return DT_OK;
    }
    s->mode = DT_CKPT_DDP;
    if (!m->adam_m) {
        size_t bytes = m->num_params * sizeof(float);
        m->adam_m = m->be->alloc(bytes);
        m->adam_v = m->be->alloc(bytes);
        if (!m->adam_m || !m->adam_v)
            return DT_ENOMEM;
    }
    s->opt_lo = m->param_lo;
    s->opt_n = m->num_params;
    s->adam_m = m->adam_m;
    s->adam_v = m->adam_v;
    return DT_OK;
}
