/*
 * test_groups.c — sub-communicators: dt_comm_split has MPI_Comm_split's
 * meaning, a child is a communicator like any other, and the groups of a
 * rank share one fate.
 *
 * The shapes a dp × pp job needs (rows and columns of the grid) and the
 * corner cases of the definition (reversed and equal keys, undefined and
 * other negative colours, one rank per group) are checked on every world
 * size from 1 to 8 against a plain reference: a rank's group is the ranks
 * of its colour, and its group rank the number of members that sort before
 * it by (key, parent rank). Results on children (all-reduce, broadcast,
 * p2p) are checked against values each rank can compute. How groups fail
 * together is test_groups_failure.c's subject.
 *
 * Ranks run as threads (rank_threads.h) over loopback TCP, every op bounded
 * by the communicators' timeouts and every test by Criterion's.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rank_threads.h"

/* ---- the reference ------------------------------------------------------------ */

typedef enum shape_kind {
    ONE_GROUP,      /* colour 0, key = rank */
    GRID_ROWS,      /* colour = rank / pp: the pipeline group of a replica */
    GRID_COLUMNS,   /* colour = rank % pp: the data-parallel group of a stage */
    REVERSED_KEYS,  /* colour = rank % 2, key = -rank */
    EQUAL_KEYS,     /* colour = rank % 3, key 7: parent order decides */
    SOME_UNDEFINED, /* every third rank DT_UNDEFINED, the rest by parity */
    OTHER_NEGATIVE, /* even ranks pass colour -5: no group either */
    EACH_ALONE,     /* colour = rank */
} shape_kind;

typedef struct shape {
    shape_kind kind;
    int pp; /* GRID_*: columns of the grid */
} shape;

static int color_of(shape s, int rank)
{
    switch (s.kind) {
    case ONE_GROUP: return 0;
    case GRID_ROWS: return rank / s.pp;
    case GRID_COLUMNS: return rank % s.pp;
    case REVERSED_KEYS: return rank % 2;
    case EQUAL_KEYS: return rank % 3;
    case SOME_UNDEFINED: return rank % 3 == 1 ? DT_UNDEFINED : rank % 2;
    case OTHER_NEGATIVE: return rank % 2 == 0 ? -5 : 1;
    case EACH_ALONE: return rank;
    }
    return 0;
}

static int key_of(shape s, int rank)
{
    switch (s.kind) {
    case REVERSED_KEYS: return -rank;
    case EQUAL_KEYS: return 7;
    default: return rank;
    }
}

/* The parent ranks of `rank`'s group in group-rank order, into members;
 * returns the group's size (0: no group) and sets *position. */
static int expected_group(shape s, int n, int rank, int *members, int *position)
{
    int color = color_of(s, rank), size = 0;
    if (color < 0)
        return 0;
    for (int j = 0; j < n; j++) {
        if (color_of(s, j) != color)
            continue;
        int before = 0; /* members sorting before j by (key, rank) */
        for (int i = 0; i < n; i++)
            if (color_of(s, i) == color &&
                (key_of(s, i) < key_of(s, j) || (key_of(s, i) == key_of(s, j) && i < j)))
                before++;
        members[before] = j;
        if (j == rank)
            *position = before;
        size++;
    }
    return size;
}

/* ---- every shape on 1..8 ranks ------------------------------------------------- */

/* The child's rank, size and world ranks are the reference's; an all-reduce
 * and a broadcast from its last rank give what its members imply. */
static bool check_child(rank_ctx *rc, dt_comm *child, const int *members, int size, int pos,
                        const char *what)
{
    if (dt_comm_size(child) != size || dt_comm_rank(child) != pos)
        return rank_fail(rc, "%s: rank %d of %d, expected %d of %d", what, dt_comm_rank(child),
                         dt_comm_size(child), pos, size);
    for (int i = 0; i < size; i++)
        if (dt_comm_world_rank(child, i) != members[i])
            return rank_fail(rc, "%s: group rank %d is world rank %d, expected %d", what, i,
                             dt_comm_world_rank(child, i), members[i]);
    if (dt_comm_world_rank(child, size) != -1)
        return rank_fail(rc, "%s: group rank %d (out of range) has a world rank", what, size);
    int64_t sum = rc->rank + 1, want = 0;
    for (int i = 0; i < size; i++)
        want += members[i] + 1;
    int32_t b = pos == size - 1 ? 1000 + rc->rank : -1;
    if (dt_allreduce(child, &sum, 1, DT_I64, DT_SUM) != DT_OK ||
        dt_broadcast(child, &b, 1, DT_I32, size - 1) != DT_OK)
        return rank_fail(rc, "%s: op on the child: %s", what, dt_comm_error(child));
    if (sum != want || b != 1000 + members[size - 1])
        return rank_fail(rc, "%s: all-reduce %lld (want %lld), broadcast %d (want %d)", what,
                         (long long)sum, (long long)want, b, 1000 + members[size - 1]);
    return true;
}

static bool check_shape(rank_ctx *rc, shape s)
{
    char what[64];
    snprintf(what, sizeof what, "N=%d shape %d pp=%d", rc->world, s.kind, s.pp);
    int members[RANK_THREADS_MAX], pos = -1;
    int size = expected_group(s, rc->world, rc->rank, members, &pos);
    dt_comm *child = (dt_comm *)&child; /* must be overwritten */
    dt_status st = dt_comm_split(rc->comm, color_of(s, rc->rank), key_of(s, rc->rank), &child);
    if (st != DT_OK)
        return rank_fail(rc, "%s: split: %s: %s", what, dt_status_name(st),
                         dt_comm_error(rc->comm));
    bool ok = size == 0 ? (child == NULL || rank_fail(rc, "%s: a child without a colour", what))
                        : (child != NULL || rank_fail(rc, "%s: no child", what));
    if (ok && child)
        ok = check_child(rc, child, members, size, pos, what);
    if (child)
        dt_comm_destroy(child);
    return ok;
}

static void every_shape(rank_ctx *rc)
{
    int n = rc->world;
    shape fixed[] = {{ONE_GROUP, 0},      {REVERSED_KEYS, 0},  {EQUAL_KEYS, 0},
                     {SOME_UNDEFINED, 0}, {OTHER_NEGATIVE, 0}, {EACH_ALONE, 0}};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (!check_shape(rc, fixed[i]))
            return;
    for (int pp = 1; pp <= n; pp++) {
        if (n % pp != 0)
            continue;
        if (!check_shape(rc, (shape){GRID_ROWS, pp}) || !check_shape(rc, (shape){GRID_COLUMNS, pp}))
            return;
    }
    int32_t x = 1; /* the parent still works after all those children */
    if (dt_allreduce(rc->comm, &x, 1, DT_I32, DT_SUM) != DT_OK || x != n)
        rank_fail(rc, "parent all-reduce after the splits: %d (%s)", x, dt_comm_error(rc->comm));
}

static void every_shape_on(int lo, int hi)
{
    for (int n = lo; n <= hi; n++) {
        rank_job job;
        int failed = rank_threads_run(&job, n, every_shape, NULL);
        for (int r = 0; r < n; r++)
            cr_expect(!job.ranks[r].failed, "N=%d rank %d: %s", n, r, job.ranks[r].msg);
        cr_assert_eq(failed, 0);
    }
}

Test(groups, every_shape_splits_as_mpi_comm_split_on_1_to_4_ranks, .timeout = 120)
{
    every_shape_on(1, 4);
}

Test(groups, every_shape_splits_as_mpi_comm_split_on_5_to_8_ranks, .timeout = 180)
{
    every_shape_on(5, 8);
}

/* Splitting a child again: world ranks compose through both splits. */
static void split_twice(rank_ctx *rc)
{
    dt_comm *half = NULL, *quarter = NULL;
    /* 8 ranks: odd and even halves, each in reverse order */
    if (dt_comm_split(rc->comm, rc->rank % 2, -rc->rank, &half) != DT_OK) {
        rank_fail(rc, "first split: %s", dt_comm_error(rc->comm));
        return;
    }
    /* each half: group ranks 0,1 and 2,3 */
    int hr = dt_comm_rank(half);
    if (dt_comm_split(half, hr / 2, hr, &quarter) != DT_OK) {
        rank_fail(rc, "second split: %s", dt_comm_error(half));
    } else {
        /* half ranks 2q, 2q+1 of the even half are world 6-4q, 4-4q (odd: +1) */
        int first = rc->rank % 2 + 2 * (3 - 2 * (hr / 2));
        int want[2] = {first, first - 2};
        if (dt_comm_world_rank(quarter, 0) != want[0] || dt_comm_world_rank(quarter, 1) != want[1])
            rank_fail(rc, "quarter is world ranks %d,%d, expected %d,%d",
                      dt_comm_world_rank(quarter, 0), dt_comm_world_rank(quarter, 1), want[0],
                      want[1]);
        int32_t sum = rc->rank;
        if (dt_allreduce(quarter, &sum, 1, DT_I32, DT_SUM) != DT_OK || sum != want[0] + want[1])
            rank_fail(rc, "quarter all-reduce %d, want %d", sum, want[0] + want[1]);
    }
    dt_comm_destroy(quarter);
    dt_comm_destroy(half);
}

Test(groups, a_child_split_again_maps_its_ranks_to_world_ranks, .timeout = 60)
{
    rank_job job;
    int failed = rank_threads_run(&job, 8, split_twice, NULL);
    for (int r = 0; r < 8; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}

/* ---- results on children -------------------------------------------------------- */

#define GRID_PP 3
#define BIG 300000 /* floats: the ring and its segments, not only small messages */

typedef struct grid {
    dt_comm *dp, *pp;
} grid;

/* dp × pp: the pipeline group of a replica (a row), the data-parallel group
 * of a stage (a column). */
static bool grid_split(rank_ctx *rc, int pp, grid *g)
{
    g->dp = g->pp = NULL;
    if (dt_comm_split(rc->comm, rc->rank / pp, rc->rank, &g->pp) != DT_OK ||
        dt_comm_split(rc->comm, rc->rank % pp, rc->rank, &g->dp) != DT_OK)
        return rank_fail(rc, "split: %s", dt_comm_error(rc->comm));
    return true;
}

static void grid_destroy(grid *g)
{
    dt_comm_destroy(g->dp);
    dt_comm_destroy(g->pp);
}

/* Each stage sends a vector to the next stage and receives one from the
 * previous (a ring, both posted before either is waited). */
static bool pp_ring(rank_ctx *rc, dt_comm *pp, int round)
{
    int me = dt_comm_rank(pp), p = dt_comm_size(pp);
    float out[1000], in[1000];
    for (int i = 0; i < 1000; i++)
        out[i] = (float)(rc->rank * 1000 + i + round);
    dt_work *ws, *wr;
    int from = -1;
    if (dt_recv_async(pp, in, 1000, DT_F32, DT_ANY_SOURCE, 7, &from, &wr) != DT_OK ||
        dt_send_async(pp, out, 1000, DT_F32, (me + 1) % p, 7, &ws) != DT_OK)
        return rank_fail(rc, "p2p submit: %s", dt_comm_error(pp));
    dt_status a = dt_work_wait(wr), b = dt_work_wait(ws);
    if (a != DT_OK || b != DT_OK)
        return rank_fail(rc, "p2p: %s", dt_comm_error(pp));
    int prev = (me + p - 1) % p, prev_world = dt_comm_world_rank(pp, prev);
    if (from != prev)
        return rank_fail(rc, "p2p: came from %d, expected %d", from, prev);
    for (int i = 0; i < 1000; i++)
        if (in[i] != (float)(prev_world * 1000 + i + round))
            return rank_fail(rc, "p2p round %d: element %d is %g", round, i, in[i]);
    return true;
}

/* Sum over the data-parallel group of (world rank + 1)·(i mod 7): exact in f32. */
static bool dp_allreduce(rank_ctx *rc, dt_comm *dp, float *buf, size_t n, int round)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)((rc->rank + 1) * (int)((i + (size_t)round) % 7));
    if (dt_allreduce(dp, buf, n, DT_F32, DT_SUM) != DT_OK)
        return rank_fail(rc, "dp all-reduce: %s", dt_comm_error(dp));
    int ranks = 0;
    for (int i = 0; i < dt_comm_size(dp); i++)
        ranks += dt_comm_world_rank(dp, i) + 1;
    for (size_t i = 0; i < n; i++)
        if (buf[i] != (float)(ranks * (int)((i + (size_t)round) % 7)))
            return rank_fail(rc, "dp all-reduce round %d: element %zu is %g", round, i, buf[i]);
    return true;
}

static void grid_results(rank_ctx *rc)
{
    grid g = {0};
    float *buf = malloc(BIG * sizeof *buf);
    if (buf && grid_split(rc, GRID_PP, &g) && dp_allreduce(rc, g.dp, buf, BIG, 0) &&
        pp_ring(rc, g.pp, 0)) {
        /* a broadcast of 1 MiB + 1 from the last stage, over the pipeline group */
        size_t n = (1u << 18) + 1;
        float *b = malloc(n * sizeof *b);
        int root = dt_comm_size(g.pp) - 1, root_world = dt_comm_world_rank(g.pp, root);
        for (size_t i = 0; i < n; i++)
            b[i] = dt_comm_rank(g.pp) == root ? (float)(i % 1000) : -1;
        if (dt_broadcast(g.pp, b, n, DT_F32, root) != DT_OK)
            rank_fail(rc, "broadcast from world rank %d: %s", root_world, dt_comm_error(g.pp));
        for (size_t i = 0; i < n && !rc->failed; i++)
            if (b[i] != (float)(i % 1000))
                rank_fail(rc, "broadcast: element %zu is %g", i, b[i]);
        free(b);
    }
    grid_destroy(&g);
    free(buf);
}

Test(groups, all_reduce_broadcast_and_p2p_on_children_of_a_2x3_grid, .timeout = 90)
{
    rank_job job;
    int failed = rank_threads_run(&job, 2 * GRID_PP, grid_results, NULL);
    for (int r = 0; r < 2 * GRID_PP; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}

/* ---- several groups at once ------------------------------------------------------ */

#define ROUNDS 12

typedef struct pp_worker {
    rank_ctx *rc;
    dt_comm *pp;
    bool ok;
} pp_worker;

static void *pp_rounds(void *p)
{
    pp_worker *w = p;
    w->ok = true;
    for (int round = 0; round < ROUNDS && w->ok; round++)
        w->ok = pp_ring(w->rc, w->pp, round);
    return NULL;
}

/* A second thread drives the pipeline group while this one alternates the
 * data-parallel group and the parent, with async ops of both children in
 * flight together besides. */
static void groups_at_once(rank_ctx *rc)
{
    grid g = {0};
    enum { N = 4096 };
    float *buf = malloc(N * sizeof *buf), a[64], b[64];
    if (!buf || !grid_split(rc, 2, &g))
        goto out;
    for (int i = 0; i < 64; i++)
        a[i] = b[i] = (float)rc->rank;
    dt_work *wa, *wb;
    int32_t world_sum = 1;
    if (dt_allreduce_async(g.dp, a, 64, DT_F32, DT_MAX, &wa) != DT_OK ||
        dt_allreduce_async(g.pp, b, 64, DT_F32, DT_MIN, &wb) != DT_OK) {
        rank_fail(rc, "async submit: %s", dt_comm_error(g.dp));
        goto out;
    }
    dt_status sw = dt_allreduce(rc->comm, &world_sum, 1, DT_I32, DT_SUM);
    dt_status sa = dt_work_wait(wa), sb = dt_work_wait(wb);
    int dp_max = dt_comm_world_rank(g.dp, dt_comm_size(g.dp) - 1);
    int pp_min = dt_comm_world_rank(g.pp, 0);
    if (sw != DT_OK || sa != DT_OK || sb != DT_OK || world_sum != rc->world ||
        a[63] != (float)dp_max || b[0] != (float)pp_min) {
        rank_fail(rc, "async on both children and the parent: %s %s %s: %d %g %g",
                  dt_status_name(sw), dt_status_name(sa), dt_status_name(sb), world_sum, a[63],
                  b[0]);
        goto out;
    }
    pp_worker w = {.rc = rc, .pp = g.pp};
    pthread_t t;
    pthread_create(&t, NULL, pp_rounds, &w);
    for (int round = 0; round < ROUNDS && !rc->failed; round++) {
        int32_t x = rc->rank;
        if (!dp_allreduce(rc, g.dp, buf, N, round))
            break;
        if (dt_allreduce(rc->comm, &x, 1, DT_I32, DT_SUM) != DT_OK ||
            x != rc->world * (rc->world - 1) / 2)
            rank_fail(rc, "parent round %d: %d (%s)", round, x, dt_comm_error(rc->comm));
    }
    pthread_join(t, NULL);
out:
    grid_destroy(&g);
    free(buf);
}

Test(groups, ops_on_several_children_at_once_and_on_the_parent_between, .timeout = 90)
{
    rank_job job;
    int failed = rank_threads_run(&job, 4, groups_at_once, NULL);
    for (int r = 0; r < 4; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}

/* ---- life: destroy ------------------------------------------------------------- */

static bool world_sum_is(rank_ctx *rc, const char *when)
{
    int32_t x = rc->rank;
    if (dt_allreduce(rc->comm, &x, 1, DT_I32, DT_SUM) != DT_OK ||
        x != rc->world * (rc->world - 1) / 2 || dt_comm_error(rc->comm)[0] != '\0')
        return rank_fail(rc, "parent %s: sum %d, error '%s'", when, x, dt_comm_error(rc->comm));
    return true;
}

/* Children destroyed at different moments on different ranks; then the
 * parent all-reduces, broadcasts and splits again. */
static void destroy_children_then_use_parent(rank_ctx *rc)
{
    grid g = {0};
    if (!grid_split(rc, 2, &g))
        return;
    float x[256];
    if (!dp_allreduce(rc, g.dp, x, 256, 0) || !pp_ring(rc, g.pp, 0))
        goto out;
    if (rc->rank % 2)
        usleep(50 * 1000); /* odd ranks leave later */
    grid_destroy(&g);
    g = (grid){0};
    if (!world_sum_is(rc, "after the children were destroyed"))
        return;
    int32_t b = rc->rank == 2 ? 42 : 0;
    if (dt_broadcast(rc->comm, &b, 1, DT_I32, 2) != DT_OK || b != 42) {
        rank_fail(rc, "parent broadcast: %d (%s)", b, dt_comm_error(rc->comm));
        return;
    }
    if (grid_split(rc, 2, &g))
        dp_allreduce(rc, g.dp, x, 256, 1);
out:
    grid_destroy(&g);
}

Test(groups, destroying_a_child_leaves_the_parent_usable, .timeout = 60)
{
    rank_job job;
    int failed = rank_threads_run(&job, 4, destroy_children_then_use_parent, NULL);
    for (int r = 0; r < 4; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}

static void destroy_parent_then_use_child(rank_ctx *rc)
{
    dt_comm *child = NULL;
    if (dt_comm_split(rc->comm, 0, -rc->rank, &child) != DT_OK) {
        rank_fail(rc, "split: %s", dt_comm_error(rc->comm));
        return;
    }
    dt_comm_destroy(rc->comm);
    rc->comm = NULL;
    float x[1000];
    for (int round = 0; round < 3 && !rc->failed; round++)
        dp_allreduce(rc, child, x, 1000, round);
    dt_comm_destroy(child);
}

Test(groups, destroying_the_parent_first_leaves_its_children_working, .timeout = 60)
{
    rank_job job;
    int failed = rank_threads_run(&job, 3, destroy_parent_then_use_child, NULL);
    for (int r = 0; r < 3; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}
