/*
 * test_collectives.c — every collective, against a serial reference, with
 * ranks as threads over loopback TCP (rank_threads.h).
 *
 * Results are compared byte for byte: inputs are small integers whose
 * reductions are exact in any order (collective_data.h), and reductions
 * meet a serial reference made with dt_reduce_into_reference and
 * dt_reduce_finish (collective_cases.h). The one test about rounding — all
 * ranks ending bitwise identical — uses inexact values on purpose and
 * compares the ranks with each other.
 *
 * The matrix, chosen to stay within about a minute on two cores:
 *   - world sizes 1 2 3 4 5 8: every collective × every dtype × every op
 *     the dtype supports, at counts 0, 1, p-1 (fewer than the world),
 *     3p+1 (not divisible by it) and 1000+p; rooted ones from every root;
 *     both all-reduce algorithms and both broadcast algorithms forced, and
 *     the automatic choice across its size thresholds;
 *   - world sizes 2 3 4 8: >= 1M elements (many segments per chunk) for
 *     ring all-reduce, reduce-scatter and all-gather with f32/bf16/i64 ×
 *     sum/avg/max, and for every other collective with f32;
 *   - in-place variants, two communicators at once, async ops overlapped
 *     with work, forced algorithms that do not apply.
 * Tagged send/recv, the transport's own ops, are test_send_recv.c's.
 * Each parameterized test (one world size) joins one job and runs its
 * whole slice of the matrix in it, rather than one job per case.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "collective_cases.h"
#include "collective_data.h"
#include "dt_comm.h"
#include "rank_threads.h"
#include "reduce.h"

#define TEST_TIMEOUT_S 60
#define MILLION ((size_t)1 << 20)
#define MAX_COUNTS 10 /* counts a plan runs at, at most */

/* ---- plans: one slice of the matrix, run by every rank of a job ------------- */

static const dt_dtype ALL_DTYPES[] = {DT_F32, DT_F64, DT_F16, DT_BF16,      DT_I8,
                                      DT_U8,  DT_I32, DT_I64, DT_NUM_DTYPES};
static const dt_dtype LARGE_DTYPES[] = {DT_F32, DT_BF16, DT_I64, DT_NUM_DTYPES};
static const dt_dtype F32_ONLY[] = {DT_F32, DT_NUM_DTYPES};
static const dt_redop LARGE_OPS[] = {DT_SUM, DT_AVG, DT_MAX};
static const dt_redop SUM_ONLY[] = {DT_SUM};

/* Whole-buffer kinds count the buffer; the others count per rank (or per
 * peer), so their large count is a million elements over all ranks. */
static int plan_counts(const plan *pl, int p, size_t out[MAX_COUNTS])
{
    int n = 0;
    if (pl->counts == COUNTS_LARGE) {
        bool whole = pl->kind == DT_OP_ALLREDUCE || pl->kind == DT_OP_BROADCAST ||
                     pl->kind == DT_OP_REDUCE;
        out[n++] = whole ? MILLION + 3 : MILLION / (size_t)p + 1;
        return n;
    }
    out[n++] = 0;
    out[n++] = 1;
    if (p > 2)
        out[n++] = (size_t)p - 1;
    out[n++] = p > 1 ? 3 * (size_t)p + 1 : 7;
    out[n++] = 1000 + (size_t)p;
    if (pl->counts == COUNTS_AUTO) { /* both sides of 64 KiB and 1 MiB of f32 */
        out[n++] = 16384;
        out[n++] = 16385;
        out[n++] = 262144;
        out[n++] = 262145;
    }
    return n;
}

static void run_plan(rank_ctx *rc)
{
    plan *pl = rc->arg;
    const int p = rc->world;
    size_t counts[MAX_COUNTS];
    int ncounts = plan_counts(pl, p, counts);
    const dt_dtype *dtypes = pl->dtypes ? pl->dtypes : ALL_DTYPES;
    for (const dt_dtype *t = dtypes; *t != DT_NUM_DTYPES; t++) {
        for (int oi = 0; oi < (is_reduction(pl->kind) ? DT_NUM_REDOPS : 1); oi++) {
            dt_redop op = (dt_redop)oi;
            if (is_reduction(pl->kind) && pl->ops)
                op = oi < pl->nops ? pl->ops[oi] : DT_NUM_REDOPS;
            if (is_reduction(pl->kind) && (op == DT_NUM_REDOPS || !dt_redop_supports(op, *t)))
                continue;
            for (int ci = 0; ci < ncounts; ci++) {
                int first = pl->every_root ? 0 : p - 1;
                int last = is_rooted(pl->kind) ? p - 1 : first;
                for (int root = first; root <= last; root++) {
                    test_case k = {*t, op, counts[ci], root, ""};
                    char where[24] = "";
                    if (is_rooted(pl->kind))
                        snprintf(where, sizeof where, " root %d", root);
                    snprintf(k.label, sizeof k.label, "%s%s (algo %d) %s %s count %zu%s",
                             dt_op_name(pl->kind), pl->in_place ? " in place" : "", pl->algo,
                             dt_dtype_name(*t), is_reduction(pl->kind) ? dt_redop_name(op) : "-",
                             k.count, where);
                    if (!run_case(rc, pl, &k)) {
                        rank_fail(rc, "%s: stopped", k.label); /* if nothing said why */
                        return;
                    }
                }
            }
        }
    }
}

/* ---- the matrix --------------------------------------------------------------- */

static int every_world[] = {1, 2, 3, 4, 5, 8};
static int large_worlds[] = {2, 3, 4, 8};

/* One parameterized test per plan: one run per world size. */
#define PLAN_TEST(name, worlds, ...)                                               \
    ParameterizedTestParameters(collectives, name)                                 \
    {                                                                              \
        return cr_make_param_array(int, worlds, sizeof worlds / sizeof worlds[0]); \
    }                                                                              \
    ParameterizedTest(int *world, collectives, name, .timeout = TEST_TIMEOUT_S)    \
    {                                                                              \
        plan pl = {__VA_ARGS__};                                                   \
        rank_threads_expect_ok(*world, run_plan, &pl);                             \
        free(pl.ref);                                                              \
    }

PLAN_TEST(allreduce_ring_matches_reference, every_world, .kind = DT_OP_ALLREDUCE,
          .algo = DT_ALGO_RING)
PLAN_TEST(allreduce_recursive_doubling_matches_reference, every_world, .kind = DT_OP_ALLREDUCE,
          .algo = DT_ALGO_RECURSIVE_DOUBLING)
PLAN_TEST(allreduce_auto_matches_reference_across_the_size_threshold, every_world,
          .kind = DT_OP_ALLREDUCE, .dtypes = F32_ONLY, .ops = SUM_ONLY, .nops = 1,
          .counts = COUNTS_AUTO)
PLAN_TEST(reduce_scatter_matches_reference, every_world, .kind = DT_OP_REDUCE_SCATTER)
PLAN_TEST(reduce_scatter_in_place_matches_reference, every_world, .kind = DT_OP_REDUCE_SCATTER,
          .in_place = true, .dtypes = LARGE_DTYPES, .ops = LARGE_OPS, .nops = 3)
PLAN_TEST(allgather_matches_reference, every_world, .kind = DT_OP_ALLGATHER)
PLAN_TEST(allgather_in_place_matches_reference, every_world, .kind = DT_OP_ALLGATHER,
          .in_place = true, .dtypes = LARGE_DTYPES)
PLAN_TEST(allgatherv_matches_reference_with_uneven_and_empty_counts, every_world,
          .kind = DT_OP_ALLGATHERV)
PLAN_TEST(broadcast_tree_from_every_root_matches_reference, every_world, .kind = DT_OP_BROADCAST,
          .algo = DT_ALGO_TREE, .every_root = true)
PLAN_TEST(broadcast_chain_from_every_root_matches_reference, every_world, .kind = DT_OP_BROADCAST,
          .algo = DT_ALGO_CHAIN, .every_root = true)
PLAN_TEST(broadcast_auto_matches_reference_across_the_size_threshold, every_world,
          .kind = DT_OP_BROADCAST, .dtypes = F32_ONLY, .counts = COUNTS_AUTO)
PLAN_TEST(reduce_from_every_root_matches_reference_and_spares_other_buffers, every_world,
          .kind = DT_OP_REDUCE, .every_root = true)
PLAN_TEST(gather_from_every_root_matches_reference, every_world, .kind = DT_OP_GATHER,
          .every_root = true)
PLAN_TEST(scatter_from_every_root_matches_reference, every_world, .kind = DT_OP_SCATTER,
          .every_root = true)
PLAN_TEST(alltoall_matches_reference, every_world, .kind = DT_OP_ALLTOALL)
PLAN_TEST(alltoall_in_place_matches_reference, every_world, .kind = DT_OP_ALLTOALL,
          .in_place = true, .dtypes = LARGE_DTYPES)

/* >= 1M elements: several 1 MiB segments per chunk (2-3 ranks, 4-8 byte
 * dtypes), every step of every pipeline. */
PLAN_TEST(allreduce_ring_of_a_million_elements_matches_reference, large_worlds,
          .kind = DT_OP_ALLREDUCE, .algo = DT_ALGO_RING, .dtypes = LARGE_DTYPES, .ops = LARGE_OPS,
          .nops = 3, .counts = COUNTS_LARGE)
PLAN_TEST(allreduce_recursive_doubling_of_a_million_elements_matches_reference, large_worlds,
          .kind = DT_OP_ALLREDUCE, .algo = DT_ALGO_RECURSIVE_DOUBLING, .dtypes = F32_ONLY,
          .ops = SUM_ONLY, .nops = 1, .counts = COUNTS_LARGE)
PLAN_TEST(reduce_scatter_of_a_million_elements_matches_reference, large_worlds,
          .kind = DT_OP_REDUCE_SCATTER, .dtypes = LARGE_DTYPES, .ops = LARGE_OPS, .nops = 3,
          .counts = COUNTS_LARGE)
PLAN_TEST(allgather_of_a_million_elements_matches_reference, large_worlds, .kind = DT_OP_ALLGATHER,
          .dtypes = LARGE_DTYPES, .counts = COUNTS_LARGE)
PLAN_TEST(allgatherv_of_a_million_elements_matches_reference, large_worlds,
          .kind = DT_OP_ALLGATHERV, .dtypes = F32_ONLY, .counts = COUNTS_LARGE)
PLAN_TEST(broadcast_chain_of_a_million_elements_matches_reference, large_worlds,
          .kind = DT_OP_BROADCAST, .algo = DT_ALGO_CHAIN, .dtypes = LARGE_DTYPES,
          .counts = COUNTS_LARGE)
PLAN_TEST(broadcast_tree_of_a_million_elements_matches_reference, large_worlds,
          .kind = DT_OP_BROADCAST, .algo = DT_ALGO_TREE, .dtypes = F32_ONLY, .counts = COUNTS_LARGE)
PLAN_TEST(reduce_of_a_million_elements_matches_reference, large_worlds, .kind = DT_OP_REDUCE,
          .dtypes = F32_ONLY, .ops = LARGE_OPS, .nops = 3, .counts = COUNTS_LARGE)
PLAN_TEST(gather_of_a_million_elements_matches_reference, large_worlds, .kind = DT_OP_GATHER,
          .dtypes = F32_ONLY, .counts = COUNTS_LARGE)
PLAN_TEST(scatter_of_a_million_elements_matches_reference, large_worlds, .kind = DT_OP_SCATTER,
          .dtypes = F32_ONLY, .counts = COUNTS_LARGE)
PLAN_TEST(alltoall_of_a_million_elements_matches_reference, large_worlds, .kind = DT_OP_ALLTOALL,
          .dtypes = F32_ONLY, .counts = COUNTS_LARGE)


/* ---- all-reduce leaves every rank with the same bytes ------------------------- */

/* Inexact on purpose: fractions whose sums round, so that a rank combining
 * in another order than its partner would end with other bytes. */
static void fill_inexact(void *buf, size_t n, dt_dtype t, int rank)
{
    for (size_t i = 0; i < n; i++)
        put_value(buf, i, t, sin((double)i * 0.37 + rank * 1.91) * 97.3 + rank / 7.0);
}

typedef struct identity_arg {
    dt_algo algo;
    char *results; /* [p][bytes], each rank writes its own row */
} identity_arg;

static void rank_allreduce_identity(rank_ctx *rc)
{
    identity_arg *a = rc->arg;
    static const dt_dtype types[] = {DT_F32, DT_F64, DT_F16, DT_BF16};
    static const dt_redop ops[] = {DT_SUM, DT_AVG, DT_PROD, DT_MAX};
    const size_t n = 3000 + (size_t)rc->world;
    for (size_t ti = 0; ti < 4; ti++) {
        for (size_t oi = 0; oi < 4; oi++) {
            size_t bytes = n * dt_dtype_size(types[ti]);
            char *mine = a->results + (size_t)rc->rank * bytes;
            fill_inexact(mine, n, types[ti], rc->rank);
            dt_op o = {.kind = DT_OP_ALLREDUCE,
                       .recv = mine,
                       .count = n,
                       .dtype = types[ti],
                       .redop = ops[oi],
                       .algo = a->algo};
            char label[96];
            snprintf(label, sizeof label, "allreduce (algo %d) %s %s", a->algo,
                     dt_dtype_name(types[ti]), dt_redop_name(ops[oi]));
            if (!run_op(rc, &o, label) || !rank_sync(rc))
                return;
            if (memcmp(mine, a->results, bytes) != 0)
                rank_fail(rc, "%s: rank %d's bytes differ from rank 0's", label, rc->rank);
            if (!rank_sync(rc))
                return;
        }
    }
}

static void allreduce_identity(int world, dt_algo algo)
{
    identity_arg a = {algo, xmalloc((size_t)world * 3008 * 8)};
    rank_threads_expect_ok(world, rank_allreduce_identity, &a);
    free(a.results);
}

static int identity_worlds[] = {2, 3, 5, 8};

ParameterizedTestParameters(collectives, allreduce_ring_leaves_every_rank_bitwise_identical)
{
    return cr_make_param_array(int, identity_worlds, 4);
}
ParameterizedTest(int *world, collectives, allreduce_ring_leaves_every_rank_bitwise_identical,
                  .timeout = TEST_TIMEOUT_S)
{
    allreduce_identity(*world, DT_ALGO_RING);
}

ParameterizedTestParameters(collectives,
                            allreduce_recursive_doubling_leaves_every_rank_bitwise_identical)
{
    return cr_make_param_array(int, identity_worlds, 4);
}
ParameterizedTest(int *world, collectives,
                  allreduce_recursive_doubling_leaves_every_rank_bitwise_identical,
                  .timeout = TEST_TIMEOUT_S)
{
    allreduce_identity(*world, DT_ALGO_RECURSIVE_DOUBLING);
}

/* ---- barrier ------------------------------------------------------------------- */

#define BARRIER_ROUNDS 8

/* Ranks arrive staggered (rank r a little later than r-1); whoever leaves a
 * barrier must see that everyone has arrived at it. */
static void rank_barrier(rank_ctx *rc)
{
    atomic_int *arrived = rc->arg;
    for (int k = 0; k < BARRIER_ROUNDS; k++) {
        usleep((useconds_t)(rc->rank * 2000));
        atomic_fetch_add(&arrived[k], 1);
        dt_status st = dt_barrier(rc->comm);
        if (st != DT_OK) {
            rank_fail(rc, "barrier %d: %s: %s", k, dt_status_name(st), dt_comm_error(rc->comm));
            return;
        }
        int seen = atomic_load(&arrived[k]);
        if (seen != rc->world)
            rank_fail(rc, "left barrier %d when %d of %d ranks had arrived", k, seen, rc->world);
    }
}

ParameterizedTestParameters(collectives, barrier_releases_no_rank_before_all_arrive)
{
    return cr_make_param_array(int, every_world, 6);
}
ParameterizedTest(int *world, collectives, barrier_releases_no_rank_before_all_arrive,
                  .timeout = TEST_TIMEOUT_S)
{
    atomic_int arrived[BARRIER_ROUNDS];
    for (int k = 0; k < BARRIER_ROUNDS; k++)
        atomic_init(&arrived[k], 0);
    rank_threads_expect_ok(*world, rank_barrier, arrived);
}

/* ---- two communicators, async ops, forced algorithms ----------------------------- */

/* Each rank joins a second job beside the first and interleaves
 * all-reduces on both, blocking and in flight at once. */
static void rank_two_communicators(rank_ctx *rc)
{
    char url[160];
    snprintf(url, sizeof url, "%s-second", rc->job->url);
    dt_comm *second;
    if (rank_join(rc, url, "second", &second) != DT_OK)
        return;
    for (int k = 0; k < 5; k++) {
        int64_t a = rc->rank + k, b = 100 * (rc->rank + 1);
        dt_work *wa, *wb;
        dt_status sa = dt_allreduce_async(rc->comm, &a, 1, DT_I64, DT_SUM, &wa);
        dt_status sb = dt_allreduce_async(second, &b, 1, DT_I64, DT_MAX, &wb);
        if (sb == DT_OK)
            sb = dt_work_wait(wb);
        if (sa == DT_OK)
            sa = dt_work_wait(wa);
        int64_t p = rc->world;
        if (sa != DT_OK || sb != DT_OK)
            rank_fail(rc, "round %d: %s / %s: %s / %s", k, dt_status_name(sa), dt_status_name(sb),
                      dt_comm_error(rc->comm), dt_comm_error(second));
        else if (a != p * (p - 1) / 2 + p * k || b != 100 * p)
            rank_fail(rc, "round %d: sum %lld, max %lld", k, (long long)a, (long long)b);
        if (rc->failed)
            break;
    }
    dt_comm_destroy(second);
}

Test(collectives, two_communicators_in_one_process_work_independently, .timeout = TEST_TIMEOUT_S)
{
    rank_threads_expect_ok(3, rank_two_communicators, NULL);
}

/* Three ops in flight while the rank computes something else; waited in
 * reverse order of submission. */
static void rank_async_overlap(rank_ctx *rc)
{
    const size_t n = MILLION;
    const int p = rc->world;
    float *big = xmalloc(n * sizeof *big), *want = xmalloc(n * sizeof *want);
    int32_t root_val = rc->rank == p - 1 ? 42 : 0, gathered[RANK_THREADS_MAX];
    int32_t mine = rc->rank * rc->rank;
    for (size_t i = 0; i < n; i++) {
        big[i] = (float)((i + (size_t)rc->rank) % 5);
        want[i] = 0;
        for (int q = 0; q < p; q++)
            want[i] += (float)((i + (size_t)q) % 5);
    }
    dt_work *w[3];
    RANK_CHECK_OK(rc, "allreduce", dt_allreduce_async(rc->comm, big, n, DT_F32, DT_SUM, &w[0]));
    RANK_CHECK_OK(rc, "broadcast",
                  dt_broadcast_async(rc->comm, &root_val, 1, DT_I32, p - 1, &w[1]));
    RANK_CHECK_OK(rc, "allgather", dt_allgather_async(rc->comm, &mine, gathered, 1, DT_I32, &w[2]));
    volatile double work = 0; /* the other work, while the ops run */
    for (long k = 0; k < 200000 || !dt_work_test(w[0]); k++)
        work = work + sqrt((double)k);
    dt_status st[3];
    for (int k = 2; k >= 0; k--)
        st[k] = dt_work_wait(w[k]);
    for (int k = 0; k < 3; k++)
        RANK_CHECK_OK(rc, "async op", st[k]);
    expect_equal(rc, "async allreduce", big, want, n, DT_F32);
    if (root_val != 42)
        rank_fail(rc, "async broadcast gave %d", (int)root_val);
    for (int q = 0; q < p; q++)
        if (gathered[q] != q * q)
            rank_fail(rc, "async allgather: block %d is %d", q, (int)gathered[q]);
    free(big);
    free(want);
}

Test(collectives, async_ops_complete_while_the_caller_works, .timeout = TEST_TIMEOUT_S)
{
    rank_threads_expect_ok(4, rank_async_overlap, NULL);
}

/* Forcing an algorithm that does not implement the op is refused before
 * anything is sent; the communicator stays usable. */
static void rank_wrong_algorithm(rank_ctx *rc)
{
    float x = 1;
    const dt_op wrong[] = {
        {.kind = DT_OP_ALLREDUCE, .recv = &x, .count = 1, .dtype = DT_F32, .algo = DT_ALGO_CHAIN},
        {.kind = DT_OP_BROADCAST, .recv = &x, .count = 1, .dtype = DT_F32, .algo = DT_ALGO_RING},
        {.kind = DT_OP_REDUCE,
         .recv = &x,
         .count = 1,
         .dtype = DT_F32,
         .algo = DT_ALGO_RECURSIVE_DOUBLING},
        {.kind = DT_OP_ALLGATHER,
         .send = &x,
         .recv = &x,
         .count = 1,
         .dtype = DT_F32,
         .algo = DT_ALGO_TREE},
        {.kind = DT_OP_BARRIER, .algo = DT_ALGO_RING},
    };
    for (size_t k = 0; k < sizeof wrong / sizeof wrong[0]; k++) {
        dt_status st = dt_run(rc->comm, &wrong[k]);
        if (st != DT_EINVAL)
            rank_fail(rc, "%s forced to algorithm %d: %s, expected DT_EINVAL",
                      dt_op_name(wrong[k].kind), wrong[k].algo, dt_status_name(st));
    }
    RANK_CHECK_OK(rc, "allreduce after the refusals",
                  dt_allreduce(rc->comm, &x, 1, DT_F32, DT_SUM));
    if (x != (float)rc->world)
        rank_fail(rc, "allreduce after the refusals gave %g", (double)x);
}

Test(collectives, forcing_an_algorithm_the_op_lacks_is_rejected, .timeout = TEST_TIMEOUT_S)
{
    rank_threads_expect_ok(2, rank_wrong_algorithm, NULL);
}
