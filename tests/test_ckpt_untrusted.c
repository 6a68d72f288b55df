/*
 * test_ckpt_untrusted.c — checkpoint paths are untrusted: whoever can write
 * under a root can plant a symlink, a FIFO, a renamed directory or a
 * manifest of lies. The specification, one test per promise:
 *
 *   saving   never writes through a symlink at a .tmp name (shards,
 *            manifest.json, latest) or a symlinked step directory: it
 *            refuses, and the file behind is untouched;
 *   loading  refuses a symlinked shard, manifest or step directory, and a
 *            FIFO fails at once (never hangs), on one process and on every
 *            rank of a collective load;
 *   checks   a manifest's step must match its directory's name; a step
 *            past what the trainer counts is refused, not wrapped; a
 *            manifest is capped in size and refuses keys it does not know;
 *            export checks the shards before allocating from the manifest;
 *            messages escape control characters of hostile names.
 *
 * Checkpoints come from the library (the fixture's synthetic state); the
 * programs run as separate processes, found through defines.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "ckpt_fixture.h"
#include "rank_threads.h"
#include "run_program.h"

#define STEP 10

/* A root holding step STEP of the fixture's ZeRO-1 state in `world` shards;
 * dir = its step directory. */
static void make_ckpt(char *root, size_t rlen, char *dir, size_t dlen, int world)
{
    fixture_mkroot(root, rlen);
    full_state f;
    full_state_init(&f, DT_CKPT_ZERO1, STEP);
    dt_ckpt *ck = NULL;
    cr_assert_eq(dt_ckpt_open(&ck, root, NULL), DT_OK);
    cr_assert_eq(dt_ckpt_save_all(ck, &f.s, world), DT_OK, "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
    full_state_free(&f);
    snprintf(dir, dlen, "%s/step_%08d", root, STEP);
}

/* A file outside the root that a planted symlink points at. */
static void make_victim(char *path, size_t len, const char *text)
{
    snprintf(path, len, "/tmp/dtrain-ckpt-victim-%d-XXXXXX", (int)getpid());
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static void expect_file_holds(const char *path, const char *text)
{
    char buf[256] = {0};
    int fd = open(path, O_RDONLY);
    cr_assert(fd >= 0, "%s is gone", path);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    cr_assert_str_eq(buf, text, "%s was written through a symlink (%zd bytes)", path, n);
}

/* Saves the fixture at STEP in 2 shards under root; returns its status and
 * leaves the message in msg. */
static dt_status save_at(const char *root, char *msg, size_t len)
{
    full_state f;
    full_state_init(&f, DT_CKPT_ZERO1, STEP);
    dt_ckpt *ck = NULL;
    cr_assert_eq(dt_ckpt_open(&ck, root, NULL), DT_OK);
    dt_status st = dt_ckpt_save_all(ck, &f.s, 2);
    snprintf(msg, len, "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
    full_state_free(&f);
    return st;
}

/* ---- saving ------------------------------------------------------------- */

/* A symlink at `name` (under the step directory, or the root when in_root)
 * to a victim: the save must fail naming it, the victim stay as it was. */
static void save_refuses_symlink_at(const char *name, bool in_root)
{
    char root[64], dir[128], link[256], victim[128], msg[1100];
    fixture_mkroot(root, sizeof root);
    snprintf(dir, sizeof dir, "%s/step_%08d", root, STEP);
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(link, sizeof link, "%s/%s", in_root ? root : dir, name);
    make_victim(victim, sizeof victim, "precious\n");
    cr_assert_eq(symlink(victim, link), 0);
    cr_assert_neq(save_at(root, msg, sizeof msg), DT_OK, "the save succeeded");
    cr_assert(strstr(msg, link) && strstr(msg, "never writes through it"), "message: %s", msg);
    expect_file_holds(victim, "precious\n");
    unlink(victim);
    fixture_rmtree(root);
}

Test(ckpt_untrusted, save_never_writes_through_a_symlinked_shard_tmp, .timeout = 30)
{
    save_refuses_symlink_at("rank00001.bin.tmp", false);
}

Test(ckpt_untrusted, save_never_writes_through_a_symlinked_manifest_tmp, .timeout = 30)
{
    save_refuses_symlink_at("manifest.json.tmp", false);
}

Test(ckpt_untrusted, save_never_writes_through_a_symlinked_latest_tmp, .timeout = 30)
{
    save_refuses_symlink_at("latest.tmp", true);
}

Test(ckpt_untrusted, trainers_save_never_writes_through_a_symlinked_shard_tmp, .timeout = 30)
{
    /* dt_ckpt_save is what minigpt calls every --ckpt-every steps */
    char root[64], dir[128], link[256], victim[128];
    fixture_mkroot(root, sizeof root);
    snprintf(dir, sizeof dir, "%s/step_%08d", root, STEP);
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(link, sizeof link, "%s/rank00000.bin.tmp", dir);
    make_victim(victim, sizeof victim, "precious\n");
    cr_assert_eq(symlink(victim, link), 0);
    full_state f;
    full_state_init(&f, DT_CKPT_DDP, STEP);
    dt_ckpt *ck = NULL;
    cr_assert_eq(dt_ckpt_open(&ck, root, NULL), DT_OK);
    cr_assert_neq(dt_ckpt_save(ck, NULL, &f.s), DT_OK, "the save succeeded");
    cr_assert(strstr(dt_ckpt_error(ck), "never writes through it"), "message: %s",
              dt_ckpt_error(ck));
    dt_ckpt_close(ck);
    full_state_free(&f);
    expect_file_holds(victim, "precious\n");
    unlink(victim);
    fixture_rmtree(root);
}

Test(ckpt_untrusted, save_replaces_a_stale_tmp_of_its_own, .timeout = 30)
{
    char root[64], dir[128], tmp[256], msg[1100];
    fixture_mkroot(root, sizeof root);
    snprintf(dir, sizeof dir, "%s/step_%08d", root, STEP);
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(tmp, sizeof tmp, "%s/rank00000.bin.tmp", dir);
    fclose(fopen(tmp, "w")); /* what a crashed save leaves */
    cr_assert_eq(save_at(root, msg, sizeof msg), DT_OK, "%s", msg);
    fixture_rmtree(root);
}

Test(ckpt_untrusted, save_refuses_a_symlinked_step_directory, .timeout = 30)
{
    char root[64], elsewhere[64], link[128], msg[1100];
    fixture_mkroot(root, sizeof root);
    fixture_mkroot(elsewhere, sizeof elsewhere);
    snprintf(link, sizeof link, "%s/step_%08d", root, STEP);
    cr_assert_eq(symlink(elsewhere, link), 0);
    cr_assert_neq(save_at(root, msg, sizeof msg), DT_OK, "the save succeeded");
    cr_assert(strstr(msg, "is a symbolic link"), "message: %s", msg);
    cr_assert_eq(rmdir(elsewhere), 0, "files were written outside the root");
    fixture_rmtree(root);
}

Test(ckpt_untrusted, rotation_removes_a_planted_step_symlink_not_what_it_points_to, .timeout = 30)
{
    char root[64], elsewhere[64], link[128], keep[160];
    fixture_mkroot(root, sizeof root);
    fixture_mkroot(elsewhere, sizeof elsewhere);
    snprintf(keep, sizeof keep, "%s/manifest.json", elsewhere);
    fclose(fopen(keep, "w")); /* the user's files behind the link */
    snprintf(link, sizeof link, "%s/step_00000001", root);
    cr_assert_eq(symlink(elsewhere, link), 0);
    full_state f;
    full_state_init(&f, DT_CKPT_ZERO1, STEP);
    dt_ckpt_options o = {.keep = 1};
    dt_ckpt *ck = NULL;
    cr_assert_eq(dt_ckpt_open(&ck, root, &o), DT_OK);
    cr_assert_eq(dt_ckpt_save_all(ck, &f.s, 2), DT_OK, "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck); /* joins the background removal */
    full_state_free(&f);
    cr_assert_eq(access(keep, F_OK), 0, "rotation removed a file behind a symlink");
    fixture_rmtree(elsewhere);
    fixture_rmtree(root);
}

/* ---- loading ------------------------------------------------------------ */

static void expect_verify_fails(const char *dir, dt_ckpt_fault fault, const char *why)
{
    dt_ckpt *ck = NULL;
    cr_assert_eq(dt_ckpt_open(&ck, dir, NULL), DT_OK);
    cr_assert_neq(dt_ckpt_verify(ck, dir), DT_OK, "verified");
    cr_assert_eq(dt_ckpt_last_fault(ck), fault, "%s: %s",
                 dt_ckpt_fault_name(dt_ckpt_last_fault(ck)), dt_ckpt_error(ck));
    cr_assert(strstr(dt_ckpt_error(ck), why), "message: %s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
}

/* Moves dir/name away and puts a symlink to the moved file in its place. */
static void symlink_in_place(const char *dir, const char *name)
{
    char path[256], moved[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(moved, sizeof moved, "%s/../moved-%s", dir, name);
    cr_assert_eq(rename(path, moved), 0);
    cr_assert_eq(symlink(moved, path), 0);
}

Test(ckpt_untrusted, load_refuses_a_symlinked_shard, .timeout = 30)
{
    char root[64], dir[128];
    make_ckpt(root, sizeof root, dir, sizeof dir, 2);
    symlink_in_place(dir, "rank00001.bin");
    expect_verify_fails(dir, DT_CKPT_FAULT_UNSAFE_NAME, "rank00001.bin: is a symbolic link");
    fixture_rmtree(root);
}

Test(ckpt_untrusted, load_refuses_a_symlinked_manifest, .timeout = 30)
{
    char root[64], dir[128];
    make_ckpt(root, sizeof root, dir, sizeof dir, 2);
    symlink_in_place(dir, "manifest.json");
    expect_verify_fails(dir, DT_CKPT_FAULT_UNSAFE_NAME, "manifest.json: is a symbolic link");
    fixture_rmtree(root);
}

Test(ckpt_untrusted, load_refuses_a_symlinked_step_directory, .timeout = 30)
{
    char root[64], dir[128], real[160];
    make_ckpt(root, sizeof root, dir, sizeof dir, 2);
    snprintf(real, sizeof real, "%s/elsewhere", root);
    cr_assert_eq(rename(dir, real), 0);
    cr_assert_eq(symlink(real, dir), 0);
    expect_verify_fails(dir, DT_CKPT_FAULT_UNSAFE_NAME, "is a symbolic link");
    fixture_rmtree(root);
}

/* Replaces dir/name with a FIFO nobody writes to. */
static void fifo_in_place(const char *dir, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(mkfifo(path, 0600), 0);
}

Test(ckpt_untrusted, fifo_as_a_shard_fails_at_once, .timeout = 10)
{
    char root[64], dir[128];
    make_ckpt(root, sizeof root, dir, sizeof dir, 2);
    fifo_in_place(dir, "rank00000.bin");
    expect_verify_fails(dir, DT_CKPT_FAULT_IO, "rank00000.bin: is a FIFO");
    fixture_rmtree(root);
}

Test(ckpt_untrusted, fifo_as_the_manifest_fails_at_once, .timeout = 10)
{
    char root[64], dir[128];
    make_ckpt(root, sizeof root, dir, sizeof dir, 2);
    fifo_in_place(dir, "manifest.json");
    expect_verify_fails(dir, DT_CKPT_FAULT_IO, "manifest.json: is a FIFO");
    fixture_rmtree(root);
}

Test(ckpt_untrusted, fifo_as_latest_fails_at_once, .timeout = 10)
{
    char root[64], dir[128], buf[256];
    make_ckpt(root, sizeof root, dir, sizeof dir, 2);
    fifo_in_place(root, "latest");
    dt_ckpt *ck = NULL;
    cr_assert_eq(dt_ckpt_open(&ck, root, NULL), DT_OK);
    cr_assert_neq(dt_ckpt_latest(ck, buf, sizeof buf), DT_OK);
    cr_assert(strstr(dt_ckpt_error(ck), "latest: is a FIFO"), "message: %s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
    fixture_rmtree(root);
}

typedef struct fifo_load {
    char root[64], dir[128];
    full_state views[4];
    dt_status st[4];
    char msg[4][1100];
} fifo_load;

static void fifo_load_rank(rank_ctx *rc)
{
    fifo_load *c = rc->arg;
    dt_ckpt *ck = NULL;
    if (dt_ckpt_open(&ck, c->root, NULL) != DT_OK) {
        rank_fail(rc, "rank %d: dt_ckpt_open", rc->rank);
        dt_ckpt_close(ck);
        return;
    }
    c->st[rc->rank] = dt_ckpt_load_collective(ck, rc->comm, c->dir, &c->views[rc->rank].s);
    snprintf(c->msg[rc->rank], sizeof c->msg[0], "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
}

Test(ckpt_untrusted, fifo_shard_fails_every_rank_of_a_4_rank_load_at_once, .timeout = 30)
{
    fifo_load *c = calloc(1, sizeof *c);
    make_ckpt(c->root, sizeof c->root, c->dir, sizeof c->dir, 4);
    fifo_in_place(c->dir, "rank00002.bin");
    for (int r = 0; r < 4; r++)
        fixture_rank_view(&c->views[r], DT_CKPT_ZERO1, r, 4);
    rank_job job;
    cr_assert_eq(rank_threads_run(&job, 4, fifo_load_rank, c), 0, "%s", job.ranks[0].msg);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(c->st[r], DT_EPROTO, "rank %d: %s", r, c->msg[r]);
        cr_assert(strstr(c->msg[r], "rank00002.bin: is a FIFO"), "rank %d: %s", r, c->msg[r]);
        full_state_free(&c->views[r]);
    }
    fixture_rmtree(c->root);
    free(c);
}

/* ---- what a manifest may claim ------------------------------------------ */

Test(ckpt_untrusted, manifest_step_must_match_its_directory_name, .timeout = 30)
{
    char root[64], dir[128], renamed[128];
    make_ckpt(root, sizeof root, dir, sizeof dir, 2);
    snprintf(renamed, sizeof renamed, "%s/step_%08d", root, 2 * STEP);
    cr_assert_eq(rename(dir, renamed), 0);
    expect_verify_fails(renamed, DT_CKPT_FAULT_FIELD,
                        "step 10 belongs in a directory named step_00000010, "
                        "not \"step_00000020\"");
    fixture_rmtree(root);
}

static void add_top_key(json_t *root)
{
    json_object_set_new(root, "extra", json_true());
}
static void add_config_key(json_t *root)
{
    json_object_set_new(json_object_get(root, "config"), "D", json_integer(3));
}
static void add_shard_key(json_t *root)
{
    json_object_set_new(json_array_get(json_object_get(root, "shards"), 1), "note\x1b[2J",
                        json_string("hi"));
}

Test(ckpt_untrusted, unknown_keys_are_refused_by_name_at_every_level, .timeout = 30)
{
    void (*edits[])(json_t *) = {add_top_key, add_config_key, add_shard_key};
    const char *named[] = {"unknown key \"extra\" in the manifest", "unknown key \"D\" in config",
                           "unknown key \"note\\x1b[2J\" in a shard"};
    for (int i = 0; i < 3; i++) {
        char root[64], dir[128];
        make_ckpt(root, sizeof root, dir, sizeof dir, 2);
        fixture_edit_manifest(dir, edits[i]);
        expect_verify_fails(dir, DT_CKPT_FAULT_FIELD, named[i]);
        fixture_rmtree(root);
    }
}

static void add_big_array(json_t *root)
{
    json_t *a = json_array();
    for (int i = 0; i < 1200000; i++) /* ~2.4 MB of "0, " */
        json_array_append_new(a, json_integer(0));
    json_object_set_new(root, "padding", a);
}

Test(ckpt_untrusted, manifest_over_the_size_cap_is_refused_before_parsing, .timeout = 60)
{
    char root[64], dir[128];
    make_ckpt(root, sizeof root, dir, sizeof dir, 2);
    fixture_edit_manifest(dir, add_big_array);
    expect_verify_fails(dir, DT_CKPT_FAULT_ABSURD, "more than the");
    fixture_rmtree(root);
}

static void bad_file_name(json_t *root)
{
    json_object_set_new(json_array_get(json_object_get(root, "shards"), 0), "file",
                        json_string("evil\x1b]0;owned\x07.bin"));
}

Test(ckpt_untrusted, messages_escape_control_characters_of_hostile_names, .timeout = 30)
{
    char root[64], dir[128];
    make_ckpt(root, sizeof root, dir, sizeof dir, 2);
    fixture_edit_manifest(dir, bad_file_name);
    dt_ckpt *ck = NULL;
    cr_assert_eq(dt_ckpt_open(&ck, root, NULL), DT_OK);
    cr_assert_neq(dt_ckpt_verify(ck, dir), DT_OK);
    const char *msg = dt_ckpt_error(ck);
    for (const char *p = msg; *p; p++)
        cr_assert((unsigned char)*p >= 0x20, "a raw control byte 0x%02x in: %s", (unsigned char)*p,
                  msg);
    cr_assert(strstr(msg, "evil\\x1b]0;owned\\x07.bin"), "message: %s", msg);
    dt_ckpt_close(ck);
    fixture_rmtree(root);
}

/* ---- the programs ---------------------------------------------------------- */

#if !defined(DT_CKPT_BIN) || !defined(MINIGPT_BIN)
#error "DT_CKPT_BIN and MINIGPT_BIN must name the built programs"
#endif

/* Runs argv (NULL-terminated), output into *out; returns the exit code. */
static int run(const char *root, const char *const *argv, char **out)
{
    char log[128];
    snprintf(log, sizeof log, "%s.log", root);
    int rc = run_program(argv, log, out);
    remove(log);
    return rc;
}

Test(ckpt_untrusted, reshard_refuses_a_symlinked_tmp_in_its_output, .timeout = 30)
{
    char base[64], dir[128], out_root[64], link[160], victim[128], *out = NULL;
    make_ckpt(base, sizeof base, dir, sizeof dir, 3);
    fixture_mkroot(out_root, sizeof out_root);
    /* not in the step directory: reshard refuses one that exists at all */
    snprintf(link, sizeof link, "%s/latest.tmp", out_root);
    make_victim(victim, sizeof victim, "precious\n");
    cr_assert_eq(symlink(victim, link), 0);
    const char *argv[] = {DT_CKPT_BIN, "reshard", base, out_root, "2", NULL};
    int rc = run(base, argv, &out);
    cr_assert_eq(rc, 1, "reshard exited %d:\n%s", rc, out);
    cr_assert(strstr(out, "never writes through it"), "output:\n%s", out);
    expect_file_holds(victim, "precious\n");
    unlink(victim);
    free(out);
    fixture_rmtree(out_root);
    fixture_rmtree(base);
}

/* A world-1 DDP manifest that claims V = C = 65536 (~4.3 G parameters)
 * over shards of a few KB. */
static void claim_a_huge_model(json_t *root)
{
    dt_config cfg = {.V = 65536, .T = 16, .L = 1, .H = 1, .C = 65536};
    json_int_t n = (json_int_t)dt_config_num_params(&cfg);
    json_t *c = json_object_get(root, "config");
    json_object_set_new(c, "V", json_integer(cfg.V));
    json_object_set_new(c, "T", json_integer(cfg.T));
    json_object_set_new(c, "L", json_integer(cfg.L));
    json_object_set_new(c, "H", json_integer(cfg.H));
    json_object_set_new(c, "C", json_integer(cfg.C));
    json_object_set_new(root, "num_params", json_integer(n));
    json_t *sh = json_array_get(json_object_get(root, "shards"), 0);
    json_t *ranges = json_object_get(sh, "ranges");
    const char *kinds[] = {"params", "m", "v"};
    for (int k = 0; k < 3; k++)
        json_object_set_new(ranges, kinds[k], json_pack("[iI]", 0, n));
    json_object_set_new(sh, "bytes", json_integer(72 + 3 * 32 + 3 * 4 * n));
}

Test(ckpt_untrusted, export_checks_the_shards_before_allocating_from_the_manifest, .timeout = 30)
{
    char root[64], dir[128], dst[128], *out = NULL;
    fixture_mkroot(root, sizeof root);
    full_state f;
    full_state_init(&f, DT_CKPT_DDP, STEP);
    dt_ckpt *ck = NULL;
    cr_assert_eq(dt_ckpt_open(&ck, root, NULL), DT_OK);
    cr_assert_eq(dt_ckpt_save_all(ck, &f.s, 1), DT_OK, "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
    full_state_free(&f);
    snprintf(dir, sizeof dir, "%s/step_%08d", root, STEP);
    fixture_edit_manifest(dir, claim_a_huge_model);
    snprintf(dst, sizeof dst, "%s/out.safetensors", root);
    const char *argv[] = {DT_CKPT_BIN, "export", dir, dst, NULL};
    int rc = run(root, argv, &out);
    cr_assert_eq(rc, 1, "export exited %d:\n%s", rc, out);
    cr_assert(strstr(out, "rank00000.bin") && strstr(out, "bytes on disk"), "output:\n%s", out);
    cr_assert_null(strstr(out, "out of memory"), "output:\n%s", out);
    free(out);
    fixture_rmtree(root);
}

Test(ckpt_untrusted, ls_escapes_hostile_directory_names, .timeout = 30)
{
    char root[64], dir[128], evil[160], *out = NULL;
    make_ckpt(root, sizeof root, dir, sizeof dir, 2);
    snprintf(evil, sizeof evil, "%s/step_\x1b[2J", root);
    cr_assert_eq(mkdir(evil, 0755), 0);
    const char *argv[] = {DT_CKPT_BIN, "ls", root, NULL};
    run(root, argv, &out);
    cr_assert(strstr(out, "step_\\x1b[2J"), "output:\n%s", out);
    cr_assert_null(strchr(out, '\x1b'), "a raw ESC reached the output:\n%s", out);
    free(out);
    fixture_rmtree(root);
}

/* minigpt's own small run (its default model) saving at step 2 under root. */
static void minigpt_run(const char *root, const char *resume, char **out, int *rc)
{
    const char *argv[] = {MINIGPT_BIN, "--steps",
                          "2",         "--batch",
                          "4",         "--data",
                          "random",    "--eval-every",
                          "0",         "--sample",
                          "0",         "--threads",
                          "1",         "--log-every",
                          "10",        "--ckpt-dir",
                          root,        "--ckpt-every",
                          "2",         resume ? "--resume" : NULL,
                          resume,      NULL};
    *rc = run(root, argv, out);
}

Test(ckpt_untrusted, resume_refuses_a_step_past_the_trainers_counter, .timeout = 60)
{
    char a[64], b[64], dir[128], latest[256], *out = NULL;
    int rc;
    fixture_mkroot(a, sizeof a);
    minigpt_run(a, NULL, &out, &rc);
    cr_assert_eq(rc, 0, "minigpt exited %d:\n%s", rc, out);
    free(out);
    /* the same state as step 2^32 + 10, which an int cast makes 10 */
    dt_ckpt *ck = NULL;
    dt_ckpt_info info;
    cr_assert_eq(dt_ckpt_open(&ck, a, NULL), DT_OK);
    cr_assert_eq(dt_ckpt_latest(ck, latest, sizeof latest), DT_OK);
    cr_assert_eq(dt_ckpt_inspect(ck, latest, &info), DT_OK, "%s", dt_ckpt_error(ck));
    size_t n = info.num_params;
    dt_ckpt_state s = {.cfg = info.cfg,
                       .mode = info.mode,
                       .world = 1,
                       .num_params = n,
                       .opt_n = n,
                       .params = calloc(n, 4),
                       .adam_m = calloc(n, 4),
                       .adam_v = calloc(n, 4)};
    cr_assert_eq(dt_ckpt_load(ck, latest, &s), DT_OK, "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
    s.step = 4294967306L;
    fixture_mkroot(b, sizeof b);
    cr_assert_eq(dt_ckpt_open(&ck, b, NULL), DT_OK);
    cr_assert_eq(dt_ckpt_save_all(ck, &s, 1), DT_OK, "%s", dt_ckpt_error(ck));
    snprintf(dir, sizeof dir, "%s/step_4294967306", b);
    cr_assert_eq(dt_ckpt_inspect(ck, dir, &info), DT_OK, "%s", dt_ckpt_error(ck));
    cr_assert_eq(info.step, 4294967306L, "the manifest's step is not 64-bit");
    dt_ckpt_close(ck);
    minigpt_run(b, b, &out, &rc);
    cr_assert_neq(rc, 0, "minigpt resumed:\n%s", out);
    cr_assert(strstr(out, "step 4294967306 is past the last step the trainer "
                          "counts"),
              "output:\n%s", out);
    free(out);
    free(s.params);
    free(s.adam_m);
    free(s.adam_v);
    fixture_rmtree(a);
    fixture_rmtree(b);
}
