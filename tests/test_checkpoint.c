/*
 * test_checkpoint.c — the checkpoint format: round trips, every corruption
 * with its own error, and crash-safety of the commit protocol.
 *
 * States here are synthetic (ckpt_fixture.h): every value a function of
 * (step, array, index), written by one process as N shards
 * (dt_ckpt_save_all — the same shard writer every rank runs), so the tests
 * need no network. The collective load and the verdict it shares with
 * the collective save are in test_checkpoint_collective.c, rotation in
 * test_checkpoint_rotate.c, training resumes in test_checkpoint_train.c,
 * the safetensors export in test_ckpt_export.c.
 */
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include <sodium.h>

#include "ckpt_fixture.h"

#define WORLD 3

static void round_trip(dt_ckpt_mode mode)
{
    fixture_saved x;
    fixture_saved_open(&x, mode, NULL, WORLD);
    char latest[4200];
    cr_assert_eq(dt_ckpt_latest(x.ck, latest, sizeof latest), DT_OK);
    cr_assert_str_eq(latest, x.step_dir);
    for (int r = 0; r < WORLD; r++) {
        full_state got;
        fixture_rank_view(&got, mode, r, WORLD);
        cr_assert_eq(dt_ckpt_load(x.ck, latest, &got.s), DT_OK, "%s", dt_ckpt_error(x.ck));
        fixture_expect_view(&x.f, &got);
        full_state_free(&got);
    }
    fixture_saved_close(&x);
}

Test(checkpoint, ddp_round_trip_is_byte_identical_on_every_rank, .timeout = 30)
{
    round_trip(DT_CKPT_DDP);
}

Test(checkpoint, zero1_round_trip_is_byte_identical_on_every_rank, .timeout = 30)
{
    round_trip(DT_CKPT_ZERO1);
}

Test(checkpoint, manifest_lists_every_shard_with_its_ranges, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_ZERO1, NULL, WORLD);
    dt_ckpt_info info;
    cr_assert_eq(dt_ckpt_inspect(x.ck, x.step_dir, &info), DT_OK);
    cr_assert_eq(info.step, 10);
    cr_assert_eq(info.world, WORLD);
    cr_assert_eq(info.mode, DT_CKPT_ZERO1);
    cr_assert_eq(info.num_params, 805);
    /* 805 = 269 + 269 + 267; 4 arrays of 4 bytes, header 72 + 4 x 32 */
    cr_assert_eq(info.total_bytes, 3 * 200 + 805 * 16);
    fixture_saved_close(&x);
}

Test(checkpoint, a_state_holding_a_stages_range_loads_exactly_that_range, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, &(dt_ckpt_options){.allow_reshard = true}, WORLD);
    size_t n = x.f.s.num_params, lo = n / 3, k = n / 2;
    float *p = calloc(k, sizeof(float)), *m = calloc(k, sizeof(float)),
          *v = calloc(k, sizeof(float));
    dt_ckpt_state s = x.f.s;
    s.params = p, s.adam_m = m, s.adam_v = v;
    s.held_lo = lo, s.held_n = k, s.opt_lo = lo, s.opt_n = k;
    cr_assert_eq(dt_ckpt_load(x.ck, x.step_dir, &s), DT_OK, "%s", dt_ckpt_error(x.ck));
    cr_expect(memcmp(p, x.f.params + lo, k * sizeof(float)) == 0);
    cr_expect(memcmp(m, x.f.m + lo, k * sizeof(float)) == 0);
    cr_expect(memcmp(v, x.f.v + lo, k * sizeof(float)) == 0);
    free(p);
    free(m);
    free(v);
    fixture_saved_close(&x);
}

Test(checkpoint, a_slice_outside_the_parameters_a_rank_holds_is_refused, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
    size_t n = x.f.s.num_params, slices[2] = {0, n};
    dt_ckpt_state s = x.f.s;
    s.step = 11;
    s.held_n = n / 2; /* holds the first half, asked to save all of it */
    s.slices = slices;
    cr_assert_eq(dt_ckpt_save(x.ck, NULL, &s), DT_EINVAL);
    cr_expect(strstr(dt_ckpt_error(x.ck), "outside the parameters") != NULL, "%s",
              dt_ckpt_error(x.ck));
    slices[1] = n - 1; /* slices must end at the parameter count */
    s.held_n = 0;
    cr_assert_eq(dt_ckpt_save(x.ck, NULL, &s), DT_EINVAL);
    cr_expect_eq(dt_ckpt_last_fault(x.ck), DT_CKPT_FAULT_CONFIG);
    fixture_saved_close(&x);
}

Test(checkpoint, reshard_loads_three_shards_on_two_and_five_ranks, .timeout = 30)
{
    dt_ckpt_options o = {.allow_reshard = true};
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_ZERO1, &o, WORLD);
    int worlds[2] = {2, 5};
    for (int w = 0; w < 2; w++)
        for (int r = 0; r < worlds[w]; r++) {
            full_state got;
            fixture_rank_view(&got, DT_CKPT_ZERO1, r, worlds[w]);
            cr_assert_eq(dt_ckpt_load(x.ck, x.step_dir, &got.s), DT_OK, "%s", dt_ckpt_error(x.ck));
            fixture_expect_view(&x.f, &got);
            full_state_free(&got);
        }
    fixture_saved_close(&x);
}

Test(checkpoint, ddp_checkpoint_loads_as_zero1_with_master_from_params, .timeout = 30)
{
    dt_ckpt_options o = {.allow_reshard = true};
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, &o, WORLD);
    full_state got;
    fixture_rank_view(&got, DT_CKPT_ZERO1, 1, 2);
    cr_assert_eq(dt_ckpt_load(x.ck, x.step_dir, &got.s), DT_OK, "%s", dt_ckpt_error(x.ck));
    fixture_expect_view(&x.f, &got);
    full_state_free(&got);
    fixture_saved_close(&x);
}

/* ---- corruptions: each its own fault, a message naming the file ---------- */

static void expect_fault(fixture_saved *x, dt_ckpt_fault want, const char *needle)
{
    full_state got;
    fixture_rank_view(&got, x->f.s.mode, 0, WORLD);
    dt_status st = dt_ckpt_load(x->ck, x->step_dir, &got.s);
    full_state_free(&got);
    cr_assert_neq(st, DT_OK, "a corrupt checkpoint loaded");
    cr_assert_eq(dt_ckpt_last_fault(x->ck), want, "fault %s, expected %s: %s",
                 dt_ckpt_fault_name(dt_ckpt_last_fault(x->ck)), dt_ckpt_fault_name(want),
                 dt_ckpt_error(x->ck));
    cr_assert_not_null(strstr(dt_ckpt_error(x->ck), needle), "message \"%s\" does not name \"%s\"",
                       dt_ckpt_error(x->ck), needle);
    cr_assert_eq(dt_ckpt_verify(x->ck, x->step_dir), st);
}

static void shard_path(const fixture_saved *x, int r, char *buf, size_t len)
{
    snprintf(buf, len, "%s/rank%05d.bin", x->step_dir, r);
}

Test(checkpoint_corrupt, flipped_byte_is_a_hash_mismatch, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_ZERO1, NULL, WORLD);
    char p[512];
    shard_path(&x, 1, p, sizeof p);
    FILE *f = fopen(p, "r+b");
    cr_assert_not_null(f);
    fseek(f, 1000, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 1000, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
    expect_fault(&x, DT_CKPT_FAULT_HASH, "rank00001.bin");
    fixture_saved_close(&x);
}

Test(checkpoint_corrupt, truncated_shard_is_a_size_mismatch, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
    char p[512];
    shard_path(&x, 2, p, sizeof p);
    cr_assert_eq(truncate(p, 100), 0);
    expect_fault(&x, DT_CKPT_FAULT_SIZE, "rank00002.bin");
    fixture_saved_close(&x);
}

Test(checkpoint_corrupt, missing_shard_file_is_named, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
    char p[512];
    shard_path(&x, 0, p, sizeof p);
    cr_assert_eq(unlink(p), 0);
    expect_fault(&x, DT_CKPT_FAULT_MISSING_FILE, "rank00000.bin");
    fixture_saved_close(&x);
}

Test(checkpoint_corrupt, missing_manifest_is_not_a_checkpoint, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
    char p[512];
    snprintf(p, sizeof p, "%s/manifest.json", x.step_dir);
    cr_assert_eq(unlink(p), 0);
    expect_fault(&x, DT_CKPT_FAULT_NO_CHECKPOINT, "manifest");
    fixture_saved_close(&x);
}

static void drop_last_shard(json_t *r)
{
    json_array_remove(json_object_get(r, "shards"), 2);
}
static void duplicate_rank(json_t *r)
{
    json_object_set_new(json_array_get(json_object_get(r, "shards"), 1), "rank", json_integer(0));
}
static void extra_rank(json_t *r)
{
    json_t *arr = json_object_get(r, "shards");
    json_t *e = json_deep_copy(json_array_get(arr, 2));
    json_object_set_new(e, "rank", json_integer(3));
    json_array_append_new(arr, e);
}
static void parent_name(json_t *r)
{
    json_object_set_new(json_array_get(json_object_get(r, "shards"), 1), "file",
                        json_string("../rank00001.bin"));
}
static void absolute_name(json_t *r)
{
    json_object_set_new(json_array_get(json_object_get(r, "shards"), 1), "file",
                        json_string("/etc/passwd"));
}
static void unknown_schema(json_t *r)
{
    json_object_set_new(r, "schema_version", json_integer(99));
}
static void absurd_bytes(json_t *r)
{
    json_object_set_new(json_array_get(json_object_get(r, "shards"), 0), "bytes",
                        json_integer((json_int_t)1 << 62));
}
static void absurd_range(json_t *r)
{
    json_t *ranges = json_object_get(json_array_get(json_object_get(r, "shards"), 0), "ranges");
    json_object_set_new(ranges, "m", json_pack("[II]", (json_int_t)0, (json_int_t)1 << 40));
}
static void absurd_world(json_t *r)
{
    json_object_set_new(r, "world_size", json_integer(1 << 30));
}
static void wrong_world_field(json_t *r)
{
    json_object_set_new(r, "world_size", json_integer(2));
}

Test(checkpoint_corrupt, missing_rank_is_named, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
    fixture_edit_manifest(x.step_dir, drop_last_shard);
    expect_fault(&x, DT_CKPT_FAULT_RANK_MISSING, "rank 2");
    fixture_saved_close(&x);
}

Test(checkpoint_corrupt, duplicate_rank_is_refused, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
    fixture_edit_manifest(x.step_dir, duplicate_rank);
    expect_fault(&x, DT_CKPT_FAULT_RANK_DUP, "rank 0");
    fixture_saved_close(&x);
}

Test(checkpoint_corrupt, extra_rank_is_out_of_range, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
    fixture_edit_manifest(x.step_dir, extra_rank);
    expect_fault(&x, DT_CKPT_FAULT_RANK_RANGE, "rank 3");
    fixture_saved_close(&x);
}

Test(checkpoint_corrupt, hostile_file_names_are_refused, .timeout = 30)
{
    void (*edits[2])(json_t *) = {parent_name, absolute_name};
    for (int i = 0; i < 2; i++) {
        fixture_saved x;
        fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
        fixture_edit_manifest(x.step_dir, edits[i]);
        expect_fault(&x, DT_CKPT_FAULT_UNSAFE_NAME, "not a plain name");
        fixture_saved_close(&x);
    }
}

Test(checkpoint_corrupt, wrong_world_size_is_refused_without_reshard, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
    full_state got;
    fixture_rank_view(&got, DT_CKPT_DDP, 0, 2);
    cr_assert_eq(dt_ckpt_load(x.ck, x.step_dir, &got.s), DT_EINVAL);
    cr_assert_eq(dt_ckpt_last_fault(x.ck), DT_CKPT_FAULT_WORLD, "%s", dt_ckpt_error(x.ck));
    cr_assert_not_null(strstr(dt_ckpt_error(x.ck), "saved by 3 ranks"));
    full_state_free(&got);
    fixture_saved_close(&x);
}

Test(checkpoint_corrupt, manifest_world_size_disagreeing_with_shards_is_refused, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
    fixture_edit_manifest(x.step_dir, wrong_world_field);
    expect_fault(&x, DT_CKPT_FAULT_RANK_RANGE, "outside [0, 2)");
    fixture_saved_close(&x);
}

Test(checkpoint_corrupt, malformed_json_is_reported_with_its_position, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
    char p[512];
    snprintf(p, sizeof p, "%s/manifest.json", x.step_dir);
    cr_assert_eq(truncate(p, 40), 0);
    expect_fault(&x, DT_CKPT_FAULT_BAD_JSON, "not valid JSON");
    fixture_saved_close(&x);
}

Test(checkpoint_corrupt, unknown_schema_version_is_refused, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
    fixture_edit_manifest(x.step_dir, unknown_schema);
    expect_fault(&x, DT_CKPT_FAULT_SCHEMA, "schema_version 99");
    fixture_saved_close(&x);
}

Test(checkpoint_corrupt, absurd_sizes_are_refused_before_reading, .timeout = 30)
{
    void (*edits[3])(json_t *) = {absurd_bytes, absurd_range, absurd_world};
    const char *needles[3] = {"bytes", "range", "world_size"};
    for (int i = 0; i < 3; i++) {
        fixture_saved x;
        fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
        fixture_edit_manifest(x.step_dir, edits[i]);
        expect_fault(&x, DT_CKPT_FAULT_ABSURD, needles[i]);
        fixture_saved_close(&x);
    }
}

static char relabelled_sha[65];
static void set_shard0_sha(json_t *root)
{
    json_t *sh = json_array_get(json_object_get(root, "shards"), 0);
    json_object_set_new(sh, "sha256", json_string(relabelled_sha));
}

/* A shard whose section table lists "params" twice (its m section
 * relabelled), with a manifest whose hash agrees: a writer's bug or a
 * forgery, not a flipped bit. Loading it would leave m unwritten. */
Test(checkpoint_corrupt, a_shard_listing_a_section_kind_twice_is_refused, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
    char p[300];
    snprintf(p, sizeof p, "%s/rank00000.bin", x.step_dir);
    FILE *fp = fopen(p, "r+b");
    cr_assert_not_null(fp);
    cr_assert_eq(fseek(fp, 0, SEEK_END), 0);
    long n = ftell(fp);
    unsigned char *buf = malloc((size_t)n);
    cr_assert_eq(fseek(fp, 0, SEEK_SET), 0);
    cr_assert_eq(fread(buf, 1, (size_t)n, fp), (size_t)n);
    unsigned char *second = buf + 72 + 32; /* 72-byte header, 32-byte table entries */
    cr_assert_eq(second[0], 2, "section 1 of a DDP shard is m");
    second[0] = 0; /* now a second "params" */
    cr_assert_eq(fseek(fp, 0, SEEK_SET), 0);
    cr_assert_eq(fwrite(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    unsigned char d[32];
    crypto_hash_sha256(d, buf, (unsigned long long)n);
    for (int i = 0; i < 32; i++)
        snprintf(relabelled_sha + 2 * i, 3, "%02x", d[i]);
    fixture_edit_manifest(x.step_dir, set_shard0_sha);
    full_state got;
    fixture_rank_view(&got, DT_CKPT_DDP, 0, WORLD);
    cr_assert_eq(dt_ckpt_load(x.ck, x.step_dir, &got.s), DT_EPROTO, "%s", dt_ckpt_error(x.ck));
    cr_expect_eq(dt_ckpt_last_fault(x.ck), DT_CKPT_FAULT_HEADER);
    cr_expect_not_null(strstr(dt_ckpt_error(x.ck), "repeats kind 0"), "%s", dt_ckpt_error(x.ck));
    free(buf);
    full_state_free(&got);
    fixture_saved_close(&x);
}

/* ---- crash safety ------------------------------------------------------- */

/* The child resumes like a trainer, from latest's step + 1, and saves
 * steps until it is killed; every third round it re-saves latest's own
 * step first (a run resumed from there), the hardest case for `latest`. */
static void saver_child(const char *root, int round)
{
    dt_ckpt_options o = {.keep = 2};
    dt_ckpt *ck;
    char dir[4200];
    dt_ckpt_info info;
    if (dt_ckpt_open(&ck, root, &o) != DT_OK || dt_ckpt_latest(ck, dir, sizeof dir) != DT_OK ||
        dt_ckpt_inspect(ck, dir, &info) != DT_OK)
        _exit(2);
    /* re-saving latest's step needs another committed step for latest to
     * fall back on (else latest is withdrawn: no checkpoint, never a bad
     * one); keep 2 guarantees step - 1 after any completed save */
    char prev[4300];
    snprintf(prev, sizeof prev, "%s/step_%08ld/manifest.json", root, info.step - 1);
    bool resave = round % 3 == 0 && access(prev, F_OK) == 0;
    for (long step = info.step + !resave;; step++) {
        full_state f;
        full_state_init(&f, DT_CKPT_ZERO1, step);
        if (dt_ckpt_save_all(ck, &f.s, 4) != DT_OK)
            _exit(3);
        full_state_free(&f);
    }
}

Test(checkpoint_crash, killed_saver_always_leaves_a_verified_latest, .timeout = 120)
{
    fixture_saved x;
    dt_ckpt_options o = {.allow_reshard = true};
    fixture_saved_open(&x, DT_CKPT_ZERO1, &o, WORLD);
    /* two committed steps (9, then 10 again), so that re-saving latest's
     * step always has another committed step to point latest at */
    full_state f9;
    full_state_init(&f9, DT_CKPT_ZERO1, 9);
    cr_assert_eq(dt_ckpt_save_all(x.ck, &f9.s, 4), DT_OK);
    full_state_free(&f9);
    cr_assert_eq(dt_ckpt_save_all(x.ck, &x.f.s, WORLD), DT_OK);
    unsigned seed = (unsigned)time(NULL);
    srand(seed);
    for (int round = 0; round < 20; round++) {
        pid_t pid = fork();
        cr_assert_neq(pid, -1);
        if (pid == 0)
            saver_child(x.root, round);
        usleep((useconds_t)(rand() % 30000));
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        cr_assert(WIFSIGNALED(status),
                  "round %d (seed %u): the saver exited "
                  "on its own with %d",
                  round, seed, WEXITSTATUS(status));
        char latest[4200];
        cr_assert_eq(dt_ckpt_latest(x.ck, latest, sizeof latest), DT_OK, "round %d (seed %u): %s",
                     round, seed, dt_ckpt_error(x.ck));
        full_state got;
        fixture_rank_view(&got, DT_CKPT_ZERO1, 0, 1);
        cr_assert_eq(dt_ckpt_load(x.ck, latest, &got.s), DT_OK, "round %d (seed %u): %s", round,
                     seed, dt_ckpt_error(x.ck));
        full_state want;
        full_state_init(&want, DT_CKPT_ZERO1, got.s.step);
        fixture_expect_view(&want, &got);
        full_state_free(&want);
        full_state_free(&got);
    }
    fixture_saved_close(&x);
}
