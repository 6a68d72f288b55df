/*
 * test_minigpt_tp.c — `minigpt --tp T [--dp D]` under dtrain-launch, as a
 * person runs it: a tp group trains the embedded task (digit reversal)
 * as one process does, a dp x tp grid follows one process's loss curve,
 * so does a vocabulary tp does not divide (padded), a shape the split
 * cannot divide is refused naming what, and a killed
 * rank is named the root cause by its world rank, though its peers' errors
 * name it by its rank in their group.
 *
 * The curves are compared through --metrics (JSONL, every step's loss at
 * full precision): the split changes the order of sums, so not bitwise,
 * but within 1e-4 relative at every step of 50 (1e-3 in bf16, whose
 * roundings the other order flips now and then; see that test), and a
 * bf16 dp x tp grid keeps identical replicas.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>

#include <criterion/criterion.h>

#include "launch_children.h"
#include "proc_state.h"
#include "run_program.h"

#ifndef LAUNCH_BIN
#error "LAUNCH_BIN must name the built dtrain-launch"
#endif
#ifndef MINIGPT_BIN
#error "MINIGPT_BIN must name the built minigpt"
#endif

enum { STEPS = 50 };

static void temp_path(char *path, size_t len, const char *what)
{
    snprintf(path, len, "/tmp/dt-minigpt-tp-%s-XXXXXX", what);
    int fd = mkstemp(path);
    cr_assert(fd >= 0, "mkstemp: %s", strerror(errno));
    close(fd);
}

/* Runs argv with its output in a temporary file; returns the exit code
 * and the output (malloc'ed). */
static int run(const char *const *argv, char **out)
{
    char log[64];
    temp_path(log, sizeof log, "log");
    int rc = run_program(argv, log, out);
    unlink(log);
    return rc;
}

/* Every step's loss from a --metrics file, in step order. */
static void read_losses(const char *path, double loss[STEPS])
{
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot read %s", path);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        cr_assert(o, "not JSON: %s", line);
        const char *ev = json_string_value(json_object_get(o, "event"));
        if (ev && strcmp(ev, "step") == 0) {
            int step = (int)json_integer_value(json_object_get(o, "step"));
            cr_assert(step >= 1 && step <= STEPS, "step %d", step);
            loss[step - 1] = json_real_value(json_object_get(o, "loss"));
            n++;
        }
        json_decref(o);
    }
    fclose(f);
    cr_assert_eq(n, STEPS, "%s has %d step records", path, n);
}

/* The loss curve of a run of `ranks` ranks with extra flags (NULL-ended). */
static void loss_curve(double loss[STEPS], const char *ranks, const char *const *extra)
{
    char metrics[64], *out;
    temp_path(metrics, sizeof metrics, "metrics");
    const char *argv[32] = {LAUNCH_BIN,     "-n", ranks,         MINIGPT_BIN, "--steps",  "50",
                            "--batch",      "8",  "--log-every", "50",        "--sample", "0",
                            "--eval-every", "0",  "--metrics",   metrics};
    int k = 16;
    for (int i = 0; extra[i]; i++)
        argv[k++] = extra[i];
    argv[k] = NULL;
    int rc = run(argv, &out);
    cr_assert_eq(rc, 0, "minigpt failed:\n%s", out);
    free(out);
    read_losses(metrics, loss);
    unlink(metrics);
}

/* ref: the one-process run's flags */
static void expect_curves_close_to(const char *ranks, const char *const *extra,
                                   const char *const *ref_flags, const char *what)
{
    double ref[STEPS], got[STEPS];
    loss_curve(ref, "1", ref_flags);
    loss_curve(got, ranks, extra);
    for (int s = 0; s < STEPS; s++)
        cr_expect_leq(fabs(got[s] - ref[s]) / ref[s], 1e-4, "%s: step %d: loss %.9g vs %.9g", what,
                      s + 1, got[s], ref[s]);
}

static void expect_curves_close(const char *ranks, const char *const *extra, const char *what)
{
    /* the reference: one process, the global batch of 2 x 8 sequences */
    const char *const one[] = {"--batch", "16", NULL};
    expect_curves_close_to(ranks, extra, one, what);
}

/* V 63: 32 rows a rank, rank 1's last one padding (model/tp_layout.c) */
Test(minigpt_tp, a_tp_group_on_a_vocabulary_it_does_not_divide_follows_one_process, .timeout = 120)
{
    const char *const tp[] = {"--tp", "2", "--batch", "16", "-V", "63", NULL};
    const char *const one[] = {"--batch", "16", "-V", "63", NULL};
    expect_curves_close_to("2", tp, one, "--tp 2 -V 63");
}

/* Evaluation and sampling read the assembled model, V rows: a padding row
 * is no token to generate (an id >= V would fail the decoding). */
Test(minigpt_tp, a_tp_group_on_a_padded_vocabulary_evaluates_and_samples, .timeout = 120)
{
    char *out;
    const char *argv[] = {LAUNCH_BIN, "-n", "2",        MINIGPT_BIN, "--tp",
                          "2",        "-V", "63",       "--steps",   "20",
                          "--batch",  "16", "--sample", "64",        "--eval-prompts",
                          "20",       NULL};
    int rc = run(argv, &out);
    cr_assert_eq(rc, 0, "minigpt failed:\n%s", out);
    cr_expect(strstr(out, "exact-match accuracy "), "no evaluation in:\n%s", out);
    free(out);
}

Test(minigpt_tp, a_tp_group_follows_one_process_loss_curve, .timeout = 120)
{
    const char *const tp[] = {"--tp", "2", "--batch", "16", NULL};
    expect_curves_close("2", tp, "--tp 2");
}

Test(minigpt_tp, a_dp_by_tp_grid_follows_one_process_loss_curve, .timeout = 120)
{
    const char *const grid[] = {"--dp", "2", "--tp", "2", NULL};
    expect_curves_close("4", grid, "--dp 2 --tp 2");
}

/* The largest relative gap between two curves over the 50 steps. */
static double max_gap(const double a[STEPS], const double b[STEPS])
{
    double worst = 0;
    for (int s = 0; s < STEPS; s++)
        worst = fmax(worst, fabs(a[s] - b[s]) / b[s]);
    return worst;
}

/*
 * --precision bf16 (tensor/tp_precision.c). The split's other sum order
 * (fp32 noise, 1.2e-7 relative between the fp32 curves here) flips
 * roundings to bf16 by a whole ulp (2^-8 of a value) now and then, and
 * those grow over the steps: the bf16 tp curve stayed within 7.3e-5 of
 * one bf16 process's (2.8e-4 while the one-process model read LayerNorm,
 * biases and embeddings unrounded), so the bound is 1e-3. bf16 itself
 * moves the curve by 3.0e-4 from fp32's, so an fp32 tp run must be
 * farther than 5e-5 from the bf16 process (400 times fp32's noise), and
 * farther than the bf16 tp run is: a tp run that ignored --precision
 * would pass neither.
 */
Test(minigpt_tp, a_bf16_tp_group_follows_one_bf16_process_loss_curve, .timeout = 120)
{
    const char *const one[] = {"--batch", "16", "--precision", "bf16", NULL};
    const char *const tp[] = {"--tp", "2", "--batch", "16", "--precision", "bf16", NULL};
    const char *const tp_fp32[] = {"--tp", "2", "--batch", "16", NULL};
    double ref[STEPS], got[STEPS], fp32[STEPS];
    loss_curve(ref, "1", one);
    loss_curve(got, "2", tp);
    loss_curve(fp32, "2", tp_fp32);
    cr_expect_leq(max_gap(got, ref), 1e-3, "bf16 --tp 2: %.3g from one bf16 process",
                  max_gap(got, ref));
    cr_expect_gt(max_gap(fp32, ref), 5e-5, "fp32 --tp 2: only %.3g from one bf16 process",
                 max_gap(fp32, ref));
    cr_expect_lt(max_gap(got, ref), max_gap(fp32, ref),
                 "bf16 --tp 2 is %.3g from one bf16 process, fp32 --tp 2 only %.3g",
                 max_gap(got, ref), max_gap(fp32, ref));
}

Test(minigpt_tp, a_bf16_dp_by_tp_grid_keeps_identical_replicas_and_says_its_precision,
     .timeout = 120)
{
    char *out;
    const char *argv[] = {LAUNCH_BIN, "-n",   "4",        MINIGPT_BIN,   "--dp",
                          "2",        "--tp", "2",        "--precision", "bf16",
                          "--steps",  "20",   "--sample", "0",           "--eval-every",
                          "0",        NULL};
    int rc = run(argv, &out);
    cr_assert_eq(rc, 0, "minigpt failed:\n%s", out);
    cr_expect(strstr(out, "replicas: all 4 ranks hold bitwise identical parameters"),
              "the assembled model differs between the ranks:\n%s", out);
    cr_expect(strstr(out, "precision: bf16 compute on each share, fp32 master weights, "
                          "gradients and AdamW state; path: portable"),
              "no precision line in:\n%s", out);
    free(out);
}

Test(minigpt_tp, a_tp_group_learns_the_task, .timeout = 180)
{
    char *out;
    const char *argv[] = {LAUNCH_BIN, "-n",  "2",       MINIGPT_BIN, "--tp",         "2",
                          "--steps",  "400", "--batch", "16",        "--eval-every", "0",
                          "--sample", "0",   NULL};
    int rc = run(argv, &out);
    cr_assert_eq(rc, 0, "minigpt failed:\n%s", out);
    const char *acc = strstr(out, "exact-match accuracy ");
    cr_assert(acc, "no accuracy in:\n%s", out);
    double pct = atof(acc + strlen("exact-match accuracy "));
    cr_expect_geq(pct, 90.0, "accuracy %.1f%% after 400 steps:\n%s", pct, out);
    cr_expect(strstr(out, "replicas: all 2 ranks hold bitwise identical parameters"),
              "the assembled model differs between the ranks:\n%s", out);
    free(out);
}

Test(minigpt_tp, heads_the_group_cannot_divide_are_refused_by_name, .timeout = 60)
{
    char *out;
    const char *argv[] = {LAUNCH_BIN, "-n", "3", MINIGPT_BIN, "--tp", "3", "--steps", "1", NULL};
    int rc = run(argv, &out);
    cr_expect_neq(rc, 0, "a 4-head model split 3 ways ran:\n%s", out);
    cr_expect(strstr(out, "does not divide the heads H = 4"), "no reason given:\n%s", out);
    free(out);
}

Test(minigpt_tp, a_killed_rank_fails_its_group_naming_it, .timeout = 120)
{
    char *out;
    const char *argv[] = {LAUNCH_BIN,
                          "-n",
                          "4",
                          MINIGPT_BIN,
                          "--dp",
                          "2",
                          "--tp",
                          "2",
                          "--steps",
                          "100",
                          "--die-at-step",
                          "3",
                          "--eval-every",
                          "0",
                          "--sample",
                          "0",
                          NULL};
    int rc = run(argv, &out);
    cr_expect_neq(rc, 0, "the job survived a killed rank:\n%s", out);
    cr_expect(strstr(out, "ROOT CAUSE: rank 3 "), "the launcher does not blame rank 3:\n%s", out);
    /* rank 2 shares rank 3's tp group: its own error, when it prints one
     * before the launcher stops it, names the dead peer by its world rank
     * (group messages name both; the test below holds the launcher so that
     * every rank prints) */
    const char *mine = strstr(out, "[2] minigpt: rank 2:");
    const char *eol = mine ? strchr(mine, '\n') : NULL;
    const char *named = mine ? strstr(mine, "world rank 3) lost") : NULL;
    cr_expect(!mine || (named && (!eol || named < eol)), "rank 2 does not name rank 3:\n%s", out);
    free(out);
}

/* ---- a killed rank, named by the launcher --------------------------------- */

static bool log_has(const char *path, const char *what)
{
    char *text = run_slurp(path);
    bool has = strstr(text, what) != NULL;
    free(text);
    return has;
}

/* World rank 3 of a 2 x 2 grid is rank 1 of both its groups, and its peers'
 * errors say "connection to rank 1 (ADDR, world rank 3) lost". The launcher
 * is held (SIGSTOP) until every worker has exited, so it finds them all
 * gone at once and takes them in its own order (libuv's: rank order, here),
 * not the order they died in: the first failure is a peer's, and the
 * verdict rests on reading the errors, which must lead to world rank 3. */
Test(minigpt_tp, a_killed_rank_is_the_root_cause_by_its_world_rank, .timeout = 120)
{
    char log[64];
    temp_path(log, sizeof log, "log");
    const char *argv[] = {LAUNCH_BIN,     "-n", "4",        MINIGPT_BIN, "--tp",        "2",
                          "--dp",         "2",  "--steps",  "1000000",   "--log-every", "1000000",
                          "--eval-every", "0",  "--sample", "0",         NULL};
    pid_t launcher = start_program(argv, log);
    pid_t worker[4] = {0};
    while (!launch_children_by_rank(launcher, worker, 4))
        launch_nap_ms(10);
    while (!log_has(log, "\n[0]      1 ")) /* step 1 done: every group is up */
        launch_nap_ms(20);
    kill(launcher, SIGSTOP);
    while (proc_state(launcher) != 'T')
        launch_nap_ms(1);
    kill(worker[3], SIGKILL);
    for (int r = 0; r < 4; r++)
        while (proc_state(worker[r]) != 'Z')
            launch_nap_ms(10);
    kill(launcher, SIGCONT);
    char *out;
    int rc = finish_program(launcher, log, &out);
    unlink(log);
    cr_expect_neq(rc, 0, "the job survived a killed rank:\n%s", out);
    char want[128];
    snprintf(want, sizeof want, "ROOT CAUSE: rank 3 (local rank 3 on node 0, pid %d)",
             (int)worker[3]);
    cr_expect(strstr(out, want), "'%s' missing from:\n%s", want, out);
    free(out);
}
