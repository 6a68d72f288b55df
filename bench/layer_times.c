/*
 * layer_times.c — what one layer of a MiniGPT step costs outside the
 * products, fast kernel beside the one it replaced, one thread.
 *
 *   layer-times [-C 256 -H 8 -T 128 -B 8]
 *
 * For one config's shapes: attention forward and backward in register
 * tiles (model/attention_tiles.c) and on sgemm (kernels_cpu.c's path,
 * the fallback); GELU forward and backward with fastmath.h's rational erf
 * and with glibc's erff/expf (the reference kernels); LayerNorm forward
 * and its input gradient with lane sums and with one running sum (the
 * reference). Each is the best of 9 rounds in the calling thread's CPU
 * time, so another process's load moves it little. These are the figures
 * behind docs/05's "Threads and bits" (bench/README.md has the table).
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "dt_flags.h"
#include "dt_model.h"
#include "model_internal.h"

enum { ROUNDS = 9 };

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct shapes {
    int B, T, C, NH;
    size_t nq, no, na, nh; /* qkv, (B,T,C), (B,NH,T,T), (B,T,4C) */
    float *qkv, *dqkv, *out, *dout, *att, *scr, *h, *dh, *hout, *w, *b, *mean, *rstd;
} shapes;

/* one timed kernel: which = 0 the fast one, 1 the one it replaced */
typedef void (*kernel_fn)(shapes *s, int which);

static void attention_fwd(shapes *s, int which)
{
    if (which == 0)
        dt_tiles_attention_forward(s->out, s->att, s->qkv, s->B, s->T, s->C, s->NH);
    else
        dt_sgemm_attention_forward(s->out, s->att, s->qkv, s->B, s->T, s->C, s->NH);
}

static void attention_bwd(shapes *s, int which)
{
    if (which == 0)
        dt_tiles_attention_backward(s->dqkv, s->scr, s->dout, s->qkv, s->att, s->B, s->T, s->C,
                                    s->NH);
    else
        dt_sgemm_attention_backward(s->dqkv, s->scr, s->dout, s->qkv, s->att, s->B, s->T, s->C,
                                    s->NH);
}

static void gelu_fwd(shapes *s, int which)
{
    (which == 0 ? dt_cpu_gelu_forward : dt_ref_gelu_forward)(s->hout, s->h, s->nh);
}

static void gelu_bwd(shapes *s, int which)
{
    (which == 0 ? dt_cpu_gelu_backward : dt_ref_gelu_backward)(s->dh, s->hout, s->h, s->nh);
}

static void layernorm_fwd(shapes *s, int which)
{
    (which == 0 ? dt_cpu_layernorm_forward : dt_ref_layernorm_forward)(s->out, s->mean, s->rstd,
                                                                       s->dout, s->w, s->b,
                                                                       s->B * s->T, s->C);
}

static void layernorm_dinp(shapes *s, int which)
{
    (which == 0 ? dt_cpu_layernorm_backward
                : dt_ref_layernorm_backward)(s->dqkv, NULL, NULL, s->out, s->dout, s->w, s->mean,
                                             s->rstd, s->B * s->T, s->C);
}

static double best_us(kernel_fn k, shapes *s, int which)
{
    double best = 1e30;
    k(s, which); /* warm */
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = cpu_now();
        k(s, which);
        double t = cpu_now() - t0;
        best = t < best ? t : best;
    }
    return best * 1e6;
}

static float *filled(size_t n, unsigned *seed)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    if (!x) {
        fprintf(stderr, "layer-times: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        x[i] = (float)(*seed >> 8) / (float)(1u << 24) * 4.0f - 2.0f;
    }
    return x;
}

int main(int argc, char **argv)
{
    shapes s = {.B = 8, .T = 128, .C = 256, .NH = 8};
    const dt_flag flags[] = {
        {"-C", NULL, "N", &s.C, NULL, 1, 100000, "embedding width"},
        {"-H", NULL, "N", &s.NH, NULL, 1, 1000, "attention heads"},
        {"-T", NULL, "N", &s.T, NULL, 1, 100000, "context length"},
        {"-B", NULL, "N", &s.B, NULL, 1, 100000, "batch size"},
    };
    int n_flags = (int)(sizeof flags / sizeof flags[0]);
    int prc = dt_flags_parse("layer-times", flags, n_flags, argc, argv);
    if (prc == DT_FLAGS_HELP) {
        printf("usage: layer-times [flags]\n");
        dt_flags_usage(stdout, flags, n_flags);
        return 0;
    }
    if (prc)
        return DT_FLAGS_USAGE_ERROR;
    if (s.C % s.NH != 0) {
        fprintf(stderr, "layer-times: -C %d is not a multiple of -H %d\n", s.C, s.NH);
        return 2;
    }
    dt_threads_use(1);
    unsigned seed = 1;
    size_t N = (size_t)s.B * s.T;
    s.nq = N * 3 * s.C, s.no = N * s.C, s.na = (size_t)s.B * s.NH * s.T * s.T, s.nh = N * 4 * s.C;
    s.qkv = filled(s.nq, &seed), s.dqkv = filled(s.nq, &seed), s.out = filled(s.no, &seed);
    s.dout = filled(s.no, &seed), s.att = filled(s.na, &seed), s.scr = filled(s.na, &seed);
    s.h = filled(s.nh, &seed), s.dh = filled(s.nh, &seed), s.hout = filled(s.nh, &seed);
    s.w = filled((size_t)s.C, &seed), s.b = filled((size_t)s.C, &seed);
    s.mean = filled(N, &seed), s.rstd = filled(N, &seed);

    int tiles = dt_attention_tiles_usable(s.T, s.C, s.NH);
    struct {
        const char *layer, *op, *fast, *old;
        kernel_fn k;
    } rows[] = {
        {"attention", "forward", "tiles", "sgemm", attention_fwd},
        {"attention", "backward", "tiles", "sgemm", attention_bwd},
        {"GELU", "forward", "rational erf", "glibc erff", gelu_fwd},
        {"GELU", "backward", "rational erf", "glibc erff", gelu_bwd},
        {"LayerNorm", "forward", "lane sums", "one sum", layernorm_fwd},
        {"LayerNorm", "dinp", "lane sums", "one sum", layernorm_dinp},
    };
    printf("one thread, one layer, CPU time (best of %d); B %d T %d C %d H %d (head size %d)\n",
           ROUNDS, s.B, s.T, s.C, s.NH, s.C / s.NH);
    printf("%-10s %-9s %-13s %10s   %-11s %10s %7s\n", "layer", "op", "fast", "us", "replaced",
           "us", "ratio");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (rows[i].k == attention_fwd || rows[i].k == attention_bwd) {
            if (!tiles) {
                printf("%-10s %-9s (tiles do not run here: head size %d or no AVX2/FMA)\n",
                       rows[i].layer, rows[i].op, s.C / s.NH);
                continue;
            }
        }
        double fast = best_us(rows[i].k, &s, 0), old = best_us(rows[i].k, &s, 1);
        printf("%-10s %-9s %-13s %10.1f   %-11s %10.1f %6.2fx\n", rows[i].layer, rows[i].op,
               rows[i].fast, fast, rows[i].old, old, old / fast);
    }
    return 0;
}
