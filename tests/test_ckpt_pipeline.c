/*
 * test_ckpt_pipeline.c — checkpoints of pipelined runs, end to end: the
 * built dtrain-launch runs minigpt --pp 2 on 4 ranks (2 stages x 2
 * data-parallel replicas) as processes, and dtrain-ckpt reshards.
 *
 * - Each rank writes its own slice: stage s's range of the flat buffer,
 *   cut over its replicas (the manifest's global offsets say which).
 * - `--resume auto` is bitwise: a run stopped after its step-3 checkpoint
 *   and resumed ends with the same step-6 state (parameters, m, v, ZeRO-1
 *   master) as a run never stopped, DDP, ZeRO-1 and ZeRO-2.
 * - `dtrain-ckpt reshard` turns the 2 x 2 checkpoint into 4 plain
 *   data-parallel shards, which `minigpt --grad-accum 2` on 4 ranks
 *   resumes, ending within 1e-5 relative of the unresharded run (the same
 *   rows per step, summed in another order); and `reshard --pp 2` turns
 *   the 4 shards back into the 2 x 2 layout byte for byte.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_fixture.h"
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

static const dt_config cfg = {.V = 64, .T = 16, .L = 3, .H = 4, .C = 32};

/* Trains `steps` steps on 4 ranks into root/sub (checkpoint every 3);
 * pipelined: --pp 2 with 4 micro-batches, else DDP with --grad-accum 2
 * (the same 16 rows per step). extra flags after. */
static void train(const char *root, const char *sub, bool pipelined, const char *parallel,
                  const char *steps, const char *extra)
{
    char dir[256], log[256];
    snprintf(dir, sizeof dir, "%s/%s", root, sub);
    snprintf(log, sizeof log, "%s/%s-%s.log", root, sub, steps);
    const char *argv[40] = {LAUNCH_BIN,  "-n",       "4",          MINIGPT_BIN,   "--steps",
                            steps,       "--batch",  "2",          "--layers",    "3",
                            "--data",    "random",   "--parallel", parallel,      "--eval-every",
                            "0",         "--sample", "0",          "--log-every", "10",
                            "--threads", "1",        "--ckpt-dir", dir,           "--ckpt-every",
                            "3"};
    int n = 26;
    const char *pp[] = {"--pp", "2", "--microbatches", "4", "--schedule", "zb", NULL};
    const char *dp[] = {"--grad-accum", "2", NULL};
    for (const char *const *f = pipelined ? pp : dp; *f; f++)
        argv[n++] = *f;
    if (extra)
        argv[n++] = "--resume", argv[n++] = extra;
    argv[n] = NULL;
    char *out = NULL;
    int rc = run_program(argv, log, &out);
    cr_assert_eq(rc, 0, "%s %s exited %d:\n%s", sub, steps, rc, out);
    free(out);
}

static void reshard(const char *src, const char *dst, const char *pp)
{
    char log[300];
    snprintf(log, sizeof log, "%s.log", dst);
    const char *argv[] = {DT_CKPT_BIN, "reshard", src, dst, "4", pp ? "--pp" : NULL, pp, NULL};
    char *out = NULL;
    int rc = run_program(argv, log, &out);
    cr_assert_eq(rc, 0, "reshard %s -> %s exited %d:\n%s", src, dst, rc, out);
    free(out);
}

/* A step directory's full state, loaded as one process. */
static dt_ckpt_state load_full(const char *dir, bool zero1)
{
    size_t n = dt_config_num_params(&cfg);
    dt_ckpt_state s = {.cfg = cfg,
                       .mode = zero1 ? DT_CKPT_ZERO1 : DT_CKPT_DDP,
                       .world = 1,
                       .num_params = n,
                       .opt_n = n,
                       .params = calloc(n, 4),
                       .adam_m = calloc(n, 4),
                       .adam_v = calloc(n, 4),
                       .master = zero1 ? calloc(n, 4) : NULL};
    dt_ckpt_options o = {.allow_reshard = true};
    dt_ckpt *ck;
    cr_assert_eq(dt_ckpt_open(&ck, dir, &o), DT_OK);
    cr_assert_eq(dt_ckpt_load(ck, dir, &s), DT_OK, "%s: %s", dir, dt_ckpt_error(ck));
    dt_ckpt_close(ck);
    return s;
}

static void free_full(dt_ckpt_state *s)
{
    free(s->params);
    free(s->adam_m);
    free(s->adam_v);
    free(s->master);
}

static void expect_bitwise(const dt_ckpt_state *a, const dt_ckpt_state *b, const char *what)
{
    size_t bytes = a->num_params * sizeof(float);
    cr_expect(memcmp(a->params, b->params, bytes) == 0, "%s: parameters", what);
    cr_expect(memcmp(a->adam_m, b->adam_m, bytes) == 0, "%s: m", what);
    cr_expect(memcmp(a->adam_v, b->adam_v, bytes) == 0, "%s: v", what);
    if (a->master)
        cr_expect(memcmp(a->master, b->master, bytes) == 0, "%s: master", what);
    cr_expect_eq(a->data_row, b->data_row, "%s: data position", what);
}

static void resume_is_bitwise(const char *parallel)
{
    char root[128], a[200], b[200];
    fixture_mkroot(root, sizeof root);
    train(root, "a", true, parallel, "6", NULL);
    train(root, "b", true, parallel, "3", NULL);
    train(root, "b", true, parallel, "6", "auto");
    snprintf(a, sizeof a, "%s/a/step_00000006", root);
    snprintf(b, sizeof b, "%s/b/step_00000006", root);
    bool zero1 = strcmp(parallel, "ddp") != 0; /* ZeRO-2 saves ZeRO-1's state */
    dt_ckpt_state x = load_full(a, zero1), y = load_full(b, zero1);
    expect_bitwise(&x, &y, parallel);
    free_full(&x);
    free_full(&y);
    fixture_rmtree(root);
}

Test(ckpt_pipeline, resume_auto_of_2x2_ddp_ends_bitwise_equal_to_a_run_never_stopped,
     .timeout = 300)
{
    resume_is_bitwise("ddp");
}

Test(ckpt_pipeline, resume_auto_of_2x2_zero1_ends_bitwise_equal_to_a_run_never_stopped,
     .timeout = 300)
{
    resume_is_bitwise("zero1");
}

Test(ckpt_pipeline, resume_auto_of_2x2_zero2_ends_bitwise_equal_to_a_run_never_stopped,
     .timeout = 300)
{
    resume_is_bitwise("zero2");
}

/* Shard r's params range in dir's manifest. */
static void params_range(const char *dir, int r, size_t *lo, size_t *n)
{
    char path[300];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_error_t e;
    json_t *m = json_load_file(path, 0, &e);
    cr_assert(m, "%s: %s", path, e.text);
    json_t *range = json_object_get(
        json_object_get(json_array_get(json_object_get(m, "shards"), (size_t)r), "ranges"),
        "params");
    cr_assert(json_is_array(range), "%s: shard %d has no params range", path, r);
    *lo = (size_t)json_integer_value(json_array_get(range, 0));
    *n = (size_t)json_integer_value(json_array_get(range, 1));
    json_decref(m);
}

Test(ckpt_pipeline, each_rank_of_2x2_saves_its_replicas_share_of_its_stage, .timeout = 300)
{
    char root[128], dir[200], err[256];
    fixture_mkroot(root, sizeof root);
    train(root, "a", true, "ddp", "3", NULL);
    snprintf(dir, sizeof dir, "%s/a/step_00000003", root);
    int blocks[3];
    cr_assert_eq(dt_pipe_partition(blocks, &cfg, 2, DT_PARTITION_PARAMS, err, sizeof err), DT_OK,
                 "%s", err);
    for (int s = 0; s < 2; s++) {
        size_t lo, hi;
        dt_config_stage_range(&cfg, blocks[s], blocks[s + 1], &lo, &hi);
        for (int r = 0; r < 2; r++) {
            size_t want_lo, want_n, got_lo, got_n;
            dt_ckpt_partition(hi - lo, 2, r, &want_lo, &want_n);
            params_range(dir, 2 * s + r, &got_lo, &got_n);
            cr_expect(got_lo == lo + want_lo && got_n == want_n,
                      "rank %d (stage %d, replica %d) saved [%zu, +%zu), "
                      "its share of the stage [%zu, %zu) is [%zu, +%zu)",
                      2 * s + r, s, r, got_lo, got_n, lo, hi, lo + want_lo, want_n);
        }
    }
    fixture_rmtree(root);
}

static void read_file(const char *path, char **buf, long *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    rewind(f);
    *buf = malloc((size_t)*len + 1);
    cr_assert_eq(fread(*buf, 1, (size_t)*len, f), (size_t)*len);
    fclose(f);
}

static void expect_same_shards(const char *x, const char *y)
{
    for (int r = 0; r < 4; r++) {
        char p[300], q[300], *a, *b;
        long na, nb;
        snprintf(p, sizeof p, "%s/rank%05d.bin", x, r);
        snprintf(q, sizeof q, "%s/rank%05d.bin", y, r);
        read_file(p, &a, &na);
        read_file(q, &b, &nb);
        cr_expect(na == nb && memcmp(a, b, (size_t)na) == 0, "%s and %s differ", p, q);
        free(a);
        free(b);
    }
}

/* Largest |a - b| / max(|a|, |b|) over the elements, and over those whose
 * magnitude is not tiny (1e-3 of the largest): the tolerance's meaning. */
static double max_relative(const float *a, const float *b, size_t n)
{
    float big = 0;
    for (size_t i = 0; i < n; i++)
        big = fabsf(a[i]) > big ? fabsf(a[i]) : big;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double m = fmax(fabs((double)a[i]), fabs((double)b[i]));
        if (m < 1e-3 * big)
            continue;
        double rel = fabs((double)a[i] - b[i]) / m;
        worst = rel > worst ? rel : worst;
    }
    return worst;
}

Test(ckpt_pipeline, reshard_2x2_to_4_ranks_continues_within_1e_5_and_back_is_byte_equal,
     .timeout = 300)
{
    char root[128], src[200], flat[200], back[200], a[200], c[200];
    fixture_mkroot(root, sizeof root);
    train(root, "a", true, "ddp", "6", NULL);
    snprintf(src, sizeof src, "%s/a/step_00000003", root);
    snprintf(flat, sizeof flat, "%s/flat", root);
    snprintf(back, sizeof back, "%s/back", root);
    reshard(src, flat, NULL);
    /* 4 plain DDP ranks continue from the resharded step 3 */
    train(root, "flat", false, "ddp", "6", "auto");
    snprintf(a, sizeof a, "%s/a/step_00000006", root);
    snprintf(c, sizeof c, "%s/flat/step_00000006", root);
    dt_ckpt_state x = load_full(a, false), y = load_full(c, false);
    double rel = max_relative(x.params, y.params, x.num_params);
    cr_log_info("2 x 2 resharded to 4 DDP ranks, step 6: max relative %.3g", rel);
    cr_expect(rel <= 1e-5,
              "after 3 more steps on 4 DDP ranks the parameters "
              "are %.3g relative from the 2 x 2 run's",
              rel);
    cr_expect_eq(x.data_row, y.data_row);
    free_full(&x);
    free_full(&y);
    /* and back: the 4 plain shards of step 3, laid out for --pp 2 again */
    char flat3[220];
    snprintf(flat3, sizeof flat3, "%s/step_00000003", flat);
    reshard(flat3, back, "2");
    char back3[220];
    snprintf(back3, sizeof back3, "%s/step_00000003", back);
    expect_same_shards(src, back3);
    fixture_rmtree(root);
}
