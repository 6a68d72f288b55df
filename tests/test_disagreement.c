/*
 * test_disagreement.c — ranks that disagree about an op all fail, in that
 * op, with DT_EPROTO and both views; never a silent wrong answer.
 *
 * Rooted collectives: one rank names another root than the others (a rank
 * that believes it is the root, or the root itself naming someone else),
 * for every rooted op and every algorithm that can be forced. Every rank
 * must return DT_EPROTO from that very op (the one after a warm-up barrier,
 * so #1), with a message that names the op and both roots. Whether a rank
 * could return early used to depend on timing (DT_OK "in most runs"), so
 * each case runs several fresh jobs.
 *
 * A failure in a later op (a peer that had finished this one) fails the op
 * after the current one, not the current one, which can still finish.
 *
 * Tagged send/recv: a receive whose size or dtype disagrees with the send
 * that matched it fails with DT_EPROTO naming both, on the receiver at once
 * and on the sender at its next op (a send completes when its bytes are
 * handed to the kernel, so the send itself may have returned DT_OK).
 *
 * Ranks run as threads (rank_threads.h); each op carries its own timeout,
 * so a hang is a message, not a killed test.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "dt_comm.h"
#include "rank_threads.h"

#define WORLD 4
#define REPEATS 20
#define OP_TIMEOUT_S 8.0

/* ---- rooted ops with disagreeing roots ------------------------------------- */

typedef struct root_case {
    dt_op_kind kind;
    dt_algo algo;
    size_t count; /* elements (per rank for gather/scatter) */
    int root;     /* the root every other rank names */
    int odd_rank; /* the rank that names another root ... */
    int odd_root; /* ... this one */
} root_case;

static void run_disagreeing_root(rank_ctx *rc)
{
    const root_case *k = rc->arg;
    size_t n = k->count * (size_t)WORLD;
    float *send = calloc(n, sizeof *send), *recv = calloc(n, sizeof *recv);
    if (!send || !recv) {
        rank_fail(rc, "out of memory");
        goto out;
    }
    dt_status st = dt_barrier(rc->comm); /* #0: so the bad op is #1 */
    if (st != DT_OK) {
        rank_fail(rc, "warm-up barrier: %s: %s", dt_status_name(st), dt_comm_error(rc->comm));
        goto out;
    }
    dt_op op = {.kind = k->kind,
                .send = send,
                .recv = recv,
                .count = k->count,
                .dtype = DT_F32,
                .redop = DT_SUM,
                .algo = k->algo,
                .root = rc->rank == k->odd_rank ? k->odd_root : k->root,
                .timeout_s = OP_TIMEOUT_S};
    st = dt_run(rc->comm, &op);
    char op_seq[48], want_root[16], odd_root[16];
    snprintf(op_seq, sizeof op_seq, "%s #1", dt_op_name(k->kind));
    snprintf(want_root, sizeof want_root, "root %d", k->root);
    snprintf(odd_root, sizeof odd_root, "root %d", k->odd_root);
    const char *msg = dt_comm_error(rc->comm);
    if (st != DT_EPROTO)
        rank_fail(rc, "rank %d (root %d) got %s, want DT_EPROTO: %s", rc->rank, op.root,
                  dt_status_name(st), msg);
    else if (!strstr(msg, op_seq) || !strstr(msg, want_root) || !strstr(msg, odd_root))
        rank_fail(rc, "rank %d: the error does not name %s with both %s and %s: %s", rc->rank,
                  op_seq, want_root, odd_root, msg);
out:
    free(send);
    free(recv);
}

/* Every rank of every repetition fails as it should; the first that does
 * not is reported. */
static void expect_every_rank_fails(root_case k)
{
    for (int rep = 0; rep < REPEATS; rep++) {
        rank_job job;
        rank_threads_run(&job, WORLD, run_disagreeing_root, &k);
        for (int r = 0; r < WORLD; r++)
            cr_assert(!job.ranks[r].failed, "repetition %d: %s", rep, job.ranks[r].msg);
    }
}

/* A non-root rank believes it is the root. */
#define SELF_ROOT(kind_, algo_, count_) \
    ((root_case){kind_, algo_, count_, .root = 0, .odd_rank = 1, .odd_root = 1})
/* The root names another rank as the root. */
#define ROOT_ELSEWHERE(kind_, algo_, count_) \
    ((root_case){kind_, algo_, count_, .root = 0, .odd_rank = 0, .odd_root = 2})
/* A non-root rank names a third rank. */
#define THIRD_ROOT(kind_, algo_, count_) \
    ((root_case){kind_, algo_, count_, .root = 1, .odd_rank = 3, .odd_root = 2})

#define SMALL 16                                           /* one tree message */
#define CHAIN_COUNT ((size_t)(2 * 1024 * 1024 + 4096) / 4) /* three chain segments */

#define ROOT_TESTS(name, kind, algo, count)                                                     \
    Test(disagreement, name##_where_a_rank_thinks_it_is_root_fails_every_rank, .timeout = 120)  \
    {                                                                                           \
        expect_every_rank_fails(SELF_ROOT(kind, algo, count));                                  \
    }                                                                                           \
    Test(disagreement, name##_where_the_root_names_another_fails_every_rank, .timeout = 120)    \
    {                                                                                           \
        expect_every_rank_fails(ROOT_ELSEWHERE(kind, algo, count));                             \
    }                                                                                           \
    Test(disagreement, name##_where_a_rank_names_a_third_root_fails_every_rank, .timeout = 120) \
    {                                                                                           \
        expect_every_rank_fails(THIRD_ROOT(kind, algo, count));                                 \
    }

ROOT_TESTS(broadcast_tree, DT_OP_BROADCAST, DT_ALGO_TREE, SMALL)
ROOT_TESTS(broadcast_chain, DT_OP_BROADCAST, DT_ALGO_CHAIN, CHAIN_COUNT)
ROOT_TESTS(reduce_tree, DT_OP_REDUCE, DT_ALGO_TREE, SMALL)
ROOT_TESTS(gather, DT_OP_GATHER, DT_ALGO_AUTO, SMALL)
ROOT_TESTS(scatter, DT_OP_SCATTER, DT_ALGO_AUTO, SMALL)

/* Zero elements move no data, but the ranks still disagree. */
Test(disagreement, broadcast_of_nothing_with_disagreeing_roots_fails_every_rank, .timeout = 120)
{
    expect_every_rank_fails(SELF_ROOT(DT_OP_BROADCAST, DT_ALGO_AUTO, 0));
}

/* ---- a failure in a later op leaves the earlier one alone ---------------------- */

#define REDUCE_COUNT ((size_t)4 << 20) /* 16 MiB of f32: takes a while to read */
#define ABORT_WHY "rank 1 stops after the reduce"

/* Reduce #0 to rank 0 (the tree: rank 1 sends first, then rank 2). Rank 1
 * is done once the kernel has its bytes, long before rank 0 has read them
 * and rank 2's, and aborts at once. It had finished #0, so #0 can still
 * finish on ranks 0 and 2: it must return DT_OK with the right sum there,
 * and the abort must fail the op after it. */
static void run_abort_after_reduce(rank_ctx *rc)
{
    float *buf = malloc(REDUCE_COUNT * sizeof *buf);
    if (!buf) {
        rank_fail(rc, "out of memory");
        return;
    }
    for (size_t i = 0; i < REDUCE_COUNT; i++)
        buf[i] = (float)(rc->rank + 1);
    dt_status st = dt_reduce(rc->comm, buf, REDUCE_COUNT, DT_F32, DT_SUM, 0);
    float want = rc->rank == 0 ? 6.0f : (float)(rc->rank + 1);
    if (st != DT_OK)
        rank_fail(rc, "rank %d: reduce #0 got %s: %s", rc->rank, dt_status_name(st),
                  dt_comm_error(rc->comm));
    else if (buf[0] != want || buf[REDUCE_COUNT - 1] != want)
        rank_fail(rc, "rank %d: reduce #0 left %g, want %g", rc->rank, buf[0], want);
    free(buf);
    if (rc->failed)
        return;
    if (rc->rank == 1)
        dt_comm_abort(rc->comm, ABORT_WHY);
    st = dt_barrier(rc->comm);
    if (st != DT_EABORTED || !strstr(dt_comm_error(rc->comm), ABORT_WHY))
        rank_fail(rc, "rank %d: barrier #1 got %s, want DT_EABORTED naming the abort: %s", rc->rank,
                  dt_status_name(st), dt_comm_error(rc->comm));
}

Test(disagreement, a_failure_in_a_later_op_fails_the_next_op_not_the_current_one, .timeout = 120)
{
    for (int rep = 0; rep < 3; rep++) {
        rank_job job;
        rank_threads_run(&job, 3, run_abort_after_reduce, NULL);
        for (int r = 0; r < 3; r++)
            cr_assert(!job.ranks[r].failed, "repetition %d: %s", rep, job.ranks[r].msg);
    }
}

/* ---- tagged send/recv that disagree ------------------------------------------ */

typedef struct p2p_case {
    size_t send_count, recv_count;
    dt_dtype send_type, recv_type;
    const char *send_view, *recv_view; /* what the error must quote */
} p2p_case;

/* Rank 0 sends to rank 1 under tag 7, then joins a barrier; rank 1 posts a
 * receive that does not fit. */
static void run_disagreeing_p2p(rank_ctx *rc)
{
    const p2p_case *k = rc->arg;
    char buf[4096] = {0};
    dt_status st;
    if (rc->rank == 0) {
        st = dt_send(rc->comm, buf, k->send_count, k->send_type, 1, 7);
        if (st == DT_OK)
            st = dt_barrier(rc->comm);
    } else {
        st = dt_recv(rc->comm, buf, k->recv_count, k->recv_type, 0, 7, NULL);
    }
    const char *msg = dt_comm_error(rc->comm);
    if (st != DT_EPROTO)
        rank_fail(rc, "rank %d got %s, want DT_EPROTO: '%s'", rc->rank, dt_status_name(st), msg);
    else if (!strstr(msg, k->send_view) || !strstr(msg, k->recv_view))
        rank_fail(rc, "rank %d: the error does not quote '%s' and '%s': %s", rc->rank, k->send_view,
                  k->recv_view, msg);
}

static void expect_both_sides_fail(p2p_case k)
{
    for (int rep = 0; rep < REPEATS; rep++) {
        rank_job job;
        rank_threads_run(&job, 2, run_disagreeing_p2p, &k);
        for (int r = 0; r < 2; r++)
            cr_assert(!job.ranks[r].failed, "repetition %d: %s", rep, job.ranks[r].msg);
    }
}

Test(disagreement, recv_shorter_than_the_send_fails_both_sides_with_both_views, .timeout = 120)
{
    expect_both_sides_fail((p2p_case){100, 50, DT_F32, DT_F32, "100 x f32", "50 x f32"});
}

Test(disagreement, recv_longer_than_the_send_fails_both_sides_with_both_views, .timeout = 120)
{
    expect_both_sides_fail((p2p_case){50, 100, DT_F32, DT_F32, "50 x f32", "100 x f32"});
}

Test(disagreement, recv_of_another_dtype_of_equal_size_fails_both_sides, .timeout = 120)
{
    expect_both_sides_fail((p2p_case){100, 100, DT_F32, DT_I32, "100 x f32", "100 x i32"});
}
