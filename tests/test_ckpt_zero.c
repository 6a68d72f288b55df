/*
 * test_ckpt_zero.c — checkpoints of ZeRO-2 and ZeRO-3 runs through
 * `dtrain-ckpt reshard`, minigpt run as processes (minigpt_ranks.h):
 *
 * - a 4-rank ZeRO-2 or ZeRO-3 checkpoint resharded to 2 shards and back
 *   to 4 is the same bytes, manifest and every shard;
 * - the 4-rank ZeRO-3 checkpoint resharded to 2 resumes on 2 ranks
 *   (--grad-accum 2: the same global batch) as ZeRO-3 or as DDP, and
 *   every later loss is within 1e-5 relative of the run that went on on 4;
 * - under --deterministic, a 4-rank ZeRO-3 checkpoint resharded to 1
 *   resumes as one DDP process with --grad-accum 4, whose next checkpoint
 *   holds bitwise the parameters, m and v of ZeRO-3's; that one resharded
 *   back to 4 resumes as ZeRO-3 and ends with the hash of the ZeRO-3 run
 *   that was never interrupted.
 */
#include <math.h>

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <jansson.h>

#include "dt_ckpt.h"
#include "minigpt_ranks.h"

#ifndef DT_CKPT_BIN
#error "DT_CKPT_BIN must name the built dtrain-ckpt"
#endif

#define FLAGS "--log-every", "10", "--eval-every", "0", "--sample", "0", "--threads", "1"

/* dtrain-ckpt reshard FROM TO M, which must succeed. */
static void reshard(const char *dir, const char *from, const char *to, const char *m)
{
    const char *argv[] = {DT_CKPT_BIN, "reshard", from, to, m, NULL};
    char log[160], *out = NULL;
    snprintf(log, sizeof log, "%s/reshard.log", dir);
    int rc = run_program(argv, log, &out);
    cr_assert_eq(rc, 0, "reshard %s -> %s (%s shards) exited %d:\n%s", from, to, m, rc,
                 out ? out : "");
    free(out);
}

/* Whether two files hold the same bytes. */
static bool same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    int ca = 0, cb = 0;
    while (same && (ca = fgetc(fa)) == (cb = fgetc(fb)) && ca != EOF)
        ;
    same = same && ca == cb;
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

/* Parameters are indices: a test runs in a process of its own, where
 * the parent's pointers mean nothing. */
static const char *const stages[] = {"zero2", "zero3"};
static int stage_index[] = {0, 1};

ParameterizedTestParameters(ckpt_zero, resharded_4_to_2_and_back_is_the_same_bytes)
{
    return cr_make_param_array(int, stage_index, 2);
}

ParameterizedTest(int *which, ckpt_zero, resharded_4_to_2_and_back_is_the_same_bytes,
                  .timeout = 120)
{
    const char *const *mode = &stages[*which];
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    char ck[128], two[128], four[128];
    snprintf(ck, sizeof ck, "%s/ck", j.dir);
    snprintf(two, sizeof two, "%s/two", j.dir);
    snprintf(four, sizeof four, "%s/four", j.dir);
    const char *args[] = {FLAGS, "--steps",      "3", "--parallel", *mode, "--ckpt-dir",
                          ck,    "--ckpt-every", "3", NULL};
    mg_ranks_run(&j, 4, args);
    mg_ranks_assert_ok(&j, *mode);
    reshard(j.dir, ck, two, "2");
    reshard(j.dir, two, four, "4");
    const char *files[] = {"manifest.json", "rank00000.bin", "rank00001.bin", "rank00002.bin",
                           "rank00003.bin"};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        char a[192], b[192];
        snprintf(a, sizeof a, "%s/step_00000003/%s", ck, files[f]);
        snprintf(b, sizeof b, "%s/step_00000003/%s", four, files[f]);
        cr_expect(same_file(a, b), "%s: %s differs after 4 -> 2 -> 4", *mode, files[f]);
    }
    mg_ranks_free(&j);
}

/* Each step's loss from a --metrics file, by step (1-based); n of them. */
static void read_losses(const char *path, double *loss, int n)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no metrics file %s", path);
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        const char *ev = json_string_value(json_object_get(o, "event"));
        int step = (int)json_integer_value(json_object_get(o, "step"));
        if (ev && strcmp(ev, "step") == 0 && step >= 1 && step <= n)
            loss[step - 1] = json_real_value(json_object_get(o, "loss"));
        json_decref(o);
    }
    fclose(f);
}

static const char *const resumers[] = {"zero3", "ddp"};

ParameterizedTestParameters(ckpt_zero, zero3_resharded_to_2_resumes_on_2_ranks_within_1e5)
{
    return cr_make_param_array(int, stage_index, 2);
}

ParameterizedTest(int *which, ckpt_zero, zero3_resharded_to_2_resumes_on_2_ranks_within_1e5,
                  .timeout = 120)
{
    const char *const *mode = &resumers[*which];
    enum { STEPS = 6 };
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    char ck[128], two[128], m4[128], m2[128];
    snprintf(ck, sizeof ck, "%s/ck", j.dir);
    snprintf(two, sizeof two, "%s/two", j.dir);
    snprintf(m4, sizeof m4, "%s/four.jsonl", j.dir);
    snprintf(m2, sizeof m2, "%s/two.jsonl", j.dir);
    const char *four_args[] = {FLAGS, "--steps",      "6", "--parallel", "zero3", "--ckpt-dir",
                               ck,    "--ckpt-every", "3", "--metrics",  m4,      NULL};
    mg_ranks_run(&j, 4, four_args);
    mg_ranks_assert_ok(&j, "zero3 on 4 ranks");
    char step3[160];
    snprintf(step3, sizeof step3, "%s/step_00000003", ck);
    reshard(j.dir, step3, two, "2");
    const char *two_args[] = {FLAGS, "--steps",  "6", "--parallel", *mode, "--grad-accum",
                              "2",   "--resume", two, "--metrics",  m2,    NULL};
    mg_ranks_run(&j, 2, two_args);
    mg_ranks_assert_ok(&j, "resumed on 2 ranks");
    cr_expect(strstr(j.out[0], "resume: "), "rank 0 did not resume:\n%s", j.out[0]);
    double a[STEPS] = {0}, b[STEPS] = {0};
    read_losses(m4, a, STEPS);
    read_losses(m2, b, STEPS);
    for (int s = 3; s < STEPS; s++) {
        cr_expect(a[s] > 0 && b[s] > 0, "step %d: no loss (%g, %g)", s + 1, a[s], b[s]);
        cr_expect(fabs(a[s] - b[s]) <= 1e-5 * fabs(a[s]),
                  "step %d: %.9g on 4 ranks, %.9g resumed as %s on 2", s + 1, a[s], b[s], *mode);
    }
    mg_ranks_free(&j);
}

/* The full state of a checkpoint (a root: its latest), as one rank. */
static void load_full(const char *root, dt_ckpt_state *s)
{
    dt_ckpt *ck = NULL;
    cr_assert_eq(dt_ckpt_open(&ck, root, &(dt_ckpt_options){.allow_reshard = true}), DT_OK);
    char dir[256];
    cr_assert_eq(dt_ckpt_latest(ck, dir, sizeof dir), DT_OK, "%s", dt_ckpt_error(ck));
    dt_ckpt_info info;
    cr_assert_eq(dt_ckpt_inspect(ck, dir, &info), DT_OK, "%s", dt_ckpt_error(ck));
    size_t n = info.num_params;
    *s = (dt_ckpt_state){.cfg = info.cfg,
                         .mode = DT_CKPT_DDP,
                         .world = 1,
                         .num_params = n,
                         .opt_n = n,
                         .params = malloc(n * sizeof(float)),
                         .adam_m = malloc(n * sizeof(float)),
                         .adam_v = malloc(n * sizeof(float))};
    cr_assert_eq(dt_ckpt_load(ck, dir, s), DT_OK, "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
}

static void expect_same(const char *what, const float *a, const float *b, size_t n)
{
    size_t i = 0;
    while (i < n && memcmp(&a[i], &b[i], sizeof a[i]) == 0)
        i++;
    cr_expect_eq(i, n, "%s: element %zu differs (%.9g, %.9g)", what, i, i < n ? (double)a[i] : 0.0,
                 i < n ? (double)b[i] : 0.0);
}

Test(ckpt_zero, a_deterministic_zero3_checkpoint_resumes_as_one_ddp_process_bitwise_and_back,
     .timeout = 180)
{
    mg_ranks j = {0};
    mg_ranks_dir(&j);
    char ck[128], one[128], one_ck[128], six[128], back[128];
    snprintf(ck, sizeof ck, "%s/ck", j.dir);
    snprintf(one, sizeof one, "%s/one", j.dir);
    snprintf(one_ck, sizeof one_ck, "%s/one-ck", j.dir);
    snprintf(six, sizeof six, "%s/six", j.dir);
    snprintf(back, sizeof back, "%s/back", j.dir);
    const char *zero3[] = {
        FLAGS, "--deterministic", "--steps", "9", "--parallel", "zero3", "--ckpt-dir",
        ck,    "--ckpt-every",    "3",       NULL};
    mg_ranks_run(&j, 4, zero3);
    mg_ranks_assert_ok(&j, "zero3 --deterministic on 4 ranks");
    unsigned long long whole = mg_ranks_hash(&j, "zero3 on 4 ranks");
    char step3[160], step6[160];
    snprintf(step3, sizeof step3, "%s/step_00000003", ck);
    snprintf(step6, sizeof step6, "%s/step_00000006", ck);
    reshard(j.dir, step3, one, "1");
    reshard(j.dir, step6, six, "1");
    /* one DDP process, 4 micro-steps: steps 4..6, saving at 6 */
    const char *ddp[] = {FLAGS,
                         "--deterministic",
                         "--steps",
                         "6",
                         "--grad-accum",
                         "4",
                         "--resume",
                         one,
                         "--ckpt-dir",
                         one_ck,
                         "--ckpt-every",
                         "6",
                         NULL};
    mg_ranks_run(&j, 1, ddp);
    mg_ranks_assert_ok(&j, "one ddp process resumed");
    dt_ckpt_state a, b;
    load_full(six, &a);
    load_full(one_ck, &b);
    expect_same("parameters", a.params, b.params, a.num_params);
    expect_same("AdamW m", a.adam_m, b.adam_m, a.num_params);
    expect_same("AdamW v", a.adam_v, b.adam_v, a.num_params);
    free(a.params), free(a.adam_m), free(a.adam_v);
    free(b.params), free(b.adam_m), free(b.adam_v);
    /* and back: the DDP checkpoint on 4 ranks as ZeRO-3, steps 7..9 */
    reshard(j.dir, one_ck, back, "4");
    const char *again[] = {FLAGS,   "--deterministic", "--steps", "9", "--parallel",
                           "zero3", "--resume",        back,      NULL};
    mg_ranks_run(&j, 4, again);
    mg_ranks_assert_ok(&j, "zero3 resumed from the ddp checkpoint");
    unsigned long long h = mg_ranks_hash(&j, "zero3 resumed");
    cr_expect_eq(h, whole, "resumed %016llx, never interrupted %016llx", h, whole);
    mg_ranks_free(&j);
}
