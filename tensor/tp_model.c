/*
 * tp_model.c — a tensor-parallel rank's MiniGPT: memory, the whole
 * forward and backward, AdamW.
 *
 * The story is minigpt.c's, on a share (dt_tp.h, model/tp_layout.c):
 *
 *   encoded = g(wte_r[x]) + wpe                    (B,T,C)  tp_vocab.c
 *   for each block l:                                       tp_block.c
 *     residual2 = residual + g(attn_r(f(LN1(residual))))
 *     residual3 = residual2 + g(mlp_r(f(LN2(residual2)))) + fcprojb
 *   lnf = LN(residual3);  logits_r = f(lnf) . lm_head_r^T  (B,T,V/tp)
 *   loss = parallel cross-entropy(logits_r, y)              tp_vocab.c
 *
 * Memory: one allocation each for the share's parameters, gradients,
 * activations and activation gradients, all through the backend, fixed
 * after create; AdamW's m and v on the first update. Activations are laid
 * out for the forward's (B, T) so every tensor is contiguous.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tp_internal.h"

static dt_status fail(dt_tp_model *m, dt_status s, const char *what)
{
    snprintf(m->err, sizeof m->err, "tensor parallel rank %d/%d: %s", m->rank, m->tp, what);
    return s;
}

/* The widths of a block's 15 tensors (dt_block_acts order) for (B, T). */
static void block_sizes(size_t n[15], const dt_config *c, int tp, size_t B, size_t T)
{
    size_t N = B * T, C = (size_t)c->C, Cl = C / (size_t)tp;
    size_t att = B * ((size_t)c->H / (size_t)tp) * T * T;
    size_t blk[15] = {N * C, N, N, 3 * N * Cl, N * Cl,     att,   N * C, N * C,
                      N * C, N, N, 4 * N * Cl, 4 * N * Cl, N * C, N * C};
    memcpy(n, blk, sizeof blk);
}

/* In bf16, the tensors each block keeps in fp32: the statistics and the
 * residual stream, and of the gradients only residual3's (what the block
 * below reads); the others live in the one-block workspace. */
static bool kept_fp32(int i, bool grads)
{
    return grads ? i == 14 : i == 1 || i == 2 || i == 7 || i == 9 || i == 10 || i == 14;
}

/* The gradients tp_block_backward never writes (of the statistics, att,
 * attproj, fcproj): in bf16 they get no memory (NULL). */
static bool unused_grad(int i)
{
    return i == 1 || i == 2 || i == 5 || i == 6 || i == 9 || i == 10 || i == 13;
}

size_t tp_carve_blocks(dt_acts *a, float *base, size_t off, int l0, int l1, const dt_config *c,
                       int tp, size_t B, size_t T, float *ws, bool grads)
{
    size_t blk[15];
    block_sizes(blk, c, tp, B, T);
    for (int l = l0; l < l1; l++) {
        dt_block_acts *b = &a->blocks[l];
        float **bp[15] = {&b->ln1,      &b->ln1_mean, &b->ln1_rstd,  &b->qkv,    &b->atty,
                          &b->att,      &b->attproj,  &b->residual2, &b->ln2,    &b->ln2_mean,
                          &b->ln2_rstd, &b->fch,      &b->fch_gelu,  &b->fcproj, &b->residual3};
        size_t ws_off = 0;
        for (int i = 0; i < 15; i++) {
            if (ws && grads && unused_grad(i)) {
                *bp[i] = NULL;
                continue;
            }
            if (ws && !kept_fp32(i, grads)) { /* bf16: every block's points at the workspace */
                *bp[i] = ws + ws_off;
                ws_off += blk[i];
                continue;
            }
            *bp[i] = base ? base + off : NULL;
            off += blk[i];
        }
    }
    return off;
}

size_t tp_block_ws_floats(const dt_config *c, int tp, size_t B, size_t T, bool grads)
{
    size_t blk[15], n = 0;
    block_sizes(blk, c, tp, B, T);
    for (int i = 0; i < 15; i++)
        n += kept_fp32(i, grads) || (grads && unused_grad(i)) ? 0 : blk[i];
    return n;
}

/* Points a's tensors at base for (B, T) with the share's local widths;
 * returns the element count (base may be NULL). Order: dt_acts' top
 * tensors, then each block's in dt_block_acts order. */
static size_t carve_acts(dt_acts *a, float *base, const dt_tp_model *m, size_t B, size_t T,
                         float *ws, bool grads)
{
    const dt_config *c = &m->cfg;
    size_t tp = (size_t)m->tp, N = B * T, C = (size_t)c->C;
    size_t Vl = (size_t)dt_tp_vocab_rows(c, m->tp);
    size_t att = B * ((size_t)c->H / tp) * T * T, off = 0;
    size_t top[8] = {N * C, N * C, N, N, N * Vl, N * Vl, N, att};
    float **top_ptr[8] = {&a->encoded, &a->lnf,   &a->lnf_mean, &a->lnf_rstd,
                          &a->logits,  &a->probs, &a->losses,   &a->scratch};
    for (int i = 0; i < 8; i++) {
        *top_ptr[i] = base ? base + off : NULL;
        off += top[i];
    }
    return tp_carve_blocks(a, base, off, 0, c->L, c, m->tp, B, T, ws, grads);
}

/* Points the dt_params fields of p at base, in the tensor table's order
 * (the full model's: wte, wpe, blocks' ten, ln_f.w, ln_f.b, lm_head). */
static void point_params(dt_params *p, float *base, const dt_tp_model *m)
{
    const dt_tp_tensor *t = m->tensors;
    p->wte = base + t[0].local.offset;
    p->wpe = base + t[1].local.offset;
    for (int l = 0; l < m->cfg.L; l++) {
        dt_block_params *b = &p->blocks[l];
        float **f[10] = {&b->ln1w, &b->ln1b, &b->qkvw, &b->attprojw, &b->ln2w,
                         &b->ln2b, &b->fcw,  &b->fcb,  &b->fcprojw,  &b->fcprojb};
        for (int k = 0; k < 10; k++)
            *f[k] = base + t[2 + 10 * l + k].local.offset;
    }
    int tail = 2 + 10 * m->cfg.L;
    p->lnfw = base + t[tail].local.offset;
    p->lnfb = base + t[tail + 1].local.offset;
    p->lm_head = base + t[tail + 2].local.offset;
}

static dt_status alloc_host(dt_tp_model *m)
{
    size_t L = (size_t)m->cfg.L, tok = (size_t)m->max_B * (size_t)m->cfg.T;
    m->num_tensors = dt_tp_layout_num_tensors(&m->cfg);
    m->tensors = calloc((size_t)m->num_tensors, sizeof *m->tensors);
    m->params.blocks = calloc(L, sizeof(dt_block_params));
    m->grads.blocks = calloc(L, sizeof(dt_block_params));
    m->acts.blocks = calloc(L, sizeof(dt_block_acts));
    m->grad_acts.blocks = calloc(L, sizeof(dt_block_acts));
    m->ce_stats = calloc(3 * tok, sizeof(float));
    m->inputs = calloc(2 * tok, sizeof(int));
    if (!m->tensors || !m->params.blocks || !m->grads.blocks || !m->acts.blocks ||
        !m->grad_acts.blocks || !m->ce_stats || !m->inputs ||
        dt_tp_layout_build(m->tensors, &m->cfg, m->tp) < 0)
        return fail(m, DT_ENOMEM, "create: out of host memory");
    m->targets = m->inputs + tok;
    return DT_OK;
}

/* The vocabulary-parallel layers and the f/g operators run on host
 * loops and host buffers: a backend whose memory the host cannot read is
 * refused rather than crashed on. */
static int host_backend(const dt_backend *be)
{
    return strcmp(be->name, "cuda") != 0;
}

dt_status dt_tp_create(dt_tp_model **out, const dt_config *cfg, const dt_backend *be, int max_B,
                       dt_comm *tp_comm)
{
    dt_tp_model *m = calloc(1, sizeof *m);
    *out = m;
    if (!m)
        return DT_ENOMEM;
    m->cfg = *cfg;
    m->be = be;
    m->comm = tp_comm;
    m->max_B = max_B;
    m->tp = tp_comm ? dt_comm_size(tp_comm) : 0;
    m->rank = tp_comm ? dt_comm_rank(tp_comm) : 0;
    if (!tp_comm || !be || max_B < 1)
        return fail(m, DT_EINVAL, "create: needs a tp communicator, a backend and max_B >= 1");
    if (!host_backend(be))
        return fail(m, DT_EINVAL,
                    "create: the cuda backend is not supported yet (host memory only)");
    if (dt_tp_config_check(cfg, m->tp, m->err, sizeof m->err) != DT_OK)
        return DT_EINVAL;
    if (alloc_host(m) != DT_OK)
        return DT_ENOMEM;
    m->num_params = dt_tp_num_params(cfg, m->tp);
    m->num_acts = carve_acts(&m->acts, NULL, m, (size_t)max_B, (size_t)cfg->T, NULL, false);
    m->num_grad_acts = m->num_acts;
    size_t bp = m->num_params * sizeof(float), ba = m->num_acts * sizeof(float);
    m->params_memory = be->alloc(bp);
    m->grads_memory = be->alloc(bp);
    m->acts_memory = be->alloc(ba);
    m->grad_acts_memory = be->alloc(ba);
    if (!m->params_memory || !m->grads_memory || !m->acts_memory || !m->grad_acts_memory)
        return fail(m, DT_ENOMEM, "create: the backend could not allocate the share");
    point_params(&m->params, m->params_memory, m);
    point_params(&m->grads, m->grads_memory, m);
    m->compute = m->params;
    return DT_OK;
}

dt_status tp_precision_switch(dt_tp_model *m, dt_precision p, size_t store)
{
    size_t B = (size_t)m->max_B, T = (size_t)m->cfg.T;
    return tp_precision_alloc(m, p, store, tp_block_ws_floats(&m->cfg, m->tp, B, T, false),
                              tp_block_ws_floats(&m->cfg, m->tp, B, T, true));
}

size_t tp_workspace_floats(const dt_tp_model *m)
{
    size_t B = (size_t)m->max_B, T = (size_t)m->cfg.T;
    return m->bf16 ? tp_block_ws_floats(&m->cfg, m->tp, B, T, false) +
                         tp_block_ws_floats(&m->cfg, m->tp, B, T, true)
                   : 0;
}

/* bf16: the activations shrink to what each block keeps in fp32 (its
 * inner tensors go to the one-block workspaces and the bf16 store). */
dt_status dt_tp_set_precision(dt_tp_model *m, dt_precision p)
{
    size_t B = (size_t)m->max_B, T = (size_t)m->cfg.T;
    size_t store = (size_t)m->cfg.L * tp_store_block(&m->cfg, m->tp, B, T);
    dt_status st = tp_precision_switch(m, p, store);
    if (st != DT_OK || !m->bf16)
        return st;
    point_params(&m->compute, m->rounded_memory, m);
    m->be->free(m->acts_memory);
    m->be->free(m->grad_acts_memory);
    m->num_acts = carve_acts(&m->acts, NULL, m, B, T, m->act_ws, false);
    m->num_grad_acts = carve_acts(&m->grad_acts, NULL, m, B, T, m->grad_ws, true);
    m->acts_memory = m->be->alloc(m->num_acts * sizeof(float));
    m->grad_acts_memory = m->be->alloc(m->num_grad_acts * sizeof(float));
    if (!m->acts_memory || !m->grad_acts_memory)
        return fail(m, DT_ENOMEM, "precision bf16: out of memory for the activations");
    return DT_OK;
}

size_t dt_tp_activation_bytes(const dt_tp_model *m)
{
    return (m->num_acts + m->num_grad_acts + tp_workspace_floats(m)) * sizeof(float) +
           m->num_store * sizeof(uint16_t);
}

void dt_tp_destroy(dt_tp_model *m)
{
    if (!m)
        return;
    void *dev[] = {m->params_memory,    m->grads_memory, m->acts_memory,
                   m->grad_acts_memory, m->adam_m,       m->adam_v};
    for (size_t i = 0; m->be && i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            m->be->free(dev[i]);
    tp_precision_free(m);
    free(m->tensors);
    free(m->params.blocks);
    free(m->grads.blocks);
    free(m->acts.blocks);
    free(m->grad_acts.blocks);
    free(m->ce_stats);
    free(m->inputs);
    free(m);
}

const char *dt_tp_error(const dt_tp_model *m)
{
    return m ? m->err : "tensor parallel: out of memory";
}

dt_status dt_tp_init(dt_tp_model *m, uint64_t seed)
{
    float *host = malloc(m->num_params * sizeof(float)); /* slice zeroes the padding */
    if (!host || dt_tp_layout_init(host, m->tensors, &m->cfg, m->tp, m->rank, seed) != 0) {
        free(host);
        return fail(m, DT_ENOMEM, "init: out of host memory");
    }
    m->be->from_host(m->params_memory, host, m->num_params * sizeof(float));
    free(host);
    return DT_OK;
}

/* A batch fits as the whole model's does (model/minigpt.c): its B·T
 * tokens within max_B·T, T within the context, so evaluation's grading
 * may run more, shorter rows (B > max_B) than training. */
static dt_status check_batch(dt_tp_model *m, const int *inputs, const int *targets, int B, int T)
{
    if (B < 1 || T < 1 || T > m->cfg.T || (size_t)B * (size_t)T > (size_t)m->max_B * m->cfg.T ||
        !inputs) {
        snprintf(m->err, sizeof m->err,
                 "tensor parallel rank %d/%d: forward: batch (%d, %d) does not fit the "
                 "allocation (%d, %d), or no inputs",
                 m->rank, m->tp, B, T, m->max_B, m->cfg.T);
        return DT_EINVAL;
    }
    for (int i = 0; i < B * T; i++)
        if (inputs[i] < 0 || inputs[i] >= m->cfg.V ||
            (targets && (targets[i] < 0 || targets[i] >= m->cfg.V))) {
            snprintf(m->err, sizeof m->err,
                     "tensor parallel rank %d/%d: forward: token [%d][%d] is not an id of "
                     "this model (vocabulary %d)",
                     m->rank, m->tp, i / T, i % T, m->cfg.V);
            return DT_EINVAL;
        }
    return DT_OK;
}

dt_status dt_tp_forward(dt_tp_model *m, const int *inputs, const int *targets, int B, int T)
{
    const dt_backend *be = m->be;
    int C = m->cfg.C, L = m->cfg.L, N = B * T, Vl = tp_vocab_of(m).rows;
    if (check_batch(m, inputs, targets, B, T) != DT_OK)
        return DT_EINVAL;
    carve_acts(&m->acts, m->acts_memory, m, (size_t)B, (size_t)T, m->act_ws, false);
    carve_acts(&m->grad_acts, m->grad_acts_memory, m, (size_t)B, (size_t)T, m->grad_ws, true);
    memcpy(m->inputs, inputs, (size_t)N * sizeof(int));
    if (targets)
        memcpy(m->targets, targets, (size_t)N * sizeof(int));
    m->last_B = m->last_T = 0;
    tp_round_params(m);
    dt_status st = tp_vocab_embed_forward(m, B, T);
    const float *residual = m->acts.encoded;
    for (int l = 0; l < L && st == DT_OK; l++) {
        st = tp_block_forward(m, l, residual, B, T);
        residual = m->acts.blocks[l].residual3;
    }
    if (st != DT_OK)
        return st;
    dt_acts *a = &m->acts;
    be->layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, residual, m->compute.lnfw,
                          m->compute.lnfb, N, C);
    tp_round_acts(m, a->lnf, (size_t)N * C);
    /* after f; all Vt rows, padding included (tp_vocab.c leaves it out) */
    be->matmul_forward(a->logits, a->lnf, m->compute.lm_head, NULL, N, C, Vl);
    if ((st = tp_vocab_crossentropy_forward(m, targets != NULL, N)) != DT_OK)
        return st;
    m->last_B = B;
    m->last_T = T;
    m->have_targets = targets != NULL;
    return DT_OK;
}

dt_status dt_tp_backward(dt_tp_model *m, float dloss)
{
    if (m->last_B < 1 || !m->have_targets)
        return fail(m, DT_EINVAL, "backward: the last forward had no targets (no loss)");
    const dt_backend *be = m->be;
    int B = m->last_B, T = m->last_T, N = B * T, C = m->cfg.C, L = m->cfg.L;
    dt_acts *a = &m->acts, *da = &m->grad_acts;
    float *dlast = da->blocks[L - 1].residual3;
    tp_vocab_crossentropy_backward(m, dloss, N);
    be->matmul_backward(da->lnf, m->grads.lm_head, NULL, da->logits, a->lnf, m->compute.lm_head, N,
                        C, tp_vocab_of(m).rows);
    dt_status st = tp_allreduce(m, da->lnf, (size_t)N * C, DT_SUM, DT_TP_HEAD_GRAD, -1);
    if (st != DT_OK)
        return st;
    be->zero(dlast, (size_t)N * C * sizeof(float));
    be->layernorm_backward(dlast, m->grads.lnfw, m->grads.lnfb, da->lnf, a->blocks[L - 1].residual3,
                           m->compute.lnfw, a->lnf_mean, a->lnf_rstd, N, C);
    for (int l = L - 1; l >= 0 && st == DT_OK; l--) {
        const float *in = l > 0 ? a->blocks[l - 1].residual3 : a->encoded;
        float *din = l > 0 ? da->blocks[l - 1].residual3 : da->encoded;
        st = tp_block_backward(m, l, da->blocks[l].residual3, in, din);
    }
    if (st == DT_OK)
        tp_vocab_embed_backward(m, B, T);
    return st;
}

void dt_tp_zero_grad(dt_tp_model *m)
{
    m->be->zero(m->grads_memory, m->num_params * sizeof(float));
}

dt_status dt_tp_update(dt_tp_model *m, const dt_adamw_hparams *h, long step)
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
    m->be->adamw(m->params_memory, m->grads_memory, m->adam_m, m->adam_v, m->num_params, step, h);
    return DT_OK;
}
