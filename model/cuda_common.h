/*
 * cuda_common.h — what every CUDA kernel header needs: the DT_HD marker.
 *
 * The CUDA backend's kernels are written in two layers (llm.c's first
 * kernel versions have the same shape):
 *
 *   body     one thread's work — one element, one row, or one column of a
 *            reduction — as a `static inline DT_HD` function in a header
 *            (cuda_encoder.h, cuda_layernorm.h, ...), in the C that both
 *            nvcc and the host C compiler accept;
 *   launch   a thin __global__ wrapper in backend_cuda.cu that computes its
 *            thread's index and calls the body, and a host loop in
 *            backend_cuda_host.c that calls the same body for every index.
 *
 * So the arithmetic a GPU runs is the arithmetic the Criterion suite checks
 * against the CPU reference on a machine without one (tests/test_cuda_kernels.c).
 * What the host loop cannot check — launch configurations, streams — lives
 * in backend_cuda.cu in as few lines as possible.
 *
 * Where a reduction crosses rows (a parameter gradient summed over tokens),
 * a body owns a column and loops over the rows in order, instead of rows
 * racing on atomics: slower on a large GPU, but deterministic, and the same
 * order of additions as the CPU reference.
 */
#ifndef DT_CUDA_COMMON_H
#define DT_CUDA_COMMON_H

#include <math.h>
#include <stddef.h>

#ifdef __CUDACC__
#define DT_HD __host__ __device__
#else
#define DT_HD
#endif

#endif /* DT_CUDA_COMMON_H */
