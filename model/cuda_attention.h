/*
 * cuda_attention.h — causal self-attention (softmax(q.k / sqrt(hs)) . v per
 * head), forward and backward, as per-thread bodies (see cuda_common.h).
 *
 * qkv (B, T, 3C) rows are [q | k | v]; head h is columns h*hs .. h*hs+hs-1
 * of each, hs = C / NH. att (B, NH, T, T) keeps the softmax for backward.
 * A "row" is one (b, h, t): index r = (b*NH + h)*T + t, B*NH*T of them.
 *
 * Forward: one thread per row (query t) computes its T scores, the
 * softmax (max-subtracted) and the weighted sum of values: O(T*hs) each.
 *
 * Backward, in two passes so that every output has one owner (the CPU
 * reference scatters into dk and dv of earlier positions from each query
 * row, which would race across threads):
 *   query pass  thread (b, h, t): datt[t2] = v[t2].dy[t]; the softmax
 *               backward dpre[t2] = att[t2] * (datt[t2] - sum_j att[j]
 *               datt[j]) * scale, kept in scratch (B, NH, T, T); and
 *               dq[t] = sum_t2 dpre[t2] k[t2];
 *   key pass    thread (b, h, t2): dk[t2] = sum_{t >= t2} dpre[t][t2] q[t]
 *               and dv[t2] = sum_{t >= t2} att[t][t2] dy[t].
 * Each writes (not adds) its slice of dqkv, so dqkv needs no zeroing.
 */
#ifndef DT_CUDA_ATTENTION_H
#define DT_CUDA_ATTENTION_H

#include "cuda_common.h"

/* out (B, T, C) head h of position t; att (B, NH, T, T) row r */
static inline DT_HD void dtk_attention_forward_row(float *out, float *att, const float *qkv,
                                                   size_t r, int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;
    int t = (int)(r % (size_t)T), h = (int)(r / (size_t)T % (size_t)NH);
    size_t b = r / ((size_t)T * NH);
    float scale = 1.0f / sqrtf((float)hs);
    const float *q = qkv + (b * T + t) * C3 + h * hs;
    float *a = att + r * T;
    float maxv = -INFINITY;
    for (int t2 = 0; t2 <= t; t2++) {
        const float *k = qkv + (b * T + t2) * C3 + C + h * hs;
        float dot = 0.0f;
        for (int i = 0; i < hs; i++)
            dot += q[i] * k[i];
        a[t2] = dot * scale;
        maxv = a[t2] > maxv ? a[t2] : maxv;
    }
    float sum = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) {
        a[t2] = expf(a[t2] - maxv);
        sum += a[t2];
    }
    for (int t2 = 0; t2 < T; t2++)
        a[t2] = t2 <= t ? a[t2] / sum : 0.0f;
    float *o = out + (b * T + t) * C + h * hs;
    for (int i = 0; i < hs; i++) {
        float acc = 0.0f;
        for (int t2 = 0; t2 <= t; t2++)
            acc += a[t2] * qkv[(b * T + t2) * C3 + 2 * C + h * hs + i];
        o[i] = acc;
    }
}

/* query pass: dqkv's q slice of (b, t, h); scratch row r = dpre */
static inline DT_HD void dtk_attention_backward_query_row(float *dqkv, float *scratch,
                                                          const float *dout, const float *qkv,
                                                          const float *att, size_t r, int T, int C,
                                                          int NH)
{
    int hs = C / NH, C3 = 3 * C;
    int t = (int)(r % (size_t)T), h = (int)(r / (size_t)T % (size_t)NH);
    size_t b = r / ((size_t)T * NH);
    float scale = 1.0f / sqrtf((float)hs);
    const float *a = att + r * T;
    float *dpre = scratch + r * T;
    const float *dy = dout + (b * T + t) * C + h * hs;
    float dot_ad = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) {
        const float *v = qkv + (b * T + t2) * C3 + 2 * C + h * hs;
        float s = 0.0f;
        for (int i = 0; i < hs; i++)
            s += v[i] * dy[i];
        dpre[t2] = s; /* datt for now */
        dot_ad += a[t2] * s;
    }
    for (int t2 = 0; t2 < T; t2++)
        dpre[t2] = t2 <= t ? a[t2] * (dpre[t2] - dot_ad) * scale : 0.0f;
    float *dq = dqkv + (b * T + t) * C3 + h * hs;
    for (int i = 0; i < hs; i++) {
        float acc = 0.0f;
        for (int t2 = 0; t2 <= t; t2++)
            acc += dpre[t2] * qkv[(b * T + t2) * C3 + C + h * hs + i];
        dq[i] = acc;
    }
}

/* key pass: dqkv's k and v slices of (b, t2, h), row r = (b, h, t2);
 * reads the query pass's dpre from scratch */
static inline DT_HD void dtk_attention_backward_key_row(float *dqkv, const float *scratch,
                                                        const float *dout, const float *qkv,
                                                        const float *att, size_t r, int T, int C,
                                                        int NH)
{
    int hs = C / NH, C3 = 3 * C;
    int t2 = (int)(r % (size_t)T);
    int h = (int)(r / (size_t)T % (size_t)NH);
    size_t b = r / ((size_t)T * NH), head_rows = r - (size_t)t2; /* (b,h,0) */
    float *dk = dqkv + (b * T + t2) * C3 + C + h * hs;
    float *dv = dk + C;
    for (int i = 0; i < hs; i++) {
        float k_acc = 0.0f, v_acc = 0.0f;
        for (int t = t2; t < T; t++) {
            size_t rt = (head_rows + (size_t)t) * T + t2; /* [t][t2] */
            size_t pos = (b * T + t) * C3 + h * hs + i;
            k_acc += scratch[rt] * qkv[pos];
            v_acc += att[rt] * dout[(b * T + t) * C + h * hs + i];
        }
        dk[i] = k_acc;
        dv[i] = v_acc;
    }
}

#endif /* DT_CUDA_ATTENTION_H */
