/*
 * cuda_elementwise.h — GELU (erf form, PyTorch's approximate='none') and
 * the residual add, forward and backward, one thread per element (see
 * cuda_common.h). The residual's backward is a copy (the model calls the
 * backend's copy), so it has no body here.
 */
#ifndef DT_CUDA_ELEMENTWISE_H
#define DT_CUDA_ELEMENTWISE_H

#include "cuda_common.h"

#define DTK_SQRT1_2 0.70710678118654752f
#define DTK_INV_SQRT_2PI 0.3989422804014327f

/* out[i] = x * Phi(x) */
static inline DT_HD void dtk_gelu_forward_elem(float *out, const float *inp, size_t i)
{
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + erff(x * DTK_SQRT1_2));
}

/* dinp[i] = dout[i] * (Phi(x) + x * phi(x)) */
static inline DT_HD void dtk_gelu_backward_elem(float *dinp, const float *dout, const float *inp,
                                                size_t i)
{
    float x = inp[i];
    float cdf = 0.5f * (1.0f + erff(x * DTK_SQRT1_2));
    float pdf = DTK_INV_SQRT_2PI * expf(-0.5f * x * x);
    dinp[i] = dout[i] * (cdf + x * pdf);
}

static inline DT_HD void dtk_residual_forward_elem(float *out, const float *a, const float *b,
                                                   size_t i)
{
    out[i] = a[i] + b[i];
}

#endif /* DT_CUDA_ELEMENTWISE_H */
