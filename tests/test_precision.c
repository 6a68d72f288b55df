/*
 * test_precision.c — minigpt --precision bf16 (model/precision.c): bf16
 * compute with fp32 master weights, gradients and AdamW state, alone and
 * under DDP and ZeRO-1/2/3:
 *
 * - the embedded task reaches 100% exact match on 4 ranks (DDP);
 * - the replicas stay bitwise identical in every mode it covers;
 * - with --recompute, DDP and ZeRO-2 end with the bits of the run
 *   without it, as fp32 recomputation does;
 * - with --deterministic, DDP, ZeRO-1 and ZeRO-2 on 2 ranks end with the
 *   bits of one process running --grad-accum 2, as fp32 does;
 * - ZeRO-3 with --deterministic on 4 ranks prints DDP's loss table and
 *   ends with its bits;
 * - a run resumed from a checkpoint (fp32 masters and AdamW state) ends
 *   bitwise where the run without the interruption ends, in every mode
 *   (ZeRO-1/2/3 gather bf16 roundings of the masters they checkpoint);
 * - the run says which path bf16 took, and its memory table gains the
 *   mixed-precision rows;
 * - what it does not cover is refused by name, and ranks that disagree on
 *   it are refused at start-up.
 *
 * minigpt runs as processes joined by hand (minigpt_ranks.h), real TCP.
 */
#include <criterion/criterion.h>

#include "minigpt_ranks.h"

#define FLAGS                                                                                   \
    "--steps", "6", "--log-every", "6", "--eval-every", "0", "--sample", "0", "--threads", "1", \
        "--bucket-mb", "0.02"

Test(precision, the_task_reaches_full_exact_match_on_four_ranks, .timeout = 600)
{
    const char *args[] = {"--precision",  "bf16", "--log-every", "1000",
                          "--eval-every", "0",    "--threads",   "1",
                          "--sample",     "0",    NULL};
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    mg_ranks_run(&j, 4, args);
    mg_ranks_assert_ok(&j, "the task, 4 ranks, --precision bf16");
    const char *acc = strstr(j.out[0], "exact-match accuracy ");
    cr_assert(acc, "no accuracy in:\n%s", j.out[0]);
    double pct = atof(acc + strlen("exact-match accuracy "));
    cr_expect_eq(pct, 100.0, "accuracy %.1f%% after 600 steps:\n%s", pct, j.out[0]);
    mg_ranks_hash(&j, "the task, 4 ranks, --precision bf16"); /* replicas bitwise */
    mg_ranks_free(&j);
}

/* mg_ranks_hash reads the line "all N ranks hold bitwise identical
 * parameters": it fails the test when the replicas differ. */
Test(precision, every_mode_it_covers_keeps_identical_replicas, .timeout = 300)
{
    const char *modes[] = {"ddp", "zero1", "zero2", "zero3"};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        char what[48];
        snprintf(what, sizeof what, "3 ranks --parallel %s", modes[m]);
        const char *args[] = {FLAGS, "--parallel", modes[m], "--precision", "bf16", NULL};
        mg_ranks j = {0};
        mg_ranks_dir(&j);
        mg_ranks_run(&j, 3, args);
        mg_ranks_assert_ok(&j, what);
        mg_ranks_hash(&j, what);
        mg_ranks_free(&j);
    }
}

/* The parameters of a bf16 run after 6 steps: world ranks, --parallel
 * mode, --grad-accum k, --deterministic (rank-order sums). */
static unsigned long long deterministic_hash(int world, const char *mode, const char *k)
{
    char what[80];
    snprintf(what, sizeof what, "%d ranks --parallel %s --grad-accum %s --deterministic", world,
             mode, k);
    const char *args[] = {FLAGS, "--precision",     "bf16", "--parallel", mode, "--grad-accum",
                          k,     "--deterministic", NULL};
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    mg_ranks_run(&j, world, args);
    mg_ranks_assert_ok(&j, what);
    unsigned long long h = mg_ranks_hash(&j, what);
    mg_ranks_free(&j);
    return h;
}

Test(precision, deterministic_modes_on_two_ranks_end_where_one_process_accumulating_two_ends,
     .timeout = 300)
{
    unsigned long long one = deterministic_hash(1, "ddp", "2");
    const char *modes[] = {"ddp", "zero1", "zero2"};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        unsigned long long h = deterministic_hash(2, modes[m], "1");
        cr_expect_eq(h, one, "2 ranks --parallel %s: %016llx, one process: %016llx", modes[m], h,
                     one);
    }
}

/* The parameters of a 2-rank bf16 run after 6 steps, --parallel mode,
 * with or without --recompute. */
static unsigned long long recompute_hash(const char *mode, bool recompute)
{
    char what[64];
    snprintf(what, sizeof what, "2 ranks --parallel %s%s", mode, recompute ? " --recompute" : "");
    const char *args[] = {FLAGS,        "--precision", "bf16",
                          "--parallel", mode,          recompute ? "--recompute" : NULL,
                          NULL};
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    mg_ranks_run(&j, 2, args);
    mg_ranks_assert_ok(&j, what);
    unsigned long long h = mg_ranks_hash(&j, what);
    mg_ranks_free(&j);
    return h;
}

Test(precision, recompute_ends_with_the_bits_of_the_run_without_it, .timeout = 300)
{
    const char *modes[] = {"ddp", "zero2"};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        unsigned long long with = recompute_hash(modes[m], true);
        unsigned long long without = recompute_hash(modes[m], false);
        cr_expect_eq(with, without, "--parallel %s: --recompute %016llx, without %016llx", modes[m],
                     with, without);
    }
}

/* "step loss" of each row of the log table in out (the rows under its
 * "step loss" header), one a line, the timings dropped; the caller frees
 * it. */
static char *loss_lines(const char *out)
{
    size_t cap = strlen(out) + 1, len = 0;
    char *t = calloc(cap, 1);
    cr_assert_not_null(t);
    const char *l = strstr(out, "step      loss");
    cr_assert_not_null(l, "no log table in:\n%s", out);
    int step;
    char loss[32];
    for (l = strchr(l, '\n'); l && sscanf(l + 1, " %d %31s", &step, loss) == 2;
         l = strchr(l + 1, '\n'))
        len += (size_t)snprintf(t + len, cap - len, "%d %s\n", step, loss);
    return t;
}

/* ZeRO-3 gathers its units in bf16, the fp32 masters rounded, and DDP
 * rounds every parameter from its fp32 replica on use: the same values
 * read, so with rank-order sums (which make the fp32 modes agree bitwise)
 * the same parameters, and the same loss table, on 4 ranks. */
Test(precision, zero3_on_four_ranks_ends_with_ddps_bits_and_loss_table, .timeout = 300)
{
    const char *modes[] = {"ddp", "zero3"};
    char *table[2];
    unsigned long long h[2];
    for (int m = 0; m < 2; m++) {
        char what[64];
        snprintf(what, sizeof what, "4 ranks --parallel %s --deterministic", modes[m]);
        const char *args[] = {"--steps",      "6",    "--log-every",     "1",
                              "--eval-every", "0",    "--sample",        "0",
                              "--threads",    "1",    "--bucket-mb",     "0.02",
                              "--precision",  "bf16", "--deterministic", "--parallel",
                              modes[m],       NULL};
        mg_ranks j = {0};
        mg_ranks_dir(&j);
        mg_ranks_run(&j, 4, args);
        mg_ranks_assert_ok(&j, what);
        h[m] = mg_ranks_hash(&j, what);
        table[m] = loss_lines(j.out[0]);
        mg_ranks_free(&j);
    }
    cr_expect(strstr(table[0], "\n6 "), "no step 6 in the table:\n%s", table[0]);
    cr_expect_eq(h[1], h[0], "zero3 %016llx, ddp %016llx", h[1], h[0]);
    cr_expect_str_eq(table[1], table[0]);
    free(table[0]);
    free(table[1]);
}

/* The parameters after 6 steps, on 2 ranks, in precision p. */
static unsigned long long hash_after_six(const char *p)
{
    const char *args[] = {FLAGS, "--precision", p, NULL};
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    mg_ranks_run(&j, 2, args);
    mg_ranks_assert_ok(&j, p);
    unsigned long long h = mg_ranks_hash(&j, p);
    mg_ranks_free(&j);
    return h;
}

/* The flag reaches the model: the same run in fp32 ends elsewhere. */
Test(precision, bf16_ends_with_other_bits_than_fp32, .timeout = 120)
{
    cr_expect_neq(hash_after_six("bf16"), hash_after_six("fp32"));
}

Test(precision, a_resumed_run_ends_with_the_uninterrupted_runs_bits, .timeout = 300)
{
    const char *modes[] = {"ddp", "zero1", "zero2", "zero3"};
    for (int m = 0; m < 4; m++) {
        unsigned long long whole = mg_ranks_resumed_hash("--precision", "bf16", modes[m], 10),
                           resumed = mg_ranks_resumed_hash("--precision", "bf16", modes[m], 5);
        cr_expect_eq(resumed, whole, "--parallel %s: resumed %016llx, uninterrupted %016llx",
                     modes[m], resumed, whole);
    }
}

/* The parameters after 10 steps on 2 ranks with bf16 compute and bf16
 * gradients, --parallel first to a checkpoint at step 5, then --parallel
 * then from it. */
static unsigned long long switched_hash(const char *first, const char *then)
{
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    char ckpt[96], what[64];
    snprintf(ckpt, sizeof ckpt, "%s/ck", j.dir);
    snprintf(what, sizeof what, "--parallel %s, then %s", first, then);
    const char *mode[2] = {first, then}, *steps[2] = {"5", "10"};
    for (int k = 0; k < 2; k++) {
        const char *args[] = {"--log-every",  "10",    "--eval-every",    "0",
                              "--sample",     "0",     "--threads",       "1",
                              "--precision",  "bf16",  "--grad-comm",     "bf16",
                              "--parallel",   mode[k], "--ckpt-dir",      ckpt,
                              "--ckpt-every", "5",     "--steps",         steps[k],
                              "--resume",     "auto",  "--verify-resume", NULL};
        mg_ranks_run(&j, 2, args);
        mg_ranks_assert_ok(&j, what);
    }
    unsigned long long h = mg_ranks_hash(&j, what);
    mg_ranks_free(&j);
    return h;
}

/* ZeRO-1/2 replicas hold the masters rounded, but a checkpoint's
 * parameters are the fp32 masters (and --verify-resume finds them in
 * memory): DDP, whose parameters are its masters, resumes from a ZeRO
 * checkpoint and ends with the bits of a DDP run resumed from its own
 * (bf16 gradients: DDP's and ZeRO's means are the same bytes). */
Test(precision, a_zero_checkpoint_holds_the_fp32_masters_ddp_resumes_from, .timeout = 300)
{
    unsigned long long ddp = switched_hash("ddp", "ddp");
    const char *modes[] = {"zero1", "zero2"};
    for (int m = 0; m < 2; m++) {
        unsigned long long h = switched_hash(modes[m], "ddp");
        cr_expect_eq(h, ddp, "%s, then ddp: %016llx; ddp throughout: %016llx", modes[m], h, ddp);
    }
}

Test(precision, the_run_says_which_path_bf16_took, .timeout = 60)
{
    const char *args[] = {FLAGS, "--precision", "bf16", NULL};
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    mg_ranks_run(&j, 1, args);
    mg_ranks_assert_ok(&j, "one rank, --precision bf16");
    cr_expect(strstr(j.out[0], "precision: bf16 compute, fp32 master weights, gradients and "
                               "AdamW state; path: portable"),
              "no precision line in:\n%s", j.out[0]);
    mg_ranks_free(&j);
}

/* Ψ = 29,824 on one rank: the mixed-precision accounting's bytes beside
 * the fp32 rows this run holds. */
Test(precision, the_memory_table_gains_the_mixed_precision_rows, .timeout = 60)
{
    const char *args[] = {FLAGS, "--precision", "bf16", NULL};
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    mg_ranks_run(&j, 1, args);
    mg_ranks_assert_ok(&j, "one rank, --precision bf16");
    cr_expect(strstr(j.out[0], "The ZeRO paper's mixed precision, 2Ψ + 2Ψ + 12Ψ: DDP 16Ψ 477,184, "
                               "ZeRO-1 4Ψ + 12Ψ/N 477,184, ZeRO-2 2Ψ + 14Ψ/N 477,184"),
              "no bf16 rows in:\n%s", j.out[0]);
    mg_ranks_free(&j);
}

Test(precision, what_it_does_not_cover_is_refused_naming_the_flag, .timeout = 60)
{
    const char *const cases[][5] = {
        {"--precision", "fp16", NULL, NULL, "--precision is fp32 or bf16, not 'fp16'"},
        {"--device", "cuda-host", NULL, NULL, "drop '--device'"},
        {"--parallel", "zero3", "--wire", "gloo",
         "gathers ZeRO's parameters in bf16: torch 1.13's gloo has no bfloat16; use '--wire "
         "dtrain'"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *args[] = {FLAGS,       "--precision", "bf16",      cases[c][0],
                              cases[c][1], cases[c][2],   cases[c][3], NULL};
        mg_ranks j = {0};
        mg_ranks_dir(&j);
        mg_ranks_run(&j, 1, args);
        cr_expect_eq(j.code[0], 2, "case %zu: exit %d:\n%s", c, j.code[0], j.out[0]);
        cr_expect(strstr(j.out[0], cases[c][4]), "case %zu: no \"%s\" in:\n%s", c, cases[c][4],
                  j.out[0]);
        mg_ranks_free(&j);
    }
}

/* A bf16 rank beside an fp32 one would train another model: refused at
 * start-up on every rank, naming both. */
Test(precision, ranks_that_disagree_on_it_are_refused_at_start_up, .timeout = 120)
{
    const char *args[] = {FLAGS, "--precision", "bf16", NULL};
    const char *last[] = {"--precision", "fp32", NULL};
    mg_ranks_expect_mode_refusal(args, last,
                                 "rank 0 runs --parallel ddp --precision bf16, rank 1 "
                                 "--parallel ddp: every rank must run the same mode");
}

Test(precision, pipeline_ranks_that_disagree_on_act_comm_are_refused_at_start_up, .timeout = 120)
{
    const char *args[] = {FLAGS, "--pp", "2", "--act-comm", "bf16", NULL};
    const char *last[] = {"--act-comm", "fp32", NULL};
    mg_ranks_expect_mode_refusal(args, last,
                                 "rank 0 runs --parallel ddp --act-comm bf16, rank 1 "
                                 "--parallel ddp: every rank must run the same mode");
}
