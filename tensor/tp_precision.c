/*
 * tp_precision.c — bf16 compute on a tensor-parallel share (--precision
 * bf16 with --tp, and so in the 3-D grid), by model/precision.c's rule:
 *
 *   - the parameters stay fp32 masters (AdamW, ZeRO-1's shards and the
 *     checkpoints see nothing new); every layer reads them rounded to bf16
 *     (round to nearest, ties to even): the matmul weights, LayerNorm's
 *     scale and shift, the biases, wte, wpe and the head;
 *   - every layer output that backward reads is rounded as it is written
 *     (ln1, qkv, the attention's output and probabilities, ln2, fch, its
 *     GELU, ln_f), and so are the two row-parallel outputs, once, after g
 *     has summed their fp32 partial sums (and, for the MLP, after the
 *     replicated bias is added): the whole model rounds its attproj and
 *     fcproj as its sgemm writes them, here the all-reduce is the end of
 *     that sum. The all-reduces themselves move fp32;
 *   - the residual stream, LayerNorm's mean and rstd, the logits, the
 *     softmax, the loss, all gradients and every matmul's accumulation
 *     stay fp32.
 *
 * The rounded parameters are a copy of the share (m->compute points into
 * it), refreshed from the masters at the start of each forward: between
 * a forward and its backward nothing writes the masters, so backward
 * reads what forward read, and a checkpoint load, ZeRO-1's gather or a
 * step need no hook. The copy is fp32-wide (4 B per element of the share,
 * where the mixed-precision accounting's bf16 copy would be 2 B) because
 * the portable path's kernels are the fp32 ones.
 *
 * The activations backward reads are STORED as bf16 (2 B), as the whole
 * model stores them (model/precision.c): a block is computed in an fp32
 * workspace of one block (every block's inner tensors point at it,
 * tp_carve_blocks), packed into its bf16 store after its forward and
 * widened back just before its backward (exact: the values are bf16
 * ones), so the bits are those of rounding in place. Each block keeps in
 * fp32 only its LayerNorm statistics and its residual stream; of the
 * activation gradients only the residual stream's is kept per block, the
 * rest live in one block's gradient workspace. A 3-D stage keeps one
 * store per activation slot (micro-batches in flight). Measured on the
 * 865k config, batch 8, tp 2: 0.526x fp32's activation bytes per rank.
 *
 * Cost per forward: one pass over the share's parameters, one over each
 * rounded activation, one pack per block; per backward one unpack per
 * block.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tp_internal.h"

dt_status tp_precision_alloc(dt_tp_model *m, dt_precision p, size_t store, size_t ws,
                             size_t grad_ws)
{
    if (p == DT_PRECISION_FP32 && !m->bf16)
        return DT_OK;
    if (p != DT_PRECISION_BF16 || m->bf16 || m->last_B) {
        snprintf(m->err, sizeof m->err,
                 "tensor parallel rank %d/%d: precision bf16: a share is switched once, from "
                 "fp32 to bf16, before its first forward",
                 m->rank, m->tp);
        return DT_EINVAL;
    }
    m->bf16 = true;
    m->num_store = store;
    m->rounded_memory = m->be->alloc(m->num_params * sizeof(float));
    m->act_ws = m->be->alloc(ws * sizeof(float));
    m->grad_ws = m->be->alloc(grad_ws * sizeof(float));
    m->store_memory = m->be->alloc(store * sizeof(uint16_t));
    m->store = m->store_memory;
    m->compute.blocks = calloc((size_t)m->cfg.L, sizeof(dt_block_params));
    if (!m->rounded_memory || !m->act_ws || !m->grad_ws || !m->store_memory || !m->compute.blocks) {
        snprintf(m->err, sizeof m->err,
                 "tensor parallel rank %d/%d: precision bf16: out of memory for the rounded "
                 "parameters, the workspaces and the store (%zu MiB)",
                 m->rank, m->tp,
                 ((m->num_params + ws + grad_ws) * sizeof(float) + 2 * store) >> 20);
        return DT_ENOMEM;
    }
    return DT_OK;
}

void tp_precision_free(dt_tp_model *m)
{
    void *dev[] = {m->rounded_memory, m->act_ws, m->grad_ws, m->store_memory};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            m->be->free(dev[i]);
    if (m->compute.blocks != m->params.blocks)
        free(m->compute.blocks);
}

void tp_round_params(dt_tp_model *m)
{
    if (m->bf16)
        dt_bf16_round_floats(m->rounded_memory, m->params_memory, m->num_params);
}

void tp_round_acts(const dt_tp_model *m, float *x, size_t n)
{
    if (m->bf16)
        dt_bf16_round_floats(x, x, n);
}

/* ---- the bf16 store of a block's tensors ----------------------------------- */

enum { NUM_STORED = 7 };

/* The tensors of block l backward reads from the store (in the
 * workspace), and their element counts for (B, T); returns their sum. */
static size_t stored(float *f[NUM_STORED], size_t n[NUM_STORED], const dt_tp_model *m, int l,
                     const dt_config *c, int tp, size_t B, size_t T)
{
    size_t N = B * T, C = (size_t)c->C, Cl = C / (size_t)tp;
    size_t att = B * ((size_t)c->H / (size_t)tp) * T * T;
    size_t k[NUM_STORED] = {N * C, 3 * N * Cl, N * Cl, att, N * C, 4 * N * Cl, 4 * N * Cl};
    if (m) {
        const dt_block_acts *x = &m->acts.blocks[l];
        float *p[NUM_STORED] = {x->ln1, x->qkv, x->atty, x->att, x->ln2, x->fch, x->fch_gelu};
        memcpy(f, p, sizeof p);
        memcpy(n, k, sizeof k);
    }
    size_t total = 0;
    for (int i = 0; i < NUM_STORED; i++)
        total += k[i];
    return total;
}

size_t tp_store_block(const dt_config *c, int tp, size_t B, size_t T)
{
    return stored(NULL, NULL, NULL, 0, c, tp, B, T);
}

static void move_block(dt_tp_model *m, int l, int B, int T, bool pack)
{
    float *f[NUM_STORED];
    size_t n[NUM_STORED];
    size_t per = stored(f, n, m, l, &m->cfg, m->tp, (size_t)B, (size_t)T);
    uint16_t *s = m->store + (size_t)(l - m->store_l0) * per;
    for (int i = 0; i < NUM_STORED; i++) {
        if (pack)
            dt_f32_to_bf16_n(s, f[i], n[i]); /* exact: f[i] holds bf16 values */
        else
            dt_bf16_to_f32_n(f[i], s, n[i]);
        s += n[i];
    }
}

void tp_store_pack(dt_tp_model *m, int l, int B, int T)
{
    if (m->bf16)
        move_block(m, l, B, T, true);
}

void tp_store_unpack(dt_tp_model *m, int l, int B, int T)
{
    if (m->bf16)
        move_block(m, l, B, T, false);
}
