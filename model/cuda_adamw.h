/*
 * cuda_adamw.h — AdamW (PyTorch's formula, as model/adamw.c), one thread
 * per element (see cuda_common.h). The per-step constants (bias
 * corrections in double, then rounded) are computed once on the host by
 * dtk_adamw_consts_of, so every element sees the same floats as the CPU's.
 */
#ifndef DT_CUDA_ADAMW_H
#define DT_CUDA_ADAMW_H

#include "cuda_common.h"

typedef struct dtk_adamw_consts {
    float step_size; /* lr / (1 - b1^step) */
    float bc2_sqrt;  /* sqrt(1 - b2^step) */
    float decay;     /* 1 - lr * wd */
    float b1, b2, eps;
} dtk_adamw_consts;

/* Host only: the constants of step `step` (>= 1). */
static inline dtk_adamw_consts dtk_adamw_consts_of(float lr, float beta1, float beta2, float eps,
                                                   float weight_decay, long step)
{
    double bc1 = 1.0 - pow((double)beta1, (double)step);
    double bc2 = 1.0 - pow((double)beta2, (double)step);
    dtk_adamw_consts k;
    k.step_size = (float)(lr / bc1);
    k.bc2_sqrt = (float)sqrt(bc2);
    k.decay = 1.0f - lr * weight_decay;
    k.b1 = beta1;
    k.b2 = beta2;
    k.eps = eps;
    return k;
}

static inline DT_HD void dtk_adamw_elem(float *params, const float *grads, float *m, float *v,
                                        dtk_adamw_consts k, size_t i)
{
    float g = grads[i];
    float mi = k.b1 * m[i] + (1.0f - k.b1) * g;
    float vi = k.b2 * v[i] + (1.0f - k.b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float denom = sqrtf(vi) / k.bc2_sqrt + k.eps;
    params[i] = params[i] * k.decay - k.step_size * mi / denom;
}

#endif /* DT_CUDA_ADAMW_H */
