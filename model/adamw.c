/*
 * adamw.c — AdamW, exactly PyTorch's torch.optim.AdamW (non-amsgrad,
 * non-foreach), on any contiguous range of the flat buffers.
 *
 * Why a range and not a model: ZeRO-1 runs the same update on the shard a
 * rank owns, [lo, hi) of the flat parameter/gradient buffers, with m and v
 * allocated for that shard only. Every element is updated independently,
 * so running on shards and running on the whole buffer give bitwise the
 * same parameters.
 *
 * Per element, step t >= 1 (PyTorch's order of operations, so results
 * agree to float rounding):
 *   p  = p * (1 - lr * wd)                   decoupled weight decay
 *   m  = b1 * m + (1 - b1) * g
 *   v  = b2 * v + (1 - b2) * g^2
 *   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * Cost: one pass over 4 arrays, ~12 flops per element; memory-bound.
 * Weight decay applies to every element of the range (as AdamW over
 * model.parameters() does); a caller wanting no decay on biases and
 * LayerNorm runs two ranges with different hyperparameters.
 */
#include <math.h>

#include "dt_model.h"
#include "model_internal.h"

dt_adamw_hparams dt_adamw_defaults(float lr)
{
    dt_adamw_hparams h = {.lr = lr,
                          .beta1 = 0.9f,
                          .beta2 = 0.999f,
                          .eps = 1e-8f,
                          .weight_decay = 0.01f};
    return h;
}

DT_VECTORIZE
void dt_adamw_step(float *params, const float *grads, float *m, float *v, size_t n, long step,
                   const dt_adamw_hparams *h)
{
    /* bias corrections in double: b^t for large t loses bits in float */
    double bc1 = 1.0 - pow((double)h->beta1, (double)step);
    double bc2 = 1.0 - pow((double)h->beta2, (double)step);
    float step_size = (float)(h->lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float decay = 1.0f - h->lr * h->weight_decay;
    float b1 = h->beta1, b2 = h->beta2, eps = h->eps;
    for (size_t i = 0; i < n; i++) {
        float g = grads[i];
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        params[i] = params[i] * decay - step_size * mi / denom;
    }
}
