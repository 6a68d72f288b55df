/*
 * backward.c — MiniGPT's backward pass, whole or in two halves.
 *
 * Backward walks forward's list in reverse. Each matmul and LayerNorm has
 * two products: the gradient of its input (which the layer below needs
 * next: the critical path) and the gradient of its weights (which nothing
 * else waits for until the optimizer step). The whole backward computes
 * both layer by layer (DT_BACKWARD_ALL). A zero-bubble pipeline schedule
 * splits them (Qi et al. 2023): DT_BACKWARD_INPUT runs the chain of input
 * gradients down to the stage's input, so it can be sent to the previous
 * stage at once; DT_BACKWARD_WEIGHT later replays the same layers for the
 * weight gradients only, from the activations and activation gradients
 * the input half left in the selected slots. The kernels compute the two
 * products independently (matmul_backward and layernorm_backward take
 * NULL for the half not wanted), so ALL and INPUT + WEIGHT give the same
 * bits. Cost: the halves together cost what ALL costs; WEIGHT keeps the
 * slot's activation gradients alive until it runs.
 *
 * With recomputation (dt_model_create_recompute) each block's
 * activations are rebuilt in the workspace just before its backward, and
 * the weight half, whose inner activation gradients lived in the shared
 * workspace too, recomputes those as well: block_backward without the
 * gradient it hands down, which the input half already left in place.
 *
 * Activation gradients need no zeroing: every kernel writes its dinp,
 * except layernorm backward, which adds — and every buffer it adds into
 * was just written by a copy, but the first (dlast), zeroed here.
 */
#include <stdio.h>

#include "model_internal.h"

/* Tells backward's progress hook (if any) that every gradient from
 * offset lo (read from the tensor table, so that neither gradient nor
 * parameter windows change it) to the end of the flat buffer is
 * final. Called after each layer that
 * writes parameter gradients, so DDP sees its buckets fill at the finest
 * grain backward offers (blocks are laid out in forward order, tensors
 * within a block too, so each call's lo is below the previous one). */
static void grad_ready(dt_model *m, size_t lo)
{
    if (m->grad_ready)
        m->grad_ready(m->grad_ready_user, lo);
}

/* Tells backward's parameter hook (if any) that the unit starting at lo
 * is about to be read. */
static void params_back(dt_model *m, size_t lo)
{
    if (m->params_back)
        m->params_back(m->params_back_user, lo);
}

/* One block in reverse. The gradient flowing into the block's output is
 * dres3 (the next block's input gradient, or what ln_f or the next stage
 * gave); on return the gradient w.r.t. the block's input is in
 * dresidual_in (NULL: not computed, when a recomputed weight half only
 * needs the block's inner gradients). With weights 0, no parameter
 * gradient is touched. */
static void block_backward(dt_model *m, int l, const float *dres3, const float *residual_in,
                           float *dresidual_in, int weights)
{
    const dt_backend *be = m->be;
    int B = m->last_B, T = m->last_T;
    int C = m->cfg.C, NH = m->cfg.H, N = B * T;
    size_t NC = (size_t)N * C, CC = (size_t)C * C; /* parameters: rounded in bf16 */
    dt_block_params *w = &m->params.blocks[l], *dw = &m->grads.blocks[l];
    dt_block_acts *x = &m->acts.blocks[l], *dx = &m->grad_acts.blocks[l];
    dt_block_params none = {0};
    dt_block_params *g = weights ? dw : &none;
    /* residual3 = residual2 + fcproj: fcproj's gradient is dres3 itself */
    be->matmul_backward(dx->fch_gelu, g->fcprojw, g->fcprojb, dres3, x->fch_gelu,
                        dt_model_matmul_weight(m, w->fcprojw, 4 * CC), N, 4 * C, C);
    if (weights)
        grad_ready(m, dt_block_offset(m, l, 8));
    be->gelu_backward(dx->fch, dx->fch_gelu, x->fch, 4 * NC);
    be->matmul_backward(dx->ln2, g->fcw, g->fcb, dx->fch, x->ln2,
                        dt_model_matmul_weight(m, w->fcw, 4 * CC), N, C, 4 * C);
    if (weights)
        grad_ready(m, dt_block_offset(m, l, 6));
    /* dresidual2 = dres3 (skip path) + LN2's input gradient */
    be->copy(dx->residual2, dres3, NC * sizeof(float));
    be->layernorm_backward(dx->residual2, g->ln2w, g->ln2b, dx->ln2, x->residual2,
                           dt_model_bf16_param(m, w->ln2w, (size_t)C, 0), x->ln2_mean, x->ln2_rstd,
                           N, C);
    if (weights)
        grad_ready(m, dt_block_offset(m, l, 4));
    be->matmul_backward(dx->atty, g->attprojw, NULL, dx->residual2, x->atty,
                        dt_model_matmul_weight(m, w->attprojw, CC), N, C, C);
    if (weights)
        grad_ready(m, dt_block_offset(m, l, 3));
    be->attention_backward(dx->qkv, m->grad_acts.scratch, dx->atty, x->qkv, x->att, B, T, C, NH);
    be->matmul_backward(dx->ln1, g->qkvw, NULL, dx->qkv, x->ln1,
                        dt_model_matmul_weight(m, w->qkvw, 3 * CC), N, C, 3 * C);
    if (weights)
        grad_ready(m, dt_block_offset(m, l, 2));
    /* dresidual_in = dresidual2 (skip path) + LN1's input gradient */
    if (dresidual_in)
        be->copy(dresidual_in, dx->residual2, NC * sizeof(float));
    be->layernorm_backward(dresidual_in, g->ln1w, g->ln1b, dx->ln1, residual_in,
                           dt_model_bf16_param(m, w->ln1w, (size_t)C, 0), x->ln1_mean, x->ln1_rstd,
                           N, C);
    if (weights)
        grad_ready(m, dt_block_offset(m, l, 0));
}

/* One block's weight gradients from what block_backward(weights 0) kept:
 * the same kernels, the same operands, dinp NULL. */
static void block_weights(dt_model *m, int l, const float *dres3, const float *residual_in)
{
    const dt_backend *be = m->be;
    int C = m->cfg.C, N = m->last_B * m->last_T;
    dt_block_params *w = &m->params.blocks[l], *dw = &m->grads.blocks[l];
    dt_block_acts *x = &m->acts.blocks[l], *dx = &m->grad_acts.blocks[l];
    be->matmul_backward(NULL, dw->fcprojw, dw->fcprojb, dres3, x->fch_gelu, w->fcprojw, N, 4 * C,
                        C);
    grad_ready(m, dt_block_offset(m, l, 8));
    be->matmul_backward(NULL, dw->fcw, dw->fcb, dx->fch, x->ln2, w->fcw, N, C, 4 * C);
    grad_ready(m, dt_block_offset(m, l, 6));
    be->layernorm_backward(NULL, dw->ln2w, dw->ln2b, dx->ln2, x->residual2, w->ln2w, x->ln2_mean,
                           x->ln2_rstd, N, C);
    grad_ready(m, dt_block_offset(m, l, 4));
    be->matmul_backward(NULL, dw->attprojw, NULL, dx->residual2, x->atty, w->attprojw, N, C, C);
    grad_ready(m, dt_block_offset(m, l, 3));
    be->matmul_backward(NULL, dw->qkvw, NULL, dx->qkv, x->ln1, w->qkvw, N, C, 3 * C);
    grad_ready(m, dt_block_offset(m, l, 2));
    be->layernorm_backward(NULL, dw->ln1w, dw->ln1b, dx->ln1, residual_in, w->ln1w, x->ln1_mean,
                           x->ln1_rstd, N, C);
    grad_ready(m, dt_block_offset(m, l, 0));
}

/* The last stage's head in reverse: loss, lm_head, ln_f. */
static void head_backward(dt_model *m, float dloss, dt_backward_part part)
{
    const dt_backend *be = m->be;
    int C = m->cfg.C, V = m->cfg.V, N = m->last_B * m->last_T;
    int L = m->cfg.L, in = part != DT_BACKWARD_WEIGHT;
    int wt = part != DT_BACKWARD_INPUT;
    dt_acts *a = &m->acts, *da = &m->grad_acts;
    float *dlast = da->blocks[L - 1].residual3;
    if (in) {
        be->crossentropy_backward(da->logits, a->probs, m->targets, dloss, N, V);
        be->zero(dlast, (size_t)N * C * sizeof(float));
    }
    be->matmul_backward(in ? da->lnf : NULL, wt ? m->grads.lm_head : NULL, NULL, da->logits, a->lnf,
                        dt_model_matmul_weight(m, m->params.lm_head, (size_t)V * C), N, C, V);
    if (wt)
        grad_ready(m, dt_head_offset(m, 2));
    be->layernorm_backward(in ? dlast : NULL, wt ? m->grads.lnfw : NULL, wt ? m->grads.lnfb : NULL,
                           da->lnf, a->blocks[L - 1].residual3,
                           dt_model_bf16_param(m, m->params.lnfw, (size_t)C, 0), a->lnf_mean,
                           a->lnf_rstd, N, C);
    if (wt)
        grad_ready(m, dt_head_offset(m, 0));
}

dt_status dt_model_backward_part(dt_model *m, float dloss, dt_backward_part part)
{
    int last = m->l1 == m->cfg.L;
    if (m->last_B < 1 || (last && !m->have_targets)) {
        snprintf(m->err, sizeof m->err, "minigpt: backward: %s",
                 m->last_B < 1 ? "no forward has run in this slot"
                               : "the last forward had no targets (no loss)");
        return DT_EINVAL;
    }
    if (m->grads_windowed && m->grads_window_n == 0 && part != DT_BACKWARD_INPUT) {
        snprintf(m->err, sizeof m->err,
                 "minigpt: backward: the gradients are windowed (ZeRO-2) and no window is mapped");
        return DT_EINVAL;
    }
    dt_acts *a = &m->acts, *da = &m->grad_acts;
    if (last) {
        params_back(m, dt_head_offset(m, 0));
        head_backward(m, dloss, part);
    }
    for (int l = m->l1 - 1; l >= m->l0; l--) {
        const float *in = l > m->l0 ? a->blocks[l - 1].residual3 : a->encoded;
        float *din = l > m->l0 ? da->blocks[l - 1].residual3 : da->encoded;
        params_back(m, dt_block_offset(m, l, 0));
        if ((m->recompute || m->bf16) && (m->ws_slot != m->slot || m->ws_block != l)) {
            if (m->bf16 && !m->recompute)
                dt_model_bf16_unpack(m, l); /* widened from its bf16 store */
            else
                dt_model_block_forward(m, l, in, m->last_B, m->last_T); /* into the workspace */
        }
        if (part == DT_BACKWARD_WEIGHT && (m->recompute || m->bf16)) /* inner gradients again */
            block_backward(m, l, da->blocks[l].residual3, in, NULL, 1);
        else if (part == DT_BACKWARD_WEIGHT)
            block_weights(m, l, da->blocks[l].residual3, in);
        else
            block_backward(m, l, da->blocks[l].residual3, in, din, part == DT_BACKWARD_ALL);
    }
    if (m->l0 == 0 && part != DT_BACKWARD_INPUT) {
        m->be->encoder_backward(m->grads.wte, m->grads.wpe, da->encoded, m->inputs, m->last_B,
                                m->last_T, m->cfg.C);
        grad_ready(m, 0);
    }
    return DT_OK;
}

dt_status dt_model_backward(dt_model *m, float dloss)
{
    return dt_model_backward_part(m, dloss, DT_BACKWARD_ALL);
}

int dt_model_grad_units(const dt_model *m, size_t *lo)
{
    int n = 0;
    if (m->l1 == m->cfg.L) {
        const int head[2] = {2, 0}; /* lm_head, ln_f */
        for (int k = 0; k < 2; k++, n++)
            if (lo)
                lo[n] = dt_head_offset(m, head[k]);
    }
    const int block[6] = {8, 6, 4, 3, 2, 0}; /* block_backward's order */
    for (int l = m->l1 - 1; l >= m->l0; l--)
        for (int k = 0; k < 6; k++, n++)
            if (lo)
                lo[n] = dt_block_offset(m, l, block[k]);
    if (m->l0 == 0) {
        if (lo)
            lo[n] = 0; /* wte */
        n++;
    }
    return n;
}
