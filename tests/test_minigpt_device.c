/*
 * test_minigpt_device.c — `minigpt --device cuda` as a program: on a
 * machine without a GPU (CI) it stops with a message naming what is
 * missing (the driver, or a device) and exit code 1, never a crash; alone
 * (the model backend refuses) and as two ranks under dtrain-launch (the
 * communicator's staging device refuses first). On a machine with a GPU
 * the same runs must train. And `--device cuda-host`, the CUDA kernel
 * bodies run on the host inside the real trainer: DDP/ZeRO-1 ranks, the
 * checkpoint's host mirror (save, verify, resume), the loss curve against
 * the CPU backend's.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "dt_model.h"
#include "run_program.h"

#ifndef MINIGPT_BIN
#error "MINIGPT_BIN must name the built minigpt"
#endif

/* each test its own files: Criterion may run them in parallel */
#define LOG(name) "/tmp/dt_test_mgdev_" name ".log"

/* Either it trained (a GPU is here), or it failed cleanly with exit code 1,
 * naming what is missing: the driver or a device, or in a build without
 * CUDA, how to build it in. */
static void expect_trained_or_named_failure(int rc, const char *out)
{
    cr_assert_lt(rc, 128, "killed by signal %d:\n%s", rc - 128, out);
    if (rc == 0) {
        cr_expect(strstr(out, "backend: cuda") && strstr(out, "summary:"),
                  "exit 0 without training on the GPU:\n%s", out);
        return;
    }
    cr_expect_eq(rc, 1, "exit code %d:\n%s", rc, out);
    cr_expect(strstr(out, "usage:") == NULL, "the flags were refused:\n%s", out);
    if (dt_backend_cuda_built())
        cr_expect(strstr(out, "driver") || strstr(out, "CUDA device"),
                  "the error names neither the driver nor a device:\n%s", out);
    else
        cr_expect(strstr(out, "-Dcuda") != NULL, "%s", out);
}

Test(minigpt_device, cuda_alone_trains_or_names_what_is_missing, .timeout = 120)
{
    const char *argv[] = {MINIGPT_BIN, "--device", "cuda",     "--steps", "2",
                          "--data",    "random",   "--sample", "0",       NULL};
    char *out = NULL;
    int rc = run_program(argv, LOG("alone"), &out);
    expect_trained_or_named_failure(rc, out);
    free(out);
}

Test(minigpt_device, cuda_under_the_launcher_trains_or_names_what_is_missing, .timeout = 120)
{
    const char *argv[] = {LAUNCH_BIN, "-n",      "2",        MINIGPT_BIN, "--device",
                          "cuda",     "--steps", "2",        "--batch",   "2",
                          "--data",   "random",  "--sample", "0",         NULL};
    char *out = NULL;
    int rc = run_program(argv, LOG("launched"), &out);
    expect_trained_or_named_failure(rc, out);
    free(out);
}

/* ---- cuda-host: the CUDA kernels inside the real trainer, without a GPU ---- */

#define MAX_STEPS 64

/* losses[step] from a --metrics file; returns how many steps it has. */
static int read_losses(const char *path, double losses[MAX_STEPS + 1])
{
    char *text = run_slurp(path), *line = text;
    int n = 0;
    for (int i = 0; i <= MAX_STEPS; i++)
        losses[i] = NAN;
    while (line && *line) {
        int step;
        double loss;
        if (sscanf(line, "{\"event\":\"step\",\"step\":%d,\"loss\":%lf", &step, &loss) == 2 &&
            step >= 1 && step <= MAX_STEPS) {
            losses[step] = loss;
            n++;
        }
        line = strchr(line, '\n');
        line = line ? line + 1 : NULL;
    }
    free(text);
    return n;
}

static void run_ok(const char *const *argv, const char *log, char **out)
{
    int rc = run_program(argv, log, out);
    cr_assert_eq(rc, 0, "%s exited %d:\n%s", argv[0], rc, *out);
}

/* The seed preset on 2 ranks, its checkpoint verified through the host
 * mirror, the loss curve within 1e-4 of the CPU backend's at every step
 * (the comparison gpu_check.sh makes on a GPU). */
Test(minigpt_device, cuda_host_seed_run_verifies_its_checkpoint_and_matches_cpu, .timeout = 300)
{
    const char *cpu[] = {LAUNCH_BIN, "-n",   "2",         MINIGPT_BIN,
                         "--preset", "seed", "--sample",  "0",
                         "--device", "cpu",  "--metrics", "/tmp/dt_test_mgdev_cpu.jsonl",
                         NULL};
    const char *host[] = {LAUNCH_BIN, "-n",        "2",         MINIGPT_BIN,
                          "--preset", "seed",      "--sample",  "0",
                          "--device", "cuda-host", "--metrics", "/tmp/dt_test_mgdev_host.jsonl",
                          NULL};
    char *out = NULL;
    run_ok(cpu, LOG("seed_cpu"), &out);
    free(out);
    run_ok(host, LOG("seed_host"), &out);
    cr_expect(strstr(out, "backend: cuda-host") != NULL, "%s", out);
    cr_expect(strstr(out, "RESUME VERIFIED") != NULL, "%s", out);
    free(out);
    double a[MAX_STEPS + 1], b[MAX_STEPS + 1];
    cr_assert_eq(read_losses("/tmp/dt_test_mgdev_cpu.jsonl", a), 20);
    cr_assert_eq(read_losses("/tmp/dt_test_mgdev_host.jsonl", b), 20);
    for (int s = 1; s <= 20; s++)
        cr_expect(fabs(b[s] - a[s]) <= 1e-4 * fabs(a[s]), "step %d: cuda-host loss %.7f, cpu %.7f",
                  s, b[s], a[s]);
    remove("/tmp/dt_test_mgdev_cpu.jsonl");
    remove("/tmp/dt_test_mgdev_host.jsonl");
}

/* Saved at step 6 through the host mirror, resumed into device memory: the
 * next six losses are bitwise those of a run never interrupted. */
Test(minigpt_device, cuda_host_resume_continues_the_uninterrupted_curve, .timeout = 300)
{
    char dir[] = "/tmp/dt_test_mgdev_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    const char *whole[] = {MINIGPT_BIN,
                           "--device",
                           "cuda-host",
                           "--data",
                           "random",
                           "--batch",
                           "4",
                           "--steps",
                           "12",
                           "--sample",
                           "0",
                           "--metrics",
                           "/tmp/dt_test_mgdev_whole.jsonl",
                           NULL};
    const char *first[] = {MINIGPT_BIN, "--device",     "cuda-host", "--data",
                           "random",    "--batch",      "4",         "--steps",
                           "6",         "--sample",     "0",         "--ckpt-dir",
                           dir,         "--ckpt-every", "6",         NULL};
    const char *rest[] = {MINIGPT_BIN,
                          "--device",
                          "cuda-host",
                          "--data",
                          "random",
                          "--batch",
                          "4",
                          "--steps",
                          "12",
                          "--sample",
                          "0",
                          "--ckpt-dir",
                          dir,
                          "--resume",
                          "auto",
                          "--metrics",
                          "/tmp/dt_test_mgdev_rest.jsonl",
                          NULL};
    char *out = NULL;
    run_ok(whole, LOG("resume_whole"), &out);
    free(out);
    run_ok(first, LOG("resume_first"), &out);
    free(out);
    run_ok(rest, LOG("resume_rest"), &out);
    cr_expect(strstr(out, "resume:") != NULL, "%s", out);
    free(out);
    double a[MAX_STEPS + 1], b[MAX_STEPS + 1];
    cr_assert_eq(read_losses("/tmp/dt_test_mgdev_whole.jsonl", a), 12);
    cr_assert_eq(read_losses("/tmp/dt_test_mgdev_rest.jsonl", b), 6);
    for (int s = 7; s <= 12; s++)
        cr_expect(b[s] == a[s], "step %d: resumed loss %.9g, uninterrupted %.9g", s, b[s], a[s]);
    remove("/tmp/dt_test_mgdev_whole.jsonl");
    remove("/tmp/dt_test_mgdev_rest.jsonl");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

Test(minigpt_device, unknown_device_is_refused_by_name, .timeout = 60)
{
    const char *argv[] = {MINIGPT_BIN, "--device", "tpu", NULL};
    char *out = NULL;
    int rc = run_program(argv, LOG("unknown"), &out);
    cr_expect_eq(rc, 2, "exit code %d:\n%s", rc, out);
    cr_expect(strstr(out, "'tpu'") != NULL, "%s", out);
    free(out);
}
