/*
 * bench_case.h — one (collective, size) cell of dtrain-bench: its buffers,
 * its deterministic inputs, the op that runs it, and the check of its output
 * against closed-form expected values.
 *
 * Sizes follow nccl-tests: `bytes` is the whole array (the allreduce
 * buffer, the reduce_scatter input, the allgather output, the alltoall
 * input), and `count` is the count the API takes (per rank for
 * reduce_scatter, allgather and alltoall). A size that does not divide by
 * p elements is rounded down, but never below one element per rank; the
 * row then reports the bytes actually moved.
 */
#ifndef DT_BENCH_CASE_H
#define DT_BENCH_CASE_H

#include <stddef.h>

#include "dt_comm.h"

typedef struct bench_case {
    dt_op op;          /* what dt_run executes; send/recv point below */
    size_t bytes;      /* whole-array bytes, as reported */
    int rank, p;       /* this rank, world size */
    void *send, *recv; /* owned; send is NULL for in-place ops */
    size_t send_count; /* elements in send */
    size_t recv_count; /* elements in recv */
} bench_case;

/* Allocates buffers for `kind` at `bytes` (whole array). Returns DT_ENOMEM
 * or DT_OK. algo and root go straight into the op. */
dt_status bench_case_init(bench_case *bc, dt_op_kind kind, size_t bytes, dt_dtype t, dt_redop op,
                          int root, dt_algo algo, int rank, int p);
void bench_case_free(bench_case *bc);

/* Writes this rank's inputs (and a sentinel where outputs go, so an op that
 * writes nothing is caught). */
void bench_case_fill(bench_case *bc);

/* Elements of this rank's output that differ from the expected values. */
size_t bench_case_count_wrong(const bench_case *bc);

/* nccl-tests' bus-bandwidth factor: busbw = algbw * factor, the bytes each
 * rank's busiest link carries relative to the array size, so busbw compares
 * with the link's speed whatever the collective. */
double bench_busbw_factor(dt_op_kind kind, int p);

#endif /* DT_BENCH_CASE_H */
