/*
 * collective_cases.h — one call of each collective, checked: the inputs each
 * rank makes, the dt_op it submits, and what it expects afterwards.
 *
 * A `plan` names a slice of the test matrix (one kind, maybe a forced
 * algorithm, in place or not, which dtypes/ops/counts/roots); the suite
 * (test_collectives.c) walks it and calls run_case once per combination,
 * on every rank of a job, in the same order everywhere.
 *
 * Reductions share one serial reference per case: rank 0 computes it
 * (dt_reduce_into_reference over every rank's input, in rank order, then
 * dt_reduce_finish) into the plan's buffer while the others wait at a
 * rank_sync, and a second rank_sync keeps it from being overwritten while
 * others still compare. Data-movement cases compute what they expect
 * locally: it is only the inputs, rearranged.
 *
 * A case returns false only when the job cannot go on (an op failed, or
 * another rank gave up); a wrong value is recorded and the ranks carry on,
 * so that every rank still submits the same ops.
 */
#ifndef DT_TEST_COLLECTIVE_CASES_H
#define DT_TEST_COLLECTIVE_CASES_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collective_data.h"
#include "dt_comm.h"
#include "rank_threads.h"
#include "reduce.h"

typedef enum count_set { COUNTS_SMALL, COUNTS_LARGE, COUNTS_AUTO } count_set;

typedef struct plan {
    dt_op_kind kind;
    dt_algo algo;
    bool in_place;
    const dt_dtype *dtypes; /* NULL: all eight */
    const dt_redop *ops;    /* reductions; NULL: every op the dtype supports */
    int nops;
    count_set counts;
    bool every_root; /* rooted kinds: every root, else root p-1 */
    char *ref;       /* shared: rank 0 writes it between rank_syncs */
    size_t ref_cap;
} plan;

typedef struct test_case {
    dt_dtype t;
    dt_redop op;
    size_t count;
    int root;
    char label[160];
} test_case;

static inline bool is_reduction(dt_op_kind k)
{
    return k == DT_OP_ALLREDUCE || k == DT_OP_REDUCE_SCATTER || k == DT_OP_REDUCE;
}

static inline bool is_rooted(dt_op_kind k)
{
    return k == DT_OP_BROADCAST || k == DT_OP_REDUCE || k == DT_OP_GATHER || k == DT_OP_SCATTER;
}

/* Rank 0 reduces every rank's input of n elements into the plan's shared
 * buffer, serially and in rank order; everyone waits for it. NULL if the
 * job broke. */
static inline const void *shared_reduction(rank_ctx *rc, plan *pl, size_t n, dt_dtype t,
                                           dt_redop op)
{
    size_t bytes = n * dt_dtype_size(t);
    if (rc->rank == 0) {
        if (!pl->ref || bytes > pl->ref_cap) { /* non-NULL even for 0 B */
            free(pl->ref);
            pl->ref = xmalloc(bytes);
            pl->ref_cap = bytes;
        }
        char *other = xmalloc(bytes);
        fill_reduction_input(pl->ref, n, t, op, 0);
        for (int q = 1; q < rc->world; q++) {
            fill_reduction_input(other, n, t, op, q);
            dt_reduce_into_reference(pl->ref, other, n, t, op);
        }
        dt_reduce_finish(pl->ref, n, t, op, rc->world);
        free(other);
    }
    return rank_sync(rc) ? pl->ref : NULL;
}

/* Runs one op; false (recorded) if it failed. */
static inline bool run_op(rank_ctx *rc, const dt_op *o, const char *label)
{
    dt_status st = dt_run(rc->comm, o);
    if (st != DT_OK)
        return rank_fail(rc, "%s: %s: %s", label, dt_status_name(st), dt_comm_error(rc->comm));
    return true;
}

/* ---- one case of each kind: every rank runs it, then checks its part ----- */

/* allreduce: in place; every rank expects the whole reduction. */
static inline bool case_allreduce(rank_ctx *rc, plan *pl, const test_case *k)
{
    char *buf = xmalloc(k->count * dt_dtype_size(k->t));
    fill_reduction_input(buf, k->count, k->t, k->op, rc->rank);
    const void *want = shared_reduction(rc, pl, k->count, k->t, k->op);
    dt_op o = {.kind = DT_OP_ALLREDUCE,
               .recv = buf,
               .count = k->count,
               .dtype = k->t,
               .redop = k->op,
               .algo = pl->algo};
    bool ok = want && run_op(rc, &o, k->label);
    if (ok)
        expect_equal(rc, k->label, buf, want, k->count, k->t);
    free(buf);
    return ok;
}

/* reduce_scatter: send [p·count] → recv [count] = block `rank` of the
 * reduction; in place: recv is that block of send. */
static inline bool case_reduce_scatter(rank_ctx *rc, plan *pl, const test_case *k)
{
    const size_t es = dt_dtype_size(k->t), p = (size_t)rc->world;
    char *send = xmalloc(p * k->count * es);
    char *mine = send + (size_t)rc->rank * k->count * es;
    char *recv = pl->in_place ? mine : xmalloc(k->count * es);
    fill_reduction_input(send, p * k->count, k->t, k->op, rc->rank);
    const char *want = shared_reduction(rc, pl, p * k->count, k->t, k->op);
    dt_op o = {.kind = DT_OP_REDUCE_SCATTER,
               .send = send,
               .recv = recv,
               .count = k->count,
               .dtype = k->t,
               .redop = k->op,
               .algo = pl->algo};
    bool ok = want && run_op(rc, &o, k->label);
    if (ok)
        expect_equal(rc, k->label, recv, want + (size_t)rc->rank * k->count * es, k->count, k->t);
    if (!pl->in_place)
        free(recv);
    free(send);
    return ok;
}

/* reduce: the root expects the reduction, every other rank its own input. */
static inline bool case_reduce(rank_ctx *rc, plan *pl, const test_case *k)
{
    const size_t bytes = k->count * dt_dtype_size(k->t);
    char *buf = xmalloc(bytes), *input = xmalloc(bytes);
    fill_reduction_input(input, k->count, k->t, k->op, rc->rank);
    memcpy(buf, input, bytes);
    const void *want = shared_reduction(rc, pl, k->count, k->t, k->op);
    dt_op o = {.kind = DT_OP_REDUCE,
               .recv = buf,
               .count = k->count,
               .dtype = k->t,
               .redop = k->op,
               .root = k->root,
               .algo = pl->algo};
    bool ok = want && run_op(rc, &o, k->label);
    if (ok)
        expect_equal(rc, k->label, buf, rc->rank == k->root ? want : input, k->count, k->t);
    free(buf);
    free(input);
    return ok;
}

/* allgather / allgatherv: every rank expects every rank's block in order.
 * allgatherv's counts: count+q for rank q, except every third rank sends
 * nothing. */
static inline bool case_allgather(rank_ctx *rc, plan *pl, const test_case *k)
{
    const size_t es = dt_dtype_size(k->t);
    const int p = rc->world;
    size_t counts[RANK_THREADS_MAX], offsets[RANK_THREADS_MAX], total = 0;
    for (int q = 0; q < p; q++) {
        bool v = pl->kind == DT_OP_ALLGATHERV;
        counts[q] = !v ? k->count : q % 3 == 1 ? 0 : k->count + (size_t)q;
        offsets[q] = total;
        total += counts[q];
    }
    char *recv = xmalloc(total * es), *want = xmalloc(total * es);
    char *send = pl->in_place ? recv + offsets[rc->rank] * es : xmalloc(counts[rc->rank] * es);
    for (int q = 0; q < p; q++)
        fill_block(want + offsets[q] * es, counts[q], k->t, q, 0);
    fill_block(send, counts[rc->rank], k->t, rc->rank, 0);
    dt_op o = {.kind = pl->kind,
               .send = send,
               .recv = recv,
               .count = k->count,
               .counts = counts,
               .dtype = k->t,
               .algo = pl->algo};
    bool ok = run_op(rc, &o, k->label);
    if (ok)
        expect_equal(rc, k->label, recv, want, total, k->t);
    if (!pl->in_place)
        free(send);
    free(recv);
    free(want);
    return ok;
}

/* broadcast: everyone expects the root's buffer. */
static inline bool case_broadcast(rank_ctx *rc, plan *pl, const test_case *k)
{
    const size_t bytes = k->count * dt_dtype_size(k->t);
    char *buf = xmalloc(bytes), *want = xmalloc(bytes);
    fill_block(want, k->count, k->t, k->root, 0);
    if (rc->rank == k->root)
        memcpy(buf, want, bytes);
    else
        memset(buf, 0xa5, bytes);
    dt_op o = {.kind = DT_OP_BROADCAST,
               .recv = buf,
               .count = k->count,
               .dtype = k->t,
               .root = k->root,
               .algo = pl->algo};
    bool ok = run_op(rc, &o, k->label);
    if (ok)
        expect_equal(rc, k->label, buf, want, k->count, k->t);
    free(buf);
    free(want);
    return ok;
}

/* gather: the root expects block q from rank q; others pass no recv. */
static inline bool case_gather(rank_ctx *rc, plan *pl, const test_case *k)
{
    const size_t es = dt_dtype_size(k->t), p = (size_t)rc->world;
    const bool root = rc->rank == k->root;
    char *send = xmalloc(k->count * es);
    char *recv = root ? xmalloc(p * k->count * es) : NULL;
    char *want = xmalloc(p * k->count * es);
    fill_block(send, k->count, k->t, rc->rank, 0);
    for (size_t q = 0; q < p; q++)
        fill_block(want + q * k->count * es, k->count, k->t, (int)q, 0);
    dt_op o = {.kind = DT_OP_GATHER,
               .send = send,
               .recv = recv,
               .count = k->count,
               .dtype = k->t,
               .root = k->root,
               .algo = pl->algo};
    bool ok = run_op(rc, &o, k->label);
    if (ok && root)
        expect_equal(rc, k->label, recv, want, p * k->count, k->t);
    free(send);
    free(recv);
    free(want);
    return ok;
}

/* scatter: rank q expects block q of the root's send buffer. */
static inline bool case_scatter(rank_ctx *rc, plan *pl, const test_case *k)
{
    const size_t es = dt_dtype_size(k->t), p = (size_t)rc->world;
    const bool root = rc->rank == k->root;
    char *send = root ? xmalloc(p * k->count * es) : NULL;
    char *recv = xmalloc(k->count * es), *want = xmalloc(k->count * es);
    for (size_t q = 0; q < p && root; q++)
        fill_block(send + q * k->count * es, k->count, k->t, k->root, (int)q);
    fill_block(want, k->count, k->t, k->root, rc->rank);
    dt_op o = {.kind = DT_OP_SCATTER,
               .send = send,
               .recv = recv,
               .count = k->count,
               .dtype = k->t,
               .root = k->root,
               .algo = pl->algo};
    bool ok = run_op(rc, &o, k->label);
    if (ok)
        expect_equal(rc, k->label, recv, want, k->count, k->t);
    free(send);
    free(recv);
    free(want);
    return ok;
}

/* alltoall: block q of rank r's send → block r of rank q's recv; in place:
 * one buffer for both. */
static inline bool case_alltoall(rank_ctx *rc, plan *pl, const test_case *k)
{
    const size_t es = dt_dtype_size(k->t), p = (size_t)rc->world;
    const size_t block = k->count * es;
    char *send = xmalloc(p * block), *want = xmalloc(p * block);
    char *recv = pl->in_place ? send : xmalloc(p * block);
    for (size_t q = 0; q < p; q++) {
        fill_block(send + q * block, k->count, k->t, rc->rank, (int)q);
        fill_block(want + q * block, k->count, k->t, (int)q, rc->rank);
    }
    dt_op o = {.kind = DT_OP_ALLTOALL,
               .send = send,
               .recv = recv,
               .count = k->count,
               .dtype = k->t,
               .algo = pl->algo};
    bool ok = run_op(rc, &o, k->label);
    if (ok)
        expect_equal(rc, k->label, recv, want, p * k->count, k->t);
    if (!pl->in_place)
        free(recv);
    free(send);
    free(want);
    return ok;
}

/* One case; false when the job cannot go on. The trailing rank_sync keeps
 * rank 0 from rewriting the shared reference while others still read it. */
static inline bool run_case(rank_ctx *rc, plan *pl, const test_case *k)
{
    bool ok;
    switch (pl->kind) {
    case DT_OP_ALLREDUCE: ok = case_allreduce(rc, pl, k); break;
    case DT_OP_REDUCE_SCATTER: ok = case_reduce_scatter(rc, pl, k); break;
    case DT_OP_REDUCE: ok = case_reduce(rc, pl, k); break;
    case DT_OP_ALLGATHER:
    case DT_OP_ALLGATHERV: ok = case_allgather(rc, pl, k); break;
    case DT_OP_BROADCAST: ok = case_broadcast(rc, pl, k); break;
    case DT_OP_GATHER: ok = case_gather(rc, pl, k); break;
    case DT_OP_SCATTER: ok = case_scatter(rc, pl, k); break;
    case DT_OP_ALLTOALL: ok = case_alltoall(rc, pl, k); break;
    default: return rank_fail(rc, "no test case for %s", dt_op_name(pl->kind));
    }
    return ok && (!is_reduction(pl->kind) || rank_sync(rc));
}

#endif /* DT_TEST_COLLECTIVE_CASES_H */
