/*
 * test_zero_ranks.c — sharded data parallelism when the ranks do not
 * cooperate: minigpt ranks started by hand (RANK, WORLD_SIZE,
 * DT_INIT_URL; no launcher to stop the others), so what each survivor
 * says is its own.
 *
 * - Ranks asked for different --parallel modes are refused at start-up,
 *   every one of them, by a message naming the ranks and their modes
 *   (before any collective a mismatch would derail).
 * - A rank killed while the others wait for its share of the parameter
 *   all-gather (ZeRO-2 leaves the gather in flight after the step; the
 *   next forward waits for it) fails every survivor with an error naming
 *   the dead rank, instead of a hang or a crash. Which collective a
 *   survivor is in when it notices depends on timing (the gather, if the
 *   dead rank's share had not left yet; else the next step's reduces),
 *   so the test asserts the name of the dead rank, not the collective.
 *
 * - A stage rank of `--pp 2 --dp 2 --parallel zero2` killed after a step
 *   fails every survivor naming it: its data-parallel partner, its
 *   pipeline neighbour and the rank that shares neither with it.
 *
 * - ZeRO-3 (parameters sharded, each unit gathered when it is read)
 *   ends where ZeRO-1 ends, with and without --recompute: the replica
 *   hash every run prints is the same, bit for bit. A rank killed with
 *   its share of the next forward's first unit in flight (the gather the
 *   step prefetches) fails every survivor naming it.
 *
 * Waiting is bounded by each test's Criterion timeout.
 */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "run_program.h"

#ifndef MINIGPT_BIN
#error "MINIGPT_BIN must name the built minigpt"
#endif

enum { RANKS = 3, MAX_RANKS = 4, MAX_EXTRA = 9 };

typedef struct ranks {
    char dir[64];
    int n;
    int code[MAX_RANKS];  /* exit code, or 128 + signal */
    char *out[MAX_RANKS]; /* stdout and stderr */
} ranks;

/* Starts j->n (RANKS unless set) minigpt processes joined through a file
 * store in a fresh directory, rank r with the common flags then extra[r]
 * (NULL-ended), and waits for all of them. */
static void run_ranks(ranks *j, const char *const *common,
                      const char *const extra[MAX_RANKS][MAX_EXTRA])
{
    snprintf(j->dir, sizeof j->dir, "/tmp/dt-zero-ranks-XXXXXX");
    cr_assert(mkdtemp(j->dir), "mkdtemp: %s", strerror(errno));
    j->n = j->n ? j->n : RANKS;
    pid_t pid[MAX_RANKS];
    for (int r = 0; r < j->n; r++) {
        char rank[32], world[32], url[128], log[128];
        snprintf(rank, sizeof rank, "RANK=%d", r);
        snprintf(world, sizeof world, "WORLD_SIZE=%d", j->n);
        snprintf(url, sizeof url, "DT_INIT_URL=file://%s/store", j->dir);
        snprintf(log, sizeof log, "%s/rank%d.log", j->dir, r);
        char *env[] = {rank, world, url, "OPENBLAS_NUM_THREADS=1", NULL};
        const char *argv[40] = {MINIGPT_BIN};
        int n = 1;
        for (const char *const *a = common; *a; a++)
            argv[n++] = *a;
        for (const char *const *a = extra[r]; *a; a++)
            argv[n++] = *a;
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        posix_spawn_file_actions_adddup2(&fa, 1, 2);
        int rc = posix_spawn(&pid[r], argv[0], &fa, NULL, (char **)argv, env);
        posix_spawn_file_actions_destroy(&fa);
        cr_assert_eq(rc, 0, "posix_spawn: %s", strerror(rc));
    }
    for (int r = 0; r < j->n; r++) {
        int status;
        while (waitpid(pid[r], &status, 0) < 0)
            cr_assert_eq(errno, EINTR);
        j->code[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        char log[128];
        snprintf(log, sizeof log, "%s/rank%d.log", j->dir, r);
        j->out[r] = run_slurp(log);
    }
}

static void ranks_free(ranks *j)
{
    char cmd[128];
    for (int r = 0; r < j->n; r++)
        free(j->out[r]);
    snprintf(cmd, sizeof cmd, "rm -rf %s", j->dir);
    cr_expect_eq(system(cmd), 0);
}

static const char *const common[] = {"--steps",      "6", "--log-every", "1",
                                     "--eval-every", "0", "--sample",    "0",
                                     "--threads",    "1", NULL};

Test(zero_ranks, mismatched_modes_are_refused_at_start_up_naming_the_ranks, .timeout = 60)
{
    const char *const extra[MAX_RANKS][MAX_EXTRA] = {{"--parallel", "zero2", NULL},
                                                     {"--parallel", "zero2", NULL},
                                                     {"--parallel", "zero1", NULL}};
    ranks j = {0};
    run_ranks(&j, common, extra);
    for (int r = 0; r < RANKS; r++) {
        cr_expect_eq(j.code[r], 1, "rank %d exited %d:\n%s", r, j.code[r], j.out[r]);
        cr_expect(strstr(j.out[r], "rank 0 runs --parallel zero2, rank 2 --parallel zero1"),
                  "rank %d does not name the mismatch:\n%s", r, j.out[r]);
        cr_expect_null(strstr(j.out[r], "step      loss"), "rank %d trained:\n%s", r, j.out[r]);
    }
    ranks_free(&j);
}

/* --die-at-step 2: the last rank SIGKILLs itself after step 2's update,
 * its share of the parameter all-gather in flight; the others must fail
 * (exit 1) naming it. */
static void killed_mid_gather_is_named_by_every_survivor(const char *mode)
{
    const char *const extra[MAX_RANKS][MAX_EXTRA] = {{"--parallel", mode, "--die-at-step", "2"},
                                                     {"--parallel", mode, "--die-at-step", "2"},
                                                     {"--parallel", mode, "--die-at-step", "2"}};
    ranks j = {0};
    run_ranks(&j, common, extra);
    cr_expect_eq(j.code[2], 128 + 9, "rank 2 was not killed: %d\n%s", j.code[2], j.out[2]);
    for (int r = 0; r < 2; r++) {
        cr_expect_eq(j.code[r], 1, "rank %d exited %d:\n%s", r, j.code[r], j.out[r]);
        cr_expect(strstr(j.out[r], "rank 2 died"), "rank %d does not name rank 2:\n%s", r,
                  j.out[r]);
    }
    ranks_free(&j);
}

Test(zero_ranks, a_rank_killed_with_its_gather_in_flight_fails_every_survivor_naming_it,
     .timeout = 120)
{
    killed_mid_gather_is_named_by_every_survivor("zero2");
}

/* The hash of the final parameters in rank 0's replica line. */
static unsigned long long final_hash(const char *out)
{
    const char *h = out ? strstr(out, "parameters (hash ") : NULL;
    cr_assert_not_null(h, "no replica line in:\n%s", out ? out : "");
    return strtoull(h + strlen("parameters (hash "), NULL, 16);
}

Test(zero_ranks, zero3_ends_bitwise_where_zero1_ends_with_and_without_recompute, .timeout = 120)
{
    const char *const runs[3][5] = {{"--parallel", "zero1", NULL},
                                    {"--parallel", "zero3", NULL},
                                    {"--parallel", "zero3", "--recompute", NULL}};
    unsigned long long hash[3];
    for (int k = 0; k < 3; k++) {
        const char *const extra[MAX_RANKS][MAX_EXTRA] = {
            {runs[k][0], runs[k][1], runs[k][2], runs[k][3]},
            {runs[k][0], runs[k][1], runs[k][2], runs[k][3]},
            {runs[k][0], runs[k][1], runs[k][2], runs[k][3]}};
        ranks j = {0};
        run_ranks(&j, common, extra);
        for (int r = 0; r < RANKS; r++)
            cr_assert_eq(j.code[r], 0, "run %d rank %d exited %d:\n%s", k, r, j.code[r], j.out[r]);
        hash[k] = final_hash(j.out[0]);
        ranks_free(&j);
    }
    cr_expect_eq(hash[1], hash[0], "zero3 %016llx, zero1 %016llx", hash[1], hash[0]);
    cr_expect_eq(hash[2], hash[0], "zero3 --recompute %016llx, zero1 %016llx", hash[2], hash[0]);
}

Test(zero_ranks, a_rank_killed_mid_gather_under_zero3_fails_every_survivor_naming_it,
     .timeout = 120)
{
    killed_mid_gather_is_named_by_every_survivor("zero3");
}

/* A survivor names the dead rank first-hand ("connection to rank 3 (..."
 * on the world's or a shared group's connection, "rank 3 died") or
 * second-hand, through the group that lost it ("... world rank 3) lost"). */
static bool names_world_rank_3(const char *out)
{
    return out && (strstr(out, "connection to rank 3 (") || strstr(out, "world rank 3) lost") ||
                   strstr(out, "rank 3 died"));
}

/* --pp 2 --dp 2 --parallel zero2: world rank 3 (stage 1 of replica 1)
 * SIGKILLs itself after step 2's update; rank 2 shares its stage's
 * data-parallel group, rank 1 its pipeline, rank 0 only the world. */
Test(zero_ranks, a_killed_stage_rank_under_zero2_with_a_pipeline_fails_every_survivor_naming_it,
     .timeout = 120)
{
    const char *const flags[MAX_EXTRA] = {"--parallel", "zero2",         "--pp", "2", "--dp",
                                          "2",          "--die-at-step", "2",    NULL};
    const char *const extra[MAX_RANKS][MAX_EXTRA] = {
        {flags[0], flags[1], flags[2], flags[3], flags[4], flags[5], flags[6], flags[7]},
        {flags[0], flags[1], flags[2], flags[3], flags[4], flags[5], flags[6], flags[7]},
        {flags[0], flags[1], flags[2], flags[3], flags[4], flags[5], flags[6], flags[7]},
        {flags[0], flags[1], flags[2], flags[3], flags[4], flags[5], flags[6], flags[7]}};
    ranks j = {.n = 4};
    run_ranks(&j, common, extra);
    cr_expect_eq(j.code[3], 128 + 9, "rank 3 was not killed: %d\n%s", j.code[3], j.out[3]);
    for (int r = 0; r < 3; r++) {
        cr_expect_eq(j.code[r], 1, "rank %d exited %d:\n%s", r, j.code[r], j.out[r]);
        cr_expect(names_world_rank_3(j.out[r]), "rank %d does not name rank 3:\n%s", r, j.out[r]);
    }
    ranks_free(&j);
}
