/*
 * gemm_cpu.c — a small blocked single-precision GEMM that the compiler
 * vectorises: what the cpu backend's linear layers and attention run on
 * instead of OpenBLAS sgemm.
 *
 *   c (M,N) = [c +] a (M,K) . b (K,N)
 *
 * with a and b given by element strides (row stride, column stride), so a
 * transposed operand is the same call with the strides swapped: no
 * transposition is ever done by the caller.
 *
 * Why not OpenBLAS: MiniGPT's products are small (seed config: 64x32 .
 * 32x96) to mid-sized (865k config: 1024x128 . 128x512). At the small end
 * sgemm's per-call cost (dispatch, buffer set-up, beta pass, thread-pool
 * checks) is most of the time; at the mid end the Debian OpenBLAS picks
 * its Haswell (AVX2) kernel on AMD CPUs that have AVX-512, half their
 * peak. This file is the textbook Goto/BLIS loop nest, nothing more:
 *
 *   for each KC-deep slice of k:       pack b's slice into NR-wide panels
 *     for each MC-tall block of rows:  pack a's block into MR-tall panels
 *       for each b panel, a panel:     micro-kernel: MR x NR tile of c
 *
 * The micro-kernel keeps an 8 x 32 tile of c in 16 vector registers
 * (GCC vector types: one AVX-512 register each, or two AVX / four SSE
 * ones on the other clones) and adds one rank-1 update per k. Packing
 * makes both operands unit-stride and zero-pads ragged edges, so the
 * kernel has no branches; edge tiles are written through a buffer.
 * Products at most 16 wide (attention's head size) use 8 x 16 tiles.
 *
 * Cost: 2*M*N*K flops; packing touches each of a and b once per slice
 * (O(MK + KN)). The packing space (~KC*(N+MC) floats) is on the stack up
 * to 32 KiB (every product of the seed config), else one malloc per call.
 *
 * Numerics and determinism: each element of c is a sequential sum over k
 * in increasing order, a KC slice at a time added onto c, whatever the
 * tile, block or vector width; products are rounded before the add (no
 * FMA, as -std=c11 compiles it), so every clone gives the same bits. No
 * FMA is deliberate: with it, sums that cancel exactly in float (x*y -
 * x*y) leave a residue of the order of one rounding, and AdamW turns a
 * 1e-12 gradient that should be 0 into a full lr-sized step (the DDP vs
 * serial test saw it). On the AMD machine measured, mul + add ran as
 * fast as FMA (separate add pipes). Results differ from the plain
 * reference loops only by rounding; tests compare them.
 */
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

enum { MR = 8, NR = 32, KC = 256, MC = 128 };

/* Every helper is inlined into dt_cpu_gemm, so that each clone of it gets
 * its own vector code (a plain static function is compiled once, for the
 * baseline). */
#define INLINE static inline __attribute__((always_inline))

typedef float v16 __attribute__((vector_size(64)));

/* x86-64 clones for the GEMM: AVX-512 (16 zmm accumulators), AVX2 (the
 * tile spills a little, still far faster than scalar), baseline. */
#if DT_HAVE_CLONES /* see model_internal.h for when there are none */
#define DT_GEMM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DT_GEMM_CLONES
#endif

/* bp[panel][k][w] = b[k0 + k][panel*w + j], zero past column N.
 * (Full panels copy a constant NR floats, which the compiler inlines: a
 * memcpy call per 128 bytes would cost as much as the copy.) */
INLINE void pack_b(float *bp, const float *b, int b_rs, int b_cs, int kc, int N, int w)
{
    for (int j0 = 0; j0 < N; j0 += w) {
        int nr = N - j0 < w ? N - j0 : w;
        for (int k = 0; k < kc; k++) {
            const float *src = b + (size_t)k * b_rs + (size_t)j0 * b_cs;
            float *dst = bp + (size_t)k * w;
            if (b_cs == 1 && nr == w)
                memcpy(dst, src, (size_t)w * sizeof(float));
            else
                for (int j = 0; j < w; j++)
                    dst[j] = j < nr ? src[(size_t)j * b_cs] : 0.0f;
        }
        bp += (size_t)kc * w;
    }
}

/* ap[panel][k][MR] = a[panel*MR + i][k0 + k], zero past row M. */
INLINE void pack_a(float *ap, const float *a, int a_rs, int a_cs, int M, int kc)
{
    for (int i0 = 0; i0 < M; i0 += MR) {
        int mr = M - i0 < MR ? M - i0 : MR;
        const float *src = a + (size_t)i0 * a_rs;
        if (a_rs == 1 && mr == MR) /* a^T row-major: MR rows contiguous */
            for (int k = 0; k < kc; k++)
                memcpy(ap + (size_t)k * MR, src + (size_t)k * a_cs, MR * sizeof(float));
        else if (a_cs == 1 && mr == MR) { /* row-major: MR read streams */
            const float *row[MR];
            for (int i = 0; i < MR; i++)
                row[i] = src + (size_t)i * a_rs;
            for (int k = 0; k < kc; k++)
                for (int i = 0; i < MR; i++)
                    ap[(size_t)k * MR + i] = row[i][k];
        } else
            for (int k = 0; k < kc; k++)
                for (int i = 0; i < MR; i++)
                    ap[(size_t)k * MR + i] = i < mr ? src[(size_t)i * a_rs + (size_t)k * a_cs]
                                                    : 0.0f;
        ap += (size_t)kc * MR;
    }
}

/* The MR x w tile (w = 16 or 32, a constant after inlining): c[i][j]
 * (=, or += when add) sum_k ap[k][i] bp[k][j], mr x nr of it stored. */
INLINE void kernel(float *c, int ldc, const float *ap, const float *bp, int kc, int mr, int nr,
                   int add, int w)
{
    v16 acc[MR][2];
    int nv = w / 16;
    for (int i = 0; i < MR; i++)
        acc[i][0] = acc[i][1] = (v16){0};
    for (int k = 0; k < kc; k++) {
        const float *a = ap + (size_t)k * MR;
        for (int x = 0; x < nv; x++) {
            v16 bx;
            memcpy(&bx, bp + (size_t)k * w + 16 * x, sizeof bx);
            for (int i = 0; i < MR; i++)
                acc[i][x] += a[i] * bx;
        }
    }
    if (mr == MR && nr == w) {
        for (int i = 0; i < MR; i++)
            for (int x = 0; x < nv; x++) {
                float *ci = c + (size_t)i * ldc + 16 * x;
                v16 cx = acc[i][x];
                if (add) {
                    v16 o;
                    memcpy(&o, ci, sizeof o);
                    cx = o + cx;
                }
                memcpy(ci, &cx, sizeof cx);
            }
        return;
    }
    float t[MR][2 * 16];
    memcpy(t, acc, sizeof t);
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            c[(size_t)i * ldc + j] = add ? c[(size_t)i * ldc + j] + t[i][j] : t[i][j];
}

/* One packed (MC x KC) . (KC x N) block onto c, panels w wide. */
INLINE void block(float *c, int ldc, const float *ap, const float *bp, int mc, int N, int kc,
                  int add, int w)
{
    for (int j0 = 0; j0 < N; j0 += w) {
        const float *bpj = bp + (size_t)(j0 / w) * kc * w;
        int nr = N - j0 < w ? N - j0 : w;
        for (int i0 = 0; i0 < mc; i0 += MR) {
            int mr = mc - i0 < MR ? mc - i0 : MR;
            kernel(c + (size_t)i0 * ldc + j0, ldc, ap + (size_t)(i0 / MR) * kc * MR, bpj, kc, mr,
                   nr, add, w);
        }
    }
}

/* The loop nest on packing space pk (see dt_cpu_gemm for its size). */
INLINE void gemm(float *c, int ldc, const float *a, int a_rs, int a_cs, const float *b, int b_rs,
                 int b_cs, int M, int N, int K, int accumulate, float *pk, int w)
{
    int np = (N + w - 1) / w, kcmax = K < KC ? K : KC;
    float *bp = pk, *ap = pk + (size_t)kcmax * np * w;
    for (int p0 = 0; p0 < K; p0 += KC) {
        int kc = K - p0 < KC ? K - p0 : KC;
        int add = accumulate || p0 > 0;
        pack_b(bp, b + (size_t)p0 * b_rs, b_rs, b_cs, kc, N, w);
        for (int i0 = 0; i0 < M; i0 += MC) {
            int mc = M - i0 < MC ? M - i0 : MC;
            pack_a(ap, a + (size_t)i0 * a_rs + (size_t)p0 * a_cs, a_rs, a_cs, mc, kc);
            if (w == 16)
                block(c + (size_t)i0 * ldc, ldc, ap, bp, mc, N, kc, add, 16);
            else
                block(c + (size_t)i0 * ldc, ldc, ap, bp, mc, N, kc, add, 32);
        }
    }
}

/* Products whose packing fits SMALL floats pack on the stack: the seed
 * config's all do, and a malloc per call would cost ~10% of its step. */
enum { SMALL = 8192 };

DT_GEMM_CLONES
int dt_cpu_gemm(float *c, int ldc, const float *a, int a_rs, int a_cs, const float *b, int b_rs,
                int b_cs, int M, int N, int K, int accumulate)
{
    int w = N <= 16 ? 16 : NR; /* narrow products (attention's hs) */
    int np = (N + w - 1) / w, kcmax = K < KC ? K : KC;
    int mcmax = M < MC ? (M + MR - 1) / MR * MR : MC;
    size_t n = (size_t)kcmax * np * w + (size_t)kcmax * mcmax;
    float small[SMALL] __attribute__((aligned(64)));
    float *pk = n <= SMALL ? small : aligned_alloc(64, (n * sizeof(float) + 63) & ~(size_t)63);
    if (!pk)
        return -1;
    if (w == 16)
        gemm(c, ldc, a, a_rs, a_cs, b, b_rs, b_cs, M, N, K, accumulate, pk, 16);
    else
        gemm(c, ldc, a, a_rs, a_cs, b, b_rs, b_cs, M, N, K, accumulate, pk, NR);
    if (pk != small)
        free(pk);
    return 0;
}
