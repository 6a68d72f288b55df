/*
 * backend_cpu.c — the CPU compute backends: tables of function pointers
 * that the model calls for every allocation, copy and layer.
 *
 * Why a table: the training loop (minigpt.c, and train/ later) is written
 * once against dt_backend; a CUDA backend will be one more table whose
 * alloc is cudaMalloc and whose kernels are cuBLAS + CUDA. For the CPU,
 * "device" memory is host memory, so to_host/from_host are memcpy.
 *
 * Two tables share memory handling:
 *   "cpu"            matmul and attention through OpenBLAS sgemm
 *                    (gemm_cpu.c); every layer and AdamW across the
 *                    calling rank's compute threads (threads.c), GELU,
 *                    softmax and cross-entropy with the vectorisable
 *                    exp/CDF of fastmath.h
 *   "cpu-reference"  the plain loops of kernels_ref.c with libm, serial
 * Tests run the same model on both and compare.
 *
 * The tables are const: no mutable global state. The team size is the
 * calling thread's OpenMP setting (dt_threads_use), which each rank sets
 * for itself.
 */
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

/* 64-byte aligned (a cache line, and any vector width), zeroed. */
static void *cpu_alloc(size_t bytes)
{
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (p)
        memset(p, 0, rounded);
    return p;
}

static void cpu_free(void *p)
{
    free(p);
}

static void cpu_zero(void *p, size_t bytes)
{
    memset(p, 0, bytes);
}

static void cpu_copy(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
}

static const dt_backend cpu_backend = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .to_host = cpu_copy,
    .from_host = cpu_copy,
    .copy = cpu_copy,
    .encoder_forward = dt_cpu_encoder_forward,
    .encoder_backward = dt_cpu_encoder_backward,
    .layernorm_forward = dt_cpu_layernorm_forward,
    .layernorm_backward = dt_cpu_layernorm_backward,
    .matmul_forward = dt_cpu_matmul_forward,
    .matmul_backward = dt_cpu_matmul_backward,
    .attention_forward = dt_cpu_attention_forward,
    .attention_backward = dt_cpu_attention_backward,
    .gelu_forward = dt_cpu_gelu_forward,
    .gelu_backward = dt_cpu_gelu_backward,
    .residual_forward = dt_cpu_residual_forward,
    .crossentropy_forward = dt_cpu_crossentropy_forward,
    .crossentropy_backward = dt_cpu_crossentropy_backward,
    .adamw = dt_cpu_adamw,
};

static const dt_backend cpu_reference_backend = {
    .name = "cpu-reference",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .to_host = cpu_copy,
    .from_host = cpu_copy,
    .copy = cpu_copy,
    .encoder_forward = dt_ref_encoder_forward,
    .encoder_backward = dt_ref_encoder_backward,
    .layernorm_forward = dt_ref_layernorm_forward,
    .layernorm_backward = dt_ref_layernorm_backward,
    .matmul_forward = dt_ref_matmul_forward,
    .matmul_backward = dt_ref_matmul_backward,
    .attention_forward = dt_ref_attention_forward,
    .attention_backward = dt_ref_attention_backward,
    .gelu_forward = dt_ref_gelu_forward,
    .gelu_backward = dt_ref_gelu_backward,
    .residual_forward = dt_ref_residual_forward,
    .crossentropy_forward = dt_ref_crossentropy_forward,
    .crossentropy_backward = dt_ref_crossentropy_backward,
    .adamw = dt_adamw_step,
};

const dt_backend *dt_backend_cpu(void)
{
    return &cpu_backend;
}

const dt_backend *dt_backend_cpu_reference(void)
{
    return &cpu_reference_backend;
}
