/*
 * grad_comm.c — gradients reduced in bf16 (minigpt --grad-comm bf16), the
 * precision of the wire apart from the precision of training: PyTorch
 * DDP's bf16 compression hook, for DDP's buckets and ZeRO's pieces.
 *
 * The idea. Training stays fp32 (gradients, master weights, AdamW state);
 * only the copy that travels is bf16. Just before a range of gradients
 * leaves, it is rounded to bf16 (nearest even) into a buffer of this
 * file, and the collective runs on that buffer as DT_BF16; once it is
 * done, the result is widened back (exactly) into the fp32 gradients, on
 * every rank (DDP) or on the owner of the piece (ZeRO). The collectives
 * add bf16 sums in f32 and round once (collectives/algorithms/
 * rank_order.c), so each element of the mean gradient is
 *
 *   RNE_bf16(fl32(RNE_bf16(g0) + ... + RNE_bf16(g(p-1))) / p)
 *
 * two roundings to bf16 (the contributions, the result) instead of the
 * ring's p. Every rank receives the same bytes (the all-gather copies the
 * owner's), so replicas stay bitwise identical; a checkpoint keeps the
 * fp32 state, so a resumed run rounds the same values the same way.
 *
 * Cost: half the gradient bytes on the wire; one pass over the range to
 * round it and one to widen it back; memory 2 bytes per element the
 * caller sizes the buffer for (Ψ for DDP and ZeRO-1, the bucket pool for
 * ZeRO-2 and 3).
 *
 * Off by default, and off for a world of one (nothing is sent, so
 * nothing is rounded). Host memory only: the CPU backends, not CUDA's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim_internal.h"

dt_status optim_grad_comm_enable(optim_grad_comm *gc, const dt_model *m, const dt_comm *comm,
                                 size_t n, char *err, size_t errlen)
{
    if (strncmp(m->be->name, "cuda", 4) == 0) {
        snprintf(err, errlen,
                 "bf16 gradients are converted on host memory: the %s backend is not supported",
                 m->be->name);
        return DT_EINVAL;
    }
    if (!comm || dt_comm_size(comm) < 2 || gc->on)
        return DT_OK;
    if (!(gc->buf = malloc((n ? n : 1) * sizeof *gc->buf))) {
        snprintf(err, errlen, "out of memory for the bf16 gradient buffer (%zu B)",
                 n * sizeof *gc->buf);
        return DT_ENOMEM;
    }
    gc->n = n;
    gc->on = true;
    return DT_OK;
}

void optim_grad_comm_free(optim_grad_comm *gc)
{
    free(gc->buf);
    *gc = (optim_grad_comm){0};
}

void optim_grad_comm_pack(const optim_grad_comm *gc, dt_op *op, size_t at)
{
    if (!gc->on)
        return;
    uint16_t *wire = gc->buf + at;
    dt_f32_to_bf16_n(wire, op->recv, op->count);
    op->recv = wire;
    op->dtype = DT_BF16;
}

void optim_grad_comm_unpack(const optim_grad_comm *gc, float *g, size_t at, size_t n)
{
    if (gc->on)
        dt_bf16_to_f32_n(g, gc->buf + at, n);
}
