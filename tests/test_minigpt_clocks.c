/*
 * test_minigpt_clocks.c — minigpt under dtrain-launch waits by two clocks
 * (collectives/transport/heartbeat.c): a rank busy alone between steps for
 * longer than the liveness limit does not fail the job; one that stays
 * away past the progress limit is named, in one line that says which op,
 * which peer and why.
 *
 * The busy rank is minigpt's test hook MINIGPT_TEST_PAUSE=RANK:STEP:SECONDS (it
 * sleeps after that step; its communicator still answers). Each test runs
 * the built programs with the output in a temporary file; waiting is
 * bounded by each test's Criterion timeout.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "run_program.h"

#ifndef LAUNCH_BIN
#error "LAUNCH_BIN must name the built dtrain-launch"
#endif
#ifndef MINIGPT_BIN
#error "MINIGPT_BIN must name the built minigpt"
#endif

/* Runs dtrain-launch with args; its exit code, its output in *out. The
 * programs get none of this process's DT_* variables (run_program.h), so
 * the limits are the defaults unless args set them. */
static int launch(const char *const *args, char **out)
{
    char log[64];
    snprintf(log, sizeof log, "/tmp/dt-mg-clocks-XXXXXX");
    int fd = mkstemp(log);
    cr_assert(fd >= 0, "mkstemp: %s", strerror(errno));
    close(fd);
    const char *argv[32] = {LAUNCH_BIN};
    int k = 1;
    for (; *args && k < 31; args++)
        argv[k++] = *args;
    argv[k] = NULL;
    int code = run_program(argv, log, out);
    unlink(log);
    return code;
}

Test(minigpt_clocks, a_rank_held_60_s_between_steps_does_not_fail_the_job, .timeout = 240)
{
    setenv("MINIGPT_TEST_PAUSE", "1:2:60", 1); /* twice the 30 s liveness limit */
    char *out;
    int code = launch((const char *[]){"-n", "2", MINIGPT_BIN, "--steps", "4", "--eval-every", "0",
                                       "--sample", "0", NULL},
                      &out);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "replicas: all 2 ranks hold bitwise identical parameters"), "%s", out);
    free(out);
}

/* Rank 1 stays away for 60 s after step 2 while rank 0 waits in step 3's
 * collectives, with a 3 s progress limit: rank 0 fails, and its one line
 * names itself, the op and its sequence number, the rank that has not
 * joined, and the cause. */
Test(minigpt_clocks, a_rank_away_past_the_progress_limit_is_named_with_op_peer_and_cause,
     .timeout = 120)
{
    setenv("MINIGPT_TEST_PAUSE", "1:2:60", 1);
    char *out;
    int code = launch((const char *[]){"-n", "2", "--progress-timeout", "3", MINIGPT_BIN, "--steps",
                                       "4", "--eval-every", "0", "--sample", "0", NULL},
                      &out);
    cr_assert_neq(code, 0, "the job did not fail:\n%s", out);
    const char *line = strstr(out, "[0] minigpt: rank 0: ");
    cr_assert(line, "rank 0 printed no failure line:\n%s", out);
    size_t n = strcspn(line, "\n");
    char *one = strndup(line, n);
    cr_expect(strstr(one, "allreduce #"), "no op and sequence number: %s", one);
    cr_expect(strstr(one, "rank 1 (127.0.0.1:"), "no peer: %s", one);
    cr_expect(strstr(one, "is alive") && strstr(one, "has not joined #"), "no cause: %s", one);
    cr_expect(strstr(one, "timed out after 3.0 s (progress limit"), "no limit: %s", one);
    cr_expect(!strstr(out, "minigpt: DT_"), "a bare status name:\n%s", out);
    free(one);
    free(out);
}
