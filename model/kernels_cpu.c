/*
 * kernels_cpu.c — the fast CPU forms of MiniGPT's two heavy layers: the
 * linear layer (matmul) and causal self-attention, both through OpenBLAS
 * cblas_sgemm.
 *
 * Idea: every O(n^3) product of the model is a GEMM with the right
 * transpose flags and leading dimensions, so no data is ever copied or
 * transposed by hand. A linear layer stores its weight PyTorch's way,
 * (OC, C), so
 *   forward   out (N,OC)  = inp (N,C) . w^T            sgemm(N, T)
 *   backward  dinp (N,C)  = dout (N,OC) . w (OC,C)     sgemm(N, N)
 *             dw (OC,C)  += dout^T (OC,N) . inp (N,C)  sgemm(T, N)
 * and attention runs, per (sequence, head), on strided views into the qkv
 * rows (leading dimension 3C) and the output rows (leading dimension C).
 *
 * Cost: 2*N*C*OC flops per product; attention 4*T*T*hs per (b, h) each way
 * (the full square: sgemm does not skip the masked upper triangle, which
 * the softmax then zeroes — simpler, and at T <= 64 the waste is small).
 * Results equal the reference loops up to float rounding (summation order
 * differs); tests compare them with a tolerance. (A loop form for short
 * contexts, where each per-head sgemm is mostly call overhead, measured
 * no faster at T = 16 than this: the ragged causal rows vectorise badly.)
 */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "fastmath.h"
#include "model_internal.h"

DT_VECTORIZE
void dt_cpu_matmul_forward(float *out, const float *inp, const float *w,
                           const float *bias, int N, int C, int OC)
{
    float beta = 0.0f;
    if (bias) { /* preload the bias so sgemm adds onto it (beta = 1) */
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp,
                C, w, C, beta, out, OC);
}

DT_VECTORIZE
void dt_cpu_matmul_backward(float *dinp, float *dw, float *dbias,
                            const float *dout, const float *inp,
                            const float *w, int N, int C, int OC)
{
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC,
                    1.0f, dout, OC, w, C, 0.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout,
                OC, inp, C, 1.0f, dw, C);
    if (dbias) /* row by row, so the inner loop is a vector add */
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * OC;
            for (int o = 0; o < OC; o++)
                dbias[o] += d[o];
        }
}

/* Row-wise causal softmax of a (T, T) block of scaled scores, in place:
 * row t keeps columns 0..t, the rest become 0. */
DT_VECTORIZE
static void causal_softmax(float *a, int T)
{
    for (int t = 0; t < T; t++) {
        float *r = a + (size_t)t * T;
        float maxv = r[0];
        for (int t2 = 1; t2 <= t; t2++)
            maxv = r[t2] > maxv ? r[t2] : maxv;
        float sum = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
            r[t2] = dt_fast_expf(r[t2] - maxv);
            sum += r[t2];
        }
        float inv = 1.0f / sum;
        for (int t2 = 0; t2 <= t; t2++)
            r[t2] *= inv;
        for (int t2 = t + 1; t2 < T; t2++)
            r[t2] = 0.0f;
    }
}

void dt_cpu_attention_forward(float *out, float *att, const float *qkv,
                              int B, int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs;
            const float *k = q + C, *v = q + 2 * C;
            float *a = att + ((size_t)b * NH + h) * T * T;
            float *o = out + (size_t)b * T * C + h * hs;
            /* a (T,T) = scale * q (T,hs) . k^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs,
                        scale, q, C3, k, C3, 0.0f, a, T);
            causal_softmax(a, T);
            /* o (T,hs) = a (T,T) . v (T,hs) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T,
                        1.0f, a, T, v, C3, 0.0f, o, C);
        }
}

DT_VECTORIZE
void dt_cpu_attention_backward(float *dqkv, float *scratch,
                               const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            size_t qoff = (size_t)b * T * C3 + h * hs;
            const float *q = qkv + qoff, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + qoff, *dk = dq + C, *dv = dq + 2 * C;
            const float *a = att + ((size_t)b * NH + h) * T * T;
            float *d = scratch + ((size_t)b * NH + h) * T * T;
            const float *dy = dout + (size_t)b * T * C + h * hs;
            /* datt (T,T) = dy (T,hs) . v^T;  dv = a^T . dy */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs,
                        1.0f, dy, C, v, C3, 0.0f, d, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T,
                        1.0f, a, T, dy, C, 0.0f, dv, C3);
            /* softmax backward, scaled: masked entries have a = 0 */
            for (int t = 0; t < T; t++) {
                const float *ar = a + (size_t)t * T;
                float *dr = d + (size_t)t * T;
                float dot = 0.0f;
                for (int t2 = 0; t2 <= t; t2++)
                    dot += ar[t2] * dr[t2];
                for (int t2 = 0; t2 < T; t2++)
                    dr[t2] = ar[t2] * (dr[t2] - dot) * scale;
            }
            /* dq = dpre . k;  dk = dpre^T . q (each (b, h) owns its
             * columns of dqkv, so writing, not adding, is right) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T,
                        1.0f, d, T, k, C3, 0.0f, dq, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T,
                        1.0f, d, T, q, C3, 0.0f, dk, C3);
        }
}

/* ---- element-wise layers with the vectorisable exp / CDF ----------------- */

DT_VECTORIZE
void dt_cpu_gelu_forward(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = inp[i] * dt_fast_normal_cdf(inp[i]);
}

DT_VECTORIZE
void dt_cpu_gelu_backward(float *dinp, const float *dout, const float *inp,
                          size_t n)
{
    const float inv_sqrt_2pi = 0.3989422804014327f;
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float pdf = inv_sqrt_2pi * dt_fast_expf(-0.5f * x * x);
        dinp[i] = dout[i] * (dt_fast_normal_cdf(x) + x * pdf);
    }
}

DT_VECTORIZE
void dt_cpu_crossentropy_forward(float *probs, float *losses,
                                 const float *logits, const int *targets,
                                 int N, int V)
{
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * V;
        float *p = probs + (size_t)n * V;
        float maxv = z[0];
        for (int i = 1; i < V; i++)
            maxv = z[i] > maxv ? z[i] : maxv;
        for (int i = 0; i < V; i++)
            p[i] = dt_fast_expf(z[i] - maxv);
        float sum = 0.0f;
        for (int i = 0; i < V; i++)
            sum += p[i];
        float inv = 1.0f / sum;
        for (int i = 0; i < V; i++)
            p[i] *= inv;
        if (targets)
            losses[n] = logf(sum) + maxv - z[targets[n]];
    }
}
