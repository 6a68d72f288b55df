/*
 * attention_tiles.c — causal self-attention of one (sequence, head) as
 * small register tiles, for head sizes that are a multiple of 8 on CPUs
 * with AVX2 and FMA (every machine this project runs on; others take the
 * sgemm path of kernels_cpu.c).
 *
 * Why: at MiniGPT's sizes a head is small (T = 64..256, hs = 32..64), so
 * each of attention's six products per head is a few hundred KFLOP. Run
 * as sgemm calls, each pays its packing and call overhead, and the causal
 * mask can only skip whole blocks: at the 865k config (T 64, hs 32) that
 * path ran at 37 GFLOP/s forward against a 90 GFLOP/s sgemm peak. Here
 * every product is one kernel: a tile of up to 4 rows x 16 columns held
 * in eight AVX registers, fed by broadcasts of one operand and row loads
 * of the other, each row block stopping at its diagonal.
 *
 * The six products share one form, c[r][0:W] = sum_p a(r, p) * b[p][0:W]:
 *   scores  s    = q . k^T      a: q rows       b: k^T (transposed per head)
 *   output  o    = att . v      a: att rows     b: v rows
 *   datt         = dy . v^T     a: dy rows      b: v^T
 *   dq           = dpre . k     a: dpre rows    b: k rows
 *   dk           = dpre^T . q   a: dpre columns b: q rows (t >= j only)
 *   dv           = att^T . dy   a: att columns  b: dy rows
 * Entries above the diagonal of att and dpre are exact zeros, so a block
 * of rows may read a few of them and add nothing.
 *
 * Cost: about the causal half of the T x T square, 2*T*T*hs flops forward
 * and 4*T*T*hs backward, plus hs*T to transpose k (forward) or v
 * (backward) into a per-thread scratch of hs*T + 4*T floats.
 *
 * Bits: every output element is one sum in p order with fused
 * multiply-adds, the same for any thread count (a thread owns whole
 * heads). They differ from the sgemm path's and the reference loops' by
 * rounding only; tests compare them with a tolerance.
 */
#include <math.h>
#include <stdlib.h>

#include "fastmath.h"
#include "model_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <omp.h>

#define FMA_FN __attribute__((target("avx2,fma")))
#define FMA_INLINE static inline __attribute__((always_inline, target("avx2,fma")))

enum { ROWS = 4 }; /* rows of one tile: 4 x 2 accumulators of 8 */

/* c[r][0:8*NV] = sum over p in [p0, p1) of a[r*sr + p*sp] * b[p*ldb + 0:8*NV],
 * r < R; R and NV are constants where it is inlined, so acc stays in
 * registers. */
FMA_INLINE void tile(float *c, int ldc, const float *a, int sr, int sp, const float *b, int ldb,
                     int p0, int p1, int R, int NV)
{
    __m256 acc[ROWS][2];
    for (int r = 0; r < R; r++)
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int p = p0; p < p1; p++) {
        const float *bp = b + (size_t)p * ldb;
        __m256 b0 = _mm256_loadu_ps(bp);
        __m256 b1 = NV > 1 ? _mm256_loadu_ps(bp + 8) : b0;
        for (int r = 0; r < R; r++) {
            __m256 x = _mm256_broadcast_ss(a + (size_t)r * sr + (size_t)p * sp);
            acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
            if (NV > 1)
                acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
        }
    }
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(c + (size_t)r * ldc, acc[r][0]);
        if (NV > 1)
            _mm256_storeu_ps(c + (size_t)r * ldc + 8, acc[r][1]);
    }
}

/* R (1..ROWS) rows of c, W (a multiple of 8) columns wide: tiles of 16
 * columns, then one of 8 if W is an odd multiple of 8. */
static FMA_FN void row_block(float *c, int ldc, const float *a, int sr, int sp, const float *b,
                             int ldb, int p0, int p1, int R, int W)
{
    int w = 0;
    for (; w + 16 <= W; w += 16)
        switch (R) {
        case 4: tile(c + w, ldc, a, sr, sp, b + w, ldb, p0, p1, 4, 2); break;
        case 3: tile(c + w, ldc, a, sr, sp, b + w, ldb, p0, p1, 3, 2); break;
        case 2: tile(c + w, ldc, a, sr, sp, b + w, ldb, p0, p1, 2, 2); break;
        default: tile(c + w, ldc, a, sr, sp, b + w, ldb, p0, p1, 1, 2); break;
        }
    if (w < W)
        switch (R) {
        case 4: tile(c + w, ldc, a, sr, sp, b + w, ldb, p0, p1, 4, 1); break;
        case 3: tile(c + w, ldc, a, sr, sp, b + w, ldb, p0, p1, 3, 1); break;
        case 2: tile(c + w, ldc, a, sr, sp, b + w, ldb, p0, p1, 2, 1); break;
        default: tile(c + w, ldc, a, sr, sp, b + w, ldb, p0, p1, 1, 1); break;
        }
}

/* Sum of x[0:n] in a fixed order: eight lanes, then the lanes in order,
 * then the tail. */
FMA_INLINE float sum8(const float *x, int n)
{
    __m256 acc = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8)
        acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + j));
    float lane[8], s = 0.0f;
    _mm256_storeu_ps(lane, acc);
    for (int i = 0; i < 8; i++)
        s += lane[i];
    for (; j < n; j++)
        s += x[j];
    return s;
}

/* The largest of x[0:n], n >= 1 (max is exact: any order gives it). */
FMA_INLINE float max8(const float *x, int n)
{
    float m = x[0];
    int j = 0;
    if (n >= 8) {
        __m256 acc = _mm256_loadu_ps(x);
        for (j = 8; j + 8 <= n; j += 8)
            acc = _mm256_max_ps(acc, _mm256_loadu_ps(x + j));
        float lane[8];
        _mm256_storeu_ps(lane, acc);
        for (int i = 0; i < 8; i++)
            m = lane[i] > m ? lane[i] : m;
    }
    for (; j < n; j++)
        m = x[j] > m ? x[j] : m;
    return m;
}

/* Row t of the attention weights: a[0:T] = softmax(scale * s[0:t+1]),
 * zeros past t. */
static FMA_FN void softmax_row(float *a, const float *s, int t, int T, float scale)
{
    float maxv = max8(s, t + 1);
    for (int j = 0; j <= t; j++)
        a[j] = dt_fast_expf((s[j] - maxv) * scale);
    float inv = 1.0f / sum8(a, t + 1);
    for (int j = 0; j <= t; j++)
        a[j] *= inv;
    for (int j = t + 1; j < T; j++)
        a[j] = 0.0f;
}

/* Row t of softmax backward: d[0:T] = scale * a * (datt - a.datt) up to
 * t, zeros past t; prod is scratch of t+1 floats. */
static FMA_FN void softmax_back_row(float *d, float *prod, const float *datt, const float *a, int t,
                                    int T, float scale)
{
    for (int j = 0; j <= t; j++)
        prod[j] = a[j] * datt[j];
    float dot = sum8(prod, t + 1);
    for (int j = 0; j <= t; j++)
        d[j] = a[j] * (datt[j] - dot) * scale;
    for (int j = t + 1; j < T; j++)
        d[j] = 0.0f;
}

/* The 8x8 block at x (row stride ldx) transposed into y (row stride ldy). */
FMA_INLINE void transpose8(float *y, int ldy, const float *x, int ldx)
{
    __m256 r[8], u[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(x + (size_t)i * ldx);
    for (int i = 0; i < 8; i += 2) { /* interleave row pairs */
        u[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        u[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) { /* then pairs of pairs */
        r[i] = _mm256_shuffle_ps(u[i], u[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(u[i], u[i + 2], 0xee);
        r[i + 2] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) { /* then the 128-bit halves */
        _mm256_storeu_ps(y + (size_t)i * ldy, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(y + (size_t)(i + 4) * ldy, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}

/* xt (hs, Tp) = x (T rows of stride ld, hs columns)^T, zero past T: 8x8
 * blocks, then the last T % 8 rows one by one. */
static FMA_FN void transpose_head(float *xt, const float *x, int ld, int T, int Tp, int hs)
{
    int j = 0;
    for (; j + 8 <= T; j += 8)
        for (int d = 0; d < hs; d += 8)
            transpose8(xt + (size_t)d * Tp + j, Tp, x + (size_t)j * ld + d, ld);
    for (; j < T; j++)
        for (int d = 0; d < hs; d++)
            xt[(size_t)d * Tp + j] = x[(size_t)j * ld + d];
    for (int d = 0; d < hs; d++)
        for (j = T; j < Tp; j++)
            xt[(size_t)d * Tp + j] = 0.0f;
}

static int padded(int T)
{
    return (T + 15) & ~15;
}

static FMA_FN void head_forward(float *o, float *att, const float *q, int T, int C, int hs,
                                float scale, float *scratch)
{
    int C3 = 3 * C, Tp = padded(T);
    float *kt = scratch, *s = scratch + (size_t)hs * Tp; /* (hs, Tp), (ROWS, Tp) */
    transpose_head(kt, q + C, C3, T, Tp, hs);
    for (int t0 = 0; t0 < T; t0 += ROWS) {
        int R = T - t0 < ROWS ? T - t0 : ROWS, n = t0 + R; /* keys 0..n-1 */
        /* s[0:R, 0:n] = q[t0:n] . k[0:n]^T, n rounded up to 8 (kt is 0 there) */
        row_block(s, Tp, q + (size_t)t0 * C3, C3, 1, kt, Tp, 0, hs, R, (n + 7) & ~7);
        for (int r = 0; r < R; r++)
            softmax_row(att + (size_t)(t0 + r) * T, s + (size_t)r * Tp, t0 + r, T, scale);
        /* o[t0:n] = att[t0:n, 0:n] . v[0:n] */
        row_block(o + (size_t)t0 * C, C, att + (size_t)t0 * T, T, 1, q + 2 * C, C3, 0, n, R, hs);
    }
}

static FMA_FN void head_backward(float *dq, float *d, const float *dy, const float *q,
                                 const float *att, int T, int C, int hs, float scale,
                                 float *scratch)
{
    int C3 = 3 * C, Tp = padded(T);
    float *vt = scratch, *s = scratch + (size_t)hs * Tp, *prod = s + (size_t)ROWS * Tp;
    transpose_head(vt, q + 2 * C, C3, T, Tp, hs);
    for (int t0 = 0; t0 < T; t0 += ROWS) {
        int R = T - t0 < ROWS ? T - t0 : ROWS, n = t0 + R;
        /* datt[0:R, 0:n] = dy[t0:n] . v[0:n]^T, then dpre into d's rows */
        row_block(s, Tp, dy + (size_t)t0 * C, C, 1, vt, Tp, 0, hs, R, (n + 7) & ~7);
        for (int r = 0; r < R; r++)
            softmax_back_row(d + (size_t)(t0 + r) * T, prod, s + (size_t)r * Tp,
                             att + (size_t)(t0 + r) * T, t0 + r, T, scale);
        /* dq[t0:n] = dpre[t0:n, 0:n] . k[0:n] */
        row_block(dq + (size_t)t0 * C3, C3, d + (size_t)t0 * T, T, 1, q + C, C3, 0, n, R, hs);
    }
    for (int j0 = 0; j0 < T; j0 += ROWS) {
        int R = T - j0 < ROWS ? T - j0 : ROWS;
        /* dk[j0:j0+R] = sum over t >= j0 of dpre[t, j] q[t] */
        row_block(dq + C + (size_t)j0 * C3, C3, d + j0, 1, T, q, C3, j0, T, R, hs);
        /* dv[j0:j0+R] = sum over t >= j0 of att[t, j] dy[t] */
        row_block(dq + 2 * C + (size_t)j0 * C3, C3, att + j0, 1, T, dy, C, j0, T, R, hs);
    }
}

/* Floats of one thread's scratch: k^T or v^T, a tile's scores, a row. */
static size_t scratch_floats(int T, int hs)
{
    return (size_t)(hs + ROWS + 1) * padded(T);
}

int dt_attention_tiles_usable(int T, int C, int NH)
{
    return (C / NH) % 8 == 0 && T > 0 && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma");
}

/* Each thread of the team takes whole (sequence, head) pairs, in the
 * static order of the sgemm path, with its own scratch. 0: done; -1: no
 * memory for the scratch (the caller takes the sgemm path). */
int dt_tiles_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                               int NH)
{
    int hs = C / NH, nt = dt_threads_current();
    float scale = 1.0f / sqrtf((float)hs);
    size_t per = scratch_floats(T, hs);
    float *scratch = malloc((size_t)nt * per * sizeof(float));
    if (!scratch)
        return -1;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt) if (B * NH > 1)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            head_forward(out + (size_t)b * T * C + h * hs, att + ((size_t)b * NH + h) * T * T,
                         qkv + (size_t)b * T * 3 * C + h * hs, T, C, hs, scale,
                         scratch + (size_t)omp_get_thread_num() * per);
    free(scratch);
    return 0;
}

int dt_tiles_attention_backward(float *dqkv, float *scratch_tt, const float *dout, const float *qkv,
                                const float *att, int B, int T, int C, int NH)
{
    int hs = C / NH, nt = dt_threads_current();
    float scale = 1.0f / sqrtf((float)hs);
    size_t per = scratch_floats(T, hs);
    float *scratch = malloc((size_t)nt * per * sizeof(float));
    if (!scratch)
        return -1;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt) if (B * NH > 1)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            size_t qoff = (size_t)b * T * 3 * C + h * hs, hoff = ((size_t)b * NH + h) * T * T;
            head_backward(dqkv + qoff, scratch_tt + hoff, dout + (size_t)b * T * C + h * hs,
                          qkv + qoff, att + hoff, T, C, hs, scale,
                          scratch + (size_t)omp_get_thread_num() * per);
        }
    free(scratch);
    return 0;
}

#else /* not x86-64 with GCC or clang: the sgemm path only */

int dt_attention_tiles_usable(int T, int C, int NH)
{
    (void)T, (void)C, (void)NH;
    return 0;
}

int dt_tiles_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                               int NH)
{
    (void)out, (void)att, (void)qkv, (void)B, (void)T, (void)C, (void)NH;
    return -1;
}

int dt_tiles_attention_backward(float *dqkv, float *scratch_tt, const float *dout, const float *qkv,
                                const float *att, int B, int T, int C, int NH)
{
    (void)dqkv, (void)scratch_tt, (void)dout, (void)qkv, (void)att, (void)B, (void)T, (void)C,
        (void)NH;
    return -1;
}
#endif
