/*
 * minigpt.c — the MiniGPT model: memory, forward pass, backward pass.
 *
 * The story, top to bottom, as llm.c tells GPT-2's:
 *
 *   encoded = wte[x] + wpe                         (B,T,C)
 *   for each block l:
 *     ln1 = LN(residual);  qkv = ln1 . qkvw^T      (B,T,3C)
 *     atty = causal_attention(qkv)                 (B,T,C)
 *     residual2 = residual + atty . attprojw^T
 *     ln2 = LN(residual2); fch = ln2 . fcw^T + fcb (B,T,4C)
 *     residual3 = residual2 + gelu(fch) . fcprojw^T + fcprojb
 *   lnf = LN(residual3 of the last block)
 *   logits = lnf . lm_head^T                       (B,T,V)
 *   loss = mean cross-entropy(softmax(logits), y)
 *
 * Backward walks the same list in reverse, each layer adding into the
 * gradients of its inputs and parameters.
 *
 * Memory: three allocations through the backend, fixed after create —
 * parameters, gradients (the flat buffers, layout.c), and activations
 * plus their gradients (one buffer each, carved below). Nothing is
 * allocated per step except AdamW's m and v, once, on the first update.
 * A forward with a smaller (B, T) than the allocation uses the front of
 * each activation tensor, laid out as (B, T, ...) contiguous.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

#define NUM_BLOCK_ACTS 15

/* Element counts of the activation tensors for (B, T): the top-level ones
 * in dt_acts order (without blocks), and one block's in dt_block_acts
 * order. */
static void act_sizes(size_t top[8], size_t blk[NUM_BLOCK_ACTS],
                      const dt_config *c, size_t B, size_t T)
{
    size_t N = B * T, C = (size_t)c->C, V = (size_t)c->V;
    size_t att = B * (size_t)c->H * T * T;
    size_t t[8] = {N * C, N * C, N, N, N * V, N * V, N, att};
    size_t k[NUM_BLOCK_ACTS] = {N * C, N, N, 3 * N * C, N * C, att, N * C,
                                N * C, N * C, N, N, 4 * N * C, 4 * N * C,
                                N * C, N * C};
    memcpy(top, t, sizeof t);
    memcpy(blk, k, sizeof k);
}

/* Points every field of a at its range of base, in the order act_sizes
 * lists them. Returns the total element count (base may be NULL). */
static size_t carve_acts(dt_acts *a, float *base, const dt_config *c,
                         size_t B, size_t T)
{
    size_t top[8], blk[NUM_BLOCK_ACTS], off = 0;
    act_sizes(top, blk, c, B, T);
    float **tp[8] = {&a->encoded, &a->lnf, &a->lnf_mean, &a->lnf_rstd,
                     &a->logits, &a->probs, &a->losses, &a->scratch};
    for (int i = 0; i < 8; i++) {
        *tp[i] = base ? base + off : NULL;
        off += top[i];
    }
    for (int l = 0; l < c->L; l++) {
        dt_block_acts *b = &a->blocks[l];
        float **bp[NUM_BLOCK_ACTS] = {
            &b->ln1,      &b->ln1_mean, &b->ln1_rstd, &b->qkv,
            &b->atty,     &b->att,      &b->attproj,  &b->residual2,
            &b->ln2,      &b->ln2_mean, &b->ln2_rstd, &b->fch,
            &b->fch_gelu, &b->fcproj,   &b->residual3};
        for (int i = 0; i < NUM_BLOCK_ACTS; i++) {
            *bp[i] = base ? base + off : NULL;
            off += blk[i];
        }
    }
    return off;
}

static dt_status fail(dt_model *m, dt_status s, const char *what)
{
    snprintf(m->err, sizeof m->err, "minigpt: %s", what);
    return s;
}

dt_status dt_model_create(dt_model **out, const dt_config *cfg,
                          const dt_backend *be, int max_B)
{
    dt_model *m = calloc(1, sizeof *m);
    *out = m;
    if (!m)
        return DT_ENOMEM;
    m->cfg = *cfg;
    m->be = be;
    m->max_B = max_B;
    if (dt_config_check(cfg, m->err, sizeof m->err) != DT_OK)
        return DT_EINVAL;
    if (max_B < 1)
        return fail(m, DT_EINVAL, "create: batch size must be >= 1");
    if (!be)
        return fail(m, DT_EINVAL, "create: no backend");
    int L = cfg->L;
    m->num_tensors = dt_layout_num_tensors(cfg);
    m->num_params = dt_config_num_params(cfg);
    m->tensors = calloc((size_t)m->num_tensors, sizeof *m->tensors);
    m->params.blocks = calloc((size_t)L, sizeof(dt_block_params));
    m->grads.blocks = calloc((size_t)L, sizeof(dt_block_params));
    m->acts.blocks = calloc((size_t)L, sizeof(dt_block_acts));
    m->grad_acts.blocks = calloc((size_t)L, sizeof(dt_block_acts));
    size_t T = (size_t)cfg->T, bytes_p = m->num_params * sizeof(float);
    m->num_acts = carve_acts(&m->acts, NULL, cfg, (size_t)max_B, T);
    size_t bytes_a = m->num_acts * sizeof(float);
    size_t bytes_tok = (size_t)max_B * T * sizeof(int);
    if (!m->tensors || !m->params.blocks || !m->grads.blocks ||
        !m->acts.blocks || !m->grad_acts.blocks)
        return fail(m, DT_ENOMEM, "create: out of host memory");
    m->params_memory = be->alloc(bytes_p);
    m->grads_memory = be->alloc(bytes_p);
    m->acts_memory = be->alloc(bytes_a);
    m->grad_acts_memory = be->alloc(bytes_a);
    m->inputs = be->alloc(bytes_tok);
    m->targets = be->alloc(bytes_tok);
    if (!m->params_memory || !m->grads_memory || !m->acts_memory ||
        !m->grad_acts_memory || !m->inputs || !m->targets) {
        snprintf(m->err, sizeof m->err,
                 "minigpt: create: %s backend could not allocate %zu MiB",
                 be->name, (2 * bytes_p + 2 * bytes_a) >> 20);
        return DT_ENOMEM;
    }
    dt_layout_build(m->tensors, &m->params, m->params_memory, cfg);
    dt_layout_build(m->tensors, &m->grads, m->grads_memory, cfg);
    return DT_OK;
}

void dt_model_destroy(dt_model *m)
{
    if (!m)
        return;
    const dt_backend *be = m->be;
    if (be) {
        void *dev[] = {m->params_memory, m->grads_memory, m->acts_memory,
                       m->grad_acts_memory, m->inputs, m->targets,
                       m->adam_m, m->adam_v};
        for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
            if (dev[i])
                be->free(dev[i]);
    }
    free(m->tensors);
    free(m->params.blocks);
    free(m->grads.blocks);
    free(m->acts.blocks);
    free(m->grad_acts.blocks);
    free(m);
}

const char *dt_model_error(const dt_model *m)
{
    return m ? m->err : "minigpt: out of memory";
}

void dt_model_init(dt_model *m, uint64_t seed)
{
    float *host = malloc(m->num_params * sizeof(float));
    if (!host) { /* parameters stay as they were; the message says why */
        snprintf(m->err, sizeof m->err, "minigpt: init: out of memory");
        return;
    }
    dt_layout_init(host, m->tensors, m->num_tensors, seed);
    dt_model_set_params(m, host);
    free(host);
}

void dt_model_get_params(const dt_model *m, float *host)
{
    m->be->to_host(host, m->params_memory, m->num_params * sizeof(float));
}

void dt_model_set_params(dt_model *m, const float *host)
{
    m->be->from_host(m->params_memory, host, m->num_params * sizeof(float));
}

void dt_model_get_grads(const dt_model *m, float *host)
{
    m->be->to_host(host, m->grads_memory, m->num_params * sizeof(float));
}

const dt_tensor_info *dt_model_find_tensor(const dt_model *m,
                                           const char *name)
{
    for (int i = 0; i < m->num_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0)
            return &m->tensors[i];
    return NULL;
}

/* Ids outside [0, V) would index outside wte: refuse them with where. */
static dt_status check_tokens(dt_model *m, const int *tok, const char *what,
                              int B, int T)
{
    for (int i = 0; i < B * T; i++)
        if (tok[i] < 0 || tok[i] >= m->cfg.V) {
            snprintf(m->err, sizeof m->err,
                     "minigpt: forward: %s[%d][%d] = %d is not a token id "
                     "of this model (vocabulary %d)",
                     what, i / T, i % T, tok[i], m->cfg.V);
            return DT_EINVAL;
        }
    return DT_OK;
}

/* Tells forward's parameter hook (if any) that parameters below hi are
 * about to be read (see dt_params_needed_fn). */
static void params_needed(dt_model *m, const float *hi)
{
    if (m->params_needed)
        m->params_needed(m->params_needed_user, (size_t)(hi - m->params_memory));
}

dt_status dt_model_forward(dt_model *m, const int *inputs, const int *targets,
                           int B, int T)
{
    const dt_backend *be = m->be;
    int C = m->cfg.C, V = m->cfg.V, NH = m->cfg.H, N = B * T;
    if (B < 1 || B > m->max_B || T < 1 || T > m->cfg.T) {
        snprintf(m->err, sizeof m->err,
                 "minigpt: forward: batch (%d, %d) does not fit the "
                 "allocation (%d, %d)", B, T, m->max_B, m->cfg.T);
        return DT_EINVAL;
    }
    if (check_tokens(m, inputs, "inputs", B, T) != DT_OK ||
        (targets && check_tokens(m, targets, "targets", B, T) != DT_OK))
        return DT_EINVAL;
    /* carve for this (B, T) so every tensor is contiguous (B, T, ...) */
    carve_acts(&m->acts, m->acts_memory, &m->cfg, (size_t)B, (size_t)T);
    carve_acts(&m->grad_acts, m->grad_acts_memory, &m->cfg, (size_t)B,
               (size_t)T);
    be->from_host(m->inputs, inputs, (size_t)N * sizeof(int));
    if (targets)
        be->from_host(m->targets, targets, (size_t)N * sizeof(int));

    dt_params *p = &m->params;
    dt_acts *a = &m->acts;
    int L = m->cfg.L;
    params_needed(m, L > 0 ? p->blocks[0].ln1w : p->lnfw);
    be->encoder_forward(a->encoded, m->inputs, p->wte, p->wpe, B, T, C);
    const float *residual = a->encoded;
    for (int l = 0; l < m->cfg.L; l++) {
        dt_block_params *w = &p->blocks[l];
        dt_block_acts *x = &a->blocks[l];
        params_needed(m, l + 1 < L ? p->blocks[l + 1].ln1w : p->lnfw);
        be->layernorm_forward(x->ln1, x->ln1_mean, x->ln1_rstd, residual,
                              w->ln1w, w->ln1b, N, C);
        be->matmul_forward(x->qkv, x->ln1, w->qkvw, NULL, N, C, 3 * C);
        be->attention_forward(x->atty, x->att, x->qkv, B, T, C, NH);
        be->matmul_forward(x->attproj, x->atty, w->attprojw, NULL, N, C, C);
        be->residual_forward(x->residual2, residual, x->attproj,
                             (size_t)N * C);
        be->layernorm_forward(x->ln2, x->ln2_mean, x->ln2_rstd, x->residual2,
                              w->ln2w, w->ln2b, N, C);
        be->matmul_forward(x->fch, x->ln2, w->fcw, w->fcb, N, C, 4 * C);
        be->gelu_forward(x->fch_gelu, x->fch, (size_t)N * 4 * C);
        be->matmul_forward(x->fcproj, x->fch_gelu, w->fcprojw, w->fcprojb, N,
                           4 * C, C);
        be->residual_forward(x->residual3, x->residual2, x->fcproj,
                             (size_t)N * C);
        residual = x->residual3;
    }
    params_needed(m, m->params_memory + m->num_params);
    be->layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, residual, p->lnfw,
                          p->lnfb, N, C);
    be->matmul_forward(a->logits, a->lnf, p->lm_head, NULL, N, C, V);
    be->crossentropy_forward(a->probs, a->losses, a->logits,
                             targets ? m->targets : NULL, N, V);
    m->last_B = B;
    m->last_T = T;
    m->have_targets = targets != NULL;
    if (targets) { /* mean in double: the order is fixed, so deterministic */
        float *losses = malloc((size_t)N * sizeof(float));
        if (!losses)
            return fail(m, DT_ENOMEM, "forward: out of memory for losses");
        be->to_host(losses, a->losses, (size_t)N * sizeof(float));
        double sum = 0.0;
        for (int i = 0; i < N; i++)
            sum += losses[i];
        free(losses);
        m->mean_loss = (float)(sum / N);
    }
    return DT_OK;
}

/* Tells backward's progress hook (if any) that every gradient from grad_lo
 * to the end of the flat buffer is final. Called after each layer that
 * writes parameter gradients, so DDP sees its buckets fill at the finest
 * grain backward offers (blocks are laid out in forward order, tensors
 * within a block too, so each call's lo is below the previous one). */
static void grad_ready(dt_model *m, const float *grad_lo)
{
    if (m->grad_ready)
        m->grad_ready(m->grad_ready_user, (size_t)(grad_lo - m->grads_memory));
}

/* One block in reverse. The gradient flowing into the block's output is
 * dx->residual3 (for the last block) or the next block's input gradient;
 * on return the gradient w.r.t. the block's input is in dresidual_in. */
static void block_backward(dt_model *m, int l, const float *dres3,
                           const float *residual_in, float *dresidual_in,
                           int B, int T)
{
    const dt_backend *be = m->be;
    int C = m->cfg.C, NH = m->cfg.H, N = B * T;
    size_t NC = (size_t)N * C;
    dt_block_params *w = &m->params.blocks[l], *dw = &m->grads.blocks[l];
    dt_block_acts *x = &m->acts.blocks[l], *dx = &m->grad_acts.blocks[l];
    /* residual3 = residual2 + fcproj: fcproj's gradient is dres3 itself */
    be->matmul_backward(dx->fch_gelu, dw->fcprojw, dw->fcprojb, dres3,
                        x->fch_gelu, w->fcprojw, N, 4 * C, C);
    grad_ready(m, dw->fcprojw);
    be->gelu_backward(dx->fch, dx->fch_gelu, x->fch, 4 * NC);
    be->matmul_backward(dx->ln2, dw->fcw, dw->fcb, dx->fch, x->ln2, w->fcw, N,
                        C, 4 * C);
    grad_ready(m, dw->fcw);
    /* dresidual2 = dres3 (skip path) + LN2's input gradient */
    be->copy(dx->residual2, dres3, NC * sizeof(float));
    be->layernorm_backward(dx->residual2, dw->ln2w, dw->ln2b, dx->ln2,
                           x->residual2, w->ln2w, x->ln2_mean, x->ln2_rstd,
                           N, C);
    grad_ready(m, dw->ln2w);
    be->matmul_backward(dx->atty, dw->attprojw, NULL, dx->residual2, x->atty,
                        w->attprojw, N, C, C);
    grad_ready(m, dw->attprojw);
    be->attention_backward(dx->qkv, m->grad_acts.scratch, dx->atty, x->qkv,
                           x->att, B, T, C, NH);
    be->matmul_backward(dx->ln1, dw->qkvw, NULL, dx->qkv, x->ln1, w->qkvw, N,
                        C, 3 * C);
    grad_ready(m, dw->qkvw);
    /* dresidual_in = dresidual2 (skip path) + LN1's input gradient */
    be->copy(dresidual_in, dx->residual2, NC * sizeof(float));
    be->layernorm_backward(dresidual_in, dw->ln1w, dw->ln1b, dx->ln1,
                           residual_in, w->ln1w, x->ln1_mean, x->ln1_rstd, N,
                           C);
    grad_ready(m, dw->ln1w);
}

/* Activation gradients need no zeroing: every kernel writes its dinp,
 * except layernorm backward, which adds — and every buffer it adds into
 * was just written by a copy, but the first (dlast), zeroed here. */
dt_status dt_model_backward(dt_model *m, float dloss)
{
    if (!m->have_targets)
        return fail(m, DT_EINVAL,
                    "backward: the last forward had no targets (no loss)");
    const dt_backend *be = m->be;
    int B = m->last_B, T = m->last_T, C = m->cfg.C, V = m->cfg.V, N = B * T;
    int L = m->cfg.L;
    dt_acts *a = &m->acts, *da = &m->grad_acts;
    be->crossentropy_backward(da->logits, a->probs, m->targets, dloss, N, V);
    be->matmul_backward(da->lnf, m->grads.lm_head, NULL, da->logits, a->lnf,
                        m->params.lm_head, N, C, V);
    grad_ready(m, m->grads.lm_head);
    float *dlast = da->blocks[L - 1].residual3;
    be->zero(dlast, (size_t)N * C * sizeof(float));
    be->layernorm_backward(dlast, m->grads.lnfw, m->grads.lnfb, da->lnf,
                           a->blocks[L - 1].residual3, m->params.lnfw,
                           a->lnf_mean, a->lnf_rstd, N, C);
    grad_ready(m, m->grads.lnfw);
    for (int l = L - 1; l >= 0; l--) {
        const float *in = l > 0 ? a->blocks[l - 1].residual3 : a->encoded;
        float *din = l > 0 ? da->blocks[l - 1].residual3 : da->encoded;
        block_backward(m, l, da->blocks[l].residual3, in, din, B, T);
    }
    be->encoder_backward(m->grads.wte, m->grads.wpe, da->encoded, m->inputs,
                         B, T, C);
    grad_ready(m, m->grads.wte);
    return DT_OK;
}

void dt_model_zero_grad(dt_model *m)
{
    m->be->zero(m->grads_memory, m->num_params * sizeof(float));
}

void dt_model_set_grad_hook(dt_model *m, dt_grad_ready_fn fn, void *user)
{
    m->grad_ready = fn;
    m->grad_ready_user = user;
}

void dt_model_set_params_hook(dt_model *m, dt_params_needed_fn fn, void *user)
{
    m->params_needed = fn;
    m->params_needed_user = user;
}

dt_status dt_model_update(dt_model *m, const dt_adamw_hparams *h, long step)
{
    size_t bytes = m->num_params * sizeof(float);
    if (step < 1)
        return fail(m, DT_EINVAL, "update: AdamW steps count from 1");
    if (!m->adam_m) {
        m->adam_m = m->be->alloc(bytes);
        m->adam_v = m->be->alloc(bytes);
        if (!m->adam_m || !m->adam_v)
            return fail(m, DT_ENOMEM, "update: no memory for AdamW state");
    }
    m->be->adamw(m->params_memory, m->grads_memory, m->adam_m, m->adam_v,
                 m->num_params, step, h);
    return DT_OK;
}

void dt_model_get_logits(const dt_model *m, float *host, int b, int t)
{
    size_t row = (size_t)b * m->last_T + t;
    m->be->to_host(host, m->acts.logits + row * m->cfg.V,
                   (size_t)m->cfg.V * sizeof(float));
}
