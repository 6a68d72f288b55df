/*
 * windows.c — a model whose parameters or gradients live in windows
 * (ZeRO-3's parameter units, optim/param_units.c; ZeRO-2's gradient
 * shards, optim/grad_shards.c): the model's own flat buffer is freed for
 * good, and each call points the tensors lying wholly in [lo, lo + n) of
 * the flat layout at a caller's buffer, every other tensor at nothing
 * (dt_model.h says when the caller maps what). Holding allocates a whole
 * parameter buffer again for what reads the whole model (evaluation,
 * checkpoints). Cost: a walk over the tensor table per call.
 */
#include <stdio.h>

#include "model_internal.h"

void dt_model_window_grads(dt_model *m, float *base, size_t lo, size_t n)
{
    if (!m->grads_windowed) {
        m->be->free(m->grads_memory);
        m->grads_memory = NULL;
        m->grads_windowed = true;
    }
    dt_layout_map_window(&m->grads, m->tensors, m->num_tensors, &m->cfg, m->l0, base, lo,
                         base ? n : 0);
    m->grads_window_n = base ? n : 0;
}

void dt_model_window_params(dt_model *m, float *base, size_t lo, size_t n)
{
    if (!m->params_windowed) {
        m->be->free(m->params_memory);
        m->params_memory = NULL;
        m->params_windowed = true;
    }
    dt_layout_map_window(&m->params, m->tensors, m->num_tensors, &m->cfg, m->l0, base, lo,
                         base ? n : 0);
}

dt_status dt_model_hold_params(dt_model *m, bool hold)
{
    if (!m->params_windowed)
        return DT_OK; /* the full buffer is always there */
    if (hold && !m->params_memory) {
        if (!(m->params_memory = m->be->alloc(m->num_params * sizeof(float)))) {
            snprintf(m->err, sizeof m->err, "minigpt: hold: out of memory for the full parameters");
            return DT_ENOMEM;
        }
    } else if (!hold && m->params_memory) {
        m->be->free(m->params_memory);
        m->params_memory = NULL;
    }
    dt_layout_map_window(&m->params, m->tensors, m->num_tensors, &m->cfg, m->l0, m->params_memory,
                         0, m->params_memory ? m->num_params : 0);
    return DT_OK;
}
