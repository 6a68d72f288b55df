/*
 * test_rank_order.c — DT_ALGO_RANK_ORDER (collectives/algorithms/
 * rank_order.c) sums every element as x0 + x1 + ... + x(p-1), left to
 * right, on every world size, for all-reduce, reduce-scatter and reduce
 * from every root: the results are compared byte for byte with that sum
 * computed serially in float, on values whose sums round (another order
 * would give other bytes).
 *
 * Ranks are threads of this process (rank_threads.h), on real TCP.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dt_comm.h"
#include "rank_threads.h"

#define TEST_TIMEOUT_S 60
#define COUNT 1001 /* chunks of unequal sizes on every p > 1 */

/* Rank q's element i: a fraction whose sums round. */
static float value(int q, size_t i)
{
    return (float)(sin((double)i * 0.37 + q * 1.91) * 97.3 + q / 7.0);
}

/* x0 + x1 + ... + x(p-1) at element i, left to right in float. */
static float rank_order_sum(int p, size_t i)
{
    float acc = value(0, i);
    for (int q = 1; q < p; q++)
        acc = acc + value(q, i);
    return acc;
}

static float *filled(int q, size_t n)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; x && i < n; i++)
        x[i] = value(q, i);
    return x;
}

static bool same_bytes(rank_ctx *rc, const char *what, const float *got, size_t off, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float want = rank_order_sum(rc->world, off + i);
        if (memcmp(&got[i], &want, sizeof want) != 0)
            return rank_fail(rc, "%s: element %zu is %.9g, the rank-order sum %.9g", what, off + i,
                             (double)got[i], (double)want);
    }
    return true;
}

static void rank_allreduce(rank_ctx *rc)
{
    float *x = filled(rc->rank, COUNT);
    dt_op op = {.kind = DT_OP_ALLREDUCE,
                .recv = x,
                .count = COUNT,
                .dtype = DT_F32,
                .redop = DT_SUM,
                .algo = DT_ALGO_RANK_ORDER};
    dt_status st = dt_run(rc->comm, &op);
    if (st != DT_OK)
        rank_fail(rc, "allreduce: %s", dt_comm_error(rc->comm));
    else
        same_bytes(rc, "allreduce", x, 0, COUNT);
    free(x);
}

static void rank_reduce_scatter(rank_ctx *rc)
{
    size_t per = COUNT / 7 + 1;
    float *x = filled(rc->rank, per * (size_t)rc->world), *y = calloc(per, sizeof *y);
    dt_op op = {.kind = DT_OP_REDUCE_SCATTER,
                .send = x,
                .recv = y,
                .count = per,
                .dtype = DT_F32,
                .redop = DT_SUM,
                .algo = DT_ALGO_RANK_ORDER};
    dt_status st = dt_run(rc->comm, &op);
    if (st != DT_OK)
        rank_fail(rc, "reduce_scatter: %s", dt_comm_error(rc->comm));
    else
        same_bytes(rc, "reduce_scatter", y, (size_t)rc->rank * per, per);
    free(x);
    free(y);
}

static void rank_reduce_every_root(rank_ctx *rc)
{
    for (int root = 0; root < rc->world && !rc->failed; root++) {
        float *x = filled(rc->rank, COUNT), *mine = filled(rc->rank, COUNT);
        dt_op op = {.kind = DT_OP_REDUCE,
                    .recv = x,
                    .count = COUNT,
                    .dtype = DT_F32,
                    .redop = DT_SUM,
                    .root = root,
                    .algo = DT_ALGO_RANK_ORDER};
        dt_status st = dt_run(rc->comm, &op);
        if (st != DT_OK)
            rank_fail(rc, "reduce to %d: %s", root, dt_comm_error(rc->comm));
        else if (rc->rank == root)
            same_bytes(rc, "reduce at the root", x, 0, COUNT);
        else if (memcmp(x, mine, COUNT * sizeof *x) != 0)
            rank_fail(rc, "reduce to %d changed rank %d's buffer", root, rc->rank);
        free(x);
        free(mine);
    }
}

/* Averages are the rank-order sum divided once by p. */
static void rank_allreduce_avg(rank_ctx *rc)
{
    float *x = filled(rc->rank, COUNT);
    dt_op op = {.kind = DT_OP_ALLREDUCE,
                .recv = x,
                .count = COUNT,
                .dtype = DT_F32,
                .redop = DT_AVG,
                .algo = DT_ALGO_RANK_ORDER};
    if (dt_run(rc->comm, &op) != DT_OK) {
        rank_fail(rc, "allreduce avg: %s", dt_comm_error(rc->comm));
    } else {
        for (size_t i = 0; i < COUNT; i++) {
            float want = rank_order_sum(rc->world, i) / (float)rc->world;
            if (memcmp(&x[i], &want, sizeof want) != 0) {
                rank_fail(rc, "avg: element %zu is %.9g, want %.9g", i, (double)x[i], (double)want);
                break;
            }
        }
    }
    free(x);
}

static void rank_refused_elsewhere(rank_ctx *rc)
{
    float x = 1, y[RANK_THREADS_MAX];
    dt_op wrong[] = {
        {.kind = DT_OP_BROADCAST, .recv = &x, .count = 1, .dtype = DT_F32},
        {.kind = DT_OP_ALLGATHER, .send = &x, .recv = y, .count = 1, .dtype = DT_F32},
    };
    for (size_t k = 0; k < sizeof wrong / sizeof wrong[0]; k++) {
        wrong[k].algo = DT_ALGO_RANK_ORDER;
        dt_work *w = NULL;
        dt_status st = dt_submit(rc->comm, &wrong[k], &w);
        if (st != DT_EINVAL)
            rank_fail(rc, "%s forced to rank order: %s, expected DT_EINVAL",
                      dt_op_name(wrong[k].kind), dt_status_name(st));
        if (w)
            dt_work_wait(w);
    }
}

static void run_ranks(int world, rank_fn fn)
{
    rank_job *job = calloc(1, sizeof *job);
    cr_assert(job != NULL);
    rank_threads_run(job, world, fn, NULL);
    for (int r = 0; r < world; r++)
        cr_expect(!job->ranks[r].failed, "rank %d of %d: %s", r, world, job->ranks[r].msg);
    free(job);
}

static int worlds[] = {1, 2, 3, 4, 5};

#define WORLD_TEST(name, fn)                                                       \
    ParameterizedTestParameters(rank_order, name)                                  \
    {                                                                              \
        return cr_make_param_array(int, worlds, sizeof worlds / sizeof worlds[0]); \
    }                                                                              \
    ParameterizedTest(int *world, rank_order, name, .timeout = TEST_TIMEOUT_S)     \
    {                                                                              \
        run_ranks(*world, fn);                                                     \
    }

WORLD_TEST(allreduce_sums_every_element_in_rank_order, rank_allreduce)
WORLD_TEST(reduce_scatter_sums_each_chunk_in_rank_order, rank_reduce_scatter)
WORLD_TEST(reduce_sums_in_rank_order_at_every_root_and_spares_the_others, rank_reduce_every_root)
WORLD_TEST(an_average_is_the_rank_order_sum_divided_once, rank_allreduce_avg)

Test(rank_order, forcing_it_on_an_op_that_does_not_reduce_is_refused, .timeout = TEST_TIMEOUT_S)
{
    run_ranks(2, rank_refused_elsewhere);
}
