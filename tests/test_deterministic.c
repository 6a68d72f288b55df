/*
 * test_deterministic.c — minigpt --deterministic (optim/rank_order.c):
 * one summation order for the gradient in every mode, so that
 *
 * - DDP, ZeRO-1, ZeRO-2 and ZeRO-3 on N = 1..4 ranks, with and without
 *   --recompute, end with bitwise the parameters of one process running
 *   --grad-accum N (the replica hash every run prints is the same);
 * - with --grad-accum k > 1 on several ranks the four modes still agree
 *   with each other (not with one process of N·k micro-steps: another
 *   grouping, docs/06);
 * - on pipelines (--pp 2 --dp 2 and --dp 3) ZeRO-1 and ZeRO-3 end with
 *   DDP's weights: the exported final checkpoints are the same bytes;
 * - what it does not cover is refused by name (--tp, the gloo wire, a
 *   CUDA backend), and ranks that disagree on it are refused at start-up.
 *
 * minigpt runs as processes joined by hand (minigpt_ranks.h), real TCP.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include "minigpt_ranks.h"

#ifndef DT_CKPT_BIN
#error "DT_CKPT_BIN must name the built dtrain-ckpt"
#endif

#define FLAGS                                                                                   \
    "--steps", "5", "--log-every", "5", "--eval-every", "0", "--sample", "0", "--threads", "1", \
        "--deterministic"

static const char *const modes[] = {"ddp", "zero1", "zero2", "zero3"};

/* The hash of a run of `world` ranks: --parallel mode, --grad-accum k,
 * small buckets (several leave during backward), --recompute or not. */
static unsigned long long run_hash(int world, const char *mode, int k, bool recompute)
{
    char accum[16], what[96];
    snprintf(accum, sizeof accum, "%d", k);
    snprintf(what, sizeof what, "%d ranks --parallel %s --grad-accum %d%s", world, mode, k,
             recompute ? " --recompute" : "");
    const char *args[] = {FLAGS, "--parallel",  mode,   "--grad-accum",
                          accum, "--bucket-mb", "0.02", recompute ? "--recompute" : NULL,
                          NULL};
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    mg_ranks_run(&j, world, args);
    mg_ranks_assert_ok(&j, what);
    unsigned long long h = mg_ranks_hash(&j, what);
    mg_ranks_free(&j);
    return h;
}

static int worlds[] = {1, 2, 3, 4};

ParameterizedTestParameters(deterministic,
                            every_mode_on_n_ranks_ends_where_one_process_with_n_micro_steps_ends)
{
    return cr_make_param_array(int, worlds, sizeof worlds / sizeof worlds[0]);
}

ParameterizedTest(int *world, deterministic,
                  every_mode_on_n_ranks_ends_where_one_process_with_n_micro_steps_ends,
                  .timeout = 300)
{
    unsigned long long one = run_hash(1, "ddp", *world, false);
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++)
        for (int rc = 0; rc < 2; rc++) {
            unsigned long long h = run_hash(*world, modes[m], 1, rc);
            cr_expect_eq(h, one, "%d ranks --parallel %s%s: %016llx, one process: %016llx", *world,
                         modes[m], rc ? " --recompute" : "", h, one);
        }
}

Test(deterministic, with_grad_accum_on_several_ranks_every_mode_ends_with_the_same_bits,
     .timeout = 300)
{
    unsigned long long ddp = run_hash(2, "ddp", 3, false);
    for (size_t m = 1; m < sizeof modes / sizeof modes[0]; m++) {
        unsigned long long h = run_hash(2, modes[m], 3, m == 3);
        cr_expect_eq(h, ddp, "--parallel %s: %016llx, ddp: %016llx", modes[m], h, ddp);
    }
}

Test(deterministic, one_process_accumulating_ends_with_the_same_bits_in_every_mode, .timeout = 120)
{
    unsigned long long ddp = run_hash(1, "ddp", 4, false);
    for (size_t m = 1; m < sizeof modes / sizeof modes[0]; m++) {
        unsigned long long h = run_hash(1, modes[m], 4, false);
        cr_expect_eq(h, ddp, "one process --parallel %s: %016llx, ddp: %016llx", modes[m], h, ddp);
    }
}

/* The final weights of a 2-stage pipeline of dp replicas, exported from
 * its last checkpoint (a pipelined run prints no hash). */
static char *pipeline_weights(int dp, const char *mode)
{
    char dpv[8], what[64], ckpt[128], out[160];
    snprintf(dpv, sizeof dpv, "%d", dp);
    snprintf(what, sizeof what, "--pp 2 --dp %d --parallel %s", dp, mode);
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    snprintf(ckpt, sizeof ckpt, "%s/ck", j.dir);
    snprintf(out, sizeof out, "%s/w.safetensors", j.dir);
    const char *args[] = {FLAGS, "--pp",       "2",  "--dp",         dpv, "--parallel",
                          mode,  "--ckpt-dir", ckpt, "--ckpt-every", "5", NULL};
    mg_ranks_run(&j, 2 * dp, args);
    mg_ranks_assert_ok(&j, what);
    const char *exp[] = {DT_CKPT_BIN, "export", ckpt, out, NULL};
    char log[128], *msg = NULL;
    snprintf(log, sizeof log, "%s/export.log", j.dir);
    int rc = run_program(exp, log, &msg);
    cr_assert_eq(rc, 0, "%s: export exited %d:\n%s", what, rc, msg ? msg : "");
    free(msg);
    char *bytes = run_slurp(out);
    cr_assert_not_null(bytes, "%s: no export", what);
    mg_ranks_free(&j);
    return bytes;
}

static int replicas[] = {2, 3};

ParameterizedTestParameters(deterministic, pipelines_end_with_ddps_weights_under_zero1_and_zero3)
{
    return cr_make_param_array(int, replicas, sizeof replicas / sizeof replicas[0]);
}

ParameterizedTest(int *dp, deterministic, pipelines_end_with_ddps_weights_under_zero1_and_zero3,
                  .timeout = 300)
{
    char *ddp = pipeline_weights(*dp, "ddp");
    const char *zero[] = {"zero1", "zero3"};
    for (int z = 0; z < 2; z++) {
        char *w = pipeline_weights(*dp, zero[z]);
        cr_expect(strcmp(w, ddp) == 0, "--pp 2 --dp %d: %s's weights are not ddp's", *dp, zero[z]);
        free(w);
    }
    free(ddp);
}

/* One process with extra flags: exit code and output. */
static int refused(const char *const *args, char **out)
{
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    mg_ranks_run(&j, 1, args);
    int code = j.code[0];
    *out = j.out[0];
    j.out[0] = NULL;
    mg_ranks_free(&j);
    return code;
}

Test(deterministic, what_it_does_not_cover_is_refused_naming_the_flag, .timeout = 60)
{
    const char *const cases[][4] = {{"--tp", "2", "'--tp'"},
                                    {"--wire", "gloo", "'--wire gloo'"},
                                    {"--device", "cuda-host", "'--device'"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *args[] = {FLAGS, cases[c][0], cases[c][1], NULL};
        char *out;
        int code = refused(args, &out);
        cr_expect_eq(code, 2, "%s %s: exit %d:\n%s", cases[c][0], cases[c][1], code, out);
        cr_expect(strstr(out, "--deterministic") && strstr(out, cases[c][2]),
                  "%s %s: the refusal names neither:\n%s", cases[c][0], cases[c][1], out);
        free(out);
    }
}

/* DT_WIRE=gloo chooses the gloo wire as --wire gloo does, and is refused
 * as it is: when the flags are read, on every rank and in one process
 * alone, one line naming it and a pointer to --help, exit 2. */
Test(deterministic, the_gloo_wire_chosen_by_the_environment_is_refused_with_the_flags,
     .timeout = 60)
{
    const char *args[] = {FLAGS, NULL};
    const char *line = "minigpt: --deterministic needs dtrain's rank-order collectives; add "
                       "--wire dtrain or unset 'DT_WIRE=gloo'\n";
    for (int world = 1; world <= 2; world++) {
        mg_ranks j = {0};
        mg_ranks_dir(&j);
        mg_ranks_run_as(&j, world, args, "DT_WIRE=gloo", NULL);
        for (int r = 0; r < world; r++) {
            const char *out = j.out[r] ? j.out[r] : "";
            cr_expect_eq(j.code[r], 2, "rank %d of %d: exit %d:\n%s", r, world, j.code[r], out);
            /* line 1 ends with the refusal (after the program's path), line 2 is
             * the hint, and nothing follows */
            const char *said = strstr(out, line), *hint = said ? said + strlen(line) : NULL;
            cr_expect(said && strchr(out, '\n') == hint - 1 && strncmp(hint, "see '", 5) == 0 &&
                          strchr(hint, '\n') && strchr(hint, '\n')[1] == '\0',
                      "rank %d of %d: not the refusal and a hint:\n%s", r, world, out);
        }
        mg_ranks_free(&j);
    }
}

Test(deterministic, ranks_that_disagree_on_it_are_refused_at_start_up_naming_them, .timeout = 60)
{
    const char *args[] = {"--steps", "5", "--eval-every", "0", "--sample", "0", NULL};
    const char *last[] = {"--deterministic", NULL};
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    mg_ranks_run_as(&j, 2, args, NULL, last);
    for (int r = 0; r < 2; r++) {
        cr_expect_eq(j.code[r], 1, "rank %d exited %d:\n%s", r, j.code[r], j.out[r]);
        cr_expect(strstr(j.out[r], "rank 0 runs --parallel ddp, rank 1 --parallel ddp "
                                   "--deterministic"),
                  "rank %d does not name the mismatch:\n%s", r, j.out[r]);
    }
    mg_ranks_free(&j);
}
