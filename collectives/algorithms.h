/*
 * algorithms.h — internal: the collective algorithms, one file each.
 *
 * Each algorithm runs on the thread that holds the loop, reads its
 * arguments from o->op (see the table in dt_comm.h), talks to peers only
 * through the transfers of transport.h, and returns DT_OK or the first
 * failure. Each handles a world of one (a local copy) and a count of zero
 * (no message).
 * Its α-β cost is written in its file's head comment.
 *
 * algo_run picks the algorithm for an op: by kind, by message size and world
 * size, or as o->op->algo forces. A rooted op first checks that every rank
 * names the same root (root_agreement.c).
 */
#ifndef DT_ALGORITHMS_H
#define DT_ALGORITHMS_H

#include "transport.h"

dt_status algo_run(dt_opctx *o);
/* May algorithm a be forced on ops of kind k? */
bool algo_applies(dt_op_kind k, dt_algo a);
/* The algorithm algo_run will run for op in a world of p: the forced one,
 * or AUTO's choice; DT_ALGO_AUTO for kinds with a single algorithm. */
dt_algo algo_chosen(const dt_op *op, int p);

dt_status allreduce_ring(dt_opctx *o);
dt_status allreduce_recursive_doubling(dt_opctx *o);
dt_status reduce_scatter_ring(dt_opctx *o);
dt_status allgather_ring(dt_opctx *o);   /* allgather and allgatherv */
dt_status broadcast_tree(dt_opctx *o);
dt_status broadcast_chain(dt_opctx *o);
dt_status barrier_dissemination(dt_opctx *o);
dt_status reduce_tree(dt_opctx *o);
dt_status gather_linear(dt_opctx *o);
dt_status scatter_linear(dt_opctx *o);
dt_status alltoall_pairwise(dt_opctx *o);
/* Rooted ops run this first: every rank must name the same root. */
dt_status rooted_op_agree(dt_opctx *o);

#endif /* DT_ALGORITHMS_H */
