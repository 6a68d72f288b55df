/*
 * stage.c — a model as one pipeline stage: selecting the activation sets
 * a micro-batch uses, and the four tensors a stage exchanges with its
 * neighbours.
 *
 * A stage keeps several micro-batches in flight (between a forward and
 * the end of its backward), each in its own activation set ("slot"); the
 * pipeline executor picks the slot before each forward and backward. The
 * model's "current" fields (last_B, last_T, have_targets, mean_loss) always
 * describe the selected slot: selecting saves them into the old slot and
 * loads the new one's, so the one-batch API (forward, backward) works
 * unchanged on whichever micro-batch is selected.
 *
 * The exchanged tensors are (B, T, C) views into the selected sets, so a
 * stage receives straight into the memory forward or backward reads, and
 * sends straight from where they wrote: no copies.
 */
#include <stdio.h>

#include "model_internal.h"

dt_status dt_model_select(dt_model *m, int slot, int grad_slot)
{
    if (slot < 0 || slot >= m->act_slots || grad_slot < 0 || grad_slot >= m->grad_slots) {
        snprintf(m->err, sizeof m->err,
                 "minigpt: select: slot %d / gradient slot %d outside the "
                 "stage's %d / %d",
                 slot, grad_slot, m->act_slots, m->grad_slots);
        return DT_EINVAL;
    }
    dt_act_slot *old = &m->slots[m->slot], *s = &m->slots[slot];
    old->B = m->last_B;
    old->T = m->last_T;
    old->have_targets = m->have_targets;
    old->mean_loss = m->mean_loss;
    m->slot = slot;
    m->grad_slot = grad_slot;
    m->last_B = s->B;
    m->last_T = s->T;
    m->have_targets = s->have_targets;
    m->mean_loss = s->mean_loss;
    dt_model_carve(m, s->B > 0 ? s->B : m->max_B, s->B > 0 ? s->T : m->cfg.T);
    return DT_OK;
}

float *dt_model_input(dt_model *m, int B, int T)
{
    dt_model_carve(m, B, T);
    return m->acts.encoded;
}

const float *dt_model_output(const dt_model *m)
{
    return m->acts.blocks[m->l1 - 1].residual3;
}

float *dt_model_output_grad(dt_model *m)
{
    return m->grad_acts.blocks[m->l1 - 1].residual3;
}

const float *dt_model_input_grad(const dt_model *m)
{
    return m->grad_acts.encoded;
}
