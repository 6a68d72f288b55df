/*
 * tp_block.c — one transformer block on a tensor-parallel share, forward
 * and backward, with Megatron's f and g operators.
 *
 * Attention: every rank normalises the whole residual (LN1, replicated),
 * then f (identity) hands it to the column-parallel qkv matmul, which
 * yields only this rank's heads: q, k, v of H/tp heads, (N, 3C/tp). The
 * attention kernel runs on them as on a model of C/tp channels and H/tp
 * heads (the head size stays C/H). The row-parallel output projection
 * multiplies this rank's (N, C/tp) slice of the attention output by its
 * (C, C/tp) columns of attn.proj.weight: a partial (N, C) sum, which g
 * all-reduces. The MLP is the same shape: f, column-parallel fc with its
 * bias split (N, 4C/tp), GELU on the slice, row-parallel proj, g, and the
 * replicated proj bias added once, after the sum.
 *
 * Backward is the mirror: g's backward is the identity (the gradient of
 * the sum is already whole on every rank), f's backward all-reduces the
 * partial input gradients of the column-parallel matmul, before the
 * replicated LayerNorm backward adds them into the residual stream.
 *
 * Cost per block: 2 all-reduces of (N, C) floats forward, 2 backward;
 * compute 1/tp of the block's matmuls and attention, all of its
 * LayerNorms and residual adds.
 */
#include <stddef.h>

#include "tp_internal.h"

/* out (N, C) += bias (C): the replicated bias of a row-parallel matmul,
 * added after g's sum so it counts once. */
static void add_bias(float *out, const float *bias, int N, int C)
{
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            out[(size_t)n * C + c] += bias[c];
}

/* In bf16 (tp_precision.c) w is the rounded copy and every output but
 * the residual stream's is rounded as written: a row-parallel output once,
 * after g's fp32 sum (and the MLP's bias), as the whole model rounds it
 * after its sgemm. */
dt_status tp_block_forward(dt_tp_model *m, int l, const float *residual, int B, int T)
{
    const dt_backend *be = m->be;
    int C = m->cfg.C, N = B * T, Cl = C / m->tp, Hl = m->cfg.H / m->tp, Fl = 4 * C / m->tp;
    size_t NC = (size_t)N * C, NF = (size_t)N * Fl;
    dt_block_params *w = &m->compute.blocks[l];
    dt_block_acts *x = &m->acts.blocks[l];
    be->layernorm_forward(x->ln1, x->ln1_mean, x->ln1_rstd, residual, w->ln1w, w->ln1b, N, C);
    tp_round_acts(m, x->ln1, NC);
    be->matmul_forward(x->qkv, x->ln1, w->qkvw, NULL, N, C, 3 * Cl); /* f, column-parallel */
    tp_round_acts(m, x->qkv, 3 * (size_t)N * Cl);
    be->attention_forward(x->atty, x->att, x->qkv, B, T, Cl, Hl);
    tp_round_acts(m, x->atty, (size_t)N * Cl);
    tp_round_acts(m, x->att, (size_t)B * Hl * T * T);
    be->matmul_forward(x->attproj, x->atty, w->attprojw, NULL, N, Cl, C);      /* row-parallel */
    dt_status st = tp_allreduce(m, x->attproj, NC, DT_SUM, DT_TP_ATTN_OUT, l); /* g */
    if (st != DT_OK)
        return st;
    tp_round_acts(m, x->attproj, NC);
    be->residual_forward(x->residual2, residual, x->attproj, NC);
    be->layernorm_forward(x->ln2, x->ln2_mean, x->ln2_rstd, x->residual2, w->ln2w, w->ln2b, N, C);
    tp_round_acts(m, x->ln2, NC);
    be->matmul_forward(x->fch, x->ln2, w->fcw, w->fcb, N, C, Fl); /* f, column-parallel */
    tp_round_acts(m, x->fch, NF);
    be->gelu_forward(x->fch_gelu, x->fch, NF);
    tp_round_acts(m, x->fch_gelu, NF);
    be->matmul_forward(x->fcproj, x->fch_gelu, w->fcprojw, NULL, N, Fl, C);       /* row-parallel */
    if ((st = tp_allreduce(m, x->fcproj, NC, DT_SUM, DT_TP_MLP_OUT, l)) != DT_OK) /* g */
        return st;
    add_bias(x->fcproj, w->fcprojb, N, C);
    tp_round_acts(m, x->fcproj, NC);
    be->residual_forward(x->residual3, x->residual2, x->fcproj, NC);
    tp_store_pack(m, l, B, T);
    return DT_OK;
}

dt_status tp_block_backward(dt_tp_model *m, int l, const float *dres3, const float *residual_in,
                            float *dresidual_in)
{
    const dt_backend *be = m->be;
    int B = m->last_B, T = m->last_T, N = B * T;
    int C = m->cfg.C, Cl = C / m->tp, Hl = m->cfg.H / m->tp, Fl = 4 * C / m->tp;
    size_t NC = (size_t)N * C;
    dt_block_params *w = &m->compute.blocks[l], *dw = &m->grads.blocks[l];
    dt_block_acts *x = &m->acts.blocks[l], *dx = &m->grad_acts.blocks[l];
    tp_store_unpack(m, l, B, T); /* bf16: the block's tensors back into the workspace */
    /* g backward: identity; the bias's gradient is dres3's column sum */
    be->matmul_backward(dx->fch_gelu, dw->fcprojw, dw->fcprojb, dres3, x->fch_gelu, w->fcprojw, N,
                        Fl, C);
    be->gelu_backward(dx->fch, dx->fch_gelu, x->fch, (size_t)N * Fl);
    be->matmul_backward(dx->ln2, dw->fcw, dw->fcb, dx->fch, x->ln2, w->fcw, N, C, Fl);
    dt_status st = tp_allreduce(m, dx->ln2, NC, DT_SUM, DT_TP_MLP_GRAD, l); /* f */
    if (st != DT_OK)
        return st;
    be->copy(dx->residual2, dres3, NC * sizeof(float));
    be->layernorm_backward(dx->residual2, dw->ln2w, dw->ln2b, dx->ln2, x->residual2, w->ln2w,
                           x->ln2_mean, x->ln2_rstd, N, C);
    be->matmul_backward(dx->atty, dw->attprojw, NULL, dx->residual2, x->atty, w->attprojw, N, Cl,
                        C);
    be->attention_backward(dx->qkv, m->grad_acts.scratch, dx->atty, x->qkv, x->att, B, T, Cl, Hl);
    be->matmul_backward(dx->ln1, dw->qkvw, NULL, dx->qkv, x->ln1, w->qkvw, N, C, 3 * Cl);
    if ((st = tp_allreduce(m, dx->ln1, NC, DT_SUM, DT_TP_ATTN_GRAD, l)) != DT_OK)
        return st; /* f */
    be->copy(dresidual_in, dx->residual2, NC * sizeof(float));
    be->layernorm_backward(dresidual_in, dw->ln1w, dw->ln1b, dx->ln1, residual_in, w->ln1w,
                           x->ln1_mean, x->ln1_rstd, N, C);
    return DT_OK;
}
