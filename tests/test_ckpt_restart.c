/*
 * test_ckpt_restart.c — restart on failure, end to end: the built
 * dtrain-launch runs two minigpt ranks as processes; a run where one rank
 * SIGKILLs itself and the launcher restarts the group (which resumes from
 * `latest`) ends with the same bits as a run never interrupted.
 *
 * The uninterrupted run and the interrupted one train 40 steps of the seed
 * model under ZeRO-1 (and again under ZeRO-2 and ZeRO-3) with a checkpoint every 5 steps. The fault is
 * minigpt's --die-at-step N (first attempt only): the last rank kills
 * itself after step N's update, before that step's save, so the restart
 * redoes the steps since the last checkpoint. N is drawn at random after
 * the first checkpoint (printed, to replay a failure). "Same bits" is
 * checked on everything the final checkpoint holds: the step-40 shard
 * files (parameters, master, m, v, step, data position) compare byte for
 * byte, and minigpt's final parameter hash lines match.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_fixture.h"
#include "run_program.h"

#ifndef LAUNCH_BIN
#error "LAUNCH_BIN must name the built dtrain-launch"
#endif
#ifndef MINIGPT_BIN
#error "MINIGPT_BIN must name the built minigpt"
#endif

#define STEPS "40"
#define EVERY 5

/* Trains 40 steps on 2 ranks into root/sub; extra flags after. Returns the
 * launcher's exit code and its output in *out. */
static int train(const char *root, const char *sub, const char *const *extra, char **out)
{
    char dir[256], log[256];
    snprintf(dir, sizeof dir, "%s/%s", root, sub);
    snprintf(log, sizeof log, "%s/%s.log", root, sub);
    const char *argv[40] = {LAUNCH_BIN,
                            "-n",
                            "2",
                            "--max-restarts",
                            "2",
                            MINIGPT_BIN,
                            "--steps",
                            STEPS,
                            "--batch",
                            "4",
                            "--data",
                            "random",
                            "--parallel",
                            "zero1",
                            "--eval-every",
                            "0",
                            "--sample",
                            "0",
                            "--log-every",
                            "10",
                            "--threads",
                            "1",
                            "--ckpt-dir",
                            dir,
                            "--ckpt-every",
                            "5",
                            "--keep",
                            "2"};
    int n = 28;
    for (; extra && *extra; extra++)
        argv[n++] = *extra;
    argv[n] = NULL;
    return run_program(argv, log, out);
}

/* The final "hash XXXXXXXX" of minigpt's replica line. */
static void params_hash(const char *out, char *hash, size_t len)
{
    const char *p = strstr(out, "bitwise identical parameters (hash ");
    cr_assert(p, "no parameter hash line in:\n%s", out);
    p += strlen("bitwise identical parameters (hash ");
    size_t k = strcspn(p, ")");
    snprintf(hash, len, "%.*s", (int)k, p);
}

static void assert_same_file(const char *a, const char *b)
{
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    FILE *f = fopen(a, "rb"), *g = fopen(b, "rb");
    cr_assert(f && g, "open %s / %s", a, b);
    x = malloc(1 << 20);
    y = malloc(1 << 20);
    nx = fread(x, 1, 1 << 20, f);
    ny = fread(y, 1, 1 << 20, g);
    fclose(f);
    fclose(g);
    cr_assert(nx > 0 && nx < (1 << 20), "%s: unexpected size %zu", a, nx);
    cr_assert(nx == ny && memcmp(x, y, nx) == 0, "%s and %s differ", a, b);
    free(x);
    free(y);
}

/* Both runs under --parallel mode; the killed one resumes with --resume auto. */
static void restart_case(const char *mode)
{
    char root[64];
    fixture_mkroot(root, sizeof root);
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    int die = EVERY + 1 + rand() % (40 - EVERY - 1); /* 6 .. 39 */
    char die_s[16];
    snprintf(die_s, sizeof die_s, "%d", die);

    char *o1 = NULL, *o2 = NULL;
    const char *plain[] = {"--parallel", mode, NULL};
    int rc1 = train(root, "D1", plain, &o1);
    cr_assert_eq(rc1, 0, "uninterrupted run exited %d:\n%s", rc1, o1);
    const char *fault[] = {"--parallel", mode, "--resume", "auto", "--die-at-step", die_s, NULL};
    int rc2 = train(root, "D2", fault, &o2);
    cr_assert_eq(rc2, 0, "run killed at step %d exited %d:\n%s", die, rc2, o2);
    cr_assert(strstr(o2, "--die-at-step") && strstr(o2, "restart 1 of 2"),
              "the rank did not die at step %d, or no restart:\n%s", die, o2);
    cr_assert_null(strstr(o2, "restart 2 of 2"), "restarted twice:\n%s", o2);

    char h1[64], h2[64];
    params_hash(o1, h1, sizeof h1);
    params_hash(o2, h2, sizeof h2);
    cr_assert_str_eq(h1, h2, "killed at step %d: final parameter hashes differ", die);
    for (int r = 0; r < 2; r++) {
        char a[256], b[256];
        snprintf(a, sizeof a, "%s/D1/step_00000040/rank%05d.bin", root, r);
        snprintf(b, sizeof b, "%s/D2/step_00000040/rank%05d.bin", root, r);
        assert_same_file(a, b);
    }
    free(o1);
    free(o2);
    fixture_rmtree(root);
}

/* minigpt alone (one rank) for `steps` steps into root/R, extra flags after. */
static int train_alone(const char *root, const char *steps, const char *extra, char **out)
{
    char dir[256], log[256];
    snprintf(dir, sizeof dir, "%s/R", root);
    snprintf(log, sizeof log, "%s/R-%s.log", root, steps);
    const char *argv[] = {MINIGPT_BIN,
                          "--steps",
                          steps,
                          "--batch",
                          "4",
                          "--data",
                          "random",
                          "--eval-every",
                          "0",
                          "--sample",
                          "0",
                          "--threads",
                          "1",
                          "--ckpt-dir",
                          dir,
                          "--ckpt-every",
                          "6",
                          extra,
                          extra ? "auto" : NULL,
                          NULL};
    return run_program(argv, log, out);
}

Test(ckpt_restart, a_resumed_run_summarizes_the_steps_it_made_and_where_it_began, .timeout = 120)
{
    char root[64];
    fixture_mkroot(root, sizeof root);
    char *o1 = NULL, *o2 = NULL;
    int rc1 = train_alone(root, "6", NULL, &o1);
    cr_assert_eq(rc1, 0, "the first run exited %d:\n%s", rc1, o1);
    int rc2 = train_alone(root, "10", "--resume", &o2);
    cr_assert_eq(rc2, 0, "the resumed run exited %d:\n%s", rc2, o2);
    cr_expect(strstr(o2, "summary: 4 steps (resumed at step 6, ended at step 10) in "),
              "the resumed run's summary:\n%s", o2);
    free(o1);
    free(o2);
    fixture_rmtree(root);
}

Test(ckpt_restart, a_run_resumed_at_its_last_step_says_it_made_no_steps_and_shows_no_loss,
     .timeout = 120)
{
    char root[64];
    fixture_mkroot(root, sizeof root);
    char *o1 = NULL, *o2 = NULL;
    int rc1 = train_alone(root, "6", NULL, &o1);
    cr_assert_eq(rc1, 0, "the first run exited %d:\n%s", rc1, o1);
    int rc2 = train_alone(root, "6", "--resume", &o2);
    cr_assert_eq(rc2, 0, "the resumed run exited %d:\n%s", rc2, o2);
    cr_expect(strstr(o2, "summary: no steps to make (resumed at step 6, the last of --steps 6)"),
              "the resumed run's summary:\n%s", o2);
    cr_expect_null(strstr(o2, "loss 0.0000"), "a loss no step computed:\n%s", o2);
    free(o1);
    free(o2);
    fixture_rmtree(root);
}

Test(ckpt_restart, sigkilled_rank_restart_ends_bitwise_equal_to_uninterrupted, .timeout = 240)
{
    restart_case("zero1");
}

/* ZeRO-2's gradients live only within a step, so its restart is ZeRO-1's. */
Test(ckpt_restart, zero2_sigkilled_rank_restart_ends_bitwise_equal_to_uninterrupted, .timeout = 240)
{
    restart_case("zero2");
}

/* ZeRO-3 saves and loads its whole model held for the purpose, in ZeRO-1's
 * format: killed, restarted with --resume auto, it ends on the same bits. */
Test(ckpt_restart, zero3_sigkilled_rank_restart_ends_bitwise_equal_to_uninterrupted, .timeout = 240)
{
    restart_case("zero3");
}
