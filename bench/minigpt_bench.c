/*
 * minigpt_bench.c — how fast does one MiniGPT training step run on the CPU?
 *
 *   minigpt-bench [-V 64] [-C 32] [-H 4] [-L 2] [-T 16] [-B 4]
 *                 [-n steps] [-w warmup] [-t threads] [-b backend]
 *                 [--precision fp32|bf16]
 *
 * One step is what a training loop does: forward with loss, zero grads,
 * backward, AdamW update — on random tokens (the seed's data). After w
 * warm-up steps it times n steps and prints one line:
 *   ms_per_step=… tok_per_s=… gflops=… params=… backend=… threads=…
 *   loss=… precision=…
 * and with -p 1 peak_gflops=… mfu=… (the step's FLOPs over sgemm's peak
 * on the same threads, dt_cpu_gemm_peak on squares of 1024, timed after
 * the steps).
 * ms_per_step is the median of the n step times (robust to a noisy, shared
 * machine); gflops counts matmul and attention flops
 * (dt_config_flops_per_step) per median step.
 *
 * Threads: -t sizes the rank's compute team (dt_threads_use; default 1,
 * to compare with torch.set_num_threads(1); bench/torch_compare.py runs
 * both).
 * --precision bf16 times the bf16 step (dt_model_set_precision: matmul
 * weights and stored activations rounded to bf16 around the fp32 kernels,
 * the portable path) for a run beside fp32's.
 * The usage text and the parser read the same table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dt_clock.h"
#include "dt_flags.h"
#include "dt_model.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    dt_config c = dt_config_seed();
    int B = 4, steps = 200, warmup = 20, threads = 1, peak = 0;
    const char *backend = "cpu", *precision = "fp32";
    const dt_flag flags[] = {
        {"-V", NULL, "N", &c.V, NULL, 1, 1000000, "vocabulary size"},
        {"-C", NULL, "N", &c.C, NULL, 1, 1000000, "embedding width"},
        {"-H", NULL, "N", &c.H, NULL, 1, 1000000, "attention heads"},
        {"-L", NULL, "N", &c.L, NULL, 1, 1000000, "layers"},
        {"-T", NULL, "N", &c.T, NULL, 1, 1000000, "context length"},
        {"-B", NULL, "N", &B, NULL, 1, 1000000, "batch size"},
        {"-n", NULL, "N", &steps, NULL, 1, 1000000, "timed steps"},
        {"-w", NULL, "N", &warmup, NULL, 0, 1000000, "warm-up steps"},
        {"-t", NULL, "N", &threads, NULL, 1, 1024,
         "compute threads (one OpenMP team; OpenBLAS kept at 1)"},
        {"-b", NULL, "NAME", NULL, &backend, 0, 0, "backend: cpu or cpu-reference"},
        {NULL, "--precision", "TYPE", NULL, &precision, 0, 0, "fp32 or bf16 (model/precision.c)"},
        {"-p", NULL, "0|1", &peak, NULL, 0, 1,
         "1: also time sgemm's peak on the same threads (peak_gflops=, mfu=)"},
    };
    int n_flags = (int)(sizeof flags / sizeof flags[0]);
    int prc = dt_flags_parse("minigpt-bench", flags, n_flags, argc, argv);
    if (prc == DT_FLAGS_HELP) {
        printf("usage: minigpt-bench [flags]\n");
        dt_flags_usage(stdout, flags, n_flags);
        return 0;
    }
    if (prc)
        return DT_FLAGS_USAGE_ERROR;
    if (strcmp(backend, "cpu") && strcmp(backend, "cpu-reference"))
        return dt_flag_error("minigpt-bench", "-b: must be cpu or cpu-reference, got '%s'",
                             backend);
    if (strcmp(precision, "fp32") && strcmp(precision, "bf16"))
        return dt_flag_error("minigpt-bench", "--precision: must be fp32 or bf16, got '%s'",
                             precision);
    const dt_backend *be = strcmp(backend, "cpu-reference") == 0 ? dt_backend_cpu_reference()
                                                                 : dt_backend_cpu();
    dt_threads_use(threads);

    dt_model *m;
    if (dt_model_create(&m, &c, be, B) != DT_OK ||
        (strcmp(precision, "bf16") == 0 && dt_model_set_precision(m, DT_PRECISION_BF16) != DT_OK)) {
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
           "backend=%s threads=%d loss=%.4f precision=%s",
           med * 1e3, (double)B * c.T / med, flops / med * 1e-9, m->num_params, be->name, threads,
           m->mean_loss, precision);
    if (peak) {
        double pk = dt_cpu_gemm_peak(1024, 7);
        printf(" peak_gflops=%.2f mfu=%.3f", pk, flops / med * 1e-9 / pk);
    }
    printf("\n");
    free(in);
    free(tg);
    free(times);
    dt_model_destroy(m);
    return 0;
}
