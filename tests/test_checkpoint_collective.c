/*
 * test_checkpoint_collective.c — the collective load (each shard hashed by
 * one rank, one verdict for all) and the verdict it shares with the
 * collective save; ranks are threads over real loopback communicators
 * (rank_threads.h).
 *
 * The specification: loaded collectively, a checkpoint gives every rank
 * exactly what dt_ckpt_load would, on the same world size and resharded
 * (4 -> 2, 2 -> 4). When something is wrong, every rank returns the same
 * status and fault, and a message naming the shard file: the rank that
 * found it its own message, the others "rank K of the load found: …". A
 * corrupt byte that only its verifier reads, and one that every rank
 * reads but only the verifier hashes, both fail every rank — which also
 * pins down who verifies what (shard r: rank r mod world).
 *
 * Checkpoints are written by one process (dt_ckpt_save_all, the same
 * shard writer every rank runs); ZeRO-1 over 4 ranks of the fixture's 805
 * parameters gives shards of 202, 202, 202, 199 elements, each file a
 * 200-byte header and table, then params, master, m, v.
 */
#include "ckpt_fixture.h"
#include "rank_threads.h"

#define STEP 10
#define HEADER_BYTES 200 /* ZeRO-1: 72 + 4 sections x 32 */
#define SLICE 202        /* elements per shard of 805 over 4 */

typedef struct load_case {
    char root[128], step_dir[256];
    bool reshard;
    full_state src;                     /* what was saved */
    full_state views[RANK_THREADS_MAX]; /* what each rank loads into */
    dt_status st[RANK_THREADS_MAX];
    dt_ckpt_fault fault[RANK_THREADS_MAX];
    char msg[RANK_THREADS_MAX][1100];
} load_case;

/* A committed ZeRO-1 checkpoint of STEP in `saved` shards, and zeroed
 * views for `world` loading ranks. */
static void case_open(load_case *c, int saved, int world)
{
    memset(c, 0, sizeof *c);
    fixture_mkroot(c->root, sizeof c->root);
    dt_ckpt *ck;
    cr_assert_eq(dt_ckpt_open(&ck, c->root, NULL), DT_OK);
    full_state_init(&c->src, DT_CKPT_ZERO1, STEP);
    cr_assert_eq(dt_ckpt_save_all(ck, &c->src.s, saved), DT_OK, "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
    snprintf(c->step_dir, sizeof c->step_dir, "%s/step_%08d", c->root, STEP);
    c->reshard = saved != world;
    for (int r = 0; r < world; r++)
        fixture_rank_view(&c->views[r], DT_CKPT_ZERO1, r, world);
}

static void case_close(load_case *c, int world)
{
    for (int r = 0; r < world; r++)
        full_state_free(&c->views[r]);
    full_state_free(&c->src);
    fixture_rmtree(c->root);
}

static void load_rank(rank_ctx *rc)
{
    load_case *c = rc->arg;
    dt_ckpt_options o = {.allow_reshard = c->reshard};
    dt_ckpt *ck;
    if (dt_ckpt_open(&ck, c->root, &o) != DT_OK) {
        rank_fail(rc, "rank %d: dt_ckpt_open", rc->rank);
        dt_ckpt_close(ck);
        return;
    }
    int r = rc->rank;
    c->st[r] = dt_ckpt_load_collective(ck, rc->comm, c->step_dir, &c->views[r].s);
    c->fault[r] = dt_ckpt_last_fault(ck);
    snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
}

static void run_load(load_case *c, int world)
{
    rank_job job;
    int failed = rank_threads_run(&job, world, load_rank, c);
    for (int r = 0; r < world; r++)
        cr_assert_not(job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}

static void expect_loaded(load_case *c, int world)
{
    for (int r = 0; r < world; r++) {
        cr_assert_eq(c->st[r], DT_OK, "rank %d: %s", r, c->msg[r]);
        fixture_expect_view(&c->src, &c->views[r]);
    }
}

/* Every rank failed with status st and fault f; the rank that found it
 * (finder) says so in its own words naming file, the others quote it. */
static void expect_same_failure(const load_case *c, int world, dt_status st, dt_ckpt_fault f,
                                int finder, const char *file)
{
    char quoted[64];
    snprintf(quoted, sizeof quoted, "rank %d of the load found: ", finder);
    for (int r = 0; r < world; r++) {
        cr_assert_eq(c->st[r], st, "rank %d: %s, expected %s: %s", r, dt_status_name(c->st[r]),
                     dt_status_name(st), c->msg[r]);
        cr_assert_eq(c->fault[r], f, "rank %d: %s, expected %s: %s", r,
                     dt_ckpt_fault_name(c->fault[r]), dt_ckpt_fault_name(f), c->msg[r]);
        cr_assert_not_null(strstr(c->msg[r], file),
                           "rank %d: \"%s\" does "
                           "not name %s",
                           r, c->msg[r], file);
        bool quotes = strstr(c->msg[r], quoted) == c->msg[r];
        cr_assert_eq(quotes, r != finder,
                     "rank %d: \"%s\" (the finder is "
                     "rank %d)",
                     r, c->msg[r], finder);
    }
}

static void shard_path(const load_case *c, int r, char *buf, size_t len)
{
    snprintf(buf, len, "%s/rank%05d.bin", c->step_dir, r);
}

/* Saves with `saved` ranks, loads collectively on `loading`, and expects
 * every rank to hold exactly its part of what was saved. */
static void saved_by_loaded_on(int saved, int loading)
{
    load_case *c = malloc(sizeof *c);
    case_open(c, saved, loading);
    run_load(c, loading);
    expect_loaded(c, loading);
    case_close(c, loading);
    free(c);
}

Test(checkpoint_collective, load_on_4_ranks_is_byte_identical_on_every_rank, .timeout = 60)
{
    saved_by_loaded_on(4, 4);
}

Test(checkpoint_collective, reshard_4_shards_onto_2_ranks_loads_every_value, .timeout = 60)
{
    saved_by_loaded_on(4, 2);
}

Test(checkpoint_collective, reshard_2_shards_onto_4_ranks_loads_every_value, .timeout = 60)
{
    saved_by_loaded_on(2, 4);
}

/* Rank 2's m section: only rank 2 holds it, and rank 2 verifies shard 2,
 * so no other rank even reads the byte. */
Test(checkpoint_collective, flipped_byte_only_its_verifier_reads_fails_every_rank, .timeout = 60)
{
    load_case *c = malloc(sizeof *c);
    case_open(c, 4, 4);
    char p[512];
    shard_path(c, 2, p, sizeof p);
    fixture_flip_byte(p, HEADER_BYTES + 2 * SLICE * 4 + 40);
    run_load(c, 4);
    expect_same_failure(c, 4, DT_EPROTO, DT_CKPT_FAULT_HASH, 2, "rank00002.bin");
    cr_assert_not_null(strstr(c->msg[2], "SHA-256"), "%s", c->msg[2]);
    case_close(c, 4);
    free(c);
}

/* Rank 3's parameters: every rank reads them, only rank 3 hashes them. */
Test(checkpoint_collective, flipped_byte_all_ranks_read_fails_every_rank_by_its_verifier,
     .timeout = 60)
{
    load_case *c = malloc(sizeof *c);
    case_open(c, 4, 4);
    char p[512];
    shard_path(c, 3, p, sizeof p);
    fixture_flip_byte(p, HEADER_BYTES + 40);
    run_load(c, 4);
    expect_same_failure(c, 4, DT_EPROTO, DT_CKPT_FAULT_HASH, 3, "rank00003.bin");
    case_close(c, 4);
    free(c);
}

/* Every rank finds shard 1 missing (all read its parameters); rank 0, the
 * lowest, is the one quoted. */
Test(checkpoint_collective, missing_shard_fails_every_rank_with_the_same_fault, .timeout = 60)
{
    load_case *c = malloc(sizeof *c);
    case_open(c, 4, 4);
    char p[512];
    shard_path(c, 1, p, sizeof p);
    cr_assert_eq(unlink(p), 0);
    run_load(c, 4);
    expect_same_failure(c, 4, DT_EPROTO, DT_CKPT_FAULT_MISSING_FILE, 0, "rank00001.bin");
    case_close(c, 4);
    free(c);
}

/* A truncated shard is found by its size on every rank, before any read. */
Test(checkpoint_collective, truncated_shard_fails_every_rank_with_a_size_fault, .timeout = 60)
{
    load_case *c = malloc(sizeof *c);
    case_open(c, 4, 4);
    char p[512];
    shard_path(c, 2, p, sizeof p);
    cr_assert_eq(truncate(p, 1000), 0);
    run_load(c, 4);
    expect_same_failure(c, 4, DT_EPROTO, DT_CKPT_FAULT_SIZE, 0, "rank00002.bin");
    case_close(c, 4);
    free(c);
}

/* ---- the save's verdict ---------------------------------------------------- */

typedef struct save_case {
    char root[128];
    full_state states[RANK_THREADS_MAX];
    dt_status st[RANK_THREADS_MAX];
    dt_ckpt_fault fault[RANK_THREADS_MAX];
    char msg[RANK_THREADS_MAX][1100];
} save_case;

static void save_rank(rank_ctx *rc)
{
    save_case *c = rc->arg;
    dt_ckpt *ck;
    if (dt_ckpt_open(&ck, c->root, NULL) != DT_OK) {
        rank_fail(rc, "rank %d: dt_ckpt_open", rc->rank);
        dt_ckpt_close(ck);
        return;
    }
    int r = rc->rank;
    c->st[r] = dt_ckpt_save(ck, rc->comm, &c->states[r].s);
    c->fault[r] = dt_ckpt_last_fault(ck);
    snprintf(c->msg[r], sizeof c->msg[r], "%s", dt_ckpt_error(ck));
    dt_ckpt_close(ck);
}

/* Rank 2 is handed an optimizer range that misses its slice: it cannot
 * write its shard, nothing is committed, and every rank says why. */
Test(checkpoint_collective, save_failing_on_one_rank_fails_every_rank_with_its_message,
     .timeout = 60)
{
    save_case *c = calloc(1, sizeof *c);
    fixture_mkroot(c->root, sizeof c->root);
    for (int r = 0; r < 4; r++) {
        full_state_init(&c->states[r], DT_CKPT_ZERO1, STEP);
        c->states[r].s.rank = r;
        c->states[r].s.world = 4;
    }
    c->states[2].s.opt_n = 1;
    rank_job job;
    cr_assert_eq(rank_threads_run(&job, 4, save_rank, c), 0, "%s", job.ranks[0].msg);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(c->st[r], DT_EINVAL, "rank %d: %s: %s", r, dt_status_name(c->st[r]),
                     c->msg[r]);
        cr_assert_eq(c->fault[r], DT_CKPT_FAULT_FIELD, "rank %d: %s", r, c->msg[r]);
        cr_assert_not_null(strstr(c->msg[r], "rank 2's slice"), "rank %d: %s", r, c->msg[r]);
        bool quotes = strstr(c->msg[r], "rank 2 of the save found: ") == c->msg[r];
        cr_assert_eq(quotes, r != 2, "rank %d: %s", r, c->msg[r]);
    }
    dt_ckpt *ck;
    char latest[4200];
    cr_assert_eq(dt_ckpt_open(&ck, c->root, NULL), DT_OK);
    cr_assert_neq(dt_ckpt_latest(ck, latest, sizeof latest), DT_OK,
                  "a failed save moved latest to %s", latest);
    dt_ckpt_close(ck);
    for (int r = 0; r < 4; r++)
        full_state_free(&c->states[r]);
    fixture_rmtree(c->root);
    free(c);
}
