/*
 * bench_case.c — buffers, inputs and output checks for one (collective,
 * size) of dtrain-bench. See bench_case.h for the size conventions.
 *
 * Layouts (count = the API's count, p ranks):
 *   allreduce       recv [count], in place
 *   reduce_scatter  send [p·count] -> recv [count] (this rank's block)
 *   allgather       send [count]   -> recv [p·count]
 *   broadcast       recv [count], the root's contents everywhere
 *   reduce          recv [count], in place; the result at the root only
 *   alltoall        send [p·count] -> recv [p·count] (block j from rank j)
 *   barrier         nothing
 * Outputs start as a sentinel (-1) that no expected value equals, so an op
 * that leaves them untouched is counted wrong.
 */
#include "bench_case.h"

#include <stdlib.h>
#include <string.h>

#include "bench_values.h"

#define SENTINEL (-1)

static size_t at_least_one(size_t n)
{
    return n ? n : 1;
}

/* Element counts of the API's count, send and recv for `kind`. */
static void layout(bench_case *bc, dt_op_kind kind, size_t bytes, size_t esize)
{
    size_t p = (size_t)bc->p, count = 0;
    switch (kind) {
    case DT_OP_ALLREDUCE:
    case DT_OP_BROADCAST:
    case DT_OP_REDUCE:
        count = at_least_one(bytes / esize);
        bc->recv_count = count;
        break;
    case DT_OP_REDUCE_SCATTER:
        count = at_least_one(bytes / esize / p);
        bc->send_count = p * count;
        bc->recv_count = count;
        break;
    case DT_OP_ALLGATHER:
        count = at_least_one(bytes / esize / p);
        bc->send_count = count;
        bc->recv_count = p * count;
        break;
    case DT_OP_ALLTOALL:
        count = at_least_one(bytes / esize / p);
        bc->send_count = p * count;
        bc->recv_count = p * count;
        break;
    default: /* barrier */ break;
    }
    bc->op.count = count;
    bool whole = kind == DT_OP_ALLREDUCE || kind == DT_OP_BROADCAST || kind == DT_OP_REDUCE;
    bc->bytes = (whole ? count : p * count) * esize;
    if (kind == DT_OP_BARRIER)
        bc->bytes = 0;
}

dt_status bench_case_init(bench_case *bc, dt_op_kind kind, size_t bytes, dt_dtype t, dt_redop op,
                          int root, dt_algo algo, int rank, int p)
{
    memset(bc, 0, sizeof *bc);
    bc->rank = rank;
    bc->p = p;
    bc->op.kind = kind;
    bc->op.dtype = t;
    bc->op.redop = op;
    bc->op.root = root;
    bc->op.algo = algo;
    size_t esize = dt_dtype_size(t);
    layout(bc, kind, bytes, esize);
    if (bc->send_count)
        bc->send = malloc(bc->send_count * esize);
    if (bc->recv_count)
        bc->recv = malloc(bc->recv_count * esize);
    if ((bc->send_count && !bc->send) || (bc->recv_count && !bc->recv)) {
        bench_case_free(bc);
        return DT_ENOMEM;
    }
    bc->op.send = bc->send;
    bc->op.recv = bc->recv;
    bench_case_fill(bc);
    return DT_OK;
}

void bench_case_free(bench_case *bc)
{
    free(bc->send);
    free(bc->recv);
    bc->send = bc->recv = NULL;
}

void bench_case_fill(bench_case *bc)
{
    const dt_op *op = &bc->op;
    dt_dtype t = op->dtype;
    int r = bc->rank;
    for (size_t i = 0; i < bc->recv_count; i++)
        bench_store(t, bc->recv, i, SENTINEL);
    switch (op->kind) {
    case DT_OP_ALLREDUCE:
    case DT_OP_REDUCE:
        for (size_t i = 0; i < bc->recv_count; i++)
            bench_store(t, bc->recv, i, bench_reduce_input(op->redop, r, i));
        break;
    case DT_OP_REDUCE_SCATTER:
        for (size_t i = 0; i < bc->send_count; i++)
            bench_store(t, bc->send, i, bench_reduce_input(op->redop, r, i));
        break;
    case DT_OP_ALLGATHER:
    case DT_OP_ALLTOALL: /* block j of send goes to rank j */
        for (size_t i = 0; i < bc->send_count; i++)
            bench_store(t, bc->send, i, bench_plain_input(r, i));
        break;
    case DT_OP_BROADCAST:
        if (r == op->root)
            for (size_t i = 0; i < bc->recv_count; i++)
                bench_store(t, bc->recv, i, bench_plain_input(r, i));
        break;
    default: break;
    }
}

size_t bench_case_count_wrong(const bench_case *bc)
{
    const dt_op *op = &bc->op;
    dt_dtype t = op->dtype;
    size_t n = op->count, wrong = 0, me = (size_t)bc->rank;
    switch (op->kind) {
    case DT_OP_ALLREDUCE:
        for (size_t i = 0; i < n; i++)
            wrong += !bench_reduced_ok(t, op->redop, bc->p, bc->recv, i, i);
        break;
    case DT_OP_REDUCE_SCATTER:
        for (size_t i = 0; i < n; i++)
            wrong += !bench_reduced_ok(t, op->redop, bc->p, bc->recv, i, me * n + i);
        break;
    case DT_OP_ALLGATHER:
        for (size_t i = 0; i < bc->recv_count; i++)
            wrong += !bench_plain_ok(t, bc->recv, i, bench_plain_input((int)(i / n), i % n));
        break;
    case DT_OP_ALLTOALL: /* block j came from rank j, which filled it for me */
        for (size_t i = 0; i < bc->recv_count; i++)
            wrong += !bench_plain_ok(t, bc->recv, i,
                                     bench_plain_input((int)(i / n), me * n + i % n));
        break;
    case DT_OP_BROADCAST:
        for (size_t i = 0; i < n; i++)
            wrong += !bench_plain_ok(t, bc->recv, i, bench_plain_input(op->root, i));
        break;
    case DT_OP_REDUCE: /* the root has the result; the others keep their input */
        for (size_t i = 0; i < n; i++)
            wrong += bc->rank == op->root
                         ? !bench_reduced_ok(t, op->redop, bc->p, bc->recv, i, i)
                         : !bench_plain_ok(t, bc->recv, i,
                                           bench_reduce_input(op->redop, bc->rank, i));
        break;
    default: break;
    }
    return wrong;
}

double bench_busbw_factor(dt_op_kind kind, int p)
{
    switch (kind) {
    case DT_OP_ALLREDUCE: return 2.0 * (p - 1) / p;
    case DT_OP_REDUCE_SCATTER:
    case DT_OP_ALLGATHER:
    case DT_OP_ALLTOALL: return (double)(p - 1) / p;
    case DT_OP_BROADCAST:
    case DT_OP_REDUCE: return 1.0;
    default: return 0.0;
    }
}
