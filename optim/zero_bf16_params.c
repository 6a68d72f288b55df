/*
 * zero_bf16_params.c — ZeRO-1 and ZeRO-2's parameter all-gather in bf16,
 * for a model that computes in bf16 (model/precision.c): the owner
 * rounds its updated fp32 master to bf16, the allgatherv moves bf16 (2
 * bytes an element, half of fp32's; bytes copied, nothing summed, so the
 * collective rounds nothing), and every rank, the owner too, widens what
 * arrived into the model's parameter buffer. Every replica then holds the
 * same rounded values, which are what the model reads anyway: it rounds
 * every parameter on use, so a gathered value and an fp32 master rounded
 * on use (DDP) give the same bits. ZeRO-3's units do the same in
 * param_units.c.
 *
 * The master is the state: AdamW updates it, checkpoints save and load it
 * and the replica check hashes it. ZeRO-1 always keeps one; ZeRO-2 keeps
 * one only here (4·s bytes: the 12Ψ/N of mixed precision's accounting),
 * since its parameters no longer hold the master's bits. A checkpoint
 * takes its parameters from the replica, so before a save the trainer
 * all-gathers the fp32 masters exactly into every replica
 * (dt_zero1_masters_to_params, zero_replicas.c): the file holds fp32
 * masters, as an fp32 run's does, a load puts them back into every slice,
 * and --verify-resume finds in memory what it reloads. dt_zero1_state
 * also copies this rank's master over its own slice, so that a caller
 * that saves without that gather still saves masters (the other replicas
 * then hold its rounding: the same values to a model that rounds on use).
 * The replica check (zero_replicas.c) compares the replicas rounded, then
 * the masters gathered exactly, whose hash DDP's fp32 replica gives.

 * No bf16 copy of the whole model is kept: a piece arrives as bf16 in the
 * first half of its own fp32 range of the parameter buffer and is widened
 * there in place, from the back, in chunks whose fp32 destination lies
 * past their bf16 source ([lo, hi) with hi <= 2·lo: source bytes
 * [2lo, 2hi), destination [4lo, 4hi)), halving down to the first element.
 * Until its gather is waited a piece's parameters are not readable;
 * forward waits for each piece before it reads it (zero1.c's hook).
 *
 * Cost: a rounding pass over the shard, a widening pass over Ψ; 2·s bytes
 * of send buffer; half the parameter bytes on the wire.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim_internal.h"

dt_status optim_zero_bf16_enable(dt_zero1 *z)
{
    z->param_bf16 = z->m->bf16 && z->world > 1 && !z->pu;
    if (z->param_bf16 && !(z->send16 = malloc((z->s ? z->s : 1) * sizeof *z->send16)))
        return DT_ENOMEM;
    return DT_OK;
}

void optim_zero_bf16_free(dt_zero1 *z)
{
    free(z->send16);
    z->send16 = NULL;
}

size_t optim_zero_bf16_bytes(const dt_zero1 *z)
{
    return z->param_bf16 ? z->s * sizeof *z->send16 : 0;
}

void optim_zero_bf16_round_shard(dt_zero1 *z)
{
    if (z->param_bf16)
        dt_f32_to_bf16_n(z->send16, z->master, z->n);
}

void optim_zero_bf16_op(const dt_zero1 *z, const optim_zero_piece *g, dt_op *op)
{
    if (!z->param_bf16)
        return;
    size_t from = g->lo > z->lo ? g->lo - z->lo : 0;
    op->send = g->counts[z->rank] ? z->send16 + from : z->send16;
    op->recv = z->m->params_memory + g->lo; /* the first half of the piece's range */
    op->dtype = DT_BF16;
}

void optim_zero_bf16_widen(const dt_zero1 *z, const optim_zero_piece *g)
{
    if (!z->param_bf16)
        return;
    float *x = z->m->params_memory + g->lo;
    const uint16_t *h = (const uint16_t *)(const void *)x;
    size_t hi = g->n;
    while (hi > 1) {
        size_t lo = (hi + 1) / 2; /* hi <= 2·lo: no overlap */
        dt_bf16_to_f32_n(x + lo, h + lo, hi - lo);
        hi = lo;
    }
    if (hi == 1) {
        uint16_t first;
        memcpy(&first, x, sizeof first);
        dt_bf16_to_f32_n(x, &first, 1);
    }
}

void optim_zero_bf16_master_in_params(dt_zero1 *z)
{
    if (z->param_bf16 && z->n > 0 && z->m->params_memory)
        z->m->be->copy(z->m->params_memory + z->lo, z->master, z->n * sizeof(float));
}

void optim_zero_bf16_round_params(dt_zero1 *z)
{
    if (z->param_bf16) /* the model's own rounding, in place */
        dt_bf16_round_floats(z->m->params_memory, z->m->params_memory, z->m->num_params);
}

dt_status optim_zero_bf16_gather_masters(dt_zero1 *z)
{
    if (!z->param_bf16)
        return DT_OK;
    dt_op op = {.kind = DT_OP_ALLGATHERV, /* from the master: no send inside recv */
                .send = z->master,
                .recv = z->m->params_memory,
                .counts = z->counts,
                .dtype = DT_F32};
    dt_work *w = NULL;
    dt_status st = dt_submit(z->comm, &op, &w);
    return st == DT_OK ? dt_work_wait(w) : st;
}
