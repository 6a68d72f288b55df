/*
 * test_ckpt_tp.c — checkpoints of tensor-parallel runs, end to end: the
 * built dtrain-launch runs minigpt --tp 2 (2 ranks) and --tp 2 --dp 2
 * (4 ranks) as processes, and dtrain-ckpt reshards and exports.
 *
 * - The flat buffer of a tp checkpoint is the T shares end to end (the
 *   manifest says "tp": 2); each rank saves its replica's piece of its
 *   share.
 * - `--resume auto` is bitwise: a tp 2 run killed after its step-3
 *   checkpoint and restarted by the launcher, and a 2 x 2 run stopped and
 *   resumed, save the same step-6 shards byte for byte as runs never
 *   stopped.
 * - Another T is refused, naming the manifest and the reshard to run.
 * - `dtrain-ckpt reshard` tp 2 -> 1 -> 2 gives back the same files; the
 *   tp-1 result resumed by one process follows the tp 2 run within 1e-5
 *   relative; `dtrain-ckpt export` of a tp checkpoint is the unsplit
 *   model's export.
 * - A vocabulary tp does not divide (V 13: padded to 14 rows) is saved
 *   unpadded (2S - 2C elements), reshards tp 2 -> 1 -> 2 byte for byte,
 *   resumes alone within 1e-5, resumes bitwise after a kill, and under
 *   ZeRO-1 holds DDP's parameters, m and v bitwise and resumes bitwise.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_fixture.h"
#include "ckpt_runs.h"
#include "dt_ckpt.h"
#include "run_program.h"

#ifndef LAUNCH_BIN
#error "LAUNCH_BIN must name the built dtrain-launch"
#endif
#ifndef MINIGPT_BIN
#error "MINIGPT_BIN must name the built minigpt"
#endif
#ifndef DT_CKPT_BIN
#error "DT_CKPT_BIN must name the built dtrain-ckpt"
#endif

static const dt_config cfg = {.V = 64, .T = 16, .L = 2, .H = 4, .C = 32}; /* minigpt's default */

/* minigpt on n ranks (n "1": one process, no launcher) into root/sub,
 * saving every 3 steps; flags: the parallel layout, then extra ones. */
static char *train_rc(const char *root, const char *sub, const char *n, const char *const *flags,
                      const char *steps, const char *const *extra, int want)
{
    char dir[256], name[300];
    snprintf(dir, sizeof dir, "%s/%s", root, sub);
    snprintf(name, sizeof name, "%s-%s", sub, steps);
    const char *argv[48] = {LAUNCH_BIN, "-n", n, "--max-restarts", "1"};
    int k = strcmp(n, "1") == 0 ? 0 : 5;
    const char *common[] = {MINIGPT_BIN, "--steps",      steps,    "--batch",
                            "4",         "--data",       "random", "--eval-every",
                            "0",         "--sample",     "0",      "--threads",
                            "1",         "--log-every",  "10",     "--ckpt-dir",
                            dir,         "--ckpt-every", "3",      NULL};
    for (const char *const *f = common; *f; f++)
        argv[k++] = *f;
    for (; flags && *flags; flags++)
        argv[k++] = *flags;
    for (; extra && *extra; extra++)
        argv[k++] = *extra;
    argv[k] = NULL;
    return run(root, name, argv, want);
}

static void train(const char *root, const char *sub, const char *n, const char *const *flags,
                  const char *steps, const char *const *extra)
{
    free(train_rc(root, sub, n, flags, steps, extra, 0));
}

static const char *const resume[] = {"--resume", "auto", NULL};

/* A run of `n` ranks with flags, 6 steps, saved every 3 (a), against
 * the same run (b) killed by SIGKILL after step 4 (kill) or stopped after
 * step 3 (!kill) and resumed from its checkpoint: step 6's files must be
 * the same bytes. */
static void expect_resumed_run_saves_the_same_bytes(const char *n, const char *const *flags,
                                                    bool kill)
{
    char root[128], a[200], b[200];
    fixture_mkroot(root, sizeof root);
    train(root, "a", n, flags, "6", NULL);
    if (kill) {
        const char *die[] = {"--resume", "auto", "--die-at-step", "4", NULL};
        char *out = train_rc(root, "b", n, flags, "6", die, 0);
        cr_assert(strstr(out, "--die-at-step 4: SIGKILL") && strstr(out, "resume: "),
                  "the run was not killed and resumed:\n%s", out);
        free(out);
    } else {
        train(root, "b", n, flags, "3", NULL);
        train(root, "b", n, flags, "6", resume);
    }
    snprintf(a, sizeof a, "%s/a/step_00000006", root);
    snprintf(b, sizeof b, "%s/b/step_00000006", root);
    expect_same_step(a, b, atoi(n));
    fixture_rmtree(root);
}

static const char *const tp2[] = {"--tp", "2", NULL};
static const char *const tp2dp2[] = {"--tp", "2", "--dp", "2", NULL};

Test(ckpt_tp, a_tp2_run_killed_after_a_checkpoint_and_resumed_saves_the_same_bytes, .timeout = 300)
{
    expect_resumed_run_saves_the_same_bytes("2", tp2, true);
}

Test(ckpt_tp, a_2x2_run_stopped_and_resumed_saves_the_same_bytes, .timeout = 300)
{
    expect_resumed_run_saves_the_same_bytes("4", tp2dp2, false);
}

Test(ckpt_tp, each_rank_of_2x2_saves_its_replicas_piece_of_its_tp_share, .timeout = 300)
{
    char root[128], dir[200];
    fixture_mkroot(root, sizeof root);
    train(root, "a", "4", tp2dp2, "3", NULL);
    snprintf(dir, sizeof dir, "%s/a/step_00000003", root);
    dt_ckpt *ck;
    dt_ckpt_info info;
    cr_assert_eq(dt_ckpt_open(&ck, dir, NULL), DT_OK);
    cr_assert_eq(dt_ckpt_inspect(ck, dir, &info), DT_OK, "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
    size_t S = dt_tp_num_params(&cfg, 2);
    cr_expect_eq(info.tp, 2, "the manifest says tp %d", info.tp);
    cr_expect_eq(info.num_params, 2 * S, "the flat buffer is 2 shares of %zu", S);
    char path[300], *text;
    long len;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    read_file(path, &text, &len);
    for (int rep = 0; rep < 2; rep++)
        for (int t = 0; t < 2; t++) { /* world rank rep·2 + t saves share t's piece rep */
            size_t lo, n;
            dt_ckpt_partition(S, 2, rep, &lo, &n);
            char got[40];
            snprintf(got, sizeof got, "\"rank\": %d,", rep * 2 + t);
            const char *at = strstr(text, got), *p = at ? strstr(at, "\"params\": [") : NULL;
            size_t glo = 0, gn = 0;
            cr_assert(p && sscanf(p, "\"params\": [ %zu, %zu", &glo, &gn) == 2, "%s: rank %d", path,
                      rep * 2 + t);
            cr_expect(glo == t * S + lo && gn == n,
                      "rank %d (replica %d, tp rank %d) saved [%zu, +%zu), not its piece "
                      "[%zu, +%zu) of share %d",
                      rep * 2 + t, rep, t, glo, gn, t * S + lo, n, t);
        }
    free(text);
    fixture_rmtree(root);
}

Test(ckpt_tp, a_plain_checkpoints_manifest_has_no_tp_key, .timeout = 120)
{
    char root[128], path[300], *text;
    long len;
    fixture_mkroot(root, sizeof root);
    train(root, "a", "1", NULL, "3", NULL);
    snprintf(path, sizeof path, "%s/a/step_00000003/manifest.json", root);
    read_file(path, &text, &len);
    cr_expect(!strstr(text, "\"tp\""), "%s has a tp key:\n%s", path, text);
    free(text);
    fixture_rmtree(root);
}

Test(ckpt_tp, resuming_with_another_tp_is_refused_naming_the_manifest_and_the_reshard,
     .timeout = 300)
{
    char root[128];
    fixture_mkroot(root, sizeof root);
    train(root, "a", "2", tp2, "3", NULL);
    char *out = train_rc(root, "a", "2", NULL, "6", resume, 1);
    cr_expect(strstr(out, "step_00000003/manifest.json: saved with --tp 2, loading with --tp 1") &&
                  strstr(out, "dtrain-ckpt reshard") && strstr(out, "--tp 1"),
              "the refusal does not name the manifest, both T and the reshard:\n%s", out);
    free(out);
    fixture_rmtree(root);
}

Test(ckpt_tp, reshard_tp2_to_one_rank_and_back_to_tp2_gives_the_same_bytes, .timeout = 300)
{
    char root[128], src[200], one[200], back[200], back3[220];
    fixture_mkroot(root, sizeof root);
    train(root, "a", "2", tp2, "3", NULL);
    snprintf(src, sizeof src, "%s/a/step_00000003", root);
    snprintf(one, sizeof one, "%s/one", root);
    snprintf(back, sizeof back, "%s/back", root);
    ckpt_tool(root, "to-one", (const char *[]){"reshard", src, one, "1", NULL});
    ckpt_tool(root, "back", (const char *[]){"reshard", one, back, "2", "--tp", "2", NULL});
    snprintf(back3, sizeof back3, "%s/step_00000003", back);
    expect_same_step(src, back3, 2);
    fixture_rmtree(root);
}

/* A step directory's full state in the model's layout (a tp one joined). */
static dt_ckpt_state load_unsplit(const char *dir)
{
    dt_ckpt *ck;
    dt_ckpt_info info;
    dt_ckpt_options o = {.allow_reshard = true};
    cr_assert_eq(dt_ckpt_open(&ck, dir, &o), DT_OK);
    cr_assert_eq(dt_ckpt_inspect(ck, dir, &info), DT_OK, "%s", dt_ckpt_error(ck));
    size_t n = info.num_params;
    dt_ckpt_state s = {.cfg = info.cfg,
                       .world = 1,
                       .tp = info.tp,
                       .num_params = n,
                       .opt_n = n,
                       .params = calloc(n, 4),
                       .adam_m = calloc(n, 4),
                       .adam_v = calloc(n, 4)};
    cr_assert_eq(dt_ckpt_load(ck, dir, &s), DT_OK, "%s: %s", dir, dt_ckpt_error(ck));
    dt_ckpt_close(ck);
    dt_ckpt_state u;
    cr_assert_eq(dt_ckpt_tp_convert(&u, &s, 1), DT_OK);
    dt_ckpt_tp_free(&s);
    return u;
}

/* Largest |a - b| / max(|a|, |b|), over all elements (*all) and over those
 * not tiny (1e-3 of the largest magnitude; returned). */
static double max_relative(const float *a, const float *b, size_t n, double *all)
{
    float big = 0;
    for (size_t i = 0; i < n; i++)
        big = fabsf(a[i]) > big ? fabsf(a[i]) : big;
    double worst = 0;
    *all = 0;
    for (size_t i = 0; i < n; i++) {
        double m = fmax(fabs((double)a[i]), fabs((double)b[i]));
        double rel = m > 0 ? fabs((double)a[i] - b[i]) / m : 0;
        *all = rel > *all ? rel : *all;
        if (m >= 1e-3 * big)
            worst = rel > worst ? rel : worst;
    }
    return worst;
}

Test(ckpt_tp, tp2_resharded_to_one_rank_and_resumed_alone_follows_the_tp2_run_within_1e_5,
     .timeout = 300)
{
    char root[128], src[200], one[200], a[200], c[200];
    fixture_mkroot(root, sizeof root);
    train(root, "a", "2", tp2, "4", (const char *[]){"--ckpt-every", "1", NULL});
    snprintf(src, sizeof src, "%s/a/step_00000003", root);
    snprintf(one, sizeof one, "%s/one", root);
    ckpt_tool(root, "to-one", (const char *[]){"reshard", src, one, "1", NULL});
    train(root, "one", "1", NULL, "4",
          (const char *[]){"--ckpt-every", "1", "--resume", "auto", NULL});
    snprintf(a, sizeof a, "%s/a/step_00000004", root);
    snprintf(c, sizeof c, "%s/one/step_00000004", root);
    dt_ckpt_state x = load_unsplit(a), y = load_unsplit(c);
    cr_assert_eq(x.num_params, dt_config_num_params(&cfg));
    double all, rel = max_relative(x.params, y.params, x.num_params, &all);
    cr_log_info("tp 2 -> 1 process, one step after the reshard: max relative %.3g "
                "(%.3g over every element, tiny ones included)",
                rel, all);
    cr_expect(rel <= 1e-5,
              "one step after the reshard the parameters are %.3g relative "
              "from the tp 2 run's",
              rel);
    cr_expect_eq(x.data_row, y.data_row);
    dt_ckpt_tp_free(&x);
    dt_ckpt_tp_free(&y);
    fixture_rmtree(root);
}

Test(ckpt_tp, export_of_a_tp_checkpoint_is_the_unsplit_models_export, .timeout = 120)
{
    char root[128], tpdir[200], tpout[220], want[220];
    fixture_mkroot(root, sizeof root);
    size_t P = dt_config_num_params(&cfg), S = dt_tp_num_params(&cfg, 2);
    float *full = malloc(P * 4), *shares = malloc(2 * S * 4);
    for (size_t i = 0; i < P; i++)
        full[i] = fixture_value(7, 0, i);
    int n = dt_tp_layout_num_tensors(&cfg);
    dt_tp_tensor *tab = malloc((size_t)n * sizeof *tab);
    cr_assert_eq(dt_tp_layout_build(tab, &cfg, 2), n);
    for (int t = 0; t < 2; t++) /* the model's own split, not the checkpoint's */
        dt_tp_layout_slice(shares + (size_t)t * S, full, tab, n, 2, t);
    dt_ckpt_state s = {.cfg = cfg,
                       .world = 1,
                       .tp = 2,
                       .step = 7,
                       .num_params = 2 * S,
                       .opt_n = 2 * S,
                       .params = shares,
                       .adam_m = shares,
                       .adam_v = shares};
    snprintf(tpdir, sizeof tpdir, "%s/tp", root);
    dt_ckpt *ck;
    cr_assert_eq(dt_ckpt_open(&ck, tpdir, NULL), DT_OK);
    cr_assert_eq(dt_ckpt_save_all(ck, &s, 2), DT_OK, "%s", dt_ckpt_error(ck));
    snprintf(want, sizeof want, "%s/unsplit.safetensors", root);
    cr_assert_eq(dt_ckpt_export_safetensors(ck, want, &cfg, full), DT_OK, "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
    snprintf(tpout, sizeof tpout, "%s/tp.safetensors", root);
    ckpt_tool(root, "export", (const char *[]){"export", tpdir, tpout, NULL});
    expect_same_file(tpout, want);
    free(full);
    free(shares);
    free(tab);
    fixture_rmtree(root);
}

static const char *const tp2dp2_zero1[] = {"--tp", "2", "--dp", "2", "--parallel", "zero1", NULL};

/* A vocabulary tp 2 does not divide: padded to 14 rows, 7 a rank, the
 * last of rank 1's padding (model/tp_layout.c). */
static const dt_config odd = {.V = 13, .T = 16, .L = 2, .H = 4, .C = 32};
static const char *const tp2_odd[] = {"--tp", "2", "-V", "13", NULL};
static const char *const one_odd[] = {"-V", "13", NULL};

Test(ckpt_tp, a_tp2_checkpoint_of_a_padded_vocabulary_holds_the_unpadded_model, .timeout = 300)
{
    char root[128], src[200], one[200], back[200], back3[220];
    fixture_mkroot(root, sizeof root);
    train(root, "a", "2", tp2_odd, "3", NULL);
    snprintf(src, sizeof src, "%s/a/step_00000003", root);
    dt_ckpt *ck;
    dt_ckpt_info info;
    cr_assert_eq(dt_ckpt_open(&ck, src, NULL), DT_OK);
    cr_assert_eq(dt_ckpt_inspect(ck, src, &info), DT_OK, "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
    size_t S = dt_tp_num_params(&odd, 2), C = (size_t)odd.C;
    cr_expect_eq(info.num_params, 2 * S - 2 * C,
                 "two shares less one padding row of each of wte "
                 "and lm_head");
    dt_ckpt_state u = load_unsplit(src);
    cr_expect_eq(u.num_params, dt_config_num_params(&odd), "V 13's model");
    dt_ckpt_tp_free(&u);
    snprintf(one, sizeof one, "%s/one", root);
    snprintf(back, sizeof back, "%s/back", root);
    ckpt_tool(root, "to-one", (const char *[]){"reshard", src, one, "1", NULL});
    ckpt_tool(root, "back", (const char *[]){"reshard", one, back, "2", "--tp", "2", NULL});
    snprintf(back3, sizeof back3, "%s/step_00000003", back);
    expect_same_step(src, back3, 2);
    fixture_rmtree(root);
}

Test(ckpt_tp, a_padded_vocabulary_tp2_resharded_to_one_rank_follows_the_tp2_run_within_1e_5,
     .timeout = 300)
{
    char root[128], src[200], one[200], a[200], c[200];
    fixture_mkroot(root, sizeof root);
    train(root, "a", "2", tp2_odd, "4", (const char *[]){"--ckpt-every", "1", NULL});
    snprintf(src, sizeof src, "%s/a/step_00000003", root);
    snprintf(one, sizeof one, "%s/one", root);
    ckpt_tool(root, "to-one", (const char *[]){"reshard", src, one, "1", NULL});
    train(root, "one", "1", one_odd, "4",
          (const char *[]){"--ckpt-every", "1", "--resume", "auto", NULL});
    snprintf(a, sizeof a, "%s/a/step_00000004", root);
    snprintf(c, sizeof c, "%s/one/step_00000004", root);
    dt_ckpt_state x = load_unsplit(a), y = load_unsplit(c);
    cr_assert_eq(x.num_params, dt_config_num_params(&odd));
    double all, rel = max_relative(x.params, y.params, x.num_params, &all);
    cr_log_info("V 13, tp 2 -> 1 process, one step after the reshard: max relative %.3g", rel);
    cr_expect(rel <= 1e-5, "one step after the reshard the parameters are %.3g relative", rel);
    dt_ckpt_tp_free(&x);
    dt_ckpt_tp_free(&y);
    fixture_rmtree(root);
}

Test(ckpt_tp, a_padded_vocabulary_tp2_run_killed_and_resumed_saves_the_same_bytes, .timeout = 300)
{
    char root[128], a[200], b[200];
    fixture_mkroot(root, sizeof root);
    train(root, "a", "2", tp2_odd, "6", NULL);
    const char *die[] = {"--resume", "auto", "--die-at-step", "4", NULL};
    free(train_rc(root, "b", "2", tp2_odd, "6", die, 0));
    snprintf(a, sizeof a, "%s/a/step_00000006", root);
    snprintf(b, sizeof b, "%s/b/step_00000006", root);
    expect_same_step(a, b, 2);
    fixture_rmtree(root);
}

Test(ckpt_tp, a_padded_vocabulary_2x2_zero1_run_holds_ddps_parameters_bit_for_bit, .timeout = 300)
{
    const char *const ddp[] = {"--tp", "2", "--dp", "2", "-V", "13", NULL};
    const char *const z1[] = {"--tp", "2", "--dp", "2", "-V", "13", "--parallel", "zero1", NULL};
    char root[128], a[200], b[200], x[220], y[220];
    fixture_mkroot(root, sizeof root);
    train(root, "ddp", "4", ddp, "6", NULL);
    train(root, "z", "4", z1, "6", NULL);
    snprintf(a, sizeof a, "%s/ddp", root);
    snprintf(b, sizeof b, "%s/z", root);
    snprintf(x, sizeof x, "%s/ddp.safetensors", root);
    snprintf(y, sizeof y, "%s/z.safetensors", root);
    ckpt_tool(root, "export-ddp", (const char *[]){"export", a, x, NULL});
    ckpt_tool(root, "export-z", (const char *[]){"export", b, y, NULL});
    expect_same_file(x, y);
    /* the optimizer state too: each rank's m and v saved where they lie */
    snprintf(a, sizeof a, "%s/ddp/step_00000006", root);
    snprintf(b, sizeof b, "%s/z/step_00000006", root);
    dt_ckpt_state d = load_unsplit(a), z = load_unsplit(b);
    size_t bytes = d.num_params * sizeof(float);
    cr_assert_eq(d.num_params, z.num_params);
    cr_expect(memcmp(d.adam_m, z.adam_m, bytes) == 0, "AdamW's m differs from DDP's");
    cr_expect(memcmp(d.adam_v, z.adam_v, bytes) == 0, "AdamW's v differs from DDP's");
    dt_ckpt_tp_free(&d);
    dt_ckpt_tp_free(&z);
    fixture_rmtree(root);
}

Test(ckpt_tp, a_2x2_zero1_run_holds_ddps_parameters_bit_for_bit, .timeout = 300)
{
    char root[128], a[200], b[200], x[220], y[220];
    fixture_mkroot(root, sizeof root);
    train(root, "ddp", "4", tp2dp2, "6", NULL);
    char *out = train_rc(root, "z", "4", tp2dp2_zero1, "6", NULL, 0);
    cr_expect(strstr(out, "m, v and master of 7680 of the share's 15360 parameters"),
              "no optimizer piece of half the share reported:\n%s", out);
    free(out);
    snprintf(a, sizeof a, "%s/ddp", root);
    snprintf(b, sizeof b, "%s/z", root);
    snprintf(x, sizeof x, "%s/ddp.safetensors", root);
    snprintf(y, sizeof y, "%s/z.safetensors", root);
    ckpt_tool(root, "export-ddp", (const char *[]){"export", a, x, NULL});
    ckpt_tool(root, "export-z", (const char *[]){"export", b, y, NULL});
    expect_same_file(x, y);
    fixture_rmtree(root);
}

Test(ckpt_tp, a_2x2_zero1_run_stopped_and_resumed_saves_the_same_bytes, .timeout = 300)
{
    expect_resumed_run_saves_the_same_bytes("4", tp2dp2_zero1, false);
}

/* ZeRO-1's pieces of a padded share: replica 0's starts in wte's padding,
 * replica 1's ends in lm_head's; each saves and loads only the real part
 * of its master, m and v, and the resumed run is the uninterrupted one. */
Test(ckpt_tp, a_padded_vocabulary_2x2_zero1_run_stopped_and_resumed_saves_the_same_bytes,
     .timeout = 300)
{
    const char *const z1[] = {"--tp", "2", "--dp", "2", "-V", "13", "--parallel", "zero1", NULL};
    expect_resumed_run_saves_the_same_bytes("4", z1, false);
}

/* bf16 (tensor/tp_precision.c): the checkpoint holds the fp32 masters, m
 * and v; each forward rounds a fresh copy of them, so a resumed run reads
 * what the uninterrupted one read. */
static const char *const tp2_bf16[] = {"--tp", "2", "--precision", "bf16", NULL};
static const char *const tp2dp2_zero1_bf16[] = {"--tp",  "2",           "--dp", "2", "--parallel",
                                                "zero1", "--precision", "bf16", NULL};

Test(ckpt_tp, a_bf16_tp2_run_killed_after_a_checkpoint_and_resumed_saves_the_same_bytes,
     .timeout = 300)
{
    expect_resumed_run_saves_the_same_bytes("2", tp2_bf16, true);
}

Test(ckpt_tp, a_bf16_2x2_zero1_run_stopped_and_resumed_saves_the_same_bytes, .timeout = 300)
{
    expect_resumed_run_saves_the_same_bytes("4", tp2dp2_zero1_bf16, false);
}
