/*
 * tp_stage.c — a tensor-parallel share of one pipeline stage (dt_tp_stage.h):
 * the rank of a 3-D run. The story is tp_model.c's, cut to blocks
 * [l0, l1):
 *
 *   first stage:  encoded = g(wte_r[x]) + wpe            tp_vocab.c
 *   otherwise:    encoded = what the stage before sent (the executor
 *                 receives it into dt_tp_stage_input)
 *   blocks l0 .. l1-1, each with its f and g              tp_block.c
 *   last stage:   logits_r = f(LN(residual)) . lm_head_r^T, the parallel
 *                 cross-entropy                           tp_vocab.c
 *   otherwise:    the last block's residual3 is the output sent on
 *
 * and backward the mirror, from the cross-entropy (last stage) or the
 * gradient the stage after sent (into dt_tp_stage_output_grad), down to
 * the gradient of `encoded`, which is sent back (or, on the first stage,
 * added into the embeddings).
 *
 * The tensor layer's block and vocabulary functions work on a
 * dt_tp_model; the stage keeps one (core) whose parameter pointers cover
 * only the owned tensors (the rest NULL) and whose activation pointers
 * are re-pointed at the selected set by dt_tp_stage_select. The same
 * kernels in the same order as a whole-model share: a micro-batch's
 * gradients are bitwise those of dt_tp_forward / dt_tp_backward.
 *
 * Memory: the share's range [lo, hi) for parameters, gradients and AdamW's
 * m and v (16 B per element), and act_slots + grad_slots activation sets
 * of the stage's blocks only, all fixed after create.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_tp_stage.h"
#include "tp_internal.h"

static dt_status fail(dt_tp_stage *s, dt_status st, const char *what)
{
    snprintf(s->core.err, sizeof s->core.err, "tensor parallel rank %d/%d, blocks [%d, %d): %s",
             s->core.rank, s->core.tp, s->l0, s->l1, what);
    return st;
}

static bool is_first(const dt_tp_stage *s)
{
    return s->l0 == 0;
}

static bool is_last(const dt_tp_stage *s)
{
    return s->l1 == s->core.cfg.L;
}

/* Points a's tensors at base for (max_B, T), the stage's blocks only;
 * returns the element count (base may be NULL). ln_f, the logits and the
 * losses exist on the last stage only. */
static size_t carve_set(dt_acts *a, float *base, const dt_tp_stage *s, float *ws, bool grads)
{
    const dt_config *c = &s->core.cfg;
    size_t tp = (size_t)s->core.tp, N = (size_t)s->core.max_B * (size_t)c->T, C = (size_t)c->C;
    size_t Vl = (size_t)dt_tp_vocab_rows(c, s->core.tp), last = is_last(s);
    size_t att = (size_t)s->core.max_B * ((size_t)c->H / tp) * (size_t)c->T * (size_t)c->T;
    size_t top[8] = {N * C,         last * N * C,  last * N, last * N,
                     last * N * Vl, last * N * Vl, last * N, att};
    float **top_ptr[8] = {&a->encoded, &a->lnf,   &a->lnf_mean, &a->lnf_rstd,
                          &a->logits,  &a->probs, &a->losses,   &a->scratch};
    size_t off = 0;
    for (int i = 0; i < 8; i++) {
        *top_ptr[i] = base && top[i] ? base + off : NULL;
        off += top[i];
    }
    return tp_carve_blocks(a, base, off, s->l0, s->l1, c, s->core.tp, (size_t)s->core.max_B,
                           (size_t)c->T, ws, grads);
}

/* The owned tensors' pointers into base, which holds the share's
 * [lo, hi); the others NULL. */
static void point_params(dt_params *p, float *base, const dt_tp_stage *s)
{
    const dt_tp_tensor *t = s->core.tensors;
    int L = s->core.cfg.L, tail = 2 + 10 * L;
#define AT(i) (base + (t[i].local.offset - s->lo))
    p->wte = is_first(s) ? AT(0) : NULL;
    p->wpe = is_first(s) ? AT(1) : NULL;
    for (int l = s->l0; l < s->l1; l++) {
        dt_block_params *b = &p->blocks[l];
        float **f[10] = {&b->ln1w, &b->ln1b, &b->qkvw, &b->attprojw, &b->ln2w,
                         &b->ln2b, &b->fcw,  &b->fcb,  &b->fcprojw,  &b->fcprojb};
        for (int k = 0; k < 10; k++)
            *f[k] = AT(2 + 10 * l + k);
    }
    p->lnfw = is_last(s) ? AT(tail) : NULL;
    p->lnfb = is_last(s) ? AT(tail + 1) : NULL;
    p->lm_head = is_last(s) ? AT(tail + 2) : NULL;
#undef AT
}

/* [lo, hi): from the first owned tensor to the end of the last. */
static void find_range(dt_tp_stage *s)
{
    const dt_tp_tensor *t = s->core.tensors;
    int L = s->core.cfg.L, first = is_first(s) ? 0 : 2 + 10 * s->l0;
    int last = is_last(s) ? s->core.num_tensors - 1 : 2 + 10 * s->l1 - 1;
    s->lo = t[first].local.offset;
    s->hi = t[last].local.offset + t[last].local.numel;
    (void)L;
}

static dt_status alloc_host(dt_tp_stage *s)
{
    dt_tp_model *m = &s->core;
    size_t L = (size_t)m->cfg.L, tok = (size_t)m->max_B * (size_t)m->cfg.T;
    m->num_tensors = dt_tp_layout_num_tensors(&m->cfg);
    m->tensors = calloc((size_t)m->num_tensors, sizeof *m->tensors);
    m->params.blocks = calloc(L, sizeof(dt_block_params));
    m->grads.blocks = calloc(L, sizeof(dt_block_params));
    m->acts.blocks = calloc(L, sizeof(dt_block_acts));
    m->grad_acts.blocks = calloc(L, sizeof(dt_block_acts));
    m->ce_stats = calloc(3 * tok, sizeof(float));
    s->tokens = calloc(2 * tok * (size_t)s->act_slots, sizeof(int));
    s->shape = calloc(2 * (size_t)s->act_slots, sizeof(int));
    if (!m->tensors || !m->params.blocks || !m->grads.blocks || !m->acts.blocks ||
        !m->grad_acts.blocks || !m->ce_stats || !s->tokens || !s->shape ||
        dt_tp_layout_build(m->tensors, &m->cfg, m->tp) < 0)
        return fail(s, DT_ENOMEM, "create: out of host memory");
    return DT_OK;
}

static dt_status check_args(dt_tp_stage *s, const dt_backend *be, int max_B)
{
    dt_tp_model *m = &s->core;
    if (!m->comm || !be || max_B < 1 || s->act_slots < 1 || s->grad_slots < 1)
        return fail(s, DT_EINVAL,
                    "create: needs a tp communicator, a backend, max_B >= 1 "
                    "and a set of each kind at least");
    if (s->l0 < 0 || s->l1 <= s->l0 || s->l1 > m->cfg.L)
        return fail(s, DT_EINVAL, "create: not a block range of the model");
    if (strcmp(be->name, "cuda") == 0)
        return fail(s, DT_EINVAL, "create: the cuda backend is not supported (host memory only)");
    if (dt_tp_config_check(&m->cfg, m->tp, m->err, sizeof m->err) != DT_OK)
        return DT_EINVAL;
    return DT_OK;
}

dt_status dt_tp_stage_create(dt_tp_stage **out, const dt_config *cfg, const dt_backend *be,
                             int max_B, int l0, int l1, int act_slots, int grad_slots,
                             dt_comm *tp_comm)
{
    dt_tp_stage *s = calloc(1, sizeof *s);
    *out = s;
    if (!s)
        return DT_ENOMEM;
    dt_tp_model *m = &s->core;
    *s = (dt_tp_stage){.l0 = l0, .l1 = l1, .act_slots = act_slots, .grad_slots = grad_slots};
    m->cfg = *cfg;
    m->be = be;
    m->comm = tp_comm;
    m->max_B = max_B;
    m->tp = tp_comm ? dt_comm_size(tp_comm) : 0;
    m->rank = tp_comm ? dt_comm_rank(tp_comm) : 0;
    dt_status st = check_args(s, be, max_B);
    if (st != DT_OK || (st = alloc_host(s)) != DT_OK)
        return st;
    find_range(s);
    m->num_params = s->hi - s->lo;
    s->set_floats = carve_set(&m->acts, NULL, s, NULL, false);
    s->grad_floats = s->set_floats;
    size_t bp = m->num_params * sizeof(float);
    m->params_memory = be->alloc(bp);
    m->grads_memory = be->alloc(bp);
    s->act_sets = be->alloc((size_t)act_slots * s->set_floats * sizeof(float));
    s->grad_sets = be->alloc((size_t)grad_slots * s->grad_floats * sizeof(float));
    if (!m->params_memory || !m->grads_memory || !s->act_sets || !s->grad_sets)
        return fail(s, DT_ENOMEM, "create: the backend could not allocate the stage's share");
    point_params(&m->params, m->params_memory, s);
    point_params(&m->grads, m->grads_memory, s);
    m->compute = m->params;
    dt_tp_stage_select(s, 0, 0);
    return DT_OK;
}

/* One slot's bf16 store: the stage's blocks at (max_B, T). */
static size_t slot_store(const dt_tp_stage *s)
{
    const dt_tp_model *m = &s->core;
    return (size_t)(s->l1 - s->l0) *
           tp_store_block(&m->cfg, m->tp, (size_t)m->max_B, (size_t)m->cfg.T);
}

/* bf16: the sets shrink to what each block keeps in fp32; a store per
 * activation slot holds the rest (tp_precision.c). */
dt_status dt_tp_stage_set_precision(dt_tp_stage *s, dt_precision p)
{
    dt_tp_model *m = &s->core;
    dt_status st = tp_precision_switch(m, p, (size_t)s->act_slots * slot_store(s));
    if (st != DT_OK || !m->bf16)
        return st;
    point_params(&m->compute, m->rounded_memory, s);
    m->be->free(s->act_sets);
    m->be->free(s->grad_sets);
    s->set_floats = carve_set(&m->acts, NULL, s, m->act_ws, false);
    s->grad_floats = carve_set(&m->grad_acts, NULL, s, m->grad_ws, true);
    s->act_sets = m->be->alloc((size_t)s->act_slots * s->set_floats * sizeof(float));
    s->grad_sets = m->be->alloc((size_t)s->grad_slots * s->grad_floats * sizeof(float));
    if (!s->act_sets || !s->grad_sets)
        return fail(s, DT_ENOMEM, "precision bf16: out of memory for the activation sets");
    m->store_l0 = s->l0;
    dt_tp_stage_select(s, s->slot, s->grad_slot);
    return DT_OK;
}

size_t dt_tp_stage_activation_bytes(const dt_tp_stage *s)
{
    const dt_tp_model *m = &s->core;
    size_t sets = (size_t)s->act_slots * s->set_floats + (size_t)s->grad_slots * s->grad_floats;
    return (sets + tp_workspace_floats(m)) * sizeof(float) + m->num_store * sizeof(uint16_t);
}

void dt_tp_stage_destroy(dt_tp_stage *s)
{
    if (!s)
        return;
    dt_tp_model *m = &s->core;
    void *dev[] = {m->params_memory, m->grads_memory, m->adam_m,
                   m->adam_v,        s->act_sets,     s->grad_sets};
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
    free(s->tokens);
    free(s->shape);
    free(s);
}

const char *dt_tp_stage_error(const dt_tp_stage *s)
{
    return s ? s->core.err : "tensor parallel stage: out of memory";
}

dt_status dt_tp_stage_init(dt_tp_stage *s, uint64_t seed)
{
    dt_tp_model *m = &s->core;
    size_t share = dt_tp_num_params(&m->cfg, m->tp);
    float *host = malloc(share * sizeof(float));
    if (!host || dt_tp_layout_init(host, m->tensors, &m->cfg, m->tp, m->rank, seed) != 0) {
        free(host);
        return fail(s, DT_ENOMEM, "init: out of host memory");
    }
    m->be->from_host(m->params_memory, host + s->lo, m->num_params * sizeof(float));
    free(host);
    return DT_OK;
}

void dt_tp_stage_select(dt_tp_stage *s, int slot, int grad_slot)
{
    dt_tp_model *m = &s->core;
    size_t tok = (size_t)m->max_B * (size_t)m->cfg.T;
    s->slot = slot;
    s->grad_slot = grad_slot;
    carve_set(&m->acts, s->act_sets + (size_t)slot * s->set_floats, s, m->act_ws, false);
    carve_set(&m->grad_acts, s->grad_sets + (size_t)grad_slot * s->grad_floats, s, m->grad_ws,
              true);
    if (m->bf16)
        m->store = m->store_memory + (size_t)slot * slot_store(s);
    m->inputs = s->tokens + 2 * tok * (size_t)slot;
    m->targets = m->inputs + tok;
}

float *dt_tp_stage_input(dt_tp_stage *s)
{
    return s->core.acts.encoded;
}

const float *dt_tp_stage_output(const dt_tp_stage *s)
{
    return s->core.acts.blocks[s->l1 - 1].residual3;
}

float *dt_tp_stage_output_grad(dt_tp_stage *s)
{
    return s->core.grad_acts.blocks[s->l1 - 1].residual3;
}

const float *dt_tp_stage_input_grad(const dt_tp_stage *s)
{
    return s->core.grad_acts.encoded;
}

/* The tokens of a forward, copied into the selected set (the vocabulary
 * layers read them there, again in backward). */
static dt_status take_tokens(dt_tp_stage *s, const int *inputs, const int *targets, int N)
{
    dt_tp_model *m = &s->core;
    if ((is_first(s) && !inputs) || (is_last(s) && !targets))
        return fail(s, DT_EINVAL,
                    is_first(s) && !inputs ? "forward: the first stage needs inputs"
                                           : "forward: the last stage needs targets");
    for (int i = 0; i < N; i++)
        if ((is_first(s) && (inputs[i] < 0 || inputs[i] >= m->cfg.V)) ||
            (is_last(s) && (targets[i] < 0 || targets[i] >= m->cfg.V))) {
            char msg[128];
            snprintf(msg, sizeof msg,
                     "forward: token %d is not an id of this model (vocabulary %d)", i, m->cfg.V);
            return fail(s, DT_EINVAL, msg);
        }
    if (is_first(s))
        memcpy(m->inputs, inputs, (size_t)N * sizeof(int));
    if (is_last(s))
        memcpy(m->targets, targets, (size_t)N * sizeof(int));
    return DT_OK;
}

dt_status dt_tp_stage_forward(dt_tp_stage *s, const int *inputs, const int *targets, int B, int T,
                              float *loss)
{
    dt_tp_model *m = &s->core;
    const dt_backend *be = m->be;
    int C = m->cfg.C, N = B * T;
    if (B < 1 || B > m->max_B || T < 1 || T > m->cfg.T)
        return fail(s, DT_EINVAL, "forward: the batch does not fit the allocation");
    dt_status st = take_tokens(s, inputs, targets, N);
    if (st != DT_OK)
        return st;
    s->shape[2 * s->slot] = B;
    s->shape[2 * s->slot + 1] = T;
    tp_round_params(m);
    if (is_first(s) && (st = tp_vocab_embed_forward(m, B, T)) != DT_OK)
        return st;
    const float *residual = m->acts.encoded;
    for (int l = s->l0; l < s->l1 && st == DT_OK; l++) {
        st = tp_block_forward(m, l, residual, B, T);
        residual = m->acts.blocks[l].residual3;
    }
    if (st != DT_OK || !is_last(s))
        return st;
    dt_acts *a = &m->acts;
    be->layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, residual, m->compute.lnfw,
                          m->compute.lnfb, N, C);
    tp_round_acts(m, a->lnf, (size_t)N * C);
    be->matmul_forward(a->logits, a->lnf, m->compute.lm_head, NULL, N, C, tp_vocab_of(m).rows);
    if ((st = tp_vocab_crossentropy_forward(m, 1, N)) != DT_OK)
        return st;
    if (loss)
        *loss = m->mean_loss;
    return DT_OK;
}

/* The last stage's head: cross-entropy, lm_head, f, ln_f backward into
 * the last block's residual gradient. */
static dt_status head_backward(dt_tp_stage *s, float dloss, int N)
{
    dt_tp_model *m = &s->core;
    const dt_backend *be = m->be;
    int C = m->cfg.C, L = m->cfg.L;
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
    return DT_OK;
}

dt_status dt_tp_stage_backward(dt_tp_stage *s, float dloss)
{
    dt_tp_model *m = &s->core;
    int B = s->shape[2 * s->slot], T = s->shape[2 * s->slot + 1];
    if (B < 1)
        return fail(s, DT_EINVAL, "backward: the selected set holds no forward");
    m->last_B = B;
    m->last_T = T;
    dt_acts *a = &m->acts, *da = &m->grad_acts;
    dt_status st = is_last(s) ? head_backward(s, dloss, B * T) : DT_OK;
    for (int l = s->l1 - 1; l >= s->l0 && st == DT_OK; l--) {
        const float *in = l > s->l0 ? a->blocks[l - 1].residual3 : a->encoded;
        float *din = l > s->l0 ? da->blocks[l - 1].residual3 : da->encoded;
        st = tp_block_backward(m, l, da->blocks[l].residual3, in, din);
    }
    if (st == DT_OK && is_first(s))
        tp_vocab_embed_backward(m, B, T);
    return st;
}

void dt_tp_stage_zero_grad(dt_tp_stage *s)
{
    s->core.be->zero(s->core.grads_memory, s->core.num_params * sizeof(float));
}

dt_status dt_tp_stage_update(dt_tp_stage *s, const dt_adamw_hparams *h, long step)
{
    return dt_tp_update(&s->core, h, step); /* its message names the tp rank */
}
