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
 * Backward (backward.c) walks the same list in reverse, each layer adding
 * into the gradients of its inputs and parameters.
 *
 * A pipeline stage runs a slice of this story: blocks [l0, l1), the
 * encoder only on the first stage (the others start from activations
 * received into `encoded`), the head and loss only on the last.
 *
 * Memory: allocations through the backend, fixed after create —
 * parameters, gradients (the flat buffers, layout.c, or a stage's slice
 * of them), and activation sets plus activation-gradient sets (act_slots
 * and grad_slots of them, one allocation each, carved by activations.c; a whole
 * model has one of each; with recomputation a set keeps of each block
 * only its output, and one workspace, shared by all sets, the rest, and
 * each kind of set holds only the top-level tensors it touches). Nothing
 * is allocated per step except AdamW's m and v, once, on the first
 * update. A forward with a smaller (B, T) than the allocation uses the
 * front of each activation tensor, laid out as (B, T, ...) contiguous; so
 * may one of more, shorter rows (B > max_B, T < cfg.T), as long as its
 * B·T tokens fit max_B·T: every tensor is B·T times a width, but the
 * attention matrices' B·H·T², and B·T² <= max_B·T·T <= max_B·T². (The
 * task's grading packs its short prompts so.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

static dt_status fail(dt_model *m, dt_status s, const char *what)
{
    snprintf(m->err, sizeof m->err, "minigpt: %s", what);
    return s;
}

static dt_status check_spec(dt_model *m, const dt_stage_spec *sp)
{
    if (sp->l0 < 0 || sp->l1 > m->cfg.L || sp->l0 >= sp->l1) {
        snprintf(m->err, sizeof m->err,
                 "minigpt: create: stage blocks [%d, %d) are not a "
                 "non-empty range of the model's %d blocks",
                 sp->l0, sp->l1, m->cfg.L);
        return DT_EINVAL;
    }
    if (sp->act_slots < 1 || sp->grad_slots < 1)
        return fail(m, DT_EINVAL,
                    "create: a stage needs at least one "
                    "activation set and one gradient set");
    return DT_OK;
}

/* The host-side tables: tensor table and pointer structs, the slots. */
static dt_status alloc_tables(dt_model *m)
{
    size_t L = (size_t)m->cfg.L;
    m->tensors = calloc((size_t)dt_layout_num_tensors(&m->cfg), sizeof *m->tensors);
    m->params.blocks = calloc(L, sizeof(dt_block_params));
    m->grads.blocks = calloc(L, sizeof(dt_block_params));
    m->acts.blocks = calloc(L, sizeof(dt_block_acts));
    m->grad_acts.blocks = calloc(L, sizeof(dt_block_acts));
    m->slots = calloc((size_t)m->act_slots, sizeof *m->slots);
    if (!m->tensors || !m->params.blocks || !m->grads.blocks || !m->acts.blocks ||
        !m->grad_acts.blocks || !m->slots)
        return fail(m, DT_ENOMEM, "create: out of host memory");
    return DT_OK;
}

/* The device allocations of create (a sharded model's parameters and
 * gradients: none); false if one failed. */
static bool alloc_memory(dt_model *m, size_t bytes_p, size_t tok)
{
    const dt_backend *be = m->be;
    if (!m->params_windowed) {
        m->params_memory = be->alloc(bytes_p);
        m->grads_memory = be->alloc(bytes_p);
    }
    int *tokens = be->alloc(2 * tok * (size_t)m->act_slots * sizeof(int));
    m->slots[0].inputs = tokens; /* owns the allocation */
    for (int k = 0; tokens && k < m->act_slots; k++) {
        m->slots[k].inputs = tokens + 2 * (size_t)k * tok;
        m->slots[k].targets = tokens + (2 * (size_t)k + 1) * tok;
    }
    return (m->params_windowed || (m->params_memory && m->grads_memory)) && tokens &&
           dt_model_alloc_acts(m) == DT_OK;
}

/* dt_model_create_stage, with or without recomputation, with or without
 * (sharded) parameter and gradient buffers. */
static dt_status create(dt_model **out, const dt_config *cfg, const dt_backend *be, int max_B,
                        const dt_stage_spec *spec, bool recompute, bool sharded)
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
    if (check_spec(m, spec) != DT_OK)
        return DT_EINVAL;
    m->l0 = spec->l0;
    m->l1 = spec->l1;
    m->act_slots = spec->act_slots;
    m->recompute = recompute;
    m->grad_slots = spec->grad_slots;
    m->params_windowed = m->grads_windowed = sharded;
    if (alloc_tables(m) != DT_OK)
        return DT_ENOMEM;
    m->num_tensors = dt_layout_build_stage(m->tensors, NULL, NULL, cfg, m->l0, m->l1, &m->param_lo,
                                           &m->param_hi);
    if (m->num_tensors < 0)
        return fail(m, DT_ENOMEM, "create: out of host memory");
    m->num_params = m->param_hi - m->param_lo;
    size_t bytes_p = m->num_params * sizeof(float);
    if (!alloc_memory(m, bytes_p, (size_t)max_B * (size_t)cfg->T)) {
        snprintf(m->err, sizeof m->err, "minigpt: create: %s backend could not allocate %zu MiB",
                 be->name, ((sharded ? 0 : 2 * bytes_p) + dt_model_activation_bytes(m)) >> 20);
        return DT_ENOMEM;
    }
    dt_layout_build_stage(m->tensors, &m->params, m->params_memory, cfg, m->l0, m->l1, &m->param_lo,
                          &m->param_hi);
    dt_layout_build_stage(m->tensors, &m->grads, m->grads_memory, cfg, m->l0, m->l1, &m->param_lo,
                          &m->param_hi);
    dt_model_carve(m, max_B, cfg->T);
    return DT_OK;
}

dt_status dt_model_create_stage(dt_model **out, const dt_config *cfg, const dt_backend *be,
                                int max_B, const dt_stage_spec *spec)
{
    dt_status st = create(out, cfg, be, max_B, spec, spec->recompute, false);
    if (*out)
        (*out)->pipeline_stage = true;
    return st;
}

dt_status dt_model_create_recompute(dt_model **out, const dt_config *cfg, const dt_backend *be,
                                    int max_B)
{
    dt_stage_spec whole = {0, cfg->L, 1, 1, false};
    return create(out, cfg, be, max_B, &whole, true, false);
}

dt_status dt_model_create_sharded(dt_model **out, const dt_config *cfg, const dt_backend *be,
                                  int max_B, bool recompute)
{
    dt_stage_spec whole = {0, cfg->L, 1, 1, false};
    return create(out, cfg, be, max_B, &whole, recompute, true);
}

dt_status dt_model_create(dt_model **out, const dt_config *cfg, const dt_backend *be, int max_B)
{
    dt_stage_spec whole = {0, cfg->L, 1, 1, false}; /* not a pipeline's stage */
    return create(out, cfg, be, max_B, &whole, false, false);
}

void dt_model_destroy(dt_model *m)
{
    if (!m)
        return;
    const dt_backend *be = m->be;
    if (be) {
        void *dev[] = {m->params_memory,
                       m->grads_memory,
                       m->acts_memory,
                       m->grad_acts_memory,
                       m->ws_memory,
                       m->grad_ws_memory,
                       m->slots ? m->slots[0].inputs : NULL,
                       m->adam_m,
                       m->adam_v,
                       m->bf16_memory,
                       m->weight_ws,
                       m->param_ws};
        for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
            if (dev[i])
                be->free(dev[i]);
    }
    free(m->tensors);
    free(m->params.blocks);
    free(m->grads.blocks);
    free(m->acts.blocks);
    free(m->grad_acts.blocks);
    free(m->slots);
    free(m);
}

const char *dt_model_error(const dt_model *m)
{
    return m ? m->err : "minigpt: out of memory";
}

void dt_model_init(dt_model *m, uint64_t seed)
{
    if (!m->params_memory) { /* sharded: its owner initialises the shards */
        snprintf(m->err, sizeof m->err,
                 "minigpt: init: the parameters are sharded (dt_model_init_range)");
        return;
    }
    float *host = malloc(m->num_params * sizeof(float));
    if (!host) { /* parameters stay as they were; the message says why */
        snprintf(m->err, sizeof m->err, "minigpt: init: out of memory");
        return;
    }
    if (dt_layout_init_stage(host, &m->cfg, m->l0, m->l1, seed) != 0)
        snprintf(m->err, sizeof m->err, "minigpt: init: out of memory");
    else
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
    if (m->grads_windowed) { /* no full gradient exists: zeros */
        memset(host, 0, m->num_params * sizeof(float));
        return;
    }
    m->be->to_host(host, m->grads_memory, m->num_params * sizeof(float));
}

const dt_tensor_info *dt_model_find_tensor(const dt_model *m, const char *name)
{
    for (int i = 0; i < m->num_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0)
            return &m->tensors[i];
    return NULL;
}

/* Ids outside [0, V) would index outside wte: refuse them with where. */
static dt_status check_tokens(dt_model *m, const int *tok, const char *what, int B, int T)
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
static void params_needed(dt_model *m, size_t hi)
{
    if (m->params_needed)
        m->params_needed(m->params_needed_user, hi);
}

/* Just past block l's parameters: the next block's, ln_f's on the last
 * stage, or the end of this stage's slice. */
static size_t block_params_end(const dt_model *m, int l)
{
    if (l + 1 < m->l1)
        return dt_block_offset(m, l + 1, 0);
    return m->l1 == m->cfg.L ? dt_head_offset(m, 0) : m->num_params;
}

/* Shape and tokens: what forward refuses before touching anything. A
 * stage without embeddings takes activations, not tokens; only the last
 * stage reads targets. */
static dt_status check_forward(dt_model *m, const int *inputs, const int *targets, int B, int T)
{
    if (B < 1 || T < 1 || T > m->cfg.T || (size_t)B * T > (size_t)m->max_B * m->cfg.T) {
        snprintf(m->err, sizeof m->err,
                 "minigpt: forward: batch (%d, %d) does not fit the "
                 "allocation (%d, %d)",
                 B, T, m->max_B, m->cfg.T);
        return DT_EINVAL;
    }
    if ((m->l0 == 0) != (inputs != NULL)) {
        snprintf(m->err, sizeof m->err, "minigpt: forward: the stage of blocks [%d, %d) takes %s",
                 m->l0, m->l1,
                 m->l0 == 0 ? "token ids (inputs is NULL)" : "activations, not token ids");
        return DT_EINVAL;
    }
    if ((inputs && check_tokens(m, inputs, "inputs", B, T) != DT_OK) ||
        (targets && m->l1 == m->cfg.L && check_tokens(m, targets, "targets", B, T) != DT_OK))
        return DT_EINVAL;
    return DT_OK;
}

/* A LayerNorm's gain and shift and a bias of width k·C, as a layer reads
 * them: rounded to bf16 under --precision bf16 (precision.c). */
#define LN_W(p) dt_model_bf16_param(m, (p), (size_t)m->cfg.C, 0)
#define LN_B(p) dt_model_bf16_param(m, (p), (size_t)m->cfg.C, 1)
#define BIAS(p, k) dt_model_bf16_param(m, (p), (size_t)(k) * (size_t)m->cfg.C, 0)

/* One block forward: residual (N, C) in, x->residual3 out. In bf16 each
 * output but the residual stream's is rounded as it is written and each
 * parameter as it is read (precision.c), and the block is packed into
 * its store. */
void dt_model_block_forward(dt_model *m, int l, const float *residual, int B, int T)
{
    const dt_backend *be = m->be;
    int C = m->cfg.C, NH = m->cfg.H, N = B * T;
    size_t NC = (size_t)N * C, CC = (size_t)C * C;
    dt_block_params *w = &m->params.blocks[l];
    dt_block_acts *x = &m->acts.blocks[l];
    be->layernorm_forward(x->ln1, x->ln1_mean, x->ln1_rstd, residual, LN_W(w->ln1w), LN_B(w->ln1b),
                          N, C);
    dt_model_round_acts(m, x->ln1, NC);
    be->matmul_forward(x->qkv, x->ln1, dt_model_matmul_weight(m, w->qkvw, 3 * CC), NULL, N, C,
                       3 * C);
    dt_model_round_acts(m, x->qkv, 3 * NC);
    be->attention_forward(x->atty, x->att, x->qkv, B, T, C, NH);
    dt_model_round_acts(m, x->atty, NC);
    dt_model_round_acts(m, x->att, (size_t)B * NH * T * T);
    be->matmul_forward(x->attproj, x->atty, dt_model_matmul_weight(m, w->attprojw, CC), NULL, N, C,
                       C);
    dt_model_round_acts(m, x->attproj, NC);
    be->residual_forward(x->residual2, residual, x->attproj, NC);
    be->layernorm_forward(x->ln2, x->ln2_mean, x->ln2_rstd, x->residual2, LN_W(w->ln2w),
                          LN_B(w->ln2b), N, C);
    dt_model_round_acts(m, x->ln2, NC);
    be->matmul_forward(x->fch, x->ln2, dt_model_matmul_weight(m, w->fcw, 4 * CC), BIAS(w->fcb, 4),
                       N, C, 4 * C);
    dt_model_round_acts(m, x->fch, 4 * NC);
    be->gelu_forward(x->fch_gelu, x->fch, 4 * NC);
    dt_model_round_acts(m, x->fch_gelu, 4 * NC);
    be->matmul_forward(x->fcproj, x->fch_gelu, dt_model_matmul_weight(m, w->fcprojw, 4 * CC),
                       BIAS(w->fcprojb, 1), N, 4 * C, C);
    dt_model_round_acts(m, x->fcproj, NC);
    be->residual_forward(x->residual3, x->residual2, x->fcproj, NC);
    dt_model_bf16_pack(m, l, B, T);
    m->ws_slot = m->slot; /* with recomputation, the workspace now holds it */
    m->ws_block = l;
}

/* The last stage's head: ln_f, logits, and (with targets) the mean loss,
 * summed in double in a fixed order so it is deterministic. */
static dt_status head_forward(dt_model *m, int with_targets, int N)
{
    const dt_backend *be = m->be;
    int C = m->cfg.C, V = m->cfg.V;
    dt_params *p = &m->params;
    dt_acts *a = &m->acts;
    be->layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, a->blocks[m->cfg.L - 1].residual3,
                          LN_W(p->lnfw), LN_B(p->lnfb), N, C);
    dt_model_round_acts(m, a->lnf, (size_t)N * C);
    be->matmul_forward(a->logits, a->lnf, dt_model_matmul_weight(m, p->lm_head, (size_t)V * C),
                       NULL, N, C, V);
    be->crossentropy_forward(a->probs, a->losses, a->logits, with_targets ? m->targets : NULL, N,
                             V);
    if (!with_targets)
        return DT_OK;
    float *losses = malloc((size_t)N * sizeof(float));
    if (!losses)
        return fail(m, DT_ENOMEM, "forward: out of memory for losses");
    be->to_host(losses, a->losses, (size_t)N * sizeof(float));
    double sum = 0.0;
    for (int i = 0; i < N; i++)
        sum += losses[i];
    free(losses);
    m->mean_loss = (float)(sum / N);
    return DT_OK;
}

dt_status dt_model_forward(dt_model *m, const int *inputs, const int *targets, int B, int T)
{
    const dt_backend *be = m->be;
    int C = m->cfg.C, N = B * T, last = m->l1 == m->cfg.L;
    if (check_forward(m, inputs, targets, B, T) != DT_OK)
        return DT_EINVAL;
    dt_model_carve(m, B, T);
    if (inputs) {
        be->from_host(m->inputs, inputs, (size_t)N * sizeof(int));
        params_needed(m, dt_block_offset(m, m->l0, 0)); /* wte, wpe */
        be->encoder_forward(m->acts.encoded, m->inputs, /* bf16: wte, wpe rounded */
                            dt_model_matmul_weight(m, m->params.wte, (size_t)m->cfg.V * C),
                            dt_model_bf16_param(m, m->params.wpe, (size_t)m->cfg.T * C, 0), B, T,
                            C);
    }
    if (targets && last)
        be->from_host(m->targets, targets, (size_t)N * sizeof(int));
    const float *residual = m->acts.encoded;
    for (int l = m->l0; l < m->l1; l++) {
        params_needed(m, block_params_end(m, l));
        dt_model_block_forward(m, l, residual, B, T);
        residual = m->acts.blocks[l].residual3;
    }
    m->last_B = B;
    m->last_T = T;
    m->have_targets = last && targets != NULL;
    if (!last)
        return DT_OK;
    params_needed(m, m->num_params); /* ln_f, head */
    return head_forward(m, targets != NULL, N);
}

void dt_model_zero_grad(dt_model *m)
{
    if (!m->grads_windowed) /* windows are zeroed by their owner */
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

void dt_model_set_params_back_hook(dt_model *m, dt_params_back_fn fn, void *user)
{
    m->params_back = fn;
    m->params_back_user = user;
}

dt_status dt_model_update(dt_model *m, const dt_adamw_hparams *h, long step)
{
    size_t bytes = m->num_params * sizeof(float);
    if (step < 1)
        return fail(m, DT_EINVAL, "update: AdamW steps count from 1");
    if (m->grads_windowed || m->params_windowed)
        return fail(m, DT_EINVAL,
                    "update: the gradients (ZeRO-2) or parameters (ZeRO-3) are "
                    "windowed: no full buffer");
    if (!m->adam_m) {
        m->adam_m = m->be->alloc(bytes);
        m->adam_v = m->be->alloc(bytes);
        if (!m->adam_m || !m->adam_v)
            return fail(m, DT_ENOMEM, "update: no memory for AdamW state");
    }
    m->be->adamw(m->params_memory, m->grads_memory, m->adam_m, m->adam_v, m->num_params, step, h);
    return DT_OK;
}

void dt_model_get_logits(const dt_model *m, float *host, int b, int t)
{
    size_t row = (size_t)b * m->last_T + t;
    m->be->to_host(host, m->acts.logits + row * m->cfg.V, (size_t)m->cfg.V * sizeof(float));
}
