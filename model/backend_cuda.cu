/*
 * backend_cuda.cu — the "cuda" backend: MiniGPT's memory and layers on an
 * NVIDIA GPU. cudaMalloc'd flat buffers (the same layout as the CPU's, so
 * DDP buckets and ZeRO-1 shards are the same offset ranges), cuBLAS SGEMM
 * in fp32 for the matmuls, and one CUDA kernel per body of cuda_*.h.
 *
 * What is here and nowhere else — the lines a machine without a GPU cannot
 * check (the bodies and the GEMM argument mapping are checked on the host
 * through backend_cuda_host.c):
 *   - the __global__ wrappers: thread index -> body index, bounds check;
 *   - launch configurations (threads per block, blocks);
 *   - the cuBLAS call (cublas_gemm), cudaMalloc/cudaMemcpy, and when the
 *     host waits for the device.
 *
 * Streams and waiting. Every kernel and copy goes on the legacy default
 * stream, so they run in the order the model issues them. The collectives
 * stage device buffers on their own non-blocking streams, which do not
 * wait for the default stream (staging.c's contract: a device buffer holds
 * its input when the op is submitted). So every call after which the host,
 * the network or the disk may read device memory returns only once the
 * device has finished: the memory calls (zero, copy, to/from host), AdamW,
 * and the backward calls that write parameter gradients (matmul, layernorm,
 * encoder), because the grad-ready hook hands those gradients to DDP's
 * all-reduce right after them. Forward kernels and the activation-only
 * backward kernels are queued and never waited for: one wait per layer
 * that produces gradients, ~10 µs each.
 *
 * Built only into the CUDA module (dt_cuda_module.h): libdtrain loads it
 * the first time a run asks for the CUDA backend and reaches the two
 * functions at the end through the table dt_cuda_module_backend
 * (backend_cuda_entry.h); the module exports nothing else.
 *
 * State. dt_backend's entries take no context argument, so the process
 * keeps one record of the CUDA backend beside CUDA's own per-process
 * context: the device opened, its cuBLAS handle, and the first failure
 * (a launch error, a cuBLAS status) since dt_backend_cuda_check last
 * reported. One device per process — one rank per GPU, as torchrun's
 * LOCAL_RANK convention has it; opening another is refused.
 *
 * Numerics: compiled with -fmad=false (model/meson.build), so the bodies
 * round as the host C compiler's (ISO C forbids FMA contraction) and the
 * kernels match the CPU reference to the last bits that libm's and CUDA's
 * expf/erff differ in; the GEMMs sum in cuBLAS's order, so the model
 * matches to ~1e-6 relative, not bitwise.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cuda_adamw.h"
#include "cuda_attention.h"
#include "cuda_crossentropy.h"
#include "cuda_elementwise.h"
#include "cuda_encoder.h"
#include "cuda_layernorm.h"
#include "cuda_matmul.h"
#include "backend_cuda_entry.h"
#include "dt_cuda_module.h"

/* ---- the process's record of the backend ------------------------------------ */

typedef struct cuda_backend_state {
    pthread_mutex_t lock;
    int device;          /* -1 until opened */
    cublasHandle_t blas; /* bound to device */
    int failed;          /* a failure not yet reported by _check */
    char err[256];
} cuda_backend_state;

static cuda_backend_state g_cuda = {PTHREAD_MUTEX_INITIALIZER, -1, NULL, 0, ""};

/* Keeps the first failure: later ones are usually its consequences. */
static void note_failure(const char *what, const char *detail)
{
    pthread_mutex_lock(&g_cuda.lock);
    if (!g_cuda.failed) {
        g_cuda.failed = 1;
        snprintf(g_cuda.err, sizeof g_cuda.err, "cuda:%d: %s: %s", g_cuda.device, what, detail);
    }
    pthread_mutex_unlock(&g_cuda.lock);
}

static int cuda_ok(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 1;
    char detail[160];
    snprintf(detail, sizeof detail, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    note_failure(what, detail);
    return 0;
}

/* After a launch: a bad configuration shows up here, a fault at the next wait. */
static void launched(const char *kernel)
{
    cuda_ok(cudaGetLastError(), kernel);
}

/* Waits for everything queued so far (see "Streams and waiting"). */
static void settle(const char *after)
{
    cuda_ok(cudaStreamSynchronize(0), after);
}

/* ---- launch configuration ------------------------------------------------------ */

/* Element bodies are a few flops: 256 threads per block. Row and column
 * bodies loop over C, T or N: 64, so a small model still fills many SMs. */
enum { ELEM_THREADS = 256, ROW_THREADS = 64 };

static unsigned blocks_for(size_t n, unsigned threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

static __device__ size_t thread_index(void)
{
    return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}

/* ---- memory ------------------------------------------------------------------ */

static void *cuda_alloc(size_t bytes)
{
    void *p = NULL;
    if (!cuda_ok(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc"))
        return NULL;
    if (!cuda_ok(cudaMemset(p, 0, bytes), "cudaMemset")) {
        cudaFree(p);
        return NULL;
    }
    settle("alloc");
    return p;
}

static void cuda_free(void *p)
{
    cuda_ok(cudaFree(p), "cudaFree");
}

static void cuda_zero(void *p, size_t bytes)
{
    cuda_ok(cudaMemset(p, 0, bytes), "cudaMemset");
    settle("zero");
}

static void cuda_to_host(void *host, const void *dev, size_t bytes)
{
    cuda_ok(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

static void cuda_from_host(void *dev, const void *host, size_t bytes)
{
    cuda_ok(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    settle("from_host");
}

static void cuda_copy(void *dst, const void *src, size_t bytes)
{
    cuda_ok(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
    settle("copy");
}

/* ---- kernels: one thin wrapper per body ----------------------------------------- */

static __global__ void encoder_forward_kernel(float *out, const int *inp, const float *wte,
                                              const float *wpe, size_t n, int T, int C)
{
    size_t i = thread_index();
    if (i < n)
        dtk_encoder_forward_elem(out, inp, wte, wpe, i, T, C);
}

static __global__ void encoder_backward_kernel(float *dwte, float *dwpe, const float *dout,
                                               const int *inp, int N, int T, int C)
{
    size_t i = thread_index();
    if (i < (size_t)C)
        dtk_encoder_backward_col(dwte, dwpe, dout, inp, (int)i, N, T, C);
}

static __global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd,
                                                const float *inp, const float *w, const float *b,
                                                int N, int C)
{
    size_t n = thread_index();
    if (n < (size_t)N)
        dtk_layernorm_forward_row(out, mean, rstd, inp, w, b, (int)n, C);
}

static __global__ void layernorm_backward_row_kernel(float *dinp, const float *dout,
                                                     const float *inp, const float *w,
                                                     const float *mean, const float *rstd, int N,
                                                     int C)
{
    size_t n = thread_index();
    if (n < (size_t)N)
        dtk_layernorm_backward_row(dinp, dout, inp, w, mean, rstd, (int)n, C);
}

static __global__ void layernorm_backward_col_kernel(float *dw, float *db, const float *dout,
                                                     const float *inp, const float *mean,
                                                     const float *rstd, int N, int C)
{
    size_t i = thread_index();
    if (i < (size_t)C)
        dtk_layernorm_backward_col(dw, db, dout, inp, mean, rstd, (int)i, N, C);
}

static __global__ void bias_broadcast_kernel(float *out, const float *bias, size_t n, int OC)
{
    size_t i = thread_index();
    if (i < n)
        dtk_bias_broadcast_elem(out, bias, i, OC);
}

static __global__ void bias_backward_kernel(float *dbias, const float *dout, int N, int OC)
{
    size_t o = thread_index();
    if (o < (size_t)OC)
        dtk_bias_backward_col(dbias, dout, (int)o, N, OC);
}

static __global__ void attention_forward_kernel(float *out, float *att, const float *qkv,
                                                size_t rows, int T, int C, int NH)
{
    size_t r = thread_index();
    if (r < rows)
        dtk_attention_forward_row(out, att, qkv, r, T, C, NH);
}

static __global__ void attention_backward_query_kernel(float *dqkv, float *scratch,
                                                       const float *dout, const float *qkv,
                                                       const float *att, size_t rows, int T, int C,
                                                       int NH)
{
    size_t r = thread_index();
    if (r < rows)
        dtk_attention_backward_query_row(dqkv, scratch, dout, qkv, att, r, T, C, NH);
}

static __global__ void attention_backward_key_kernel(float *dqkv, const float *scratch,
                                                     const float *dout, const float *qkv,
                                                     const float *att, size_t rows, int T, int C,
                                                     int NH)
{
    size_t r = thread_index();
    if (r < rows)
        dtk_attention_backward_key_row(dqkv, scratch, dout, qkv, att, r, T, C, NH);
}

static __global__ void gelu_forward_kernel(float *out, const float *inp, size_t n)
{
    size_t i = thread_index();
    if (i < n)
        dtk_gelu_forward_elem(out, inp, i);
}

static __global__ void gelu_backward_kernel(float *dinp, const float *dout, const float *inp,
                                            size_t n)
{
    size_t i = thread_index();
    if (i < n)
        dtk_gelu_backward_elem(dinp, dout, inp, i);
}

static __global__ void residual_forward_kernel(float *out, const float *a, const float *b, size_t n)
{
    size_t i = thread_index();
    if (i < n)
        dtk_residual_forward_elem(out, a, b, i);
}

static __global__ void crossentropy_forward_kernel(float *probs, float *losses, const float *logits,
                                                   const int *targets, int N, int V)
{
    size_t n = thread_index();
    if (n < (size_t)N)
        dtk_crossentropy_forward_row(probs, losses, logits, targets, (int)n, V);
}

static __global__ void crossentropy_backward_kernel(float *dlogits, const float *probs,
                                                    const int *targets, float scale, size_t n,
                                                    int V)
{
    size_t i = thread_index();
    if (i < n)
        dtk_crossentropy_backward_elem(dlogits, probs, targets, scale, i, V);
}

static __global__ void adamw_kernel(float *params, const float *grads, float *m, float *v,
                                    dtk_adamw_consts k, size_t n)
{
    size_t i = thread_index();
    if (i < n)
        dtk_adamw_elem(params, grads, m, v, k, i);
}

/* ---- the backend's entries: launches ---------------------------------------- */

#define LAUNCH(kernel, n, threads, ...)                                \
    do {                                                               \
        size_t n_ = (n);                                               \
        if (n_ > 0) {                                                  \
            kernel<<<blocks_for(n_, threads), threads>>>(__VA_ARGS__); \
            launched(#kernel);                                         \
        }                                                              \
    } while (0)

static void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                            int T, int C)
{
    size_t n = (size_t)B * T * C;
    LAUNCH(encoder_forward_kernel, n, ELEM_THREADS, out, inp, wte, wpe, n, T, C);
}

static void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                             int T, int C)
{
    LAUNCH(encoder_backward_kernel, (size_t)C, ROW_THREADS, dwte, dwpe, dout, inp, B * T, T, C);
    settle("encoder_backward");
}

static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C)
{
    LAUNCH(layernorm_forward_kernel, (size_t)N, ROW_THREADS, out, mean, rstd, inp, w, b, N, C);
}

static void layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C)
{
    LAUNCH(layernorm_backward_row_kernel, (size_t)N, ROW_THREADS, dinp, dout, inp, w, mean, rstd, N,
           C);
    LAUNCH(layernorm_backward_col_kernel, (size_t)C, ROW_THREADS, dw, db, dout, inp, mean, rstd, N,
           C);
    settle("layernorm_backward");
}

/* cuda_matmul.h's gemm contract on cuBLAS: the same column-major
 * arguments, passed through; alpha and beta by host pointer (the handle's
 * default pointer mode). */
static void cublas_gemm(void *ctx, int transa, int transb, int m, int n, int k, float alpha,
                        const float *A, int lda, const float *B, int ldb, float beta, float *C,
                        int ldc)
{
    cublasStatus_t s = cublasSgemm((cublasHandle_t)ctx, transa ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   transb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A, lda, B,
                                   ldb, &beta, C, ldc);
    if (s != CUBLAS_STATUS_SUCCESS)
        note_failure("cublasSgemm", cublasGetStatusString(s));
}

static void matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                           int C, int OC)
{
    size_t n = (size_t)N * OC;
    if (bias)
        LAUNCH(bias_broadcast_kernel, n, ELEM_THREADS, out, bias, n, OC);
    dtk_matmul_forward_gemm(cublas_gemm, g_cuda.blas, out, inp, w, bias != NULL, N, C, OC);
}

static void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC)
{
    dtk_matmul_backward_gemm(cublas_gemm, g_cuda.blas, dinp, dw, dout, inp, w, N, C, OC);
    if (dbias)
        LAUNCH(bias_backward_kernel, (size_t)OC, ROW_THREADS, dbias, dout, N, OC);
    settle("matmul_backward");
}

static void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    size_t rows = (size_t)B * NH * T;
    LAUNCH(attention_forward_kernel, rows, ROW_THREADS, out, att, qkv, rows, T, C, NH);
}

static void attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH)
{
    size_t rows = (size_t)B * NH * T;
    LAUNCH(attention_backward_query_kernel, rows, ROW_THREADS, dqkv, scratch, dout, qkv, att, rows,
           T, C, NH);
    LAUNCH(attention_backward_key_kernel, rows, ROW_THREADS, dqkv, scratch, dout, qkv, att, rows, T,
           C, NH);
}

static void gelu_forward(float *out, const float *inp, size_t n)
{
    LAUNCH(gelu_forward_kernel, n, ELEM_THREADS, out, inp, n);
}

static void gelu_backward(float *dinp, const float *dout, const float *inp, size_t n)
{
    LAUNCH(gelu_backward_kernel, n, ELEM_THREADS, dinp, dout, inp, n);
}

static void residual_forward(float *out, const float *a, const float *b, size_t n)
{
    LAUNCH(residual_forward_kernel, n, ELEM_THREADS, out, a, b, n);
}

static void crossentropy_forward(float *probs, float *losses, const float *logits,
                                 const int *targets, int N, int V)
{
    LAUNCH(crossentropy_forward_kernel, (size_t)N, ROW_THREADS, probs, losses, logits, targets, N,
           V);
}

static void crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                                  float dloss, int N, int V)
{
    size_t n = (size_t)N * V;
    LAUNCH(crossentropy_backward_kernel, n, ELEM_THREADS, dlogits, probs, targets, dloss / (float)N,
           n, V);
}

static void adamw(float *params, const float *grads, float *m, float *v, size_t n, long step,
                  const dt_adamw_hparams *h)
{
    dtk_adamw_consts k = dtk_adamw_consts_of(h->lr, h->beta1, h->beta2, h->eps, h->weight_decay,
                                             step);
    LAUNCH(adamw_kernel, n, ELEM_THREADS, params, grads, m, v, k, n);
    settle("adamw");
}

/* Positional, in dt_backend's field order (C++ has no C designated
 * initializers before C++20). */
static const dt_backend cuda_backend = {
    "cuda",
    cuda_alloc,
    cuda_free,
    cuda_zero,
    cuda_to_host,
    cuda_from_host,
    cuda_copy,
    encoder_forward,
    encoder_backward,
    layernorm_forward,
    layernorm_backward,
    matmul_forward,
    matmul_backward,
    attention_forward,
    attention_backward,
    gelu_forward,
    gelu_backward,
    residual_forward,
    crossentropy_forward,
    crossentropy_backward,
    adamw,
};

/* ---- opening and checking ------------------------------------------------------ */

/* What a failed cudaGetDeviceCount means, in words a user can act on. */
static void explain_no_device(cudaError_t e, char *err, size_t errlen)
{
    if (e == cudaErrorInsufficientDriver)
        snprintf(err, errlen,
                 "cuda: no usable NVIDIA driver: libcuda is not installed, or is older than "
                 "this build's CUDA runtime %d.%d (%s); install or update the driver, or run "
                 "with --device cpu",
                 CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10, cudaGetErrorName(e));
    else if (e == cudaErrorNoDevice)
        snprintf(err, errlen,
                 "cuda: the driver found no CUDA device (%s); check nvidia-smi and "
                 "CUDA_VISIBLE_DEVICES, or run with --device cpu",
                 cudaGetErrorName(e));
    else
        snprintf(err, errlen, "cuda: cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
                 cudaGetErrorName(e));
}

/* Selects the device on this thread and makes its cuBLAS handle, under the
 * lock. Returns DT_OK, or a status with err written. */
static dt_status open_locked(int device, char *err, size_t errlen)
{
    if (g_cuda.device >= 0) {
        if (g_cuda.device == device) { /* again, maybe from another thread */
            cudaError_t e = cudaSetDevice(device);
            if (e == cudaSuccess)
                return DT_OK;
            snprintf(err, errlen, "cuda: cudaSetDevice(%d): %s (%s)", device, cudaGetErrorString(e),
                     cudaGetErrorName(e));
            return DT_ESYS;
        }
        snprintf(err, errlen,
                 "cuda: this process already uses device %d; one device per "
                 "process (one rank per GPU), asked for %d",
                 g_cuda.device, device);
        return DT_EINVAL;
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        explain_no_device(e == cudaSuccess ? cudaErrorNoDevice : e, err, errlen);
        return DT_ESYS;
    }
    if (device < 0 || device >= count) {
        snprintf(err, errlen,
                 "cuda: device %d asked for (LOCAL_RANK), but this machine has "
                 "%d CUDA device%s (0..%d)",
                 device, count, count == 1 ? "" : "s", count - 1);
        return DT_EINVAL;
    }
    e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cuda: cudaSetDevice(%d): %s (%s)", device, cudaGetErrorString(e),
                 cudaGetErrorName(e));
        return DT_ESYS;
    }
    cublasHandle_t h;
    cublasStatus_t s = cublasCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "cuda:%d: cublasCreate: %s", device, cublasGetStatusString(s));
        return DT_ESYS;
    }
    /* fp32 as the CPU computes it: no TF32 tensor-core rounding */
    cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
    g_cuda.device = device;
    g_cuda.blas = h;
    return DT_OK;
}

static dt_status cuda_backend_open(const dt_backend **out, int device, char *err, size_t errlen)
{
    *out = NULL;
    pthread_mutex_lock(&g_cuda.lock);
    dt_status st = open_locked(device, err, errlen);
    pthread_mutex_unlock(&g_cuda.lock);
    if (st == DT_OK)
        *out = &cuda_backend;
    return st;
}

static dt_status cuda_backend_check(char *err, size_t errlen)
{
    if (g_cuda.device < 0) {
        snprintf(err, errlen, "cuda: the backend was never opened");
        return DT_EINVAL;
    }
    settle("dt_backend_cuda_check");
    pthread_mutex_lock(&g_cuda.lock);
    int failed = g_cuda.failed;
    if (failed) {
        snprintf(err, errlen, "%s", g_cuda.err);
        g_cuda.failed = 0;
    }
    pthread_mutex_unlock(&g_cuda.lock);
    return failed ? DT_ESYS : DT_OK;
}

/* The module's entry for the model (backend_cuda_entry.h), found by dlsym. */
extern "C" const dt_backend_cuda_entry dt_cuda_module_backend = {
    DT_CUDA_MODULE_ABI,
    cuda_backend_open,
    cuda_backend_check,
};
