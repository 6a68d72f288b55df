/*
 * activations.c — where a model's activations live, and what they cost.
 *
 * An activation set holds what forward writes and backward reads for one
 * micro-batch: the top-level tensors (encoded, ln_f and its statistics,
 * logits, probabilities, losses, attention scratch) and, per block, the
 * fifteen tensors of dt_block_acts. A gradient set has the same layout
 * for their gradients. A model keeps act_slots activation sets and
 * grad_slots gradient sets (a whole model one of each; a pipeline stage
 * one per micro-batch in flight), each one allocation, carved here into
 * the pointer tables of dt_acts (llm.c's habit: one allocation, a table
 * of pointers into it).
 *
 * Recomputation and bf16 keep less per set: of each block only what
 * backward cannot rebuild (its output, and in bf16 the fp32 statistics
 * and residual2), the rest in one block's fp32 workspace shared by every
 * set (recomputation rebuilds it; bf16 widens it from the block's bf16
 * store, precision.c); of the gradients only those backward writes, in
 * one block's gradient workspace.
 *
 * Cost, per set, N = B·T tokens: N·(16C + H·T + 4) floats a block and
 * about N·(2C + 2V + H·T) at the top (the head's logits and
 * probabilities, the attention scratch);
 * dt_model_activation_bytes sums what is held, the "activations" column
 * of minigpt's memory table. Carving is O(L) pointer arithmetic, done
 * again whenever a forward selects another slot or a smaller (B, T).
 */
#include <string.h>

#include "model_internal.h"

#define NUM_BLOCK_ACTS 15
#define NUM_TOP_ACTS 8

/* Element counts of one activation set for (B, T): the top-level tensors
 * in dt_acts order (a stage that is not the last has no lnf .. losses),
 * and one block's in dt_block_acts order. */
static void act_sizes(size_t top[NUM_TOP_ACTS], size_t blk[NUM_BLOCK_ACTS], const dt_model *m,
                      size_t B, size_t T)
{
    const dt_config *c = &m->cfg;
    size_t N = B * T, C = (size_t)c->C, V = (size_t)c->V;
    size_t att = B * (size_t)c->H * T * T, h = m->l1 == c->L;
    size_t t[NUM_TOP_ACTS] = {N * C, h * N * C, h * N, h * N, h * N * V, h * N * V, h * N, att};
    size_t k[NUM_BLOCK_ACTS] = {N * C, N, N, 3 * N * C, N * C,     att,   N * C, N * C,
                                N * C, N, N, 4 * N * C, 4 * N * C, N * C, N * C};
    memcpy(top, t, sizeof t);
    memcpy(blk, k, sizeof k);
}

/* The block activations whose gradients backward writes (in dt_block_acts
 * order): ln1, qkv, atty, residual2, ln2, fch, fch_gelu and residual3.
 * LayerNorm's statistics, the attention matrix (its gradient goes through
 * the top-level scratch), attproj and fcproj (whose gradients are their
 * outputs') have none. */
static const bool has_grad[NUM_BLOCK_ACTS] = {1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 1};

/* The top-level fields (in dt_acts order) each kind of set touches. A
 * forward set never touches the attention scratch: only attention's
 * backward uses one, the gradient set's. A gradient set never touches
 * ln_f's statistics, the probabilities or the losses: backward reads the
 * forward set's. Under recomputation a set holds only what its kind
 * touches; without it both kinds keep the one layout. */
static const bool fwd_uses[NUM_TOP_ACTS] = {1, 1, 1, 1, 1, 1, 1, 0};
static const bool grad_uses[NUM_TOP_ACTS] = {1, 1, 0, 0, 1, 0, 0, 1};

/* Is top-level field i held by a set (of activations, or with grads of
 * their gradients)? */
static bool top_held(const dt_model *m, int i, bool grads)
{
    return !(m->recompute || m->bf16) || (grads ? grad_uses[i] : fwd_uses[i]);
}

/* Is field i of a block in the recompute (or bf16) workspace (of the
 * activations, or with grads of their gradients)? All but residual3; of
 * the gradients only those backward writes; bf16 keeps its fp32 fields,
 * LayerNorm's statistics and residual2, in the set (the rest goes to its
 * bf16 store, precision.c). */
static bool in_workspace(const dt_model *m, int i, bool grads)
{
    bool fp32 = i == 1 || i == 2 || i == 7 || i == 9 || i == 10;
    return (m->recompute || m->bf16) && i < NUM_BLOCK_ACTS - 1 &&
           (grads ? has_grad[i] : m->recompute || !fp32);
}

/* Points every field of a at its range of base, in the order act_sizes
 * lists them; the blocks outside [l0, l1), absent tensors and the fields
 * a recomputing model's set does not hold (top_held) stay NULL.
 * With recomputation a block's fields in_workspace point into ws, shared
 * by all blocks and sets (the other gradient fields stay NULL). Returns
 * the set's element count (base may be NULL). */
static size_t carve_acts(dt_acts *a, float *base, float *ws, const dt_model *m, size_t B, size_t T,
                         bool grads)
{
    size_t top[NUM_TOP_ACTS], blk[NUM_BLOCK_ACTS], off = 0;
    act_sizes(top, blk, m, B, T);
    float **tp[NUM_TOP_ACTS] = {&a->encoded, &a->lnf,   &a->lnf_mean, &a->lnf_rstd,
                                &a->logits,  &a->probs, &a->losses,   &a->scratch};
    for (int i = 0; i < NUM_TOP_ACTS; i++) {
        size_t n = top_held(m, i, grads) ? top[i] : 0;
        *tp[i] = base && n ? base + off : NULL;
        off += n;
    }
    for (int l = m->l0; l < m->l1; l++) {
        size_t ws_off = 0;
        dt_block_acts *b = &a->blocks[l];
        float **bp[NUM_BLOCK_ACTS] = {&b->ln1,      &b->ln1_mean, &b->ln1_rstd, &b->qkv,
                                      &b->atty,     &b->att,      &b->attproj,  &b->residual2,
                                      &b->ln2,      &b->ln2_mean, &b->ln2_rstd, &b->fch,
                                      &b->fch_gelu, &b->fcproj,   &b->residual3};
        for (int i = 0; i < NUM_BLOCK_ACTS; i++) {
            if (in_workspace(m, i, grads)) {
                *bp[i] = ws ? ws + ws_off : NULL;
                ws_off += blk[i];
            } else if (grads && (m->recompute || m->bf16) && i < NUM_BLOCK_ACTS - 1) {
                *bp[i] = NULL; /* a gradient backward never writes */
            } else {
                *bp[i] = base ? base + off : NULL;
                off += blk[i];
            }
        }
    }
    return off;
}

/* Elements of a recompute workspace (0 without recomputation). */
static size_t workspace_size(const dt_model *m, size_t B, size_t T, bool grads)
{
    size_t top[NUM_TOP_ACTS], blk[NUM_BLOCK_ACTS], n = 0;
    act_sizes(top, blk, m, B, T);
    for (int i = 0; i < NUM_BLOCK_ACTS; i++)
        n += in_workspace(m, i, grads) ? blk[i] : 0;
    return n;
}

size_t dt_model_activation_bytes(const dt_model *m)
{
    size_t sets = (size_t)m->act_slots * m->num_acts + (size_t)m->grad_slots * m->num_grad_acts;
    return (sets + m->num_ws + m->num_grad_ws) * sizeof(float) +
           (size_t)m->act_slots * m->num_bf16 * sizeof(uint16_t);
}

/* Points m->acts and m->grad_acts at the selected sets, laid out for
 * (B, T) so every tensor is contiguous (B, T, ...), and m->inputs,
 * m->targets at the selected slot's tokens. */
void dt_model_carve(dt_model *m, int B, int T)
{
    carve_acts(&m->acts, m->acts_memory + (size_t)m->slot * m->num_acts, m->ws_memory, m, (size_t)B,
               (size_t)T, false);
    carve_acts(&m->grad_acts, m->grad_acts_memory + (size_t)m->grad_slot * m->num_grad_acts,
               m->grad_ws_memory, m, (size_t)B, (size_t)T, true);
    m->inputs = m->slots[m->slot].inputs;
    m->targets = m->slots[m->slot].targets;
}

dt_status dt_model_alloc_acts(dt_model *m)
{
    const dt_backend *be = m->be;
    size_t B = (size_t)m->max_B, T = (size_t)m->cfg.T;
    void *old[] = {m->acts_memory, m->grad_acts_memory, m->ws_memory, m->grad_ws_memory,
                   m->bf16_memory};
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++)
        if (old[i])
            be->free(old[i]);
    m->num_acts = carve_acts(&m->acts, NULL, NULL, m, B, T, false);
    m->num_grad_acts = carve_acts(&m->grad_acts, NULL, NULL, m, B, T, true);
    m->num_ws = workspace_size(m, B, T, false);
    m->num_grad_ws = workspace_size(m, B, T, true);
    m->num_bf16 = m->bf16 && !m->recompute ? dt_bf16_store_size(m) : 0;
    m->ws_slot = m->ws_block = -1;
    m->acts_memory = be->alloc(m->num_acts * sizeof(float) * (size_t)m->act_slots);
    m->grad_acts_memory = be->alloc(m->num_grad_acts * sizeof(float) * (size_t)m->grad_slots);
    m->ws_memory = m->num_ws ? be->alloc(m->num_ws * sizeof(float)) : NULL;
    m->grad_ws_memory = m->num_ws ? be->alloc(m->num_grad_ws * sizeof(float)) : NULL;
    m->bf16_memory = m->num_bf16 ? be->alloc(m->num_bf16 * sizeof(uint16_t) * (size_t)m->act_slots)
                                 : NULL;
    if (!m->acts_memory || !m->grad_acts_memory || (m->num_ws && !m->ws_memory) ||
        (m->num_ws && !m->grad_ws_memory) || (m->num_bf16 && !m->bf16_memory))
        return DT_ENOMEM;
    dt_model_carve(m, m->max_B, m->cfg.T);
    return DT_OK;
}
