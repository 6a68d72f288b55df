/*
 * algorithms.h — internal: the collective algorithms, one file each.
 *
 * Each algorithm runs on the thread that holds the loop, reads its
 * arguments from o->op (see the table in dt_comm.h), talks to peers only
 * through the transfers of xfer.h, and returns DT_OK or the first
 * failure. Each handles a world of one (a local copy) and a count of zero
 * (no message).
 * Its α-β cost is written in its file's head comment.
 *
 * comm_algo_run picks the algorithm for an op: by kind, by message size and world
 * size, or as o->op->algo forces. A rooted op first checks that every rank
 * names the same root (root_agreement.c).
 */
#ifndef DT_ALGORITHMS_H
#define DT_ALGORITHMS_H

#include "xfer.h"

dt_status comm_algo_run(dt_opctx *o);
/* May algorithm a be forced on ops of kind k? */
bool comm_algo_applies(dt_op_kind k, dt_algo a);
/* The algorithm comm_algo_run will run for op in a world of p: the forced one,
 * or AUTO's choice; DT_ALGO_AUTO for kinds with a single algorithm. */
dt_algo comm_algo_chosen(const dt_op *op, int p);

dt_status comm_allreduce_ring(dt_opctx *o);
dt_status comm_allreduce_recursive_doubling(dt_opctx *o);
dt_status comm_reduce_scatter_ring(dt_opctx *o);
dt_status comm_allgather_ring(dt_opctx *o); /* allgather and allgatherv */
dt_status comm_broadcast_tree(dt_opctx *o);
dt_status comm_broadcast_chain(dt_opctx *o);
dt_status comm_barrier_dissemination(dt_opctx *o);
dt_status comm_reduce_tree(dt_opctx *o);
dt_status comm_allreduce_rank_order(dt_opctx *o);
dt_status comm_reduce_scatter_rank_order(dt_opctx *o);
dt_status comm_reduce_rank_order(dt_opctx *o);
dt_status comm_gather_linear(dt_opctx *o);
dt_status comm_scatter_linear(dt_opctx *o);
dt_status comm_alltoall_pairwise(dt_opctx *o);
/* Rooted ops run this first: every rank must name the same root. */
dt_status comm_root_agree(dt_opctx *o);

#endif /* DT_ALGORITHMS_H */
