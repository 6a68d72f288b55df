/*
 * backend_cuda_host.c — the "cuda-host" backend: the CUDA backend's kernel
 * bodies (cuda_*.h) run by host loops on host memory, so a machine without
 * a GPU checks the arithmetic a GPU will run.
 *
 * Every loop below is the host twin of one __global__ wrapper in
 * backend_cuda.cu: same body, same index space (elements, rows or
 * columns), one iteration per GPU thread. The matmuls go through the
 * shared row-major -> column-major mapping of cuda_matmul.h onto
 * host_sgemm, a plain loop honouring cublasSgemm's documented contract,
 * so that mapping is tested here too. Memory is the CPU backend's (host
 * malloc, memcpy); the table is const, like the CPU ones.
 *
 * Cost: the host_sgemm loops are the reference's O(N*C*OC) scalar work and
 * the column bodies walk rows serially; this backend is for tests, not for
 * training.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_adamw.h"
#include "cuda_attention.h"
#include "cuda_crossentropy.h"
#include "cuda_elementwise.h"
#include "cuda_encoder.h"
#include "cuda_layernorm.h"
#include "cuda_matmul.h"
#include "model_internal.h"

static void *host_alloc(size_t bytes)
{
    return calloc(1, bytes ? bytes : 1);
}

static void host_free(void *p)
{
    free(p);
}
static void host_zero(void *p, size_t bytes)
{
    memset(p, 0, bytes);
}

static void host_copy(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
}

/* cublasSgemm's contract, column-major, as plain loops (see cuda_matmul.h) */
static void host_sgemm(void *ctx, int transa, int transb, int m, int n, int k, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C,
                       int ldc)
{
    (void)ctx;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float acc = 0.0f;
            for (int l = 0; l < k; l++) {
                float a = transa ? A[l + (size_t)i * lda] : A[i + (size_t)l * lda];
                float b = transb ? B[j + (size_t)l * ldb] : B[l + (size_t)j * ldb];
                acc += a * b;
            }
            float *c = &C[i + (size_t)j * ldc];
            *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
        }
}

static void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                            int T, int C)
{
    for (size_t idx = 0; idx < (size_t)B * T * C; idx++)
        dtk_encoder_forward_elem(out, inp, wte, wpe, idx, T, C);
}

static void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                             int T, int C)
{
    for (int i = 0; i < C; i++)
        dtk_encoder_backward_col(dwte, dwpe, dout, inp, i, B * T, T, C);
}

static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C)
{
    for (int n = 0; n < N; n++)
        dtk_layernorm_forward_row(out, mean, rstd, inp, w, b, n, C);
}

static void layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C)
{
    for (int n = 0; n < N; n++)
        dtk_layernorm_backward_row(dinp, dout, inp, w, mean, rstd, n, C);
    for (int i = 0; i < C; i++)
        dtk_layernorm_backward_col(dw, db, dout, inp, mean, rstd, i, N, C);
}

static void matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                           int C, int OC)
{
    for (size_t idx = 0; bias && idx < (size_t)N * OC; idx++)
        dtk_bias_broadcast_elem(out, bias, idx, OC);
    dtk_matmul_forward_gemm(host_sgemm, NULL, out, inp, w, bias != NULL, N, C, OC);
}

static void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC)
{
    dtk_matmul_backward_gemm(host_sgemm, NULL, dinp, dw, dout, inp, w, N, C, OC);
    for (int o = 0; dbias && o < OC; o++)
        dtk_bias_backward_col(dbias, dout, o, N, OC);
}

static void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    for (size_t r = 0; r < (size_t)B * NH * T; r++)
        dtk_attention_forward_row(out, att, qkv, r, T, C, NH);
}

static void attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH)
{
    size_t rows = (size_t)B * NH * T;
    for (size_t r = 0; r < rows; r++)
        dtk_attention_backward_query_row(dqkv, scratch, dout, qkv, att, r, T, C, NH);
    for (size_t r = 0; r < rows; r++)
        dtk_attention_backward_key_row(dqkv, scratch, dout, qkv, att, r, T, C, NH);
}

static void gelu_forward(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dtk_gelu_forward_elem(out, inp, i);
}

static void gelu_backward(float *dinp, const float *dout, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dtk_gelu_backward_elem(dinp, dout, inp, i);
}

static void residual_forward(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dtk_residual_forward_elem(out, a, b, i);
}

static void crossentropy_forward(float *probs, float *losses, const float *logits,
                                 const int *targets, int N, int V)
{
    for (int n = 0; n < N; n++)
        dtk_crossentropy_forward_row(probs, losses, logits, targets, n, V);
}

static void crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                                  float dloss, int N, int V)
{
    float scale = dloss / (float)N;
    for (size_t idx = 0; idx < (size_t)N * V; idx++)
        dtk_crossentropy_backward_elem(dlogits, probs, targets, scale, idx, V);
}

static void adamw(float *params, const float *grads, float *m, float *v, size_t n, long step,
                  const dt_adamw_hparams *h)
{
    dtk_adamw_consts k = dtk_adamw_consts_of(h->lr, h->beta1, h->beta2, h->eps, h->weight_decay,
                                             step);
    for (size_t i = 0; i < n; i++)
        dtk_adamw_elem(params, grads, m, v, k, i);
}

static const dt_backend cuda_host_backend = {
    .name = "cuda-host",
    .alloc = host_alloc,
    .free = host_free,
    .zero = host_zero,
    .to_host = host_copy,
    .from_host = host_copy,
    .copy = host_copy,
    .encoder_forward = encoder_forward,
    .encoder_backward = encoder_backward,
    .layernorm_forward = layernorm_forward,
    .layernorm_backward = layernorm_backward,
    .matmul_forward = matmul_forward,
    .matmul_backward = matmul_backward,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .gelu_forward = gelu_forward,
    .gelu_backward = gelu_backward,
    .residual_forward = residual_forward,
    .crossentropy_forward = crossentropy_forward,
    .crossentropy_backward = crossentropy_backward,
    .adamw = adamw,
};

const dt_backend *dt_backend_cuda_host(void)
{
    return &cuda_host_backend;
}
