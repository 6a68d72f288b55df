/*
 * kernels_rows.c — the cpu backend's element-wise and row-wise layers
 * (GELU, residual, LayerNorm, embeddings, softmax + cross-entropy, AdamW)
 * across the rank's compute threads (threads.c).
 *
 * Each layer is a serial kernel on a piece of the work, compiled for the
 * CPU's vector width (DT_VECTORIZE), and a parallel form that gives each
 * thread of the team one contiguous share:
 *
 *   element-wise (GELU, residual, AdamW)   a range of the flat buffer
 *   row-wise (LayerNorm, softmax, loss)    a range of rows
 *   sums over rows (LayerNorm's dw, db;    a range of columns, each summed
 *   the embeddings' dwte, dwpe)            over every row, in row order
 *
 * The last kind is why a thread count never changes a bit: a column's sum
 * runs in the same order on 1 thread as on 8, and the serial kernels are
 * pure functions of their inputs (fastmath.h). The reference loops
 * (kernels_ref.c) stay serial.
 *
 * Cost: memory-bound passes over the activations (a few flops per
 * element; GELU's CDF and the softmax's exp ~20-30); LayerNorm backward
 * reads its inputs twice, once by rows for dinp and once by columns for
 * dw and db. Pieces below DT_PAR_ELEMS elements run on the calling thread.
 */
#include <math.h>
#include <string.h>

#include "fastmath.h"
#include "dt_model.h"
#include "model_internal.h"

/* ---- GELU and residual: a range of the flat buffer ------------------------ */

DT_VECTORIZE
static void gelu_forward(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = inp[i] * dt_fast_normal_cdf(inp[i]);
}

DT_VECTORIZE
static void gelu_backward(float *dinp, const float *dout, const float *inp, size_t n)
{
    const float inv_sqrt_2pi = 0.3989422804014327f;
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float pdf = inv_sqrt_2pi * dt_fast_expf(-0.5f * x * x);
        dinp[i] = dout[i] * (dt_fast_normal_cdf(x) + x * pdf);
    }
}

void dt_cpu_gelu_forward(float *out, const float *inp, size_t n)
{
#pragma omp parallel num_threads(dt_threads_current()) if (n >= DT_PAR_ELEMS)
    {
        size_t lo, hi;
        dt_team_share(n, 16, &lo, &hi);
        gelu_forward(out + lo, inp + lo, hi - lo);
    }
}

void dt_cpu_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n)
{
#pragma omp parallel num_threads(dt_threads_current()) if (n >= DT_PAR_ELEMS)
    {
        size_t lo, hi;
        dt_team_share(n, 16, &lo, &hi);
        gelu_backward(dinp + lo, dout + lo, inp + lo, hi - lo);
    }
}

void dt_cpu_residual_forward(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel num_threads(dt_threads_current()) if (n >= DT_PAR_ELEMS)
    {
        size_t lo, hi;
        dt_team_share(n, 16, &lo, &hi);
        dt_ref_residual_forward(out + lo, a + lo, b + lo, hi - lo);
    }
}

void dt_cpu_adamw(float *params, const float *grads, float *m, float *v, size_t n, long step,
                  const dt_adamw_hparams *h)
{
#pragma omp parallel num_threads(dt_threads_current()) if (n >= DT_PAR_ELEMS)
    {
        size_t lo, hi;
        dt_team_share(n, 16, &lo, &hi);
        dt_adamw_step(params + lo, grads + lo, m + lo, v + lo, hi - lo, step, h);
    }
}

/* ---- LayerNorm: rows forward and for dinp, columns for dw and db ---------- */

/* Row sums in eight running lanes (lane k adds elements k, k+8, ...), the
 * lanes then added in order, then the tail: a fixed order of plain float
 * operations, so the same bits at any vector width, yet vector code,
 * where one running sum is a chain of dependent adds (~4 cycles each).
 * lanes8 is GCC's and clang's vector type: 8 floats, element-wise ops. */
typedef float lanes8 __attribute__((vector_size(32)));

/* (Vectors pass by pointer: by value they would change the ABI between
 * the DT_VECTORIZE clones.) */
static inline void load8(lanes8 *v, const float *p)
{
    memcpy(v, p, sizeof *v);
}

static inline float fold_lanes(const lanes8 *acc)
{
    float s = 0.0f;
    for (int k = 0; k < 8; k++)
        s += (*acc)[k];
    return s;
}

/* LayerNorm forward of rows [n0, n1): the reference's mathematics with
 * lane sums for the mean and the variance (4x faster at C = 128). */
DT_VECTORIZE
static void layernorm_rows(float *out, float *mean, float *rstd, const float *inp, const float *w,
                           const float *b, int n0, int n1, int C)
{
    int C8 = C & ~7;
    for (int n = n0; n < n1; n++) {
        const float *x = inp + (size_t)n * C;
        lanes8 acc = {0}, xv;
        for (int i = 0; i < C8; i += 8) {
            load8(&xv, x + i);
            acc += xv;
        }
        float m = fold_lanes(&acc);
        for (int i = C8; i < C; i++)
            m += x[i];
        m /= (float)C;
        lanes8 vacc = {0};
        for (int i = 0; i < C8; i += 8) {
            load8(&xv, x + i);
            lanes8 dev = xv - m;
            vacc += dev * dev;
        }
        float v = fold_lanes(&vacc);
        for (int i = C8; i < C; i++)
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

/* dinp rows [n0, n1) += LayerNorm's input gradient (the reference's
 * formula, kernels_ref.c), its two row means by lane sums. */
DT_VECTORIZE
static void layernorm_rows_dinp(float *dinp, const float *dout, const float *inp, const float *w,
                                const float *mean, const float *rstd, int n0, int n1, int C)
{
    int C8 = C & ~7;
    for (int n = n0; n < n1; n++) {
        const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        lanes8 ga = {0}, gxa = {0}, xv, dv, wv;
        for (int i = 0; i < C8; i += 8) {
            load8(&xv, x + i);
            load8(&dv, d + i);
            load8(&wv, w + i);
            lanes8 xhat = (xv - m) * s, g = dv * wv;
            ga += g;
            gxa += g * xhat;
        }
        float gmean = fold_lanes(&ga), gxmean = fold_lanes(&gxa);
        for (int i = C8; i < C; i++) {
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
}

void dt_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C)
{
#pragma omp parallel num_threads(dt_threads_current()) if ((size_t)N * C >= DT_PAR_ELEMS)
    {
        size_t lo, hi;
        dt_team_share((size_t)N, 1, &lo, &hi);
        layernorm_rows(out, mean, rstd, inp, w, b, (int)lo, (int)hi, C);
    }
}

/* dw[c0:c1] += sum_n xhat * dout, db[c0:c1] += sum_n dout, n in order
 * (the same sums, in the same order, as dt_ref_layernorm_backward's). */
DT_VECTORIZE
static void layernorm_param_grads(float *dw, float *db, const float *dout, const float *inp,
                                  const float *mean, const float *rstd, int N, int C, int c0,
                                  int c1)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        for (int i = c0; i < c1; i++) {
            db[i] += d[i];
            dw[i] += (x[i] - m) * s * d[i];
        }
    }
}

void dt_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C)
{
    int par = (size_t)N * C >= DT_PAR_ELEMS;
    if (dinp) {
#pragma omp parallel num_threads(dt_threads_current()) if (par)
        {
            size_t lo, hi;
            dt_team_share((size_t)N, 1, &lo, &hi);
            layernorm_rows_dinp(dinp, dout, inp, w, mean, rstd, (int)lo, (int)hi, C);
        }
    }
    if (dw) {
#pragma omp parallel num_threads(dt_threads_current()) if (par)
        {
            size_t lo, hi;
            dt_team_share((size_t)C, 16, &lo, &hi);
            layernorm_param_grads(dw, db, dout, inp, mean, rstd, N, C, (int)lo, (int)hi);
        }
    }
}

/* ---- embeddings: rows forward, columns backward --------------------------- */

void dt_cpu_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                            int T, int C)
{
#pragma omp parallel num_threads(dt_threads_current()) if ((size_t)B * T * C >= DT_PAR_ELEMS)
    {
        size_t lo, hi;
        dt_team_share((size_t)B * T, 1, &lo, &hi);
        for (size_t r = lo; r < hi; r++) /* row r is token t = r % T */
            dt_ref_encoder_forward(out + r * C, inp + r, wte, wpe + (r % T) * C, 1, 1, C);
    }
}

/* dwte[tok][c0:c1] and dwpe[t][c0:c1] += dout rows, in (b, t) order. */
DT_VECTORIZE
static void encoder_backward_columns(float *dwte, float *dwpe, const float *dout, const int *inp,
                                     int B, int T, int C, int c0, int c1)
{
    for (int r = 0; r < B * T; r++) {
        const float *d = dout + (size_t)r * C;
        float *dwe = dwte + (size_t)inp[r] * C, *dpe = dwpe + (size_t)(r % T) * C;
        for (int i = c0; i < c1; i++) {
            dwe[i] += d[i];
            dpe[i] += d[i];
        }
    }
}

void dt_cpu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                             int T, int C)
{
#pragma omp parallel num_threads(dt_threads_current()) if ((size_t)B * T * C >= DT_PAR_ELEMS)
    {
        size_t lo, hi;
        dt_team_share((size_t)C, 16, &lo, &hi);
        encoder_backward_columns(dwte, dwpe, dout, inp, B, T, C, (int)lo, (int)hi);
    }
}

/* ---- softmax + cross-entropy: rows --------------------------------------- */

DT_VECTORIZE
static void crossentropy_forward(float *probs, float *losses, const float *logits,
                                 const int *targets, int N, int V)
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

void dt_cpu_crossentropy_forward(float *probs, float *losses, const float *logits,
                                 const int *targets, int N, int V)
{
#pragma omp parallel num_threads(dt_threads_current()) if ((size_t)N * V >= DT_PAR_ELEMS)
    {
        size_t lo, hi;
        dt_team_share((size_t)N, 1, &lo, &hi);
        crossentropy_forward(probs + lo * V, losses ? losses + lo : NULL, logits + lo * V,
                             targets ? targets + lo : NULL, (int)(hi - lo), V);
    }
}

/* dlogits = (probs - onehot(target)) * scale, rows as the reference's */
DT_VECTORIZE
static void crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                                  float scale, int N, int V)
{
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * V;
        float *d = dlogits + (size_t)n * V;
        for (int i = 0; i < V; i++)
            d[i] = p[i] * scale;
        d[targets[n]] -= scale;
    }
}

void dt_cpu_crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                                  float dloss, int N, int V)
{
    float scale = dloss / (float)N; /* the whole batch's N, whatever the share */
#pragma omp parallel num_threads(dt_threads_current()) if ((size_t)N * V >= DT_PAR_ELEMS)
    {
        size_t lo, hi;
        dt_team_share((size_t)N, 1, &lo, &hi);
        crossentropy_backward(dlogits + lo * V, probs + lo * V, targets + lo, scale, (int)(hi - lo),
                              V);
    }
}
