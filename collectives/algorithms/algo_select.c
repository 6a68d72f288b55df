/*
 * algo_select.c — which algorithm runs an op.
 *
 * Each collective has one or two algorithms (see their files for the
 * pictures and costs). With op->algo == DT_ALGO_AUTO the choice is made
 * from the message size and the world size; tests and benchmarks may force
 * one with op->algo, and forcing one that does not implement the op's kind
 * (a chain all-reduce, say) is DT_EINVAL, not a silent substitution.
 *
 *   kind             algorithms                     AUTO
 *   allreduce        ring, recursive doubling,      RD if small, else ring;
 *                    rank order                     f16/bf16 sum: rank order
 *   reduce_scatter   ring, rank order               ring; f16/bf16 sum: r. o.
 *   allgather(v)     ring                           ring
 *   broadcast        binomial tree, chain           tree if small, else chain
 *   reduce           binomial tree, rank order      tree; f16/bf16 sum: r. o.
 *   barrier, gather, scatter, alltoall: one algorithm each, AUTO only
 *
 * Rank order (rank_order.c) is AUTO's choice for one case only: sums and
 * averages of f16/bf16 (all-reduce, reduce-scatter, reduce), which it adds
 * in an f32 accumulator and rounds once, where the ring, recursive
 * doubling and the tree round every partial sum to 16 bits on its way
 * (reduce.h; docs/15-mixed-precision.md has the error bound). It moves the
 * ring's bytes; it gives up the ring's overlap of sums and wire. For every
 * other (dtype, op) it is for callers that need x0 + x1 + ... + x(p-1)
 * summed in that order (minigpt --deterministic). Forcing the ring on a
 * bf16 sum still runs the ring, rounding per hop.
 *
 * Whatever the algorithm, a rooted op (broadcast, reduce, gather, scatter)
 * first runs the root agreement (root_agreement.c).
 *
 * The choice is a pure function of (kind, algo, count, dtype, p), all of
 * which every rank agrees on, so every rank picks the same algorithm:
 * ranks running different algorithms would pair up the wrong messages.
 * (Send and receive are not collectives; the transport runs them.)
 */
#include "algorithms.h"
#include "reduce.h"

/*
 * All-reduce: recursive doubling costs log2(p)(α + nβ), the ring
 * 2(p-1)α + 2((p-1)/p)nβ. For p a power of two they cross where the
 * ring's extra latencies equal recursive doubling's extra bytes,
 *   n* = α/β · (2(p-1) - log2 p) / (log2 p - 2(p-1)/p):
 * 8 α/β for p = 4, 8.8 α/β for p = 8 (and for p = 2 recursive doubling
 * always wins in the model). Other p pay for the fold, two more rounds of
 * the whole buffer: n* ≈ 0.6 α/β for p = 3, 1.7 α/β for p = 5. On
 * loopback TCP α/β is ~30 µs × 3 GB/s ≈ 100 KB. The model flatters
 * recursive doubling, though: it reduces the whole buffer every round with
 * the network idle, where the ring reduces (p-1)/p of it once, hidden
 * behind the transfers. 64 KiB is near the crossover for p = 3 and below
 * it otherwise; dtrain-bench with a forced algorithm is the way to retune
 * it for a given network.
 * Regardless of size, a buffer of fewer elements than ranks would leave
 * ring chunks empty (steps of nothing but latency): recursive doubling.
 */
#define ALLREDUCE_RECURSIVE_DOUBLING_MAX_BYTES ((size_t)64 * 1024)

/*
 * Broadcast: the binomial tree costs ⌈log2 p⌉(α + nβ); the chain, with
 * k = n / 1 MiB segments (broadcast_chain.c), (p-2+k)(α + nβ/k), which
 * tends to nβ. At or below one segment the chain cannot pipeline and
 * always loses (p-1 hops of the whole buffer against ⌈log2 p⌉), so the
 * tree takes everything up to 1 MiB; above, with k >= 2, the chain's
 * (p-2+k)/k of a buffer time beats the tree's ⌈log2 p⌉ from p = 4 on.
 * With two ranks both are the same single transfer: the tree, which sends
 * it as one message.
 */
#define BROADCAST_TREE_MAX_BYTES ((size_t)1024 * 1024)

/* The algorithm AUTO stands for, for an all-reduce or a broadcast of
 * `bytes`, or for a 16-bit float sum; the forced one otherwise. */
dt_algo comm_algo_chosen(const dt_op *op, int p)
{
    const size_t bytes = op->count * dt_dtype_size(op->dtype);
    if (op->algo != DT_ALGO_AUTO)
        return op->algo;
    if (dt_reduce_widens(op->dtype, op->redop) &&
        (op->kind == DT_OP_ALLREDUCE || op->kind == DT_OP_REDUCE_SCATTER ||
         op->kind == DT_OP_REDUCE))
        return DT_ALGO_RANK_ORDER; /* f32 accumulator, one rounding */
    switch (op->kind) {
    case DT_OP_ALLREDUCE:
        return bytes <= ALLREDUCE_RECURSIVE_DOUBLING_MAX_BYTES || op->count < (size_t)p
                   ? DT_ALGO_RECURSIVE_DOUBLING
                   : DT_ALGO_RING;
    case DT_OP_BROADCAST:
        return bytes <= BROADCAST_TREE_MAX_BYTES || p <= 2 ? DT_ALGO_TREE : DT_ALGO_CHAIN;
    default: return DT_ALGO_AUTO; /* one algorithm: nothing to choose */
    }
}

static dt_status run_allreduce(dt_opctx *o)
{
    switch (comm_algo_chosen(o->op, o->size)) {
    case DT_ALGO_RING: return comm_allreduce_ring(o);
    case DT_ALGO_RECURSIVE_DOUBLING: return comm_allreduce_recursive_doubling(o);
    case DT_ALGO_RANK_ORDER: return comm_allreduce_rank_order(o);
    default: return DT_EINVAL;
    }
}

static dt_status run_broadcast(dt_opctx *o)
{
    switch (comm_algo_chosen(o->op, o->size)) {
    case DT_ALGO_TREE: return comm_broadcast_tree(o);
    case DT_ALGO_CHAIN: return comm_broadcast_chain(o);
    default: return DT_EINVAL;
    }
}

/* The one table of which algorithm may be forced on which op (validate.c
 * refuses the rest before an op is queued, so comm_algo_run never sees them). */
bool comm_algo_applies(dt_op_kind k, dt_algo a)
{
    switch (a) {
    case DT_ALGO_AUTO: return true;
    case DT_ALGO_RING:
        return k == DT_OP_ALLREDUCE || k == DT_OP_REDUCE_SCATTER || k == DT_OP_ALLGATHER ||
               k == DT_OP_ALLGATHERV;
    case DT_ALGO_RECURSIVE_DOUBLING: return k == DT_OP_ALLREDUCE;
    case DT_ALGO_TREE: return k == DT_OP_BROADCAST || k == DT_OP_REDUCE;
    case DT_ALGO_CHAIN: return k == DT_OP_BROADCAST;
    case DT_ALGO_RANK_ORDER:
        return k == DT_OP_ALLREDUCE || k == DT_OP_REDUCE_SCATTER || k == DT_OP_REDUCE;
    }
    return false;
}

static bool is_rooted(dt_op_kind k)
{
    return k == DT_OP_BROADCAST || k == DT_OP_REDUCE || k == DT_OP_GATHER || k == DT_OP_SCATTER;
}

dt_status comm_algo_run(dt_opctx *o)
{
    const dt_op *op = o->op;
    if (is_rooted(op->kind)) {
        dt_status st = comm_root_agree(o);
        if (st != DT_OK)
            return st;
    }
    switch (op->kind) {
    case DT_OP_ALLREDUCE: return run_allreduce(o);
    case DT_OP_REDUCE_SCATTER:
        return comm_algo_chosen(op, o->size) == DT_ALGO_RANK_ORDER
                   ? comm_reduce_scatter_rank_order(o)
                   : comm_reduce_scatter_ring(o);
    case DT_OP_ALLGATHER:
    case DT_OP_ALLGATHERV: return comm_allgather_ring(o);
    case DT_OP_BROADCAST: return run_broadcast(o);
    case DT_OP_REDUCE:
        return comm_algo_chosen(op, o->size) == DT_ALGO_RANK_ORDER ? comm_reduce_rank_order(o)
                                                                   : comm_reduce_tree(o);
    case DT_OP_BARRIER: return comm_barrier_dissemination(o);
    case DT_OP_GATHER: return comm_gather_linear(o);
    case DT_OP_SCATTER: return comm_scatter_linear(o);
    case DT_OP_ALLTOALL: return comm_alltoall_pairwise(o);
    default: /* send, recv: point to point, not an algorithm */ return DT_EINVAL;
    }
}
