/*
 * test_ckpt_tool.c — the dtrain-ckpt program as a user runs it: ls, verify
 * (exit 0 on a good checkpoint, 1 on a corrupt one), export (a safetensors
 * file whose header parses and whose data is exactly the parameters) and
 * reshard N -> M (the result loads and holds the same values); and that no
 * command line changes a checkpoint that exists: reshard into the input's
 * own root, into a step directory or behind a newer `latest`, and export
 * over a shard or `latest`, are refused by name and leave every byte as it
 * was.
 *
 * Checkpoints come from the library (dt_ckpt_save_all of the fixture's
 * synthetic state, 3 shards of 805 parameters), so every expected byte is
 * known; the tool runs as a separate process, found through DT_CKPT_BIN.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_fixture.h"
#include "run_program.h"

#ifndef DT_CKPT_BIN
#error "DT_CKPT_BIN must name the built dtrain-ckpt"
#endif

static uint64_t get_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* root with steps 10 and 20 of the fixture state, 3 shards each. */
static void make_root(char *root, size_t len, full_state *f)
{
    fixture_mkroot(root, len);
    dt_ckpt *ck = NULL;
    cr_assert_eq(dt_ckpt_open(&ck, root, NULL), DT_OK);
    for (long step = 10; step <= 20; step += 10) {
        full_state_init(f, DT_CKPT_ZERO1, step);
        cr_assert_eq(dt_ckpt_save_all(ck, &f->s, 3), DT_OK, "%s", dt_ckpt_error(ck));
        if (step < 20)
            full_state_free(f);
    }
    dt_ckpt_close(ck);
}

static int tool(const char *root, const char *a1, const char *a2, const char *a3, char **out)
{
    char log[128];
    snprintf(log, sizeof log, "%s.log", root);
    const char *argv[] = {DT_CKPT_BIN, a1, a2, a3, NULL, NULL};
    if (!a3)
        argv[3] = NULL;
    return run_program(argv, log, out);
}

static void cleanup(const char *root, full_state *f, char *out)
{
    char log[128];
    snprintf(log, sizeof log, "%s.log", root);
    remove(log);
    fixture_rmtree(root);
    full_state_free(f);
    free(out);
}

Test(ckpt_tool, ls_lists_every_committed_step_and_exits_0, .timeout = 30)
{
    char root[64], *out = NULL;
    full_state f;
    make_root(root, sizeof root, &f);
    int rc = tool(root, "ls", root, NULL, &out);
    cr_assert_eq(rc, 0, "ls exited %d:\n%s", rc, out);
    cr_assert(strstr(out, "step_00000010") && strstr(out, "step_00000020"),
              "ls output misses a step:\n%s", out);
    cleanup(root, &f, out);
}

Test(ckpt_tool, verify_exits_0_on_a_good_checkpoint, .timeout = 30)
{
    char root[64], *out = NULL;
    full_state f;
    make_root(root, sizeof root, &f);
    int rc = tool(root, "verify", root, NULL, &out);
    cr_assert_eq(rc, 0, "verify exited %d:\n%s", rc, out);
    cleanup(root, &f, out);
}

Test(ckpt_tool, verify_exits_1_and_names_the_hash_on_a_flipped_byte, .timeout = 30)
{
    char root[64], path[128], *out = NULL;
    full_state f;
    make_root(root, sizeof root, &f);
    snprintf(path, sizeof path, "%s/step_00000020/rank00001.bin", root);
    FILE *fp = fopen(path, "r+b");
    cr_assert(fp);
    fseek(fp, 500, SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, 500, SEEK_SET);
    fputc(c ^ 0x10, fp);
    fclose(fp);
    int rc = tool(root, "verify", root, NULL, &out);
    cr_assert_eq(rc, 1, "verify of a corrupt shard exited %d:\n%s", rc, out);
    cr_assert(strstr(out, "SHA-256") && strstr(out, "rank00001.bin"),
              "message does not name the hash and the file:\n%s", out);
    cleanup(root, &f, out);
}

/* Checks one tensor entry of the header; returns its byte length. */
static size_t check_tensor(const char *name, json_t *t, size_t expect_begin)
{
    json_t *shape = json_object_get(t, "shape");
    json_t *offs = json_object_get(t, "data_offsets");
    cr_assert_str_eq(json_string_value(json_object_get(t, "dtype")), "F32", "%s: dtype", name);
    cr_assert(json_is_array(shape) && json_is_array(offs) && json_array_size(offs) == 2,
              "%s: shape/data_offsets", name);
    size_t elems = 1;
    for (size_t i = 0; i < json_array_size(shape); i++)
        elems *= (size_t)json_integer_value(json_array_get(shape, i));
    size_t b = (size_t)json_integer_value(json_array_get(offs, 0));
    size_t e = (size_t)json_integer_value(json_array_get(offs, 1));
    cr_assert_eq(b, expect_begin, "%s: tensors must tile the data", name);
    cr_assert_eq(e - b, elems * sizeof(float), "%s: shape vs offsets", name);
    return e - b;
}

Test(ckpt_tool, export_writes_safetensors_whose_data_is_the_parameters, .timeout = 30)
{
    char root[64], path[128], *out = NULL;
    full_state f;
    make_root(root, sizeof root, &f);
    snprintf(path, sizeof path, "%s/model.safetensors", root);
    int rc = tool(root, "export", root, path, &out);
    cr_assert_eq(rc, 0, "export exited %d:\n%s", rc, out);
    FILE *fp = fopen(path, "rb");
    cr_assert(fp);
    unsigned char lenb[8];
    cr_assert_eq(fread(lenb, 1, 8, fp), 8u);
    size_t hlen = (size_t)get_le64(lenb);
    cr_assert(hlen > 0 && hlen < (1u << 20) && hlen % 8 == 0, "header length %zu", hlen);
    char *hdr = calloc(1, hlen + 1);
    cr_assert_eq(fread(hdr, 1, hlen, fp), hlen);
    json_error_t err;
    json_t *j = json_loads(hdr, 0, &err);
    cr_assert(json_is_object(j), "header is not JSON: %s", err.text);
    /* Tensors in order of their offsets must tile [0, 4Ψ). */
    size_t n = f.s.num_params, covered = 0, count = json_object_size(j);
    for (size_t k = 0; k < count; k++) {
        const char *key;
        json_t *t, *next = NULL;
        const char *next_name = NULL;
        json_object_foreach(j, key, t)
        {
            json_t *o = json_object_get(t, "data_offsets");
            if (o && (size_t)json_integer_value(json_array_get(o, 0)) == covered)
                next = t, next_name = key;
        }
        if (!next)
            break;
        covered += check_tensor(next_name, next, covered);
    }
    cr_assert_eq(covered, n * sizeof(float), "tensors cover %zu of %zu bytes", covered,
                 n * sizeof(float));
    float *data = malloc(n * sizeof(float) + 1);
    cr_assert_eq(fread(data, 1, n * sizeof(float) + 1, fp), n * sizeof(float),
                 "data section is not exactly 4Ψ bytes");
    cr_assert(memcmp(data, f.params, n * sizeof(float)) == 0,
              "exported data differs from the parameters");
    fclose(fp);
    free(data);
    free(hdr);
    json_decref(j);
    cleanup(root, &f, out);
}

/* The names of the seed curriculum's MiniGPT module, in its registration
 * order, with their shapes, for the fixture's V=8 C=5 L=2 T=5. */
static void seed_names(char names[][40], int shapes[][2], int *n)
{
    static const char *const block[10] = {"ln1.weight",       "ln1.bias",   "attn.qkv.weight",
                                          "attn.proj.weight", "ln2.weight", "ln2.bias",
                                          "mlp.0.weight",     "mlp.0.bias", "mlp.2.weight",
                                          "mlp.2.bias"};
    static const int block_shape[10][2] = {{5, 0}, {5, 0},  {15, 5}, {5, 5},  {5, 0},
                                           {5, 0}, {20, 5}, {20, 0}, {5, 20}, {5, 0}};
    int k = 0;
    snprintf(names[k], 40, "tok_embed.weight"), shapes[k][0] = 8, shapes[k++][1] = 5;
    snprintf(names[k], 40, "pos_embed.weight"), shapes[k][0] = 5, shapes[k++][1] = 5;
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < 10; i++, k++) {
            snprintf(names[k], 40, "blocks.%d.%s", l, block[i]);
            shapes[k][0] = block_shape[i][0], shapes[k][1] = block_shape[i][1];
        }
    snprintf(names[k], 40, "ln_f.weight"), shapes[k][0] = 5, shapes[k++][1] = 0;
    snprintf(names[k], 40, "ln_f.bias"), shapes[k][0] = 5, shapes[k++][1] = 0;
    snprintf(names[k], 40, "head.weight"), shapes[k][0] = 8, shapes[k++][1] = 5;
    *n = k;
}

Test(ckpt_tool, export_names_seed_writes_the_curriculum_modules_names_shapes_and_order,
     .timeout = 30)
{
    char root[64], path[128], *out = NULL;
    full_state f;
    make_root(root, sizeof root, &f);
    snprintf(path, sizeof path, "%s/seed.safetensors", root);
    char log[128];
    snprintf(log, sizeof log, "%s.log", root);
    const char *argv[] = {DT_CKPT_BIN, "export", root, path, "--names", "seed", NULL};
    int rc = run_program(argv, log, &out);
    cr_assert_eq(rc, 0, "export exited %d:\n%s", rc, out);
    FILE *fp = fopen(path, "rb");
    cr_assert(fp);
    unsigned char lenb[8];
    cr_assert_eq(fread(lenb, 1, 8, fp), 8u);
    size_t hlen = (size_t)get_le64(lenb);
    cr_assert(hlen > 0 && hlen < (1u << 20), "header length %zu", hlen);
    char *hdr = calloc(1, hlen + 1);
    cr_assert_eq(fread(hdr, 1, hlen, fp), hlen);
    fclose(fp);
    json_t *j = json_loads(hdr, 0, NULL);
    cr_assert(json_is_object(j));
    char names[32][40];
    int shapes[32][2], n = 0;
    seed_names(names, shapes, &n);
    cr_expect_eq(json_object_size(j), (size_t)n + 1, "tensors + __metadata__");
    size_t at = 0;
    for (int i = 0; i < n; i++) { /* registration order = order of the data */
        json_t *t = json_object_get(j, names[i]);
        cr_assert(t, "no '%s' in the header:\n%s", names[i], hdr);
        json_t *shape = json_object_get(t, "shape");
        cr_expect_eq(json_array_size(shape), shapes[i][1] ? 2u : 1u, "%s", names[i]);
        for (int d = 0; d < 2 && shapes[i][d]; d++)
            cr_expect_eq(json_integer_value(json_array_get(shape, (size_t)d)), shapes[i][d],
                         "%s: dimension %d", names[i], d);
        at += check_tensor(names[i], t, at);
    }
    cr_expect_eq(at, f.s.num_params * sizeof(float));
    json_decref(j);
    free(hdr);
    cleanup(root, &f, out);
}

Test(ckpt_tool, reshard_three_to_two_loads_with_every_value_kept, .timeout = 30)
{
    char root[64], dst[128], latest[256], *out = NULL;
    full_state f, g;
    make_root(root, sizeof root, &f);
    snprintf(dst, sizeof dst, "%s/resharded", root);
    int rc = tool(root, "reshard", root, dst, &out);
    cr_assert_eq(rc, 2, "reshard without M must be a usage error, got %d", rc);
    free(out);
    char log[128];
    snprintf(log, sizeof log, "%s.log", root);
    const char *argv[] = {DT_CKPT_BIN, "reshard", root, dst, "2", NULL};
    rc = run_program(argv, log, &out);
    cr_assert_eq(rc, 0, "reshard exited %d:\n%s", rc, out);
    dt_ckpt *ck = NULL;
    dt_ckpt_options o = {.allow_reshard = false};
    dt_ckpt_info info;
    cr_assert_eq(dt_ckpt_open(&ck, dst, &o), DT_OK);
    cr_assert_eq(dt_ckpt_latest(ck, latest, sizeof latest), DT_OK, "%s", dt_ckpt_error(ck));
    cr_assert_eq(dt_ckpt_inspect(ck, latest, &info), DT_OK, "%s", dt_ckpt_error(ck));
    cr_assert_eq(info.world, 2);
    cr_assert_eq(info.step, 20);
    full_state_init(&g, DT_CKPT_ZERO1, 0);
    dt_ckpt_close(ck);
    o.allow_reshard = true; /* a full state is world 1: loads any world */
    cr_assert_eq(dt_ckpt_open(&ck, dst, &o), DT_OK);
    cr_assert_eq(dt_ckpt_load(ck, latest, &g.s), DT_OK, "%s", dt_ckpt_error(ck));
    size_t bytes = f.s.num_params * sizeof(float);
    cr_assert(memcmp(g.params, f.params, bytes) == 0, "params differ");
    cr_assert(memcmp(g.master, f.master, bytes) == 0, "master differs");
    cr_assert(memcmp(g.m, f.m, bytes) == 0, "m differs");
    cr_assert(memcmp(g.v, f.v, bytes) == 0, "v differs");
    cr_assert_eq(g.s.step, 20);
    cr_assert_eq(g.s.data_row, f.s.data_row);
    cr_assert_eq(g.s.rng_state, f.s.rng_state);
    dt_ckpt_close(ck);
    full_state_free(&g);
    cleanup(root, &f, out);
}

/* Everything a step directory holds, as "name:size name:size ..." and the
 * manifest's bytes: what "left as it was" compares. */
static char *step_snapshot(const char *root, const char *step)
{
    char dir[256], path[512], *snap = calloc(1, 1 << 16);
    snprintf(dir, sizeof dir, "%s/%s", root, step);
    struct dirent **names;
    int n = scandir(dir, &names, NULL, alphasort);
    cr_assert_geq(n, 0, "scandir %s", dir);
    for (int i = 0; i < n; i++) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        if (names[i]->d_name[0] != '.' && stat(path, &st) == 0)
            snprintf(snap + strlen(snap), (1 << 16) - strlen(snap), "%s:%lld ", names[i]->d_name,
                     (long long)st.st_size);
        free(names[i]);
    }
    free(names);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    char *man = run_slurp(path);
    snprintf(snap + strlen(snap), (1 << 16) - strlen(snap), "%s", man);
    free(man);
    return snap;
}

/* Runs dtrain-ckpt argv[1..], expects exit 1 and a message holding each
 * of the words, and step_00000020 of root exactly as before. */
static void expect_refused(const char *root, const char *const *argv, const char *word1,
                           const char *word2)
{
    char log[128], *out = NULL;
    char *before = step_snapshot(root, "step_00000020");
    snprintf(log, sizeof log, "%s.log", root);
    int rc = run_program(argv, log, &out);
    cr_assert_eq(rc, 1, "%s %s %s exited %d, not 1 (refused):\n%s", argv[1], argv[2], argv[3], rc,
                 out);
    cr_assert(strstr(out, word1) && strstr(out, word2),
              "the refusal does not say '%s' and '%s':\n%s", word1, word2, out);
    char *after = step_snapshot(root, "step_00000020");
    cr_assert_str_eq(after, before, "the committed step changed");
    free(before);
    free(after);
    free(out);
    const char *verify[] = {DT_CKPT_BIN, "verify", root, NULL};
    rc = run_program(verify, log, &out);
    cr_assert_eq(rc, 0, "the committed step no longer verifies:\n%s", out);
    free(out);
}

Test(ckpt_tool, reshard_into_the_inputs_own_root_is_refused_naming_the_step, .timeout = 30)
{
    char root[64], step[128];
    full_state f;
    make_root(root, sizeof root, &f);
    snprintf(step, sizeof step, "%s/step_00000020", root);
    const char *argv[] = {DT_CKPT_BIN, "reshard", step, root, "2", "--tp", "1", NULL};
    expect_refused(root, argv, "step_00000020 already exists", "never replaces");
    cleanup(root, &f, NULL);
}

Test(ckpt_tool, reshard_into_a_step_directory_is_refused_and_writes_nothing_there, .timeout = 30)
{
    char root[64], step[128], below[160];
    full_state f;
    make_root(root, sizeof root, &f);
    snprintf(step, sizeof step, "%s/step_00000020", root);
    snprintf(below, sizeof below, "%s/step_00000020/new", root);
    const char *into[] = {DT_CKPT_BIN, "reshard", root, step, "2", NULL};
    expect_refused(root, into, "lies in the step directory", "step_00000020");
    const char *under[] = {DT_CKPT_BIN, "reshard", root, below, "2", NULL};
    expect_refused(root, under, "lies in the step directory", "step_00000020");
    cleanup(root, &f, NULL);
}

Test(ckpt_tool, reshard_behind_a_newer_latest_is_refused, .timeout = 30)
{
    char root[64], dst[128], older[128], log[128], *out = NULL;
    full_state f;
    make_root(root, sizeof root, &f);
    snprintf(dst, sizeof dst, "%s/two", root);
    snprintf(older, sizeof older, "%s/step_00000010", root);
    snprintf(log, sizeof log, "%s.log", root);
    const char *newer[] = {DT_CKPT_BIN, "reshard", root, dst, "2", NULL};
    cr_assert_eq(run_program(newer, log, &out), 0, "%s", out);
    free(out);
    const char *back[] = {DT_CKPT_BIN, "reshard", older, dst, "2", NULL};
    int rc = run_program(back, log, &out);
    cr_assert_eq(rc, 1, "reshard of step 10 behind step 20 exited %d:\n%s", rc, out);
    cr_assert(strstr(out, "move latest back"), "the refusal does not say why:\n%s", out);
    char latest[256];
    snprintf(latest, sizeof latest, "%s/latest", dst);
    char *text = run_slurp(latest);
    cr_assert_str_eq(text, "step_00000020\n");
    free(text);
    cleanup(root, &f, out);
}

Test(ckpt_tool, export_over_a_shard_is_refused_and_the_shard_kept, .timeout = 30)
{
    char root[64], shard[128];
    full_state f;
    make_root(root, sizeof root, &f);
    snprintf(shard, sizeof shard, "%s/step_00000020/rank00000.bin", root);
    const char *argv[] = {DT_CKPT_BIN, "export", root, shard, NULL};
    expect_refused(root, argv, "lies in the step directory", "rank00000.bin");
    cleanup(root, &f, NULL);
}

Test(ckpt_tool, export_over_latest_is_refused_since_it_is_no_safetensors_file, .timeout = 30)
{
    char root[64], latest[128];
    full_state f;
    make_root(root, sizeof root, &f);
    snprintf(latest, sizeof latest, "%s/latest", root);
    const char *argv[] = {DT_CKPT_BIN, "export", root, latest, NULL};
    expect_refused(root, argv, "not a safetensors file", "latest");
    char *text = run_slurp(latest);
    cr_assert_str_eq(text, "step_00000020\n");
    free(text);
    cleanup(root, &f, NULL);
}

/* root with step 7 of a state of 5,281,536 parameters (V 4096, C 256,
 * L 4, T 32: 21 MB of parameters, 84 MB with its ZeRO-1 master, m and
 * v) in 3 shards: larger than the limits the streaming tests set. */
static void make_big_root(char *root, size_t len, full_state *f)
{
    fixture_mkroot(root, len);
    dt_config cfg = {.V = 4096, .T = 32, .L = 4, .H = 4, .C = 256};
    size_t n = dt_config_num_params(&cfg);
    *f = (full_state){.params = malloc(n * sizeof(float)),
                      .master = malloc(n * sizeof(float)),
                      .m = malloc(n * sizeof(float)),
                      .v = malloc(n * sizeof(float))};
    cr_assert(f->params && f->master && f->m && f->v);
    for (size_t i = 0; i < n; i++) {
        f->params[i] = fixture_value(7, 0, i);
        f->m[i] = fixture_value(7, 2, i);
        f->v[i] = fixture_value(7, 3, i);
    }
    memcpy(f->master, f->params, n * sizeof(float));
    f->s = (dt_ckpt_state){.cfg = cfg,
                           .mode = DT_CKPT_ZERO1,
                           .world = 1,
                           .step = 7,
                           .num_params = n,
                           .params = f->params,
                           .opt_n = n,
                           .master = f->master,
                           .adam_m = f->m,
                           .adam_v = f->v};
    dt_ckpt *ck = NULL;
    cr_assert_eq(dt_ckpt_open(&ck, root, NULL), DT_OK);
    cr_assert_eq(dt_ckpt_save_all(ck, &f->s, 3), DT_OK, "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
}

/* A sanitizer's shadow memory and allocator maps count against
 * RLIMIT_DATA (AddressSanitizer reserves 256 MB at start), so a limited
 * run measures the sanitizer, not the tool: those builds skip the test. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif
#ifndef UNDER_SANITIZER
#define UNDER_SANITIZER 0
#endif

static void skip_under_sanitizer(void)
{
    if (UNDER_SANITIZER)
        cr_skip_test("a sanitizer build: its shadow memory counts against RLIMIT_DATA");
}

/* The tool under an RLIMIT_DATA of limit_mb (bounded by `timeout`: a tool
 * that loads the whole state fails, or spins in an allocator's retries). */
static int tool_limited(const char *root, int limit_mb, const char *args, char **out)
{
    char cmd[768], log[128];
    snprintf(cmd, sizeof cmd, "ulimit -d %d && exec timeout 60 '%s' %s", limit_mb * 1024,
             DT_CKPT_BIN, args);
    snprintf(log, sizeof log, "%s.log", root);
    return run_program((const char *[]){"/bin/sh", "-c", cmd, NULL}, log, out);
}

/*
 * export streams: the big checkpoint exports under an RLIMIT_DATA of
 * 16 MB, less than its parameters alone, so no whole-model buffer can be
 * allocated; the data section is still exactly the parameters, across
 * the tool's windows.
 */
Test(ckpt_tool, export_streams_a_checkpoint_larger_than_its_memory_limit, .timeout = 120)
{
    skip_under_sanitizer();
    char root[64], path[128], args[400], *out = NULL;
    full_state f;
    make_big_root(root, sizeof root, &f);
    size_t n = f.s.num_params;
    cr_assert_gt(n * sizeof(float), (size_t)16 << 20);
    snprintf(path, sizeof path, "%s/model.safetensors", root);
    snprintf(args, sizeof args, "export '%s' '%s'", root, path);
    int rc = tool_limited(root, 16, args, &out);
    cr_assert_eq(rc, 0, "export under a 16 MB RLIMIT_DATA exited %d:\n%s", rc, out);
    FILE *fp = fopen(path, "rb");
    cr_assert(fp);
    unsigned char lenb[8];
    cr_assert_eq(fread(lenb, 1, 8, fp), 8u);
    cr_assert_eq(fseek(fp, (long)get_le64(lenb), SEEK_CUR), 0);
    float *data = malloc(n * sizeof(float) + 1);
    cr_assert_eq(fread(data, 1, n * sizeof(float) + 1, fp), n * sizeof(float),
                 "data section is not exactly 4Ψ bytes");
    cr_expect(memcmp(data, f.params, n * sizeof(float)) == 0,
              "exported data differs from the parameters");
    fclose(fp);
    free(data);
    cleanup(root, &f, out);
}

/*
 * reshard streams: 3 shards of the big checkpoint (84 MB of state) to 8
 * under an RLIMIT_DATA of 48 MB, which the whole state exceeds and one
 * output shard's slice (10.6 MB) fits; the result loads with every
 * array's every value kept.
 */
Test(ckpt_tool, reshard_streams_one_output_shard_at_a_time, .timeout = 120)
{
    skip_under_sanitizer();
    char root[64], outroot[96], args[400], *out = NULL;
    full_state f;
    make_big_root(root, sizeof root, &f);
    size_t n = f.s.num_params;
    snprintf(outroot, sizeof outroot, "%s-eight", root);
    snprintf(args, sizeof args, "reshard '%s' '%s' 8", root, outroot);
    int rc = tool_limited(root, 48, args, &out);
    cr_assert_eq(rc, 0, "reshard under a 48 MB RLIMIT_DATA exited %d:\n%s", rc, out);
    full_state g = {.params = calloc(n, sizeof(float)),
                    .master = calloc(n, sizeof(float)),
                    .m = calloc(n, sizeof(float)),
                    .v = calloc(n, sizeof(float))};
    cr_assert(g.params && g.master && g.m && g.v);
    g.s = f.s;
    g.s.params = g.params, g.s.master = g.master, g.s.adam_m = g.m, g.s.adam_v = g.v;
    dt_ckpt *ck = NULL;
    dt_ckpt_options o = {.allow_reshard = true};
    cr_assert_eq(dt_ckpt_open(&ck, outroot, &o), DT_OK);
    char dir[160];
    snprintf(dir, sizeof dir, "%s/step_00000007", outroot);
    cr_assert_eq(dt_ckpt_load(ck, dir, &g.s), DT_OK, "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
    cr_expect_eq(g.s.step, 7);
    cr_expect(memcmp(g.params, f.params, n * sizeof(float)) == 0, "parameters differ");
    cr_expect(memcmp(g.master, f.master, n * sizeof(float)) == 0, "master differs");
    cr_expect(memcmp(g.m, f.m, n * sizeof(float)) == 0, "m differs");
    cr_expect(memcmp(g.v, f.v, n * sizeof(float)) == 0, "v differs");
    full_state_free(&g);
    fixture_rmtree(outroot);
    cleanup(root, &f, out);
}
