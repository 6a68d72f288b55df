/*
 * minigpt_bench.c — how fast does one MiniGPT training step run on the CPU?
 *
 *   minigpt-bench [-V 64] [-C 32] [-H 4] [-L 2] [-T 16] [-B 4]
 *                 [-n steps] [-w warmup] [-t threads] [-b backend]
 *
 * One step is what a training loop does: forward with loss, zero grads,
 * backward, AdamW update — on random tokens (the seed's data). After w
 * warm-up steps it times n steps and prints one line:
 *   ms_per_step=… tok_per_s=… gflops=… params=… backend=… threads=…
 * ms_per_step is the median of the n step times (robust to a noisy, shared
 * machine); gflops counts matmul and attention flops
 * (dt_config_flops_per_step) per median step.
 *
 * Threads: OpenBLAS's pool size is process-wide, so the benchmark — a
 * program, not the library — sets it (default 1, to compare with
 * torch.set_num_threads(1); bench/torch_compare.py runs both).
 * The usage text and the parser read the same table.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dt_clock.h"
#include "dt_flags.h"
#include "dt_model.h"

typedef struct option {
    const char *flag;
    const char *help;
    int *value;
} option;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void usage(FILE *f, const option *opts, int n)
{
    fprintf(f, "usage: minigpt-bench [options]\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "  %s N   %s (default %d)\n", opts[i].flag, opts[i].help, *opts[i].value);
    fprintf(f, "  -b NAME   backend: cpu or cpu-reference (default cpu)\n"
               "  -h, --help  print this help and exit\n");
}

int main(int argc, char **argv)
{
    dt_config c = dt_config_seed();
    int B = 4, steps = 200, warmup = 20, threads = 1;
    const char *backend = "cpu";
    option opts[] = {
        {"-V", "vocabulary size", &c.V},      {"-C", "embedding width", &c.C},
        {"-H", "attention heads", &c.H},      {"-L", "layers", &c.L},
        {"-T", "context length", &c.T},       {"-B", "batch size", &B},
        {"-n", "timed steps", &steps},        {"-w", "warm-up steps", &warmup},
        {"-t", "OpenBLAS threads", &threads},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    if (dt_flag_help_asked(argc, argv)) {
        usage(stdout, opts, nopts);
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        int matched = 0;
        if (strcmp(argv[i], "-b") == 0 && i + 1 < argc) {
            backend = argv[++i];
            if (strcmp(backend, "cpu") && strcmp(backend, "cpu-reference"))
                return dt_flag_error("minigpt-bench", "-b: must be cpu or cpu-reference, got '%s'",
                                     backend);
            continue;
        }
        for (int k = 0; k < nopts && !matched; k++)
            if (strcmp(argv[i], opts[k].flag) == 0 && i + 1 < argc) {
                char *end;
                long v = strtol(argv[++i], &end, 10);
                if (end == argv[i] || *end || v < 0 || v > 1000000)
                    return dt_flag_error("minigpt-bench",
                                         "%s: must be an integer in 0..1000000, got '%s'",
                                         opts[k].flag, argv[i]);
                *opts[k].value = (int)v;
                matched = 1;
            }
        if (!matched)
            return dt_flag_error("minigpt-bench", "unknown flag or missing value: '%s'", argv[i]);
    }
    const dt_backend *be = strcmp(backend, "cpu-reference") == 0 ? dt_backend_cpu_reference()
                                                                 : dt_backend_cpu();
    if (steps < 1 || threads < 1)
        return dt_flag_error("minigpt-bench", "%s: must be at least 1, got 0",
                             steps < 1 ? "-n" : "-t");
    openblas_set_num_threads(threads);

    dt_model *m;
    if (dt_model_create(&m, &c, be, B) != DT_OK) {
        fprintf(stderr, "minigpt-bench: %s\n", dt_model_error(m));
        dt_model_destroy(m);
        return 1;
    }
    dt_model_init(m, 1337);
    int *in = malloc((size_t)B * c.T * sizeof(int));
    int *tg = malloc((size_t)B * c.T * sizeof(int));
    double *times = malloc((size_t)steps * sizeof(double));
    dt_rng r;
    dt_rng_seed(&r, 42);
    for (int i = 0; i < B * c.T; i++) {
        in[i] = (int)(dt_rng_next(&r) % (uint64_t)c.V);
        tg[i] = (int)(dt_rng_next(&r) % (uint64_t)c.V);
    }
    dt_adamw_hparams h = dt_adamw_defaults(1e-3f);
    for (int s = 0; s < warmup + steps; s++) {
        double t0 = dt_now();
        dt_model_forward(m, in, tg, B, c.T);
        dt_model_zero_grad(m);
        dt_model_backward(m, 1.0f);
        dt_model_update(m, &h, s + 1);
        if (s >= warmup)
            times[s - warmup] = dt_now() - t0;
    }
    qsort(times, (size_t)steps, sizeof(double), cmp_double);
    double med = times[steps / 2];
    double flops = dt_config_flops_per_step(&c, B, c.T);
    printf("ms_per_step=%.4f tok_per_s=%.0f gflops=%.2f params=%zu "
           "backend=%s threads=%d loss=%.4f\n",
           med * 1e3, (double)B * c.T / med, flops / med * 1e-9, m->num_params, be->name, threads,
           m->mean_loss);
    free(in);
    free(tg);
    free(times);
    dt_model_destroy(m);
    return 0;
}
