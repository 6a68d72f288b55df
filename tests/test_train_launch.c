/*
 * test_train_launch.c — minigpt under dtrain-launch, as a person runs it:
 * its lines reach the launcher's output as they are printed (not when the
 * rank exits), they survive the rank being killed, and when a rank fails
 * on its own the others say why and the launcher names that rank.
 *
 * Each test runs the built programs with the output in a temporary file.
 * Waiting is bounded by each test's Criterion timeout; no assertion is
 * about time.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "run_program.h"

#ifndef LAUNCH_BIN
#error "LAUNCH_BIN must name the built dtrain-launch"
#endif
#ifndef MINIGPT_BIN
#error "MINIGPT_BIN must name the built minigpt"
#endif

/* A temporary file for the launcher's output; removed by the caller. */
static void temp_log(char *path, size_t len)
{
    snprintf(path, len, "/tmp/dt-train-launch-XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0, "mkstemp: %s", strerror(errno));
    close(fd);
}

Test(train_launch, step_lines_reach_the_launcher_while_the_trainer_runs, .timeout = 60)
{
    char log[64];
    temp_log(log, sizeof log);
    /* A run far longer than the test, printing its header and first step
     * line and then nothing for a long while: with a buffered stdout
     * those lines would sit in the trainer until it exits. */
    const char *argv[] = {LAUNCH_BIN,     "-n",      "1",           MINIGPT_BIN,
                          "--steps",      "1000000", "--log-every", "1000000",
                          "--eval-every", "0",       NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    cr_assert_eq(posix_spawn(&pid, argv[0], &fa, NULL, (char **)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    int status;
    for (;;) {
        char *out = run_slurp(log);
        bool seen = strstr(out, "[0]      1 ") != NULL;
        cr_assert_eq(waitpid(pid, &status, WNOHANG), 0, "the run ended first:\n%s", out);
        free(out);
        if (seen)
            break;
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    kill(pid, SIGINT);
    while (waitpid(pid, &status, 0) < 0)
        cr_assert_eq(errno, EINTR);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 130, "the launcher did not stop");
    unlink(log);
}

Test(train_launch, a_killed_ranks_lines_are_in_the_output_and_the_report, .timeout = 120)
{
    char log[64], *out;
    temp_log(log, sizeof log);
    /* One rank, so it is the last rank, which --die-at-step kills after
     * step 12's update: step lines 1, 5 and 10 were printed before. */
    int code = run_program((const char *[]){LAUNCH_BIN, "-n", "1", MINIGPT_BIN, "--steps", "40",
                                            "--log-every", "5", "--eval-every", "0",
                                            "--die-at-step", "12", NULL},
                           log, &out);
    cr_assert_eq(code, 128 + SIGKILL, "exit %d:\n%s", code, out);
    const char *report = strstr(out, "ROOT CAUSE: rank 0");
    cr_assert(report, "no root cause:\n%s", out);
    cr_assert(strstr(out, "\n[0]      5 ") && strstr(out, "\n[0]     10 "),
              "step lines printed before the kill were lost:\n%s", out);
    cr_assert(strstr(report, "    [0]     10 "), "step 10's line is not in the report:\n%s",
              report);
    free(out);
    unlink(log);
}

/* Every rank's line that forwards another rank's failure. */
static void assert_reports_say_why(const char *out, int trial)
{
    for (const char *p = out; (p = strstr(p, "failed and reported: ")); p++) {
        const char *eol = strchr(p, '\n');
        const char *why = strstr(p, "cannot open /nonexistent");
        cr_assert(why && (!eol || why < eol),
                  "trial %d: a rank forwarded a failure without "
                  "its reason: %.*s",
                  trial, eol ? (int)(eol - p) : 200, p);
    }
}

Test(train_launch, a_rank_that_cannot_open_its_data_is_named_and_its_peers_say_why, .timeout = 180)
{
    for (int trial = 0; trial < 3; trial++) {
        char log[64], *out;
        temp_log(log, sizeof log);
        int code = run_program((const char *[]){LAUNCH_BIN, "-n", "4", MINIGPT_BIN, "--data",
                                                "/nonexistent", NULL},
                               log, &out);
        cr_assert_eq(code, 1, "trial %d: exit %d:\n%s", trial, code, out);
        int rank = -1;
        const char *report = strstr(out, "ROOT CAUSE: rank ");
        cr_assert(report && sscanf(report, "ROOT CAUSE: rank %d", &rank) == 1, "%s", out);
        char own[96];
        snprintf(own, sizeof own,
                 "    [%d] minigpt: rank %d: data: dataset: cannot open "
                 "/nonexistent",
                 rank, rank);
        cr_assert(strstr(report, own),
                  "trial %d: the root cause, rank %d, did not fail on its "
                  "own (expected '%s'):\n%s",
                  trial, rank, own, out);
        assert_reports_say_why(out, trial);
        free(out);
        unlink(log);
    }
}

/* minigpt's output for `args` (through the launcher when n > 0). */
static char *run_minigpt(int n, const char *const *args)
{
    char log[64], nstr[16], *out;
    const char *argv[24];
    int k = 0;
    snprintf(nstr, sizeof nstr, "%d", n);
    if (n > 0)
        argv[k++] = LAUNCH_BIN, argv[k++] = "-n", argv[k++] = nstr;
    argv[k++] = MINIGPT_BIN;
    for (; *args; args++)
        argv[k++] = *args;
    argv[k] = NULL;
    temp_log(log, sizeof log);
    int code = run_program(argv, log, &out);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    unlink(log);
    return out;
}

/* One micro-batch per step would not pipeline at all: without
 * --microbatches (or --grad-accum) a pipeline runs 4 per stage, and the
 * start-up line says it chose them. */
Test(train_launch, a_pipeline_runs_four_micro_batches_per_stage_by_default_and_says_so,
     .timeout = 120)
{
    char *out = run_minigpt(2, (const char *[]){"--pp", "2", "--steps", "1", "--batch", "2",
                                                "--eval-every", "0", "--sample", "0", NULL});
    cr_expect(strstr(out, ", 8 micro-batches of 2 sequences per step (the default: 4 per stage; "
                          "--microbatches M to choose)"),
              "%s", out);
    free(out);
}

Test(train_launch, one_micro_batch_is_singular_and_one_replica_has_no_ddp_buckets, .timeout = 120)
{
    char *out = run_minigpt(2, (const char *[]){"--pp", "2", "--microbatches", "1", "--steps", "1",
                                                "--eval-every", "0", "--sample", "0", NULL});
    cr_expect(strstr(out, ", 1 micro-batch of "), "%s", out);
    cr_expect_null(strstr(out, "1 micro-batches"), "%s", out);
    free(out);
    out = run_minigpt(0,
                      (const char *[]){"--steps", "1", "--eval-every", "0", "--sample", "0", NULL});
    cr_expect_null(strstr(out, "\nddp: "), "one rank, yet a line of DDP buckets:\n%s", out);
    free(out);
}
