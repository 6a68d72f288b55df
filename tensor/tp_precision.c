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
 * Activations are rounded in place in their fp32 storage: the values are
 * the bf16 ones (widening is exact), the bytes are fp32's. Storing them as
 * bf16 (2 B, as the whole model does) is not built for a share yet.
 *
 * Cost per forward: one pass over the share's parameters, one over each
 * rounded activation; nothing in backward.
 */
#include <stdio.h>
#include <stdlib.h>

#include "tp_internal.h"

dt_status tp_precision_alloc(dt_tp_model *m, dt_precision p)
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
    m->rounded_memory = m->be->alloc(m->num_params * sizeof(float));
    m->compute.blocks = calloc((size_t)m->cfg.L, sizeof(dt_block_params));
    if (!m->rounded_memory || !m->compute.blocks) {
        snprintf(m->err, sizeof m->err,
                 "tensor parallel rank %d/%d: precision bf16: out of memory for the rounded "
                 "parameters (%zu MiB)",
                 m->rank, m->tp, (m->num_params * sizeof(float)) >> 20);
        return DT_ENOMEM;
    }
    m->bf16 = true;
    return DT_OK;
}

void tp_precision_free(dt_tp_model *m)
{
    if (m->rounded_memory)
        m->be->free(m->rounded_memory);
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
