/*
 * test_minigpt_device.c — `minigpt --device cuda` as a program: on a
 * machine without a GPU (CI) it stops with a message naming what is
 * missing (the driver, or a device) and exit code 1, never a crash; alone
 * (the model backend refuses) and as two ranks under dtrain-launch (the
 * communicator's staging device refuses first). On a machine with a GPU
 * the same runs must train. Flags it cannot honour are refused up front.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "dt_model.h"
#include "run_program.h"

#ifndef MINIGPT_BIN
#error "MINIGPT_BIN must name the built minigpt"
#endif

#define LOG "/tmp/dt_test_minigpt_device.log"

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
    const char *argv[] = {MINIGPT_BIN, "--device", "cuda", "--steps", "2",
                          "--data", "random", "--sample", "0", NULL};
    char *out = NULL;
    int rc = run_program(argv, LOG, &out);
    expect_trained_or_named_failure(rc, out);
    free(out);
}

Test(minigpt_device, cuda_under_the_launcher_trains_or_names_what_is_missing,
     .timeout = 120)
{
    const char *argv[] = {LAUNCH_BIN, "-n", "2", MINIGPT_BIN, "--device", "cuda",
                          "--steps", "2", "--batch", "2", "--data", "random",
                          "--sample", "0", NULL};
    char *out = NULL;
    int rc = run_program(argv, LOG, &out);
    expect_trained_or_named_failure(rc, out);
    free(out);
}

Test(minigpt_device, cuda_with_checkpoints_is_refused_before_starting, .timeout = 60)
{
    const char *argv[] = {MINIGPT_BIN, "--preset", "seed", "--device", "cuda", NULL};
    char *out = NULL;
    int rc = run_program(argv, LOG, &out);
    cr_expect_eq(rc, 2, "exit code %d:\n%s", rc, out);
    cr_expect(strstr(out, "--ckpt-every 0") != NULL, "%s", out);
    free(out);
}

Test(minigpt_device, unknown_device_is_refused_by_name, .timeout = 60)
{
    const char *argv[] = {MINIGPT_BIN, "--device", "tpu", NULL};
    char *out = NULL;
    int rc = run_program(argv, LOG, &out);
    cr_expect_eq(rc, 2, "exit code %d:\n%s", rc, out);
    cr_expect(strstr(out, "'tpu'") != NULL, "%s", out);
    free(out);
}
