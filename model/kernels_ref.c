/*
 * kernels_ref.c — MiniGPT's layers as plain loops, forward and backward.
 *
 * This file is the model's mathematics in its most readable form, in the
 * order data flows: encoder, layernorm, matmul, attention, gelu, residual,
 * softmax + cross-entropy. Every function follows llm.c's conventions:
 * outputs first, inputs next, dimensions last. Backward ADDS into
 * parameter gradients (callers zero them once per step, and gradient
 * accumulation is several backward calls). Activation gradients are
 * written, not added (so nothing needs zeroing per step), except where two
 * paths meet — the residual stream: layernorm and encoder backward add
 * into dinp.
 *
 * The element-wise and row-wise layers here are also what the fast CPU
 * backend uses (they cost O(N*C), next to the O(N*C*C) matmuls). The
 * matmul and attention loops are the reference that the GEMM versions in
 * kernels_cpu.c are tested against; they are O(N*C*OC) scalar loops and
 * slow by design.
 *
 * Shapes: N = B*T rows. qkv rows are [q (C) | k (C) | v (C)]; head h of
 * q is columns h*hs .. h*hs+hs-1 with hs = C/NH (PyTorch's split + view).
 */
#include <math.h>
#include <string.h>

#include "model_internal.h"

/* ---- encoder: token + position embedding ---------------------------------- */

DT_VECTORIZE
void dt_ref_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                            int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *we = wte + (size_t)inp[b * T + t] * C;
            const float *pe = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++)
                o[i] = we[i] + pe[i];
        }
}

DT_VECTORIZE
void dt_ref_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                             int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            float *dwe = dwte + (size_t)inp[b * T + t] * C;
            float *dpe = dwpe + (size_t)t * C;
            for (int i = 0; i < C; i++) {
                dwe[i] += d[i];
                dpe[i] += d[i];
            }
        }
}

/* ---- layernorm (eps 1e-5, biased variance, as PyTorch) --------------------- */

DT_VECTORIZE
void dt_ref_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C)
{
    for (int n = 0; n < N; n++) {
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
}

/* With xhat = (x - mean) * rstd and g = dout * w:
 * dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). dinp NULL skips dx,
 * dw NULL skips dw and db (a split backward asks for one half). */
DT_VECTORIZE
void dt_ref_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        const float *d = dout + (size_t)n * C;
        float *dx = dinp ? dinp + (size_t)n * C : NULL;
        float m = mean[n], s = rstd[n];
        float gmean = 0.0f, gxmean = 0.0f;
        for (int i = 0; dx && i < C; i++) {
            float xhat = (x[i] - m) * s, g = d[i] * w[i];
            gmean += g;
            gxmean += g * xhat;
        }
        gmean /= (float)C;
        gxmean /= (float)C;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - m) * s, g = d[i] * w[i];
            if (dw) {
                db[i] += d[i];
                dw[i] += xhat * d[i];
            }
            if (dx)
                dx[i] += s * (g - gmean - xhat * gxmean);
        }
    }
}

/* ---- matmul (reference) ----------------------------------------------------- */

void dt_ref_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                           int C, int OC)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            float acc = bias ? bias[o] : 0.0f;
            for (int i = 0; i < C; i++)
                acc += inp[(size_t)n * C + i] * w[(size_t)o * C + i];
            out[(size_t)n * OC + o] = acc;
        }
}

void dt_ref_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC)
{
    if (dinp)
        memset(dinp, 0, (size_t)N * C * sizeof(float));
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            float d = dout[(size_t)n * OC + o];
            for (int i = 0; i < C; i++) {
                if (dinp)
                    dinp[(size_t)n * C + i] += d * w[(size_t)o * C + i];
                if (dw)
                    dw[(size_t)o * C + i] += d * inp[(size_t)n * C + i];
            }
            if (dbias)
                dbias[o] += d;
        }
}

/* ---- causal self-attention (reference) -------------------------------------- */

void dt_ref_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                float *a = att + (((size_t)b * NH + h) * T + t) * T;
                float maxv = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * C3 + C + h * hs;
                    float dot = 0.0f;
                    for (int i = 0; i < hs; i++)
                        dot += q[i] * k[i];
                    a[t2] = dot * scale;
                    if (a[t2] > maxv)
                        maxv = a[t2];
                }
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    a[t2] = expf(a[t2] - maxv);
                    sum += a[t2];
                }
                for (int t2 = 0; t2 < T; t2++)
                    a[t2] = t2 <= t ? a[t2] / sum : 0.0f;
                float *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++)
                    o[i] = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++)
                        o[i] += a[t2] * v[i];
                }
            }
}

/* Softmax backward: dpre[t2] = att[t2] * (datt[t2] - sum_j att[j] datt[j]).
 * scratch holds datt, one row (T) per (b, h, t). */
void dt_ref_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    memset(dqkv, 0, (size_t)B * T * C3 * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                size_t row = ((size_t)b * NH + h) * T + t;
                const float *a = att + row * T;
                float *datt = scratch + row * T;
                const float *dy = dout + ((size_t)b * T + t) * C + h * hs;
                const float *q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                float *dq = dqkv + ((size_t)b * T + t) * C3 + h * hs;
                float dot_ad = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    size_t r2 = ((size_t)b * T + t2) * C3 + h * hs;
                    const float *v = qkv + r2 + 2 * C;
                    float *dv = dqkv + r2 + 2 * C;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) {
                        s += v[i] * dy[i];
                        dv[i] += a[t2] * dy[i];
                    }
                    datt[t2] = s;
                    dot_ad += a[t2] * s;
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    size_t r2 = ((size_t)b * T + t2) * C3 + h * hs;
                    const float *k = qkv + r2 + C;
                    float *dk = dqkv + r2 + C;
                    float dpre = a[t2] * (datt[t2] - dot_ad) * scale;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += dpre * k[i];
                        dk[i] += dpre * q[i];
                    }
                }
            }
}

/* ---- GELU, erf form (PyTorch's default approximate='none') ----------------- */

void dt_ref_gelu_forward(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
    }
}

/* d/dx x*Phi(x) = Phi(x) + x*phi(x) */
void dt_ref_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n)
{
    const float inv_sqrt_2pi = 0.3989422804014327f;
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float cdf = 0.5f * (1.0f + erff(x * (float)M_SQRT1_2));
        float pdf = inv_sqrt_2pi * expf(-0.5f * x * x);
        dinp[i] = dout[i] * (cdf + x * pdf);
    }
}

DT_VECTORIZE
void dt_ref_residual_forward(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

/* ---- softmax + cross-entropy ---------------------------------------------- */

void dt_ref_crossentropy_forward(float *probs, float *losses, const float *logits,
                                 const int *targets, int N, int V)
{
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * V;
        float *p = probs + (size_t)n * V;
        float maxv = z[0];
        for (int i = 1; i < V; i++)
            maxv = z[i] > maxv ? z[i] : maxv;
        float sum = 0.0f;
        for (int i = 0; i < V; i++) {
            p[i] = expf(z[i] - maxv);
            sum += p[i];
        }
        float inv = 1.0f / sum;
        for (int i = 0; i < V; i++)
            p[i] *= inv;
        /* log-sum-exp form: exact even where probs[target] underflows */
        if (targets)
            losses[n] = logf(sum) + maxv - z[targets[n]];
    }
}

DT_VECTORIZE
void dt_ref_crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                                  float dloss, int N, int V)
{
    float scale = dloss / (float)N;
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * V;
        float *d = dlogits + (size_t)n * V;
        for (int i = 0; i < V; i++)
            d[i] = p[i] * scale;
        d[targets[n]] -= scale;
    }
}
