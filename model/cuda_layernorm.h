/*
 * cuda_layernorm.h — LayerNorm (eps 1e-5, biased variance, as PyTorch),
 * forward and backward, as per-thread bodies (see cuda_common.h).
 *
 * Forward: one thread per row (N), two passes over its C values (mean,
 * then variance), as the CPU reference does.
 * Backward splits the reference's loop by who owns the output:
 *   row body     dinp row n (adds: it feeds the residual stream), with the
 *                row's two means of g = dout * w recomputed in the thread;
 *   column body  dw[i], db[i] summed over the N rows in order.
 * With xhat = (x - mean) * rstd:
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
 */
#ifndef DT_CUDA_LAYERNORM_H
#define DT_CUDA_LAYERNORM_H

#include "cuda_common.h"

/* out (N, C) row n; mean, rstd (N) entry n */
static inline DT_HD void dtk_layernorm_forward_row(float *out, float *mean, float *rstd,
                                                   const float *inp, const float *w, const float *b,
                                                   int n, int C)
{
    const float *x = inp + (size_t)n * C;
    float m = 0.0f, v = 0.0f;
    for (int i = 0; i < C; i++)
        m += x[i];
    m /= (float)C;
    for (int i = 0; i < C; i++)
        v += (x[i] - m) * (x[i] - m);
    v /= (float)C;
    float s = 1.0f / sqrtf(v + 1e-5f);
    float *o = out + (size_t)n * C;
    for (int i = 0; i < C; i++)
        o[i] = (x[i] - m) * s * w[i] + b[i];
    mean[n] = m;
    rstd[n] = s;
}

/* dinp (N, C) row n += the LayerNorm input gradient of that row */
static inline DT_HD void dtk_layernorm_backward_row(float *dinp, const float *dout,
                                                    const float *inp, const float *w,
                                                    const float *mean, const float *rstd, int n,
                                                    int C)
{
    const float *x = inp + (size_t)n * C;
    const float *d = dout + (size_t)n * C;
    float *dx = dinp + (size_t)n * C;
    float m = mean[n], s = rstd[n];
    float gmean = 0.0f, gxmean = 0.0f;
    for (int i = 0; i < C; i++) {
        float xhat = (x[i] - m) * s, g = d[i] * w[i];
        gmean += g;
        gxmean += g * xhat;
    }
    gmean /= (float)C;
    gxmean /= (float)C;
    for (int i = 0; i < C; i++) {
        float xhat = (x[i] - m) * s, g = d[i] * w[i];
        dx[i] += s * (g - gmean - xhat * gxmean);
    }
}

/* dw, db (C) entry i += sum over rows of xhat * dout, dout */
static inline DT_HD void dtk_layernorm_backward_col(float *dw, float *db, const float *dout,
                                                    const float *inp, const float *mean,
                                                    const float *rstd, int i, int N, int C)
{
    float w_acc = dw[i], b_acc = db[i];
    for (int n = 0; n < N; n++) {
        size_t k = (size_t)n * C + i;
        float xhat = (inp[k] - mean[n]) * rstd[n];
        b_acc += dout[k];
        w_acc += xhat * dout[k];
    }
    dw[i] = w_acc;
    db[i] = b_acc;
}

#endif /* DT_CUDA_LAYERNORM_H */
