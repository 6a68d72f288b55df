/*
 * minigpt_ranks.h — run minigpt as W processes joined by hand (RANK,
 * WORLD_SIZE, DT_INIT_URL on a file store in a fresh directory; no
 * launcher), every rank with the same flags, and read what they printed.
 * W = 1 runs one process with no job at all (minigpt alone).
 *
 * Waiting is bounded by the calling test's Criterion timeout.
 */
#ifndef DT_TEST_MINIGPT_RANKS_H
#define DT_TEST_MINIGPT_RANKS_H

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

enum { MG_RANKS_MAX = 8, MG_ARGS_MAX = 48 };

typedef struct mg_ranks {
    char dir[64];
    int world;
    int code[MG_RANKS_MAX];  /* exit code, or 128 + signal */
    char *out[MG_RANKS_MAX]; /* stdout and stderr */
} mg_ranks;

/* A fresh directory for a run's store, logs and checkpoints. */
static inline void mg_ranks_dir(mg_ranks *j)
{
    snprintf(j->dir, sizeof j->dir, "/tmp/dt-mg-ranks-XXXXXX");
    cr_assert(mkdtemp(j->dir), "mkdtemp: %s", strerror(errno));
}

/* Starts `world` ranks of minigpt with args (NULL-ended) in j->dir (made
 * by mg_ranks_dir) and waits for them; env_extra (may be NULL) is one
 * more variable for every rank, last_only (may be NULL) more flags for the
 * last rank. Runs again in the same directory reuse it (a new store file
 * each time). */
static inline void mg_ranks_run_as(mg_ranks *j, int world, const char *const *args,
                                   const char *env_extra, const char *const *last_only)
{
    static int run_no; /* store names within this test process */
    cr_assert(world >= 1 && world <= MG_RANKS_MAX);
    j->world = world;
    run_no++;
    pid_t pid[MG_RANKS_MAX];
    for (int r = 0; r < world; r++) {
        char rank[32], size[32], url[160], log[128];
        snprintf(rank, sizeof rank, "RANK=%d", r);
        snprintf(size, sizeof size, "WORLD_SIZE=%d", world);
        snprintf(url, sizeof url, "DT_INIT_URL=file://%s/store%d", j->dir, run_no);
        snprintf(log, sizeof log, "%s/rank%d.log", j->dir, r);
        char *env[] = {"OPENBLAS_NUM_THREADS=1", (char *)env_extra, NULL, NULL, NULL, NULL};
        int ne = env_extra ? 2 : 1;
        if (world > 1) {
            env[ne++] = rank;
            env[ne++] = size;
            env[ne++] = url;
        }
        const char *argv[MG_ARGS_MAX] = {MINIGPT_BIN};
        int n = 1;
        for (const char *const *a = args; *a && n < MG_ARGS_MAX - 1; a++)
            argv[n++] = *a;
        for (const char *const *a = last_only; r == world - 1 && a && *a && n < MG_ARGS_MAX - 1;
             a++)
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
    for (int r = 0; r < world; r++) {
        int status;
        while (waitpid(pid[r], &status, 0) < 0)
            cr_assert_eq(errno, EINTR);
        j->code[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        char log[128];
        snprintf(log, sizeof log, "%s/rank%d.log", j->dir, r);
        free(j->out[r]);
        j->out[r] = run_slurp(log);
    }
}

static inline void mg_ranks_run(mg_ranks *j, int world, const char *const *args)
{
    mg_ranks_run_as(j, world, args, NULL, NULL);
}

/* Every rank exited 0 (else the test stops, showing the first failure). */
static inline void mg_ranks_assert_ok(const mg_ranks *j, const char *what)
{
    for (int r = 0; r < j->world; r++)
        cr_assert_eq(j->code[r], 0, "%s: rank %d of %d exited %d:\n%s", what, r, j->world,
                     j->code[r], j->out[r] ? j->out[r] : "");
}

/* The final parameter hash in rank 0's replica line. */
static inline unsigned long long mg_ranks_hash(const mg_ranks *j, const char *what)
{
    const char *h = j->out[0] ? strstr(j->out[0], "parameters (hash ") : NULL;
    cr_assert_not_null(h, "%s: no replica line in:\n%s", what, j->out[0] ? j->out[0] : "");
    return strtoull(h + strlen("parameters (hash "), NULL, 16);
}

/* Frees the outputs and removes the directory. */
static inline void mg_ranks_free(mg_ranks *j)
{
    char cmd[128];
    for (int r = 0; r < MG_RANKS_MAX; r++) {
        free(j->out[r]);
        j->out[r] = NULL;
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", j->dir);
    cr_expect_eq(system(cmd), 0);
}

/* Two ranks, rank 1 with `last` added to args: both must fail, each
 * printing want (the start-up mode check naming both ranks' modes). */
static inline void mg_ranks_expect_mode_refusal(const char *const *args, const char *const *last,
                                                const char *want)
{
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    mg_ranks_run_as(&j, 2, args, NULL, last);
    for (int r = 0; r < 2; r++) {
        cr_expect_neq(j.code[r], 0, "rank %d exited 0:\n%s", r, j.out[r]);
        cr_expect(strstr(j.out[r], want), "rank %d does not name both modes:\n%s", r, j.out[r]);
    }
    mg_ranks_free(&j);
}

/* The final hash of 10 steps on 2 ranks under --parallel mode and
 * flag value (e.g. "--precision", "bf16"), saving every 5 steps; with
 * stop_at < 10 the first run ends there and a second resumes from its
 * checkpoint, so a resumed run can be held to the uninterrupted one's. */
static inline unsigned long long mg_ranks_resumed_hash(const char *flag, const char *value,
                                                       const char *mode, int stop_at)
{
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    char ckpt[96], steps[8], what[64];
    snprintf(ckpt, sizeof ckpt, "%s/ck", j.dir);
    snprintf(steps, sizeof steps, "%d", stop_at);
    snprintf(what, sizeof what, "--parallel %s to step %d", mode, stop_at);
    const char *first[] = {"--log-every", "10", "--eval-every", "0",   "--sample",   "0",
                           "--threads",   "1",  flag,           value, "--parallel", mode,
                           "--ckpt-dir",  ckpt, "--ckpt-every", "5",   "--steps",    steps,
                           NULL};
    mg_ranks_run(&j, 2, first);
    mg_ranks_assert_ok(&j, what);
    if (stop_at < 10) {
        const char *second[] = {"--log-every", "10",  "--eval-every", "0",
                                "--sample",    "0",   "--threads",    "1",
                                flag,          value, "--parallel",   mode,
                                "--ckpt-dir",  ckpt,  "--ckpt-every", "5",
                                "--steps",     "10",  "--resume",     "auto",
                                NULL};
        mg_ranks_run(&j, 2, second);
        mg_ranks_assert_ok(&j, "the resumed run");
    }
    unsigned long long h = mg_ranks_hash(&j, what);
    mg_ranks_free(&j);
    return h;
}

#endif /* DT_TEST_MINIGPT_RANKS_H */
