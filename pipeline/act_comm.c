/*
 * act_comm.c — a stage's activations and their gradients on the wire in
 * bf16 (`minigpt --act-comm bf16`, dt_pipe_set_act_comm_bf16).
 *
 * What crosses a stage boundary is the residual stream, fp32 in the model
 * (also in bf16 compute: model/precision.c). Rounded to bf16 on the way
 * (round to nearest, ties to even: the collectives' dt_f32_to_bf16_n)
 * it takes half the bytes; the receiver widens it back into the fp32
 * tensor its stage reads, exactly (a bf16 value is an fp32 value). The
 * stream is then rounded at each boundary, which one process never does:
 * a run no longer matches one process's bits, but every replica of a
 * stage rounds the same values the same way, so replicas stay identical
 * and a resumed run ends as the uninterrupted one.
 *
 * Buffers: the executor sends a slot's tensor while the stage computes
 * and receives into a slot ahead of its use (executor.c), so each slot of
 * each kind (activations by activation slot, gradients by gradient slot)
 * has its own send and its own receive buffer of B·T·C halves, allocated
 * on the first step and kept: 4 B·T·C·2 bytes per slot pair, against the
 * 4 B·T·C bytes per slot of the fp32 tensors themselves. A send buffer is
 * reused only after its send is waited, as the slot itself is.
 *
 * Cost per transfer: one rounding pass before the send, one widening pass
 * after the receive, both memory-bound beside a block's matmuls.
 */
#include <stdlib.h>

#include "pipe_internal.h"

void dt_act_wire_free(dt_act_wire *w)
{
    for (int k = 0; k < 2; k++)
        for (int d = 0; d < 2; d++) {
            free(w->buf[k][d]);
            w->buf[k][d] = NULL;
        }
    w->per_slot = 0;
}

dt_status dt_act_wire_reserve(dt_act_wire *w, size_t count, const int slots[2])
{
    if (count <= w->per_slot)
        return DT_OK;
    dt_act_wire_free(w);
    for (int k = 0; k < 2; k++)
        for (int d = 0; d < 2; d++)
            if (!(w->buf[k][d] = malloc(count * (size_t)slots[k] * sizeof(uint16_t)))) {
                dt_act_wire_free(w);
                return DT_ENOMEM;
            }
    w->per_slot = count;
    return DT_OK;
}

const uint16_t *dt_act_wire_pack(dt_act_wire *w, int kind, int slot, const float *src, size_t count)
{
    uint16_t *dst = w->buf[kind][0] + (size_t)slot * w->per_slot;
    dt_f32_to_bf16_n(dst, src, count);
    return dst;
}

uint16_t *dt_act_wire_inbox(dt_act_wire *w, int kind, int slot)
{
    return w->buf[kind][1] + (size_t)slot * w->per_slot;
}

void dt_act_wire_unpack(dt_act_wire *w, int kind, int slot, float *dst, size_t count)
{
    dt_bf16_to_f32_n(dst, dt_act_wire_inbox(w, kind, slot), count);
}
