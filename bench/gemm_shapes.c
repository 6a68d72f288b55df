/*
 * gemm_shapes.c — which sgemm runs MiniGPT's products fastest on this CPU?
 *
 *   gemm-shapes [-V 512 -C 256 -T 128 -B 8]
 *
 * For one config, every product a training step makes (model/kernels_cpu.c:
 * forward out = inp . w^T, backward dinp = dout . w and dw += dout^T . inp,
 * for the qkv, attention-projection, MLP and head layers), each timed on one
 * thread through OpenBLAS's cblas_sgemm and, where this build found oneDNN
 * (libdnnl-dev), through dnnl_sgemm and through oneDNN's matmul on bf16
 * operands with fp32 accumulation and output (what --precision bf16's
 * matmuls compute: the rounded operands, an fp32 sum), and prints a row of
 * GFLOP/s per product. The bf16 column is the candidate for a native bf16
 * path: on a CPU with AVX512-BF16 oneDNN runs it on that instruction set;
 * on one without it may have none ("none": oneDNN 2.6 on an AVX2 CPU
 * builds no bf16 matmul). dw's bf16 product overwrites where the others
 * accumulate: the same multiply-adds. Time is the calling thread's CPU time, the best of 7 rounds of
 * ~0.3 GFLOP each: on a shared machine another process's load moves wall
 * time far more than CPU time. This is the measurement behind
 * model/gemm_cpu.c's choice of library (bench/README.md has the table).
 */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef DT_HAVE_DNNL
#include <dnnl.h>
#endif
#ifdef _OPENMP
#include <omp.h>
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

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef void (*sgemm_fn)(form, float *, const float *, const float *, int, int, int);

/* GFLOP/s of run(ctx), a product of `flops`: one call to warm up, then
 * the best of 7 rounds of ~0.3 GFLOP each, in the thread's CPU time. */
static double best_gflops(void (*run)(void *), void *ctx, double flops)
{
    int reps = (int)(3e8 / flops) + 1;
    double best = 1e30;
    run(ctx);
    for (int round = 0; round < 7; round++) {
        double t0 = cpu_now();
        for (int r = 0; r < reps; r++)
            run(ctx);
        double t = (cpu_now() - t0) / reps;
        best = t < best ? t : best;
    }
    return flops / best * 1e-9;
}

#ifdef DT_HAVE_DNNL
/* oneDNN's matmul c (M,N) = a (M,K) . b (K,N) on bf16 operands laid out as
 * the form has them (a transposed for dw, b for the forward), fp32 c. */
typedef struct bf16_matmul {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
} bf16_matmul;

static int bf16_matmul_open(bf16_matmul *g, form f, int M, int N, int K, void *a, void *b, float *c)
{
    dnnl_memory_desc_t ad, bd, cd;
    const dnnl_dims_t adims = {M, K}, bdims = {K, N}, cdims = {M, N};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    int ok = dnnl_engine_create(&g->engine, dnnl_cpu, 0) == dnnl_success &&
             dnnl_stream_create(&g->stream, g->engine, dnnl_stream_default_flags) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&ad, 2, adims, dnnl_bf16, f == DW ? dnnl_ba : dnnl_ab) ==
                 dnnl_success &&
             dnnl_memory_desc_init_by_tag(&bd, 2, bdims, dnnl_bf16, f == FWD ? dnnl_ba : dnnl_ab) ==
                 dnnl_success &&
             dnnl_memory_desc_init_by_tag(&cd, 2, cdims, dnnl_f32, dnnl_ab) == dnnl_success &&
             dnnl_matmul_desc_init(&md, &ad, &bd, NULL, &cd) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &md, NULL, g->engine, NULL) == dnnl_success &&
             dnnl_primitive_create(&g->prim, pd) == dnnl_success &&
             dnnl_memory_create(&g->a, &ad, g->engine, a) == dnnl_success &&
             dnnl_memory_create(&g->b, &bd, g->engine, b) == dnnl_success &&
             dnnl_memory_create(&g->c, &cd, g->engine, c) == dnnl_success;
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return ok;
}

static void bf16_matmul_run(void *ctx)
{
    const bf16_matmul *g = ctx;
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, g->a},
                               {DNNL_ARG_WEIGHTS, g->b},
                               {DNNL_ARG_DST, g->c}};
    dnnl_primitive_execute(g->prim, g->stream, 3, args);
    dnnl_stream_wait(g->stream);
}

static void bf16_matmul_close(bf16_matmul *g)
{
    dnnl_memory_destroy(g->a);
    dnnl_memory_destroy(g->b);
    dnnl_memory_destroy(g->c);
    dnnl_primitive_destroy(g->prim);
    dnnl_stream_destroy(g->stream);
    dnnl_engine_destroy(g->engine);
}

/* GFLOP/s of the bf16 matmul (0 when oneDNN cannot build it), timed as
 * gflops times sgemm. */
static double gflops_bf16(form f, int M, int N, int K)
{
    uint16_t *a = calloc((size_t)M * K, 2), *b = calloc((size_t)K * N, 2);
    float *c = calloc((size_t)M * N, sizeof(float));
    for (size_t i = 0; i < (size_t)M * K; i++)
        a[i] = (uint16_t)(0x3f00 + i % 101); /* 0.5 .. 0.9: a spread of bf16 values */
    for (size_t i = 0; i < (size_t)K * N; i++)
        b[i] = (uint16_t)(0x3f00 + i % 97);
    bf16_matmul g = {0};
    double gf = 0;
    if (bf16_matmul_open(&g, f, M, N, K, a, b, c)) {
        gf = best_gflops(bf16_matmul_run, &g, 2.0 * M * N * K);
        bf16_matmul_close(&g);
    }
    free(a);
    free(b);
    free(c);
    return gf;
}
#endif


/* One sgemm with its arguments, for best_gflops. */
typedef struct sgemm_call {
    sgemm_fn fn;
    form f;
    float *c;
    const float *a, *b;
    int M, N, K;
} sgemm_call;

static void sgemm_run(void *ctx)
{
    const sgemm_call *s = ctx;
    s->fn(s->f, s->c, s->a, s->b, s->M, s->N, s->K);
}

static double gflops(sgemm_fn fn, form f, int M, int N, int K)
{
    float *a = malloc(sizeof(float) * (size_t)M * K), *b = malloc(sizeof(float) * (size_t)K * N);
    float *c = calloc((size_t)M * N, sizeof(float));
    for (size_t i = 0; i < (size_t)M * K; i++)
        a[i] = (float)(i % 101) / 101.0f;
    for (size_t i = 0; i < (size_t)K * N; i++)
        b[i] = (float)(i % 97) / 97.0f;
    sgemm_call call = {fn, f, c, a, b, M, N, K};
    double gf = best_gflops(sgemm_run, &call, 2.0 * M * N * K);
    free(a);
    free(b);
    free(c);
    return gf;
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
#ifdef _OPENMP
    /* oneDNN runs on OpenMP's threads, all cores unless told: the calling
     * thread's CPU time would then count only its share of the work */
    omp_set_num_threads(1);
#endif
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
    printf(" %9s %11s", "oneDNN", "oneDNN bf16");
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
            double g16 = gflops_bf16((form)f, M, Nc, K);
            printf(" %9.1f", gflops(sgemm_dnnl, (form)f, M, Nc, K));
            if (g16 > 0)
                printf(" %11.1f", g16);
            else /* oneDNN has no bf16 matmul for this CPU */
                printf(" %11s", "none");
#endif
            printf("\n");
            fflush(stdout);
        }
    return 0;
}
