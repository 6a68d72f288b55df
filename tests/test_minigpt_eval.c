/*
 * test_minigpt_eval.c — minigpt's held-out evaluation as a program: dealt
 * out to the ranks, it finds what one rank alone finds; --eval-prompts
 * bounds it; and a model of real size (over 20M parameters) runs to its
 * end on two ranks with the default timeouts, evaluation printed.
 *
 * The programs run with the environment's DT_* variables removed
 * (run_program.h), so every timeout is the default. Waiting is bounded by
 * each test's Criterion timeout; no assertion is about time.
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

#ifndef LAUNCH_BIN
#error "LAUNCH_BIN must name the built dtrain-launch"
#endif
#ifndef DT_CKPT_BIN
#error "DT_CKPT_BIN must name the built dtrain-ckpt"
#endif
#ifndef MINIGPT_BIN
#error "MINIGPT_BIN must name the built minigpt"
#endif

/* A temporary directory for a test's logs and checkpoints. */
static void temp_dir(char *path, size_t len)
{
    snprintf(path, len, "/tmp/dt-minigpt-eval-XXXXXX");
    cr_assert(mkdtemp(path), "mkdtemp: %s", strerror(errno));
}

static void remove_dir(const char *dir)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

/* The line of out that starts with (or, after a "[r] " prefix, holds)
 * prefix, up to its newline, malloc'ed; NULL if none. */
static char *line_with(const char *out, const char *prefix)
{
    const char *p = strstr(out, prefix);
    if (!p)
        return NULL;
    const char *eol = strchr(p, '\n');
    size_t n = eol ? (size_t)(eol - p) : strlen(p);
    char *line = malloc(n + 1);
    memcpy(line, p, n);
    line[n] = '\0';
    return line;
}

/*
 * One process trains the task's model 200 steps (its accuracy is then
 * between 0 and 100%), evaluates it alone and saves it; ranks resume
 * that checkpoint with no steps left (in mode, --parallel's, with the
 * grid flag `grid` and its value where grid is not NULL: --pp P stages,
 * --tp T shares) and evaluate it dealt out. On three ranks and one stage: four loss batches over three ranks, and 100
 * prompts in 5 batches of up to 23 (the 16 x 16 tokens of a training
 * batch hold 23 lines of 11), two, two and one to a rank.
 * The metrics file's eval event holds the loss and the accuracy to 8
 * digits, the printed line to 4: the events must be the same text.
 */
static void ranks_evaluate_as_one(const char *ranks, const char *mode, const char *grid,
                                  const char *n)
{
    char dir[64], log[96], ckpt[96], m1[96], m3[96];
    temp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/log", dir);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    snprintf(m1, sizeof m1, "%s/alone.jsonl", dir);
    snprintf(m3, sizeof m3, "%s/three.jsonl", dir);
    char *out;
    int code = run_program((const char *[]){MINIGPT_BIN, "--steps", "200", "--eval-every", "0",
                                            "--sample", "0", "--log-every", "100", "--ckpt-dir",
                                            ckpt, "--ckpt-every", "200", "--eval-prompts", "100",
                                            "--metrics", m1, NULL},
                           log, &out);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    free(out);
    if (grid && strcmp(grid, "--tp") == 0) { /* a tp run loads only shares of its T */
        char step[128];
        snprintf(step, sizeof step, "%s/step_00000200", ckpt);
        snprintf(ckpt, sizeof ckpt, "%s/shares", dir);
        code = run_program((const char *[]){DT_CKPT_BIN, "reshard", step, ckpt, ranks, grid, n,
                                            NULL},
                           log, &out);
        cr_assert_eq(code, 0, "reshard: exit %d:\n%s", code, out);
        free(out);
    }
    code = run_program((const char *[]){LAUNCH_BIN,
                                        "-n",
                                        ranks,
                                        MINIGPT_BIN,
                                        "--steps",
                                        "200",
                                        "--sample",
                                        "0",
                                        "--ckpt-dir",
                                        ckpt,
                                        "--resume",
                                        "auto",
                                        "--eval-prompts",
                                        "100",
                                        "--parallel",
                                        mode,
                                        "--metrics",
                                        m3,
                                        grid,
                                        n,
                                        NULL},
                       log, &out);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    free(out);
    char *alone = run_slurp(m1), *three = run_slurp(m3);
    char *want = line_with(alone, "{\"event\":\"eval\""),
         *got = line_with(three, "{\"event\":\"eval\"");
    cr_assert(want && got, "no eval event:\n%s\n---\n%s", alone, three);
    cr_assert(strstr(want, "\"accuracy\"") && !strstr(want, "\"accuracy\":0.0,") &&
                  !strstr(want, "\"accuracy\":0.0}"),
              "a model that answers nothing right proves little: %s", want);
    cr_expect_str_eq(got, want, "%s ranks (%s, %s %s): %s\none rank: %s", ranks, mode,
                     grid ? grid : "no grid", grid ? n : "", got, want);
    free(want);
    free(got);
    free(alone);
    free(three);
    remove_dir(dir);
}

Test(minigpt_eval, three_ranks_evaluate_a_model_as_one_rank_does, .timeout = 300)
{
    ranks_evaluate_as_one("3", "ddp", NULL, NULL);
}

/* ZeRO-3 holds no whole model: its forwards gather the units, so the
 * three ranks run their shares in lockstep (ranks 1 and 2 have one loss
 * batch where rank 0 has two, rank 2 one batch of prompts where the
 * others have two: the short shares add forwards that count nothing). */
Test(minigpt_eval, three_zero3_ranks_evaluate_a_model_as_one_rank_does, .timeout = 300)
{
    ranks_evaluate_as_one("3", "zero3", NULL, NULL);
}

/* Two pipelines of two stages: no rank holds the whole model, each
 * forward streams through its pipeline's stages, and the two replicas
 * split the batches (two loss batches and the 5 batches of prompts,
 * three and two, each). */
Test(minigpt_eval, two_pipelines_of_two_stages_evaluate_a_model_as_one_rank_does, .timeout = 300)
{
    ranks_evaluate_as_one("4", "ddp", "--pp", "2");
}

/* The same under ZeRO-3 over each stage's two replicas: a stage's
 * forwards gather its units, so the replicas run in lockstep. */
Test(minigpt_eval, two_zero3_pipelines_evaluate_a_model_as_one_rank_does, .timeout = 300)
{
    ranks_evaluate_as_one("4", "zero3", "--pp", "2");
}

/* Two replicas of two tensor-parallel shares: each forward runs on the
 * shares (the tp group's all-reduces), the loss from the
 * vocabulary-parallel cross-entropy and the answers from the
 * vocabulary-parallel argmax; the two replicas split the batches. */
Test(minigpt_eval, two_replicas_of_two_tp_shares_evaluate_a_model_as_one_rank_does, .timeout = 300)
{
    ranks_evaluate_as_one("4", "ddp", "--tp", "2");
}

Test(minigpt_eval, eval_prompts_sets_how_many_prompts_are_graded, .timeout = 120)
{
    char dir[64], log[96];
    temp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/log", dir);
    char *out;
    int code = run_program((const char *[]){LAUNCH_BIN, "-n", "2", MINIGPT_BIN, "--steps", "2",
                                            "--sample", "0", "--eval-prompts", "7", NULL},
                           log, &out);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "(7 held-out prompts)"), "no accuracy over 7 prompts:\n%s", out);
    free(out);
    code = run_program((const char *[]){MINIGPT_BIN, "--steps", "2", "--sample", "0",
                                        "--eval-prompts", "0", NULL},
                       log, &out);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    char *eval = line_with(out, "eval @ step 2: val loss ");
    cr_assert(eval, "no evaluation line:\n%s", out);
    cr_expect(!strstr(eval, "accuracy"), "--eval-prompts 0 still graded prompts: %s", eval);
    free(eval);
    free(out);
    remove_dir(dir);
}

/*
 * A model of real size, 23,113,728 parameters (V 4096, C 512, H 8, L 6,
 * T 32), on two ranks with every timeout at its default: two steps, the
 * replica check, the evaluation (20 prompts, to keep the test short) and
 * a sample, then exit 0. When rank 0 evaluated alone, the other rank
 * waited for it in the next collective until the op timeout (30 s) ran
 * out and the job failed; a model this size took longer than that.
 */
Test(minigpt_eval, a_23m_parameter_model_runs_to_its_end_on_two_ranks, .timeout = 300)
{
    char dir[64], log[96];
    temp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/log", dir);
    char *out;
    int code = run_program((const char *[]){LAUNCH_BIN,
                                            "-n",
                                            "2",
                                            MINIGPT_BIN,
                                            "-V",
                                            "4096",
                                            "-C",
                                            "512",
                                            "-H",
                                            "8",
                                            "-L",
                                            "6",
                                            "-T",
                                            "32",
                                            "-B",
                                            "1",
                                            "--steps",
                                            "2",
                                            "--eval-prompts",
                                            "20",
                                            NULL},
                           log, &out);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
    cr_expect(strstr(out, "23,113,728 parameters"), "not the 23M model:\n%s", out);
    cr_expect(strstr(out, "replicas: all 2 ranks hold bitwise identical parameters"),
              "no replica check:\n%s", out);
    cr_expect(strstr(out, "eval @ step 2: val loss ") && strstr(out, "(20 held-out prompts)"),
              "no evaluation:\n%s", out);
    cr_expect(strstr(out, "sample: "), "no sample:\n%s", out);
    free(out);
    remove_dir(dir);
}

/*
 * Under ZeRO-3 the evaluation's shares run in lockstep: every forward
 * gathers the units from every rank. A rank that cannot allocate its
 * grading scratch (the test hook MINIGPT_TEST_EVAL_NOMEM=1 fails rank 1's)
 * aborts the communicator with the reason, so the job ends at once, not
 * when a peer's progress limit (or the 30 s liveness limit: the test's
 * bound is below it) runs out: the launcher names rank 1 and its line says
 * the phase and the bytes, and rank 0, if it printed before the launcher
 * stopped it, names rank 1 and the same cause.
 */
Test(minigpt_eval, a_zero3_rank_failing_to_allocate_in_evaluation_ends_the_job_naming_it,
     .timeout = 25)
{
    char dir[64], log[96];
    temp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/log", dir);
    setenv("MINIGPT_TEST_EVAL_NOMEM", "1", 1);
    char *out;
    int code = run_program((const char *[]){LAUNCH_BIN, "-n", "2", MINIGPT_BIN, "--parallel",
                                            "zero3", "--steps", "2", "--sample", "0", NULL},
                           log, &out);
    unsetenv("MINIGPT_TEST_EVAL_NOMEM");
    cr_expect_neq(code, 0, "the job succeeded:\n%s", out);
    cr_expect(strstr(out, "ROOT CAUSE: rank 1 "), "the launcher does not blame rank 1:\n%s", out);
    char *mine = line_with(out, "[1] minigpt: rank 1: evaluation: allocation of ");
    cr_expect(mine && strstr(mine, "bytes for grading the held-out prompts failed"),
              "rank 1 does not name the phase and the allocation:\n%s", out);
    char *peer = line_with(out, "[0] minigpt: rank 0:");
    cr_expect(!peer || strstr(peer, "rank 1: aborted: evaluation: allocation of "),
              "rank 0 does not name rank 1 and the cause: %s", peer);
    free(mine);
    free(peer);
    free(out);
    remove_dir(dir);
}
