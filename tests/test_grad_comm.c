/*
 * test_grad_comm.c — minigpt --grad-comm bf16 (optim/grad_comm.c): fp32
 * training whose gradients travel as bf16, PyTorch DDP's bf16 compression
 * hook, under DDP and ZeRO-1/2/3:
 *
 * - the bytes a step sends, from dtrain's traffic counters, are the closed
 *   form minigpt prints beside them, and the gradients' share of them is
 *   half fp32's: DDP's whole step 0.5x fp32's, ZeRO-2's and ZeRO-3's less
 *   by half their gradient term (their parameter gathers stay fp32, as
 *   long as training does: with --precision bf16 they are bf16 too, and
 *   ZeRO-1/2/3's whole step is 0.5x fp32 training's);
 * - the replicas stay bitwise identical (and DDP, ZeRO-1, ZeRO-2 and ZeRO-3
 *   end with the same bits: the rounded mean is the same bytes in every
 *   mode);
 * - a run resumed from a checkpoint ends bitwise where the run without the
 *   interruption ends;
 * - the embedded task still reaches 100% exact match on 4 ranks;
 * - what it does not cover is refused by name, and ranks that disagree
 *   on it are refused at start-up.
 *
 * minigpt runs as processes joined by hand (minigpt_ranks.h), real TCP.
 */
#include <criterion/criterion.h>

#include <math.h>

#include "minigpt_ranks.h"

#define FLAGS                                                                                   \
    "--steps", "6", "--log-every", "6", "--eval-every", "0", "--sample", "0", "--threads", "1", \
        "--bucket-mb", "0.02"

/* What rank 0's traffic line says. */
typedef struct traffic {
    double sent, closed, grads;
    unsigned long long hash;
} traffic;

/* 4 ranks; --bucket-mb bucket_mb, --precision precision */
static traffic run_precision_traffic(const char *mode, const char *grad_comm, const char *precision,
                                     const char *bucket_mb)
{
    char what[100];
    snprintf(what, sizeof what,
             "4 ranks --parallel %s --grad-comm %s --precision %s --bucket-mb %s", mode, grad_comm,
             precision, bucket_mb);
    const char *args[] = {FLAGS,         "--parallel", mode,          "--grad-comm", grad_comm,
                          "--precision", precision,    "--bucket-mb", bucket_mb,     NULL};
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    mg_ranks_run(&j, 4, args);
    mg_ranks_assert_ok(&j, what);
    traffic t = {.hash = mg_ranks_hash(&j, what)};
    const char *line = strstr(j.out[0], "traffic per step and rank");
    cr_assert(line, "%s: no traffic line:\n%s", what, j.out[0]);
    const char *sent = strstr(line, "): "), *closed = strstr(line, "closed form ");
    const char *grads = strstr(line, "Ψ ");
    cr_assert(sent && closed && grads, "%s: unreadable traffic line:\n%s", what, line);
    t.sent = atof(sent + 3);
    t.closed = atof(closed + strlen("closed form "));
    t.grads = atof(grads + strlen("Ψ "));
    mg_ranks_free(&j);
    return t;
}

static traffic run_traffic(const char *mode, const char *grad_comm, const char *bucket_mb)
{
    return run_precision_traffic(mode, grad_comm, "fp32", bucket_mb);
}

/* Measured beside the closed form: only the loss's 4-byte all-reduce
 * (8 B a rank a step on 4 ranks) is not in it. */
static void expect_closed_form(const traffic *t, const char *what)
{
    cr_expect(fabs(t->sent - t->closed) <= 16, "%s: %.0f B sent a step, the closed form %.0f B",
              what, t->sent, t->closed);
}

/* One bucket of 119 KB: fp32 all-reduces it on the ring, as bf16's rank
 * order does (an fp32 bucket of 64 KiB or less would go by recursive
 * doubling, log2 N of the bucket: then bf16 sends 3/8 of it on 4 ranks). */
Test(grad_comm, ddp_sends_half_of_fp32s_bytes_a_step, .timeout = 300)
{
    traffic f = run_traffic("ddp", "fp32", "1"), b = run_traffic("ddp", "bf16", "1");
    expect_closed_form(&f, "ddp fp32");
    expect_closed_form(&b, "ddp bf16");
    cr_expect(fabs(b.sent / f.sent - 0.5) < 1e-3, "ddp: bf16 %.0f B against fp32 %.0f B: %.4fx",
              b.sent, f.sent, b.sent / f.sent);
}

/* ZeRO: the step's bytes drop by half the fp32 gradient term, to the byte. */
static void expect_gradients_halved(const char *mode)
{
    traffic f = run_traffic(mode, "fp32", "0.02"), b = run_traffic(mode, "bf16", "0.02");
    expect_closed_form(&f, mode);
    expect_closed_form(&b, mode);
    cr_expect_eq(2 * b.grads, f.grads, "%s: gradient term bf16 %.0f, fp32 %.0f", mode, b.grads,
                 f.grads);
    cr_expect(fabs((f.sent - b.sent) - b.grads) <= 1,
              "%s: bf16 saves %.0f B a step, half the fp32 gradients is %.0f B", mode,
              f.sent - b.sent, b.grads);
}

Test(grad_comm, zero2_sends_its_gradients_in_half_the_bytes, .timeout = 300)
{
    expect_gradients_halved("zero2");
}

Test(grad_comm, zero3_sends_its_gradients_in_half_the_bytes, .timeout = 300)
{
    expect_gradients_halved("zero3");
}

/* bf16 compute with bf16 gradients: the parameters are gathered in bf16
 * too (ZeRO-1/2's updated shards, ZeRO-3's units), so the whole step is half fp32's: against fp32
 * training with fp32 gradients 0.5x (the loss's 8 B aside), and each run
 * its closed form to the byte. */
static void expect_half_of_fp32s_step(const char *mode)
{
    traffic f = run_precision_traffic(mode, "fp32", "fp32", "0.02");
    traffic b = run_precision_traffic(mode, "bf16", "bf16", "0.02");
    expect_closed_form(&f, mode);
    expect_closed_form(&b, mode);
    cr_expect(fabs(b.sent / f.sent - 0.5) <= 1e-3,
              "%s: bf16 compute and gradients %.0f B a step against fp32's %.0f B: %.4fx", mode,
              b.sent, f.sent, b.sent / f.sent);
}

Test(grad_comm, zero1_in_bf16_sends_half_of_fp32s_bytes_a_step, .timeout = 300)
{
    expect_half_of_fp32s_step("zero1");
}

Test(grad_comm, zero2_in_bf16_sends_half_of_fp32s_bytes_a_step, .timeout = 300)
{
    expect_half_of_fp32s_step("zero2");
}

Test(grad_comm, zero3_in_bf16_sends_half_of_fp32s_bytes_a_step, .timeout = 300)
{
    expect_half_of_fp32s_step("zero3");
}

/* mg_ranks_hash reads the line "all N ranks hold bitwise identical
 * parameters": it fails the test when the replicas differ. */
Test(grad_comm, every_mode_keeps_identical_replicas_and_ends_with_ddps_bits, .timeout = 300)
{
    const char *modes[] = {"ddp", "zero1", "zero2", "zero3"};
    unsigned long long ddp = 0;
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        char what[48];
        snprintf(what, sizeof what, "3 ranks --parallel %s", modes[m]);
        const char *args[] = {FLAGS, "--parallel", modes[m], "--grad-comm", "bf16", NULL};
        mg_ranks j = {0};
        mg_ranks_dir(&j);
        mg_ranks_run(&j, 3, args);
        mg_ranks_assert_ok(&j, what);
        unsigned long long h = mg_ranks_hash(&j, what);
        mg_ranks_free(&j);
        if (m == 0)
            ddp = h;
        cr_expect_eq(h, ddp, "%s: %016llx, ddp: %016llx", what, h, ddp);
    }
}

Test(grad_comm, a_resumed_run_ends_with_the_uninterrupted_runs_bits, .timeout = 300)
{
    const char *modes[] = {"ddp", "zero2"};
    for (int m = 0; m < 2; m++) {
        unsigned long long whole = mg_ranks_resumed_hash("--grad-comm", "bf16", modes[m], 10),
                           resumed = mg_ranks_resumed_hash("--grad-comm", "bf16", modes[m], 5);
        cr_expect_eq(resumed, whole, "--parallel %s: resumed %016llx, uninterrupted %016llx",
                     modes[m], resumed, whole);
    }
}

Test(grad_comm, the_task_reaches_full_exact_match_on_four_ranks, .timeout = 600)
{
    const char *args[] = {"--grad-comm",  "bf16", "--log-every", "1000",
                          "--eval-every", "0",    "--threads",   "1",
                          "--sample",     "0",    NULL};
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    mg_ranks_run(&j, 4, args);
    mg_ranks_assert_ok(&j, "the task, 4 ranks, --grad-comm bf16");
    const char *acc = strstr(j.out[0], "exact-match accuracy ");
    cr_assert(acc, "no accuracy in:\n%s", j.out[0]);
    double pct = atof(acc + strlen("exact-match accuracy "));
    cr_expect_eq(pct, 100.0, "accuracy %.1f%% after 600 steps:\n%s", pct, j.out[0]);
    mg_ranks_free(&j);
}

Test(grad_comm, what_it_does_not_cover_is_refused_naming_the_flag, .timeout = 60)
{
    const char *const cases[][5] = {
        {"--grad-comm", "fp16", NULL, NULL, "--grad-comm is fp32 or bf16, not 'fp16'"},
        {"--grad-comm", "bf16", "--deterministic", NULL, "'--deterministic'"},
        {"--grad-comm", "bf16", "--tp", "2", "'--tp'"},
        {"--grad-comm", "bf16", "--wire", "gloo", "no bfloat16"},
        {"--grad-comm", "bf16", "--device", "cuda-host", "'--device'"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *args[] = {FLAGS, cases[c][0], cases[c][1], cases[c][2], cases[c][3], NULL};
        mg_ranks j = {0};
        mg_ranks_dir(&j);
        mg_ranks_run(&j, 1, args);
        cr_expect_eq(j.code[0], 2, "case %zu: exit %d:\n%s", c, j.code[0], j.out[0]);
        cr_expect(strstr(j.out[0], cases[c][4]), "case %zu: no \"%s\" in:\n%s", c, cases[c][4],
                  j.out[0]);
        mg_ranks_free(&j);
    }
}

/* A rank that sends fp32 gradients among bf16 ones would meet collectives
 * of half the size: refused at start-up on every rank, naming both. */
Test(grad_comm, ranks_that_disagree_on_it_are_refused_at_start_up, .timeout = 120)
{
    const char *args[] = {FLAGS, "--grad-comm", "bf16", NULL};
    const char *last[] = {"--grad-comm", "fp32", NULL};
    mg_ranks_expect_mode_refusal(args, last,
                                 "rank 0 runs --parallel ddp --grad-comm bf16, rank 1 "
                                 "--parallel ddp: every rank must run the same mode");
}
