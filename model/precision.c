/*
 * precision.c — bf16 compute over the fp32 flat layout (--precision bf16).
 *
 * Mixed precision here is a precision of the same model, not a second
 * model: the parameters (the fp32 masters), their gradients and AdamW's
 * state stay fp32 and keep their layout, so DDP buckets, ZeRO shards and
 * checkpoints see nothing new. What changes is what a layer reads:
 *
 *   - every parameter is read rounded to bf16 (round to nearest, ties to
 *     even), in forward and in backward: a matmul's weight (and wte) one
 *     matrix at a time into a workspace of the largest matrix (max(4C·C,
 *     V·C) floats), widened back to fp32 for the fp32 sgemm; LayerNorm's
 *     scale and shift, the biases and wpe into a small workspace (2·max(4,
 *     T)·C floats). The embedding lookup adds round(wte[tok]) +
 *     round(wpe[t]) in fp32. PyTorch's autocast would read the LayerNorm
 *     parameters, biases and embeddings in fp32; we give that up, as
 *     FSDP's param_dtype=bf16 and Megatron's bf16 model do, so that a
 *     parameter gathered in bf16 (ZeRO) and an fp32 master rounded on use
 *     (DDP) are the same value and every mode computes the same bits;
 *   - every activation a layer writes is rounded to bf16 as it is written,
 *     so the next layer, and backward, read the rounded value — except
 *     the residual stream (the embeddings' sum, residual2, residual3),
 *     LayerNorm's mean and rstd and the head's logits, probabilities and
 *     losses, which stay fp32 (softmax and the loss in fp32). The residual
 *     stream is fp32 as PyTorch's autocast keeps it (bf16 + fp32 adds in
 *     fp32): rounded, it loses the small update each block adds (the
 *     task's exact match fell to 99.5% with it rounded, 100% without);
 *   - the activations backward needs of each block are STORED as bf16
 *     (2 bytes): forward computes a block in an fp32 workspace sized for
 *     one block (the recomputation workspace's layout, minigpt.c) and
 *     packs it into the block's bf16 store; backward widens a block's store
 *     back into the workspace just before that block's backward. With
 *     recomputation there is no store: backward recomputes the block into
 *     the workspace from its fp32 input, rounding as forward did, so it
 *     reads the same bits a store would have given back (the rounded
 *     values are exact in bf16) and a bf16 run with --recompute ends with
 *     the bits of the run without it;
 *   - activation gradients stay fp32 but live, as under recomputation, in
 *     one block's gradient workspace (only the residual stream's gradient
 *     is kept per block): nothing outside a block reads a block's inner
 *     gradients but a pipeline's split backward, whose weight half
 *     (DT_BACKWARD_WEIGHT, zero-bubble) recomputes them from the block's
 *     widened store and its kept output gradient, as recomputation's
 *     weight half does (backward.c): one more input-gradient pass per
 *     block instead of a per-slot fp32 copy of every inner gradient, and
 *     the same bits as the whole backward. Activation bytes on the 865k
 *     config: 0.506x fp32's.
 *
 * A pipeline stage keeps one store per activation slot (a micro-batch in
 * flight, stage.c), each sized for the stage's own blocks at (max_B, T)
 * and addressed by the selected slot; the one workspace stays shared. What
 * a stage sends and receives is the residual stream (its input `encoded`
 * and its last block's residual3, and their gradients), which stays fp32:
 * the stages compute what one process computes, so `--pp` in bf16 prints
 * one process's loss table (Megatron's fp32_residual_connection sends
 * fp32 between stages for the same reason). Rounding it on the wire is
 * the pipeline's choice, not the model's (--act-comm bf16,
 * pipeline/act_comm.c).
 *
 * What the parameter buffer holds: under DDP (and on one rank) the fp32
 * masters; under ZeRO the masters are the owners' shards and the buffer
 * (ZeRO-1/2's replica, ZeRO-3's gathered units) holds their bf16
 * roundings, widened to fp32, since ZeRO gathers the parameters in bf16
 * (optim/zero_bf16_params.c, optim/param_units.c). Reading every
 * parameter rounded makes the two the same values: with rank-order sums
 * ZeRO ends with DDP's bits.
 *
 * Why no bf16 copy of the weights (2Ψ): on this portable path the rounded
 * matrix has to be widened to fp32 for sgemm anyway, and rounding on use
 * gives the same bits as a copy refreshed after each step, with nothing to
 * refresh (ZeRO's gathers, a checkpoint load and dt_model_set_params write
 * the buffer directly). A kernel that multiplies bf16 natively
 * (AVX512-BF16) would want the copy.
 *
 * The path: the fp32 kernels with round-to-nearest-even conversions around
 * them, on every CPU (dt_bf16_path says so and whether the CPU could do
 * better). Cost: one extra pass over each activation (rounding) and one
 * pack and one unpack per block and step, plus a rounding pass over each
 * weight matrix per matmul: a bf16 step is slower than fp32's here.
 */
#include <stdio.h>
#include <string.h>

#include "model_internal.h"

/* ---- switching a model to bf16 -------------------------------------------- */

static dt_status refuse(dt_model *m, const char *why)
{
    snprintf(m->err, sizeof m->err, "minigpt: precision bf16: %s", why);
    return DT_EINVAL;
}

dt_status dt_model_set_precision(dt_model *m, dt_precision p)
{
    if (p == DT_PRECISION_FP32 && !m->bf16)
        return DT_OK;
    if (p != DT_PRECISION_BF16 || m->bf16)
        return refuse(m, "a model is switched once, from fp32 to bf16");
    if (strncmp(m->be->name, "cpu", 3) != 0)
        return refuse(m, "the conversions run on host memory: the cpu backends only");
    if (m->last_B)
        return refuse(m, "switch before the first forward");
    const dt_config *c = &m->cfg;
    size_t mat = (size_t)c->C * (size_t)(c->V > 4 * c->C ? c->V : 4 * c->C);
    m->bf16 = true;
    m->weight_ws = m->be->alloc(mat * sizeof(float));
    m->param_ws = m->be->alloc(2 * dt_model_param_ws_half(c) * sizeof(float));
    if (!m->weight_ws || !m->param_ws || dt_model_alloc_acts(m) != DT_OK) {
        snprintf(m->err, sizeof m->err,
                 "minigpt: precision bf16: out of memory for the activations (%zu MiB)",
                 dt_model_activation_bytes(m) >> 20);
        return DT_ENOMEM;
    }
    return DT_OK;
}

const char *dt_bf16_path(void)
{
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    if (__builtin_cpu_supports("avx512bf16"))
        return "portable (round-to-nearest-even conversions around the fp32 kernels; this CPU "
               "has AVX512-BF16, which no kernel here uses yet)";
    return "portable (round-to-nearest-even conversions around the fp32 kernels; this CPU has "
           "no AVX512-BF16)";
#else
    return "portable (round-to-nearest-even conversions around the fp32 kernels)";
#endif
}
