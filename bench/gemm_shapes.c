/*
 * gemm_shapes.c — which sgemm runs MiniGPT's products fastest on this CPU?
 *
 *   gemm-shapes [-V 512 -C 256 -T 128 -B 8]
 *
 * For one config, every product a training step makes (model/kernels_cpu.c:
 * forward out = inp . w^T, backward dinp = dout . w and dw += dout^T . inp,
 * for the qkv, attention-projection, MLP and head layers), each timed on one
 * thread through OpenBLAS's cblas_sgemm and, where this build found oneDNN
 * (libdnnl-dev), through dnnl_sgemm, and prints a row of GFLOP/s per
 * product. Time is the calling thread's CPU time, the best of 7 rounds of
 * ~0.3 GFLOP each: on a shared machine another process's load moves wall
 * time far more than CPU time. This is the measurement behind
 * model/gemm_cpu.c's choice of library (bench/README.md has the table).
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef DT_HAVE_DNNL
#include <dnnl.h>
#endif

#include "dt_flags.h"

typedef enum { FWD, DINP, DW } form; /* the three products of a linear layer */
static const char *form_name[] = {"out = inp.w^T", "dinp = dout.w", "dw += dout^T.inp"};

/* c (M,N) for one form, M = rows of c; K the summed length. */
static void sgemm_openblas(form f, float *c, const float *a, const float *b, int M, int N, int K)
{
    if (f == FWD)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, a, K, b, K, 0, c, N);
    else if (f == DINP)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1, a, K, b, N, 0, c, N);
    else
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, N, K, 1, a, M, b, N, 1, c, N);
}

#ifdef DT_HAVE_DNNL
static void sgemm_dnnl(form f, float *c, const float *a, const float *b, int M, int N, int K)
{
    if (f == FWD)
        dnnl_sgemm('N', 'T', M, N, K, 1, a, K, b, K, 0, c, N);
    else if (f == DINP)
        dnnl_sgemm('N', 'N', M, N, K, 1, a, K, b, N, 0, c, N);
    else
        dnnl_sgemm('T', 'N', M, N, K, 1, a, M, b, N, 1, c, N);
}
#endif

typedef void (*sgemm_fn)(form, float *, const float *, const float *, int, int, int);

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double gflops(sgemm_fn fn, form f, int M, int N, int K)
{
    float *a = malloc(sizeof(float) * (size_t)M * K), *b = malloc(sizeof(float) * (size_t)K * N);
    float *c = calloc((size_t)M * N, sizeof(float));
    for (size_t i = 0; i < (size_t)M * K; i++)
        a[i] = (float)(i % 101) / 101.0f;
    for (size_t i = 0; i < (size_t)K * N; i++)
        b[i] = (float)(i % 97) / 97.0f;
    double flops = 2.0 * M * N * K, best = 1e30;
    int reps = (int)(3e8 / flops) + 1;
    fn(f, c, a, b, M, N, K);
    for (int round = 0; round < 7; round++) {
        double t0 = cpu_now();
        for (int r = 0; r < reps; r++)
            fn(f, c, a, b, M, N, K);
        double t = (cpu_now() - t0) / reps;
        best = t < best ? t : best;
    }
    free(a);
    free(b);
    free(c);
    return flops / best * 1e-9;
}

int main(int argc, char **argv)
{
    int V = 512, C = 256, T = 128, B = 8;
    const dt_flag flags[] = {
        {"-V", NULL, "N", &V, NULL, 1, 1000000, "vocabulary size"},
        {"-C", NULL, "N", &C, NULL, 1, 100000, "embedding width"},
        {"-T", NULL, "N", &T, NULL, 1, 100000, "context length"},
        {"-B", NULL, "N", &B, NULL, 1, 100000, "batch size"},
    };
    int n_flags = (int)(sizeof flags / sizeof flags[0]);
    int prc = dt_flags_parse("gemm-shapes", flags, n_flags, argc, argv);
    if (prc == DT_FLAGS_HELP) {
        printf("usage: gemm-shapes [flags]\n");
        dt_flags_usage(stdout, flags, n_flags);
        return 0;
    }
    if (prc)
        return DT_FLAGS_USAGE_ERROR;
    openblas_set_num_threads(1);
    int N = B * T;
    /* each layer: (name, in features, out features) */
    struct {
        const char *name;
        int in, out;
    } layers[] = {{"qkv", C, 3 * C},
                  {"attproj", C, C},
                  {"fc", C, 4 * C},
                  {"fcproj", 4 * C, C},
                  {"lm_head", C, V}};
    printf("one thread, GFLOP/s (CPU time, best of 7); tokens N = %d\n", N);
    printf("%-8s %-17s %6s %6s %6s %9s", "layer", "product", "M", "N", "K", "OpenBLAS");
#ifdef DT_HAVE_DNNL
    printf(" %9s", "oneDNN");
#endif
    printf("\n");
    for (size_t l = 0; l < sizeof layers / sizeof layers[0]; l++)
        for (int f = FWD; f <= DW; f++) {
            int in = layers[l].in, out = layers[l].out;
            /* (M, N, K) of c = a . b for each form */
            int M = f == DW ? out : N, Nc = f == FWD ? out : in,
                K = f == FWD    ? in
                    : f == DINP ? out
                                : N;
            printf("%-8s %-17s %6d %6d %6d %9.1f", layers[l].name, form_name[f], M, Nc, K,
                   gflops(sgemm_openblas, (form)f, M, Nc, K));
#ifdef DT_HAVE_DNNL
            printf(" %9.1f", gflops(sgemm_dnnl, (form)f, M, Nc, K));
#endif
            printf("\n");
            fflush(stdout);
        }
    return 0;
}
