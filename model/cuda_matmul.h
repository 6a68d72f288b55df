/*
 * cuda_matmul.h — the linear layer out = inp . w^T + bias, forward and
 * backward, on a column-major SGEMM (cuBLAS's cublasSgemm on the device;
 * a plain loop with the same contract on the host, backend_cuda_host.c).
 *
 * The one subtle thing is the mapping. Our tensors are row-major; BLAS is
 * column-major, and a row-major (R, S) matrix IS a column-major S x R
 * matrix with leading dimension S. So each product is written transposed:
 *
 *   forward    out (N,OC) = inp (N,C) . w (OC,C)^T
 *              out^T [OC x N] = w^T [OC x C] . inp^T [C x N]
 *              gemm(T, N, m=OC, n=N, k=C, w ld C, inp ld C, out ld OC)
 *   dinp       dinp (N,C) = dout (N,OC) . w (OC,C)
 *              dinp^T [C x N] = w_cm [C x OC] . dout_cm [OC x N]
 *              gemm(N, N, m=C, n=N, k=OC, w ld C, dout ld OC, dinp ld C)
 *   dw         dw (OC,C) += dout^T (OC,N) . inp (N,C)
 *              dw_cm [C x OC] += inp_cm [C x N] . dout_cm^T [N x OC]
 *              gemm(N, T, m=C, n=OC, k=N, inp ld C, dout ld OC, beta 1)
 *
 * Because these lines are shared by the device and the host backend, the
 * Criterion suite checks this mapping on the host; only cuBLAS's own
 * honouring of its documented contract is left to the GPU check.
 *
 * Bias: forward broadcasts bias into every row of out first and runs the
 * GEMM with beta = 1 (one thread per element); backward sums dout's
 * columns, one thread per output channel over the N rows in order.
 */
#ifndef DT_CUDA_MATMUL_H
#define DT_CUDA_MATMUL_H

#include "cuda_common.h"

/* A column-major C[m x n] = alpha op(A)[m x k] op(B)[k x n] + beta C, op
 * transposing where trans is set: cublasSgemm's contract (with beta 0, C
 * is not read). ctx is the implementation's (a cuBLAS handle, or NULL). */
typedef void (*dtk_gemm_fn)(void *ctx, int transa, int transb, int m, int n, int k, float alpha,
                            const float *A, int lda, const float *B, int ldb, float beta, float *C,
                            int ldc);

/* out (N, OC) element idx = bias[idx % OC] */
static inline DT_HD void dtk_bias_broadcast_elem(float *out, const float *bias, size_t idx, int OC)
{
    out[idx] = bias[idx % (size_t)OC];
}

/* dbias (OC) entry o += sum over rows of dout (N, OC) column o */
static inline DT_HD void dtk_bias_backward_col(float *dbias, const float *dout, int o, int N,
                                               int OC)
{
    float acc = dbias[o];
    for (int n = 0; n < N; n++)
        acc += dout[(size_t)n * OC + o];
    dbias[o] = acc;
}

/* The GEMMs of the linear layer; the bias is the caller's (above). */
static inline void dtk_matmul_forward_gemm(dtk_gemm_fn gemm, void *ctx, float *out,
                                           const float *inp, const float *w, int has_bias, int N,
                                           int C, int OC)
{
    gemm(ctx, 1, 0, OC, N, C, 1.0f, w, C, inp, C, has_bias ? 1.0f : 0.0f, out, OC);
}

static inline void dtk_matmul_backward_gemm(dtk_gemm_fn gemm, void *ctx, float *dinp, float *dw,
                                            const float *dout, const float *inp, const float *w,
                                            int N, int C, int OC)
{
    if (dinp)
        gemm(ctx, 0, 0, C, N, OC, 1.0f, w, C, dout, OC, 0.0f, dinp, C);
    gemm(ctx, 0, 1, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dw, C);
}

#endif /* DT_CUDA_MATMUL_H */
