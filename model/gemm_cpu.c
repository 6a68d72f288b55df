/*
 * gemm_cpu.c — every O(n^3) product of the CPU backend, as OpenBLAS sgemm
 * calls: one strided form for the callers, cut into row blocks across a
 * rank's compute threads.
 *
 *   c (M,N) = [c +] a (M,K) . b (K,N)
 *
 * with a and b given by element strides (row stride, column stride), so a
 * transposed operand is the same call with the strides swapped (one of
 * each operand's strides must be 1, as BLAS storage is). The adapter maps
 * that onto cblas_sgemm's transpose flags and leading dimensions.
 *
 * Why OpenBLAS and not a GEMM of our own: measured on the model's shapes,
 * one thread each, CPU time (bench/gemm_shapes.c): on an AMD EPYC Zen 3
 * (AVX2, no AVX-512) OpenBLAS 0.3.21's Zen kernel runs 78-92 GFLOP/s,
 * where the blocked GEMM this file used to hold (GCC vector types, tuned
 * for AVX-512) ran at 1.4; on a Zen 4 (AVX-512) OpenBLAS ran 91-105 and
 * the old kernel 68-75. OpenBLAS picks its kernel for the CPU at run time
 * (DYNAMIC_ARCH), which is what this code needs on a fleet that mixes
 * both. oneDNN's sgemm (libdnnl) was 5-15% faster on the small forward
 * products and 2x slower on the weight gradient's transposed one; BLIS was
 * level or slower (bench/README.md has the table).
 *
 * Threads: dt_cpu_gemm_par cuts a product into a fixed set of pieces
 * (2 or 4 blocks of rows of c, or of columns when c is wider than tall,
 * each at least 16 MFLOP),
 * and the threads of the calling rank's OpenMP team (threads.c) share the
 * pieces out, each a serial sgemm over the whole K. The cut depends on the
 * shape alone, never on the team's size: sgemm's bits depend on the shape
 * it is called with (measured: OpenBLAS 0.3.21 takes a different kernel
 * for products under ~10^6 multiply-adds, and its column edges round
 * differently), so a cut that followed the team would give each thread
 * count its own bits. With a fixed cut every element of c comes from the
 * same call on 1 thread as on 8 (test_threads.c checks it). OpenBLAS's own
 * pool stays at one thread (dt_threads_use): one pool, never two
 * competing for the cores.
 *
 * Cost: 2*M*N*K flops; each piece packs its own copy of the operand it
 * shares (b for row pieces, a for column pieces), up to 4 packings where
 * one call would do one: on one thread the cut costs 1-2% of an 865k
 * step (measured: 8 pieces of 8 MFLOP cost 4%), which is why pieces stay
 * few and above 16 MFLOP. 4 pieces keep 2 and 4 threads balanced.
 */
#include <cblas.h>
#include <stdlib.h>
#include <time.h>

#include "dt_model.h"
#include "model_internal.h"

void dt_cpu_gemm(float *c, int ldc, const float *a, int a_rs, int a_cs, const float *b, int b_rs,
                 int b_cs, int M, int N, int K, int accumulate)
{
    dt_blas_start();
    if (M <= 0 || N <= 0)
        return;
    int ta = a_cs != 1, tb = b_cs != 1;
    int lda = ta ? a_cs : a_rs, ldb = tb ? b_cs : b_rs;
    /* BLAS wants a leading dimension >= 1 even for one row or column */
    lda = lda < 1 ? 1 : lda;
    ldb = ldb < 1 ? 1 : ldb;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
}

/* The fixed cut: a product of F flops is cut into the largest power of
 * two of pieces, at most MAX_PIECES, that leaves each at least PIECE_FLOPS
 * (so a small product stays one call, and one thread pays for few extra
 * packings), along the longer of M and N, at multiples of 16. */
#define PIECE_FLOPS (16.0 * (1 << 20))
enum { MAX_PIECES = 4 };

void dt_cpu_gemm_par(float *c, int ldc, const float *a, int a_rs, int a_cs, const float *b,
                     int b_rs, int b_cs, int M, int N, int K, int accumulate)
{
    int by_rows = M >= N, len = by_rows ? M : N;
    int want = 1;
    while (want < MAX_PIECES && 2.0 * M * N * K >= 2 * want * PIECE_FLOPS && len >= 32 * want)
        want *= 2;
    if (want == 1) {
        dt_cpu_gemm(c, ldc, a, a_rs, a_cs, b, b_rs, b_cs, M, N, K, accumulate);
        return;
    }
    int piece = (len + want - 1) / want;
    piece = (piece + 15) / 16 * 16;
    int pieces = (len + piece - 1) / piece;
#pragma omp parallel num_threads(dt_threads_current())
    {
        size_t lo, hi;
        dt_team_share((size_t)pieces, 1, &lo, &hi);
        for (size_t p = lo; p < hi; p++) {
            int x0 = (int)p * piece, n = len - x0 < piece ? len - x0 : piece;
            if (by_rows) /* rows x0.. of c and a */
                dt_cpu_gemm(c + (size_t)x0 * ldc, ldc, a + (size_t)x0 * a_rs, a_rs, a_cs, b, b_rs,
                            b_cs, n, N, K, accumulate);
            else /* columns x0.. of c and b */
                dt_cpu_gemm(c + x0, ldc, a, a_rs, a_cs, b + (size_t)x0 * b_cs, b_rs, b_cs, M, n, K,
                            accumulate);
        }
    }
}

/* Wall seconds of one call of dt_cpu_gemm_par on square n x n operands. */
static double time_square(float *c, const float *a, const float *b, int n)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    dt_cpu_gemm_par(c, n, a, n, 1, b, n, 1, n, n, n, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}

double dt_cpu_gemm_peak(int n, int reps)
{
    size_t nn = (size_t)n * n;
    float *a = malloc(nn * sizeof(float)), *b = malloc(nn * sizeof(float));
    float *c = malloc(nn * sizeof(float));
    double best = 0;
    if (a && b && c) {
        for (size_t i = 0; i < nn; i++) {
            a[i] = (float)(i % 17) / 17.0f;
            b[i] = (float)(i % 13) / 13.0f;
        }
        time_square(c, a, b, n); /* warms the caches and the team */
        for (int r = 0; r < reps; r++) {
            double t = time_square(c, a, b, n);
            double g = 2.0 * n * n * (double)n / t * 1e-9;
            best = g > best ? g : best;
        }
    }
    free(a);
    free(b);
    free(c);
    return best;
}
