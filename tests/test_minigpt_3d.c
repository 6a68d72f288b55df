/*
 * test_minigpt_3d.c — `minigpt --dp D --tp T --pp P` under dtrain-launch,
 * as a person runs it: a 3-D grid ends on the bits of the same run without
 * the pipeline (the pipeline changes no sum, only where each one runs),
 * learns the embedded task (digit reversal), sends its stages' activations
 * in bf16 with --act-comm bf16, refuses by name what it cannot
 * do, and fails on every rank when one rank of the grid is killed, each
 * survivor naming it.
 *
 * The bits are compared through the replica check's hash of the whole
 * model after the run ("replicas: all N ranks hold bitwise identical
 * parameters (hash H)"), which every rank's assembled copy must agree on.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static void temp_path(char *path, size_t len, const char *what)
{
    snprintf(path, len, "/tmp/dt-minigpt-3d-%s-XXXXXX", what);
    int fd = mkstemp(path);
    cr_assert(fd >= 0, "mkstemp: %s", strerror(errno));
    close(fd);
}

/* dtrain-launch -n ranks minigpt <short run> extra...; the exit code and
 * the output (malloc'ed). */
static int launch(const char *ranks, const char *const *extra, char **out)
{
    const char *argv[40] = {LAUNCH_BIN,     "-n",          ranks,       MINIGPT_BIN, "--steps",
                            "10",           "--log-every", "10",        "--sample",  "0",
                            "--eval-every", "0",           "--threads", "1"};
    int k = 14;
    for (int i = 0; extra[i]; i++)
        argv[k++] = extra[i];
    argv[k] = NULL;
    char log[64];
    temp_path(log, sizeof log, "log");
    int rc = run_program(argv, log, out);
    unlink(log);
    return rc;
}

/* The whole model's hash after a run that must succeed. */
static unsigned long long final_hash(const char *ranks, const char *const *extra)
{
    char *out;
    int rc = launch(ranks, extra, &out);
    cr_assert_eq(rc, 0, "minigpt -n %s failed:\n%s", ranks, out);
    const char *h = strstr(out, "hold bitwise identical parameters (hash ");
    cr_assert(h, "no replica hash in:\n%s", out);
    unsigned long long v = strtoull(h + strlen("hold bitwise identical parameters (hash "), NULL,
                                    16);
    free(out);
    return v;
}

Test(minigpt_3d, tp2_pp2_ends_on_the_bits_of_tp2_with_as_many_micro_batches, .timeout = 120)
{
    const char *const grid[] = {"--tp", "2", "--pp", "2", "--grad-accum", "4", NULL};
    const char *const flat[] = {"--tp", "2", "--grad-accum", "4", NULL};
    cr_expect_eq(final_hash("4", grid), final_hash("2", flat),
                 "--tp 2 --pp 2 and --tp 2 --grad-accum 4 ended on different parameters");
}

/* V 63: 32 rows a tp rank, the last one padding (model/tp_layout.c) */
Test(minigpt_3d, tp2_pp2_on_a_padded_vocabulary_ends_on_the_bits_of_tp2, .timeout = 120)
{
    const char *const grid[] = {"--tp", "2", "--pp", "2", "--grad-accum", "4", "-V", "63", NULL};
    const char *const flat[] = {"--tp", "2", "--grad-accum", "4", "-V", "63", NULL};
    cr_expect_eq(final_hash("4", grid), final_hash("2", flat),
                 "--tp 2 --pp 2 and --tp 2 --grad-accum 4 on V 63 ended on different parameters");
}

Test(minigpt_3d, a_2x2x2_grid_ends_on_the_bits_of_dp2_tp2, .timeout = 180)
{
    const char *const grid[] = {"--dp", "2", "--tp", "2", "--pp", "2", "--grad-accum", "4", NULL};
    const char *const flat[] = {"--dp", "2", "--tp", "2", "--grad-accum", "4", NULL};
    cr_expect_eq(final_hash("8", grid), final_hash("4", flat),
                 "2 x 2 x 2 and --dp 2 --tp 2 --grad-accum 4 ended on different parameters");
}

Test(minigpt_3d, gpipe_and_1f1b_end_on_the_same_bits, .timeout = 120)
{
    const char *const gpipe[] = {"--tp", "2", "--pp", "2", "--schedule", "gpipe", NULL};
    const char *const ofob[] = {"--tp", "2", "--pp", "2", "--schedule", "1f1b", NULL};
    cr_expect_eq(final_hash("4", gpipe), final_hash("4", ofob));
}

/* --precision bf16 (tensor/tp_precision.c): a stage rounds as a whole
 * share does and the pipeline still changes no sum, so the grid keeps
 * the flat run's bits in bf16 too; fp32's bits are another model's. */
Test(minigpt_3d, tp2_pp2_in_bf16_ends_on_the_bits_of_tp2_in_bf16, .timeout = 120)
{
    const char *const grid[] = {"--tp", "2",           "--pp", "2", "--grad-accum",
                                "4",    "--precision", "bf16", NULL};
    const char *const flat[] = {"--tp", "2", "--grad-accum", "4", "--precision", "bf16", NULL};
    const char *const fp32[] = {"--tp", "2", "--pp", "2", "--grad-accum", "4", NULL};
    unsigned long long g = final_hash("4", grid);
    cr_expect_eq(g, final_hash("2", flat),
                 "bf16: --tp 2 --pp 2 and --tp 2 --grad-accum 4 ended on different parameters");
    cr_expect_neq(g, final_hash("4", fp32), "bf16 ended on fp32's parameters");
}

/* every rank's assembled copy agrees (final_hash reads the replica line) */
Test(minigpt_3d, a_2x2x2_grid_in_bf16_ends_on_the_bits_of_dp2_tp2_in_bf16, .timeout = 180)
{
    const char *const grid[] = {"--dp",         "2", "--tp",        "2",    "--pp", "2",
                                "--grad-accum", "4", "--precision", "bf16", NULL};
    const char *const flat[] = {"--dp", "2",           "--tp", "2", "--grad-accum",
                                "4",    "--precision", "bf16", NULL};
    cr_expect_eq(final_hash("8", grid), final_hash("4", flat),
                 "bf16: 2 x 2 x 2 and --dp 2 --tp 2 --grad-accum 4 ended on different parameters");
}

/* The bytes rank 0 sent in the last step of a 4-rank --tp 2 --pp 2 run
 * (its metrics' step records), and the run's final hash. */
static long long stage0_step_bytes(const char *act_comm, unsigned long long *hash)
{
    char metrics[64];
    temp_path(metrics, sizeof metrics, "metrics");
    const char *const grid[] = {"--tp",   "2",         "--pp",  "2", "--act-comm",
                                act_comm, "--metrics", metrics, NULL};
    *hash = final_hash("4", grid);
    FILE *f = fopen(metrics, "r");
    cr_assert_not_null(f, "%s: %s", metrics, strerror(errno));
    char line[1024];
    long long bytes = -1;
    while (fgets(line, sizeof line, f)) {
        const char *b = strstr(line, "\"bytes_sent\":");
        if (strstr(line, "\"event\":\"step\"") && b)
            bytes = atoll(b + strlen("\"bytes_sent\":"));
    }
    fclose(f);
    unlink(metrics);
    cr_assert_geq(bytes, 0, "no step record with bytes_sent in the metrics");
    return bytes;
}

/* --act-comm bf16 on a grid: each tp rank of stage 0 sends its copy of
 * every micro-batch's (B, T, C) activations rounded to bf16, so rank 0's
 * step sends M·B·T·C·2 bytes fewer (M 8, B 16, T 16, C 32) and nothing
 * else changes on the wire; the rounding changes the run's bits. */
Test(minigpt_3d, a_tp2_pp2_grid_with_act_comm_bf16_sends_half_the_activation_bytes, .timeout = 120)
{
    unsigned long long h32, h16;
    long long fp32 = stage0_step_bytes("fp32", &h32), bf16 = stage0_step_bytes("bf16", &h16);
    cr_expect_eq(fp32 - bf16, 8LL * 16 * 16 * 32 * 2,
                 "rank 0 sent %lld B a step with fp32 transfers, %lld B with bf16 ones", fp32,
                 bf16);
    cr_expect_neq(h32, h16, "--act-comm bf16 ended on the parameters of fp32 transfers");
}

Test(minigpt_3d, a_2x2x2_grid_with_act_comm_bf16_keeps_identical_replicas, .timeout = 180)
{
    const char *const grid[] = {"--dp", "2", "--tp", "2", "--pp", "2", "--act-comm", "bf16", NULL};
    final_hash("8", grid); /* the replica line: every rank's copy agrees */
}

static void expect_grid_learns_the_task(const char *precision)
{
    char *out;
    const char *const grid[] = {"--tp",         "2",       "--pp",    "2",
                                "--grad-accum", "16",      "--steps", "300",
                                "--precision",  precision, NULL};
    int rc = launch("4", grid, &out);
    cr_assert_eq(rc, 0, "minigpt failed:\n%s", out);
    const char *acc = strstr(out, "exact-match accuracy ");
    cr_assert(acc, "no accuracy in:\n%s", out);
    double pct = atof(acc + strlen("exact-match accuracy "));
    cr_expect_eq(pct, 100.0, "%s: accuracy %.1f%% after 300 steps:\n%s", precision, pct, out);
    free(out);
}

Test(minigpt_3d, a_tp2_pp2_grid_learns_the_task, .timeout = 300)
{
    expect_grid_learns_the_task("fp32");
}

Test(minigpt_3d, a_tp2_pp2_grid_learns_the_task_in_bf16, .timeout = 300)
{
    expect_grid_learns_the_task("bf16");
}

/* ---- refused by name ------------------------------------------------------ */

static void expect_refused(const char *ranks, const char *const *extra, const char *reason)
{
    char *out;
    int rc = launch(ranks, extra, &out);
    cr_expect_neq(rc, 0, "ran anyway:\n%s", out);
    cr_expect(strstr(out, reason), "'%s' not said:\n%s", reason, out);
    free(out);
}

Test(minigpt_3d, heads_the_tp_group_cannot_divide_are_refused_by_name, .timeout = 60)
{
    const char *const grid[] = {"--tp", "3", "--pp", "2", NULL};
    expect_refused("6", grid, "does not divide the heads H = 4");
}

Test(minigpt_3d, more_stages_than_blocks_are_refused_by_name, .timeout = 60)
{
    const char *const grid[] = {"--tp", "2", "--pp", "3", NULL};
    expect_refused("6", grid, "3 stages for 2 blocks: every stage must own at least one block");
}

Test(minigpt_3d, a_grid_that_is_not_the_world_is_refused_by_name, .timeout = 60)
{
    const char *const grid[] = {"--dp", "2", "--tp", "2", "--pp", "2", NULL};
    expect_refused("4", grid, "--dp 2 x --tp 2 x --pp 2 is not the world size 4");
}

Test(minigpt_3d, recompute_with_tp_is_refused_by_name, .timeout = 60)
{
    const char *const tp[] = {"--tp", "2", "--recompute", NULL};
    const char *const grid[] = {"--tp", "2", "--pp", "2", "--recompute", NULL};
    expect_refused("2", tp, "--recompute with --tp");
    expect_refused("4", grid, "--recompute with --tp");
}

Test(minigpt_3d, what_a_grid_does_not_build_is_refused_by_name, .timeout = 120)
{
    const char *const zero[] = {"--tp", "2", "--pp", "2", "--parallel", "zero2", NULL};
    const char *const zb[] = {"--tp", "2", "--pp", "2", "--schedule", "zb", NULL};
    const char *const cuda[] = {"--tp", "2", "--pp", "2", "--device", "cuda", NULL};
    expect_refused("4", zero,
                   "--parallel zero2/zero3 (the dp axis of a 3-D run runs DDP or zero1)");
    expect_refused("4", zb, "a tensor-parallel stage runs its backward whole");
    expect_refused("4", cuda, "--pp runs on the CPU backend for now");
}

Test(minigpt_3d, zero1_on_a_grid_of_one_replica_is_refused_by_name, .timeout = 60)
{
    const char *const grid[] = {"--tp", "2", "--pp", "2", "--parallel", "zero1", NULL};
    expect_refused("4", grid, "--parallel zero1: needs --dp 2 or more replicas to shard");
}

/* ---- a killed rank --------------------------------------------------------- */

/* Rank r's error line, from "[r] minigpt: rank r:" to the end of it, or
 * NULL when r printed none. */
static char *error_line(const char *out, int r)
{
    char head[48];
    snprintf(head, sizeof head, "[%d] minigpt: rank %d:", r, r);
    const char *p = strstr(out, head);
    if (!p)
        return NULL;
    const char *eol = strchr(p, '\n');
    return strndup(p, eol ? (size_t)(eol - p) : strlen(p));
}

/*
 * World rank 5 of a 2 x 2 x 2 grid is stage 1, replica 0, tp rank 1. The
 * launcher is held (SIGSTOP) from the kill until every worker has exited,
 * so it stops none of them: each survivor must fail by itself, and its
 * error must name rank 5, first-hand ("connection to rank 5 (", or a
 * group's "(..., world rank 5)") or second-hand, through the abort of a
 * peer that saw it ("world rank 5)" or "rank 5 (" in the peer's reason).
 */
Test(minigpt_3d, a_killed_rank_fails_every_survivor_naming_it, .timeout = 150)
{
    char log[64];
    temp_path(log, sizeof log, "log");
    const char *argv[] = {LAUNCH_BIN, "-n",       "8",           MINIGPT_BIN, "--dp",
                          "2",        "--tp",     "2",           "--pp",      "2",
                          "--steps",  "1000000",  "--log-every", "1000000",   "--eval-every",
                          "0",        "--sample", "0",           "--threads", "1",
                          NULL};
    pid_t launcher = start_program(argv, log);
    pid_t worker[8] = {0};
    while (!launch_children_by_rank(launcher, worker, 8))
        launch_nap_ms(10);
    for (char *text = NULL; !text || !strstr(text, "\n[0]      1 "); launch_nap_ms(20)) {
        free(text); /* step 1 done: every group is up */
        text = run_slurp(log);
        if (strstr(text, "\n[0]      1 ")) {
            free(text);
            break;
        }
    }
    kill(launcher, SIGSTOP);
    while (proc_state(launcher) != 'T')
        launch_nap_ms(1);
    kill(worker[5], SIGKILL);
    for (int r = 0; r < 8; r++)
        while (proc_state(worker[r]) != 'Z')
            launch_nap_ms(10);
    kill(launcher, SIGCONT);
    char *out;
    int rc = finish_program(launcher, log, &out);
    unlink(log);
    cr_expect_neq(rc, 0, "the job survived a killed rank:\n%s", out);
    for (int r = 0; r < 8; r++) {
        if (r == 5)
            continue;
        char *line = error_line(out, r);
        cr_expect(line, "rank %d printed no error:\n%s", r, out);
        if (line)
            cr_expect(strstr(line, "rank 5 (") || strstr(line, "world rank 5)"),
                      "rank %d does not name rank 5: %s", r, line);
        free(line);
    }
    free(out);
}
