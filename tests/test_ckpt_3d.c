/*
 * test_ckpt_3d.c — checkpoints of 3-D runs, end to end: the built
 * dtrain-launch runs minigpt --dp 2 --tp 2 --pp 2 on 8 ranks as
 * processes, and dtrain-ckpt reshards and exports.
 *
 * - The flat buffer is a tp checkpoint's (the 2 shares end to end, the
 *   manifest says "tp": 2); each rank saves its replica's piece of its
 *   stage's range of its tp share.
 * - `--resume auto` is bitwise: a 2 x 2 x 2 run killed after its step-3
 *   checkpoint and restarted by the launcher, and one stopped and resumed,
 *   save the same step-6 shards byte for byte as a run never stopped.
 * - Another T is refused, naming the manifest and the reshard to run; the
 *   same T on another grid loads (--dp 2 --tp 2 without the pipeline ends
 *   on the 3-D run's bits).
 * - `dtrain-ckpt reshard` 2 x 2 x 2 -> one process -> 2 x 2 x 2 gives back
 *   the same files; `dtrain-ckpt export` of a 3-D checkpoint is the
 *   unsplit model's export.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_fixture.h"
#include "ckpt_runs.h"
#include "dt_ckpt.h"
#include "dt_pipe.h"
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

/* minigpt on n ranks into root/sub, saving every 3 steps; flags: the
 * parallel layout, then extra ones. */
static char *train_rc(const char *root, const char *sub, const char *n, const char *const *flags,
                      const char *steps, const char *const *extra, int want)
{
    char dir[256], name[128];
    snprintf(dir, sizeof dir, "%s/%s", root, sub);
    snprintf(name, sizeof name, "%s-%s-%s", sub, n, steps);
    const char *argv[48] = {LAUNCH_BIN,
                            "-n",
                            n,
                            "--max-restarts",
                            "1",
                            MINIGPT_BIN,
                            "--steps",
                            steps,
                            "--batch",
                            "4",
                            "--data",
                            "random",
                            "--eval-every",
                            "0",
                            "--sample",
                            "0",
                            "--threads",
                            "1",
                            "--log-every",
                            "10",
                            "--ckpt-dir",
                            dir,
                            "--ckpt-every",
                            "3"};
    int k = 24;
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

/* 2 x 2 x 2 with 2 micro-batches a step; its bits are those of --dp 2
 * --tp 2 --grad-accum 2 (the pipeline changes no sum). */
static const char *const grid[] = {"--dp",           "2", "--tp", "2", "--pp", "2",
                                   "--microbatches", "2", NULL};

Test(ckpt_3d, a_2x2x2_run_killed_after_a_checkpoint_and_resumed_saves_the_same_bytes,
     .timeout = 400)
{
    expect_resumed_run_saves_the_same_bytes("8", grid, true);
}

Test(ckpt_3d, a_2x2x2_run_stopped_and_resumed_saves_the_same_bytes, .timeout = 400)
{
    expect_resumed_run_saves_the_same_bytes("8", grid, false);
}

/* bf16 (tensor/tp_precision.c) keeps fp32 masters, m and v in the
 * checkpoint and rounds a fresh copy each forward: a resumed run reads
 * what the uninterrupted one read. */
Test(ckpt_3d, a_bf16_tp2_pp2_run_killed_after_a_checkpoint_and_resumed_saves_the_same_bytes,
     .timeout = 300)
{
    const char *const bf16[] = {"--tp", "2",           "--pp", "2", "--microbatches",
                                "2",    "--precision", "bf16", NULL};
    expect_resumed_run_saves_the_same_bytes("4", bf16, true);
}

/* The [lo, hi) of stage s in one share of 2, from the model's own tp
 * table and the pipeline's own partition of the blocks. */
static void stage_in_share(int s, size_t *lo, size_t *hi)
{
    int blocks[3], n = dt_tp_layout_num_tensors(&cfg);
    char err[200];
    dt_pipe_partition_kind kind;
    cr_assert(dt_pipe_partition_parse("params", &kind));
    cr_assert_eq(dt_pipe_partition(blocks, &cfg, 2, kind, err, sizeof err), DT_OK, "%s", err);
    dt_tp_tensor *tab = malloc((size_t)n * sizeof *tab);
    cr_assert_eq(dt_tp_layout_build(tab, &cfg, 2), n);
    int first = -1, last = -1; /* the stage's tensors by name */
    for (int i = 0; i < n; i++) {
        int l = -1;
        const char *name = tab[i].full.name;
        bool mine = sscanf(name, "blocks.%d.", &l) == 1 ? l >= blocks[s] && l < blocks[s + 1]
                    : strncmp(name, "ln_f", 4) == 0 || strncmp(name, "lm_head", 7) == 0 ? s == 1
                                                                                        : s == 0;
        if (mine && first < 0)
            first = i;
        if (mine)
            last = i;
    }
    *lo = tab[first].local.offset;
    *hi = tab[last].local.offset + tab[last].local.numel;
    free(tab);
}

/* Rank g's "params": [lo, n] from the manifest's text. */
static void saved_range(const char *text, int g, size_t *lo, size_t *n)
{
    char key[40];
    snprintf(key, sizeof key, "\"rank\": %d,", g);
    const char *at = strstr(text, key), *p = at ? strstr(at, "\"params\": [") : NULL;
    cr_assert(p && sscanf(p, "\"params\": [ %zu, %zu", lo, n) == 2, "no range of rank %d", g);
}

Test(ckpt_3d, each_rank_of_2x2x2_saves_its_replicas_piece_of_its_stage_of_its_tp_share,
     .timeout = 300)
{
    char root[128], dir[200], path[300], *text;
    long len;
    fixture_mkroot(root, sizeof root);
    train(root, "a", "8", grid, "3", NULL);
    snprintf(dir, sizeof dir, "%s/a/step_00000003", root);
    dt_ckpt *ck;
    dt_ckpt_info info;
    cr_assert_eq(dt_ckpt_open(&ck, dir, NULL), DT_OK);
    cr_assert_eq(dt_ckpt_inspect(ck, dir, &info), DT_OK, "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
    size_t S = dt_tp_num_params(&cfg, 2);
    cr_expect_eq(info.tp, 2, "the manifest says tp %d", info.tp);
    cr_expect_eq(info.num_params, 2 * S, "the flat buffer is 2 shares of %zu", S);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    read_file(path, &text, &len);
    for (int s = 0; s < 2; s++)
        for (int rep = 0; rep < 2; rep++)
            for (int t = 0; t < 2; t++) {
                int g = s * 4 + rep * 2 + t; /* Megatron's grid */
                size_t lo, hi, plo, pn, glo, gn;
                stage_in_share(s, &lo, &hi);
                dt_ckpt_partition(hi - lo, 2, rep, &plo, &pn);
                saved_range(text, g, &glo, &gn);
                cr_expect(glo == t * S + lo + plo && gn == pn,
                          "rank %d (stage %d, replica %d, tp rank %d) saved [%zu, +%zu), not "
                          "its piece [%zu, +%zu) of share %d's stage range [%zu, %zu)",
                          g, s, rep, t, glo, gn, t * S + lo + plo, pn, t, lo, hi);
            }
    free(text);
    fixture_rmtree(root);
}

Test(ckpt_3d, resuming_with_another_tp_is_refused_naming_the_manifest_and_the_reshard,
     .timeout = 300)
{
    char root[128];
    fixture_mkroot(root, sizeof root);
    train(root, "a", "8", grid, "3", NULL);
    const char *const tp4[] = {"--dp", "1", "--tp", "4", "--pp", "2", "--microbatches", "2", NULL};
    char *out = train_rc(root, "a", "8", tp4, "6", resume, 1);
    cr_expect(strstr(out, "step_00000003/manifest.json: saved with --tp 2, loading with --tp 4") &&
                  strstr(out, "dtrain-ckpt reshard") && strstr(out, "--tp 4"),
              "the refusal does not name the manifest, both T and the reshard:\n%s", out);
    free(out);
    fixture_rmtree(root);
}

/* A step directory's full state as one rank of one, in its own layout. */
static dt_ckpt_state load_whole(const char *dir)
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
    return s;
}

Test(ckpt_3d, a_2x2x2_checkpoint_resumed_as_dp2_tp2_without_the_pipeline_ends_on_its_bits,
     .timeout = 400)
{
    char root[128], a[200], b[200];
    fixture_mkroot(root, sizeof root);
    train(root, "a", "8", grid, "6", NULL);
    train(root, "b", "8", grid, "3", NULL);
    const char *const flat[] = {"--dp", "2", "--tp", "2", "--grad-accum", "2", NULL};
    train(root, "b", "4", flat, "6", resume);
    snprintf(a, sizeof a, "%s/a/step_00000006", root);
    snprintf(b, sizeof b, "%s/b/step_00000006", root);
    dt_ckpt_state x = load_whole(a), y = load_whole(b);
    size_t bytes = x.num_params * sizeof(float);
    cr_assert_eq(x.num_params, y.num_params);
    cr_expect(memcmp(x.params, y.params, bytes) == 0, "the parameters differ");
    cr_expect(memcmp(x.adam_m, y.adam_m, bytes) == 0, "AdamW's m differs");
    cr_expect(memcmp(x.adam_v, y.adam_v, bytes) == 0, "AdamW's v differs");
    cr_expect_eq(x.data_row, y.data_row, "next rows %llu and %llu", (unsigned long long)x.data_row,
                 (unsigned long long)y.data_row);
    dt_ckpt_tp_free(&x);
    dt_ckpt_tp_free(&y);
    fixture_rmtree(root);
}

Test(ckpt_3d, reshard_2x2x2_to_one_process_and_back_to_2x2x2_gives_the_same_bytes, .timeout = 300)
{
    char root[128], src[200], one[200], back[200], back3[220];
    fixture_mkroot(root, sizeof root);
    train(root, "a", "8", grid, "3", NULL);
    snprintf(src, sizeof src, "%s/a/step_00000003", root);
    snprintf(one, sizeof one, "%s/one", root);
    snprintf(back, sizeof back, "%s/back", root);
    ckpt_tool(root, "to-one", (const char *[]){"reshard", src, one, "1", NULL});
    snprintf(back3, sizeof back3, "%s/step_00000003", one);
    dt_ckpt_state u = load_whole(back3);
    cr_expect_eq(u.tp, 1, "one process's checkpoint is unsplit, not tp %d", u.tp);
    cr_expect_eq(u.num_params, dt_config_num_params(&cfg));
    dt_ckpt_tp_free(&u);
    ckpt_tool(root, "back",
              (const char *[]){"reshard", one, back, "8", "--pp", "2", "--tp", "2", NULL});
    snprintf(back3, sizeof back3, "%s/step_00000003", back);
    expect_same_step(src, back3, 8);
    fixture_rmtree(root);
}

Test(ckpt_3d, a_reshard_to_ranks_that_are_not_whole_grids_is_refused_by_name, .timeout = 300)
{
    char root[128], src[200], out[200];
    fixture_mkroot(root, sizeof root);
    train(root, "a", "8", grid, "3", NULL);
    snprintf(src, sizeof src, "%s/a/step_00000003", root);
    snprintf(out, sizeof out, "%s/six", root);
    const char *argv[] = {DT_CKPT_BIN, "reshard", src, out, "6", "--pp", "2", "--tp", "2", NULL};
    char *text = run(root, "six", argv, 1);
    cr_expect(strstr(text, "6 ranks are not a whole number of grids of 2 stages x 2 tp ranks"),
              "the refusal does not name the ranks and the grid:\n%s", text);
    free(text);
    fixture_rmtree(root);
}

Test(ckpt_3d, export_of_a_2x2x2_checkpoint_is_the_unsplit_models_export, .timeout = 300)
{
    char root[128], src[200], got[220], want[220];
    fixture_mkroot(root, sizeof root);
    train(root, "a", "8", grid, "3", NULL);
    snprintf(src, sizeof src, "%s/a/step_00000003", root);
    dt_ckpt_state s = load_whole(src); /* the 2 shares end to end */
    size_t P = dt_config_num_params(&cfg), S = dt_tp_num_params(&cfg, 2);
    cr_assert_eq(s.num_params, 2 * S);
    float *full = calloc(P, sizeof(float));
    int n = dt_tp_layout_num_tensors(&cfg);
    dt_tp_tensor *tab = malloc((size_t)n * sizeof *tab);
    cr_assert_eq(dt_tp_layout_build(tab, &cfg, 2), n);
    for (int t = 0; t < 2; t++) /* the model's own join, not the tool's */
        dt_tp_layout_unslice(full, s.params + (size_t)t * S, tab, n, 2, t);
    dt_ckpt *ck;
    snprintf(want, sizeof want, "%s/unsplit.safetensors", root);
    cr_assert_eq(dt_ckpt_open(&ck, root, NULL), DT_OK);
    cr_assert_eq(dt_ckpt_export_safetensors(ck, want, &cfg, full), DT_OK, "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
    snprintf(got, sizeof got, "%s/3d.safetensors", root);
    ckpt_tool(root, "export", (const char *[]){"export", src, got, NULL});
    expect_same_file(got, want);
    free(full);
    free(tab);
    dt_ckpt_tp_free(&s);
    fixture_rmtree(root);
}

Test(ckpt_3d, the_grid_layout_with_one_stage_is_the_tp_layout_and_with_tp1_the_pipelines)
{
    enum { T = 2, D = 3, P = 2 };
    size_t a[T * D + 1], b[T * D + 1], c[P * D + 1], d[P * D + 1], stage[P + 1];
    int oa[T * D], ob[T * D], oc[P * D], one[2] = {0, cfg.L}, blocks[P + 1] = {0, 1, cfg.L};
    cr_assert_eq(dt_ckpt_grid_slices(a, oa, &cfg, T, 1, D, one), DT_OK);
    dt_ckpt_tp_slices(b, ob, &cfg, T, D);
    cr_expect(memcmp(a, b, sizeof a) == 0 && memcmp(oa, ob, sizeof oa) == 0,
              "--tp 2 --dp 3 as a grid of one stage saves other slices");
    cr_assert_eq(dt_ckpt_grid_slices(c, oc, &cfg, 1, P, D, blocks), DT_OK);
    for (int s = 0; s < P; s++)
        dt_config_stage_range(&cfg, blocks[s], blocks[s + 1], &stage[s], &stage[s + 1]);
    dt_ckpt_pipeline_slices(d, stage, P, D);
    cr_expect(memcmp(c, d, sizeof c) == 0, "--pp 2 --dp 3 as a grid of tp 1 saves other slices");
    for (int g = 0; g < P * D; g++)
        cr_expect_eq(oc[g], g, "rank %d of a plain pipeline saves slice %d", g, oc[g]);
}

/* A vocabulary tp 2 does not divide (model/tp_layout.c pads it): the
 * grid's slices leave the padding out exactly as the tp layout's do. */
Test(ckpt_3d, the_grid_layout_with_one_stage_is_the_tp_layout_on_a_padded_vocabulary)
{
    enum { T = 2, D = 3 };
    dt_config odd = cfg;
    odd.V = 13;
    size_t a[T * D + 1], b[T * D + 1];
    int oa[T * D], ob[T * D], one[2] = {0, odd.L};
    cr_assert_eq(dt_ckpt_grid_slices(a, oa, &odd, T, 1, D, one), DT_OK);
    dt_ckpt_tp_slices(b, ob, &odd, T, D);
    cr_expect(memcmp(a, b, sizeof a) == 0 && memcmp(oa, ob, sizeof oa) == 0,
              "--tp 2 --dp 3 as a grid of one stage saves other slices");
    cr_expect_eq(a[T * D], dt_ckpt_flat_params(&odd, T));
    cr_expect_eq(a[T * D], 2 * dt_tp_num_params(&odd, T) - 2 * (size_t)odd.C,
                 "the flat buffer keeps one padding row of wte and of lm_head");
}

/* --tp 2 --pp 2 on V 13 saves what --tp 2 alone loads and continues on
 * the same bits: the stages' ranges of the padded shares land where the
 * unpipelined shares' do. */
Test(ckpt_3d, a_padded_vocabulary_tp2_pp2_checkpoint_resumed_as_tp2_ends_on_its_bits,
     .timeout = 300)
{
    const char *const g[] = {"--tp", "2", "--pp", "2", "--microbatches", "2", "-V", "13", NULL};
    const char *const flat[] = {"--tp", "2", "--grad-accum", "2", "-V", "13", NULL};
    char root[128], a[200], b[200];
    fixture_mkroot(root, sizeof root);
    train(root, "a", "4", g, "6", NULL);
    train(root, "b", "4", g, "3", NULL);
    train(root, "b", "2", flat, "6", resume);
    snprintf(a, sizeof a, "%s/a/step_00000006", root);
    snprintf(b, sizeof b, "%s/b/step_00000006", root);
    dt_ckpt_state x = load_whole(a), y = load_whole(b);
    size_t bytes = x.num_params * sizeof(float);
    cr_assert_eq(x.num_params, y.num_params);
    cr_expect(memcmp(x.params, y.params, bytes) == 0, "the parameters differ");
    cr_expect(memcmp(x.adam_m, y.adam_m, bytes) == 0, "AdamW's m differs");
    cr_expect(memcmp(x.adam_v, y.adam_v, bytes) == 0, "AdamW's v differs");
    dt_ckpt_tp_free(&x);
    dt_ckpt_tp_free(&y);
    fixture_rmtree(root);
}

/* ---- ZeRO-1 on the dp axis ------------------------------------------------ */

static const char *const grid_zero1[] = {"--dp",           "2", "--tp",       "2",     "--pp", "2",
                                         "--microbatches", "2", "--parallel", "zero1", NULL};

/* On 2 replicas the mean of two gradients is the same bits in either
 * order and AdamW is elementwise, so ZeRO-1's parameters are DDP's. */
Test(ckpt_3d, a_2x2x2_zero1_run_holds_ddps_parameters_bit_for_bit, .timeout = 400)
{
    char root[128], a[200], b[200], x[220], y[220];
    fixture_mkroot(root, sizeof root);
    train(root, "ddp", "8", grid, "6", NULL);
    char *out = train_rc(root, "z", "8", grid_zero1, "6", NULL, 0);
    cr_expect(strstr(out, "tp zero1: AdamW state per rank: m, v and master of "),
              "no optimizer piece reported:\n%s", out);
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

/* Rank 0 (stage 0, replica 0) keeps m, v and master of the first half of
 * its stage's range of share 0: 3/4 of DDP's m and v of the whole range. */
Test(ckpt_3d, a_2x2x2_zero1_rank_keeps_optimizer_state_for_half_its_stage_range, .timeout = 400)
{
    char root[128], want[200];
    fixture_mkroot(root, sizeof root);
    size_t lo, hi;
    stage_in_share(0, &lo, &hi);
    size_t S = hi - lo, n = (S + 1) / 2;
    snprintf(want, sizeof want,
             "m, v and master of %zu of the stage range's %zu parameters, %zu bytes (DDP: m and "
             "v of all %zu, %zu bytes)",
             n, S, 12 * n, S, 8 * S);
    char *out = train_rc(root, "z", "8", grid_zero1, "1", NULL, 0);
    cr_expect(strstr(out, want), "'%s' not said:\n%s", want, out);
    free(out);
    fixture_rmtree(root);
}

Test(ckpt_3d, a_2x2x2_zero1_run_stopped_and_resumed_saves_the_same_bytes, .timeout = 400)
{
    expect_resumed_run_saves_the_same_bytes("8", grid_zero1, false);
}
