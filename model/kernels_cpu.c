/*
 * kernels_cpu.c — the fast CPU forms of MiniGPT's two heavy layers: the
 * linear layer (matmul) and causal self-attention, both on OpenBLAS sgemm
 * (gemm_cpu.c), across the rank's compute threads (threads.c).
 *
 * Idea: every O(n^3) product of the model is a GEMM with the right
 * strides, so no data is ever copied or transposed by hand. A linear
 * layer stores its weight PyTorch's way, (OC, C), so
 *   forward   out (N,OC)  = inp (N,C) . w^T
 *   backward  dinp (N,C)  = dout (N,OC) . w (OC,C)
 *             dw (OC,C)  += dout^T (OC,N) . inp (N,C)
 * and attention runs, per (sequence, head), on strided views into the qkv
 * rows (row stride 3C) and the output rows (row stride C). That sgemm
 * attention is the fallback: where the head size is a multiple of 8 and
 * the CPU has AVX2 and FMA, attention_tiles.c's register tiles run it
 * (1.6-1.8x faster at T 64..128, hs 32, where sgemm's per-call cost and
 * whole-block masking dominate).
 *
 * Threads: the linear layer's products are cut into blocks of whole rows
 * or columns of out, dinp and dw (gemm_cpu.c); attention gives each
 * thread whole (sequence, head) pairs, which own disjoint columns of the
 * output and their own T x T scratch. No sum is split across threads.
 *
 * Causal attention in blocks of RB query rows: rows r0..r1-1 only see
 * keys 0..r1-1, so the products skip the blocks above the diagonal (a
 * quarter of the T x T square at T = 64; nothing at T <= RB).
 *
 * Cost: 2*N*C*OC flops per product; attention ~4*T*T*hs per (b, h) each
 * way, less the skipped blocks. Results equal the reference loops up to
 * float rounding (summation order differs, and sgemm fuses multiply and
 * add); tests compare them with a tolerance.
 */
#include <math.h>
#include <string.h>

#include "fastmath.h"
#include "dt_model.h"
#include "model_internal.h"

void dt_cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                           int C, int OC)
{
    if (bias) /* preload the bias so the product adds onto it */
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
    /* out (N,OC) = inp (N,C) . w^T: w^T is w with its strides swapped */
    dt_cpu_gemm_par(out, OC, inp, C, 1, w, 1, C, N, OC, C, bias != NULL);
}

/* dbias[o0:o1] += column sums of dout's columns o0..o1-1, row by row:
 * a vector add per row, each column summed in row order. */
DT_VECTORIZE
static void bias_backward(float *dbias, const float *dout, int N, int OC, int o0, int o1)
{
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t)n * OC;
        for (int o = o0; o < o1; o++)
            dbias[o] += d[o];
    }
}

void dt_cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC)
{
    /* dinp (N,C) = dout (N,OC) . w (OC,C) */
    if (dinp)
        dt_cpu_gemm_par(dinp, C, dout, OC, 1, w, C, 1, N, C, OC, 0);
    /* dw (OC,C) += dout^T (OC,N) . inp (N,C) (if dw) */
    if (dw)
        dt_cpu_gemm_par(dw, C, dout, 1, OC, inp, C, 1, OC, C, N, 1);
    if (dbias) {
#pragma omp parallel num_threads(dt_threads_current()) if ((size_t)N * OC >= DT_PAR_ELEMS)
        {
            size_t lo, hi;
            dt_team_share((size_t)OC, 16, &lo, &hi);
            bias_backward(dbias, dout, N, OC, (int)lo, (int)hi);
        }
    }
}

/* Row-wise causal softmax of rows r0..r1-1 of a (T, T) block of raw
 * scores q.k, scaled here, in place: row t keeps columns 0..t, the rest
 * become 0. */
DT_VECTORIZE
static void causal_softmax(float *a, int r0, int r1, int T, float scale)
{
    for (int t = r0; t < r1; t++) {
        float *r = a + (size_t)t * T;
        for (int t2 = 0; t2 <= t; t2++)
            r[t2] *= scale;
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

/* Softmax backward on rows r0..r1-1, scaled, in place on d (datt in,
 * dpre out): dpre = scale * a * (datt - sum_j a_j datt_j); masked
 * entries have a = 0, so their dpre is 0. */
DT_VECTORIZE
static void softmax_backward(float *d, const float *a, int r0, int r1, int T, float scale)
{
    for (int t = r0; t < r1; t++) {
        const float *ar = a + (size_t)t * T;
        float *dr = d + (size_t)t * T;
        float dot = 0.0f;
        for (int t2 = 0; t2 <= t; t2++)
            dot += ar[t2] * dr[t2];
        for (int t2 = 0; t2 <= t; t2++)
            dr[t2] = ar[t2] * (dr[t2] - dot) * scale;
        for (int t2 = t + 1; t2 < T; t2++)
            dr[t2] = 0.0f;
    }
}

enum { RB = 32 }; /* query rows per attention block (see the top) */

void dt_sgemm_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                int NH)
{
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static) \
    num_threads(dt_threads_current()) if (B * NH > 1 && (size_t)T * T * hs >= 4096)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs;
            const float *k = q + C, *v = q + 2 * C;
            float *a = att + ((size_t)b * NH + h) * T * T;
            float *o = out + (size_t)b * T * C + h * hs;
            for (int r0 = 0; r0 < T; r0 += RB) {
                int r1 = r0 + RB < T ? r0 + RB : T, rb = r1 - r0;
                /* a[r0:r1, 0:r1] = q[r0:r1] (rb,hs) . k[0:r1]^T */
                dt_cpu_gemm(a + (size_t)r0 * T, T, q + (size_t)r0 * C3, C3, 1, k, 1, C3, rb, r1, hs,
                            0);
                causal_softmax(a, r0, r1, T, scale);
                /* o[r0:r1] (rb,hs) = a[r0:r1, 0:r1] . v[0:r1] */
                dt_cpu_gemm(o + (size_t)r0 * C, C, a + (size_t)r0 * T, T, 1, v, C3, 1, rb, hs, r1,
                            0);
            }
        }
}

/* Backward of one (sequence, head): d is its (T, T) scratch. */
static void attention_backward_head(float *dq, float *d, const float *dy, const float *q,
                                    const float *a, int T, int C, int hs, float scale)
{
    int C3 = 3 * C;
    const float *k = q + C, *v = q + 2 * C;
    float *dk = dq + C, *dv = dq + 2 * C;
    for (int r0 = 0; r0 < T; r0 += RB) {
        int r1 = r0 + RB < T ? r0 + RB : T, rb = r1 - r0;
        /* datt[r0:r1, 0:r1] = dy[r0:r1] . v[0:r1]^T, then dpre */
        dt_cpu_gemm(d + (size_t)r0 * T, T, dy + (size_t)r0 * C, C, 1, v, 1, C3, rb, r1, hs, 0);
        softmax_backward(d, a, r0, r1, T, scale);
        /* dv[r0:r1] = a[r0:T, r0:r1]^T . dy[r0:T] (a is 0 above the
         * diagonal, so rows before r0 add nothing) */
        dt_cpu_gemm(dv + (size_t)r0 * C3, C3, a + (size_t)r0 * T + r0, 1, T, dy + (size_t)r0 * C, C,
                    1, rb, hs, T - r0, 0);
        /* dq[r0:r1] = dpre[r0:r1, 0:r1] . k[0:r1] */
        dt_cpu_gemm(dq + (size_t)r0 * C3, C3, d + (size_t)r0 * T, T, 1, k, C3, 1, rb, hs, r1, 0);
    }
    /* dk[r0:r1] = dpre[r0:T, r0:r1]^T . q[r0:T], once all of dpre is in */
    for (int r0 = 0; r0 < T; r0 += RB) {
        int r1 = r0 + RB < T ? r0 + RB : T, rb = r1 - r0;
        dt_cpu_gemm(dk + (size_t)r0 * C3, C3, d + (size_t)r0 * T + r0, 1, T, q + (size_t)r0 * C3,
                    C3, 1, rb, hs, T - r0, 0);
    }
}

void dt_sgemm_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                 const float *att, int B, int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    /* each (b, h) owns its columns of dqkv, so writing, not adding, is
     * right */
#pragma omp parallel for collapse(2) schedule(static) \
    num_threads(dt_threads_current()) if (B * NH > 1 && (size_t)T * T * hs >= 4096)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            size_t qoff = (size_t)b * T * C3 + h * hs;
            size_t hoff = ((size_t)b * NH + h) * T * T;
            attention_backward_head(dqkv + qoff, scratch + hoff, dout + (size_t)b * T * C + h * hs,
                                    qkv + qoff, att + hoff, T, C, hs, scale);
        }
}

/* Attention in register tiles where they run (attention_tiles.c), else on
 * sgemm. */
void dt_cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    if (!dt_attention_tiles_usable(T, C, NH) ||
        dt_tiles_attention_forward(out, att, qkv, B, T, C, NH) != 0)
        dt_sgemm_attention_forward(out, att, qkv, B, T, C, NH);
}

void dt_cpu_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH)
{
    if (!dt_attention_tiles_usable(T, C, NH) ||
        dt_tiles_attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH) != 0)
        dt_sgemm_attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH);
}
