/*
 * rank_order.c — one summation order for the gradient in every mode
 * (minigpt --deterministic; PyTorch's use_deterministic_algorithms in
 * spirit): DDP, ZeRO-1, -2 and -3 on N ranks end with bitwise the
 * parameters of one process accumulating N micro-steps.
 *
 * Why they differ otherwise. Floating-point addition is not associative,
 * and each mode adds the same numbers in its own grouping: DDP's ring
 * all-reduce sums chunk c starting after its owner, ZeRO's tree reduce
 * as a balanced tree, and every backward after the first of a step adds
 * its gradients into the running sum layer by layer (sgemm with beta = 1),
 * not as one sum of two finished gradients. Each divides by k (dloss =
 * 1/k) before summing and by N after.
 *
 * The order fixed here, for k micro-steps on N ranks, element by element:
 *   1. every backward gets dloss = 1 and writes into zeroed gradients, so
 *      micro-step j's gradient g_j is computed the same way everywhere;
 *   2. micro-steps are summed left to right, ((g_0 + g_1) + g_2) + ...:
 *      from the second one on, the running sum is kept aside (a copy of
 *      the gradients, or ZeRO-2's accumulation buffer) and added as
 *      (sum + g_j) just before each bucket leaves, from backward's hook,
 *      so the buckets still overlap backward;
 *   3. ranks are folded x_0 + x_1 + ... + x_(N-1) in rank order by the
 *      collectives' DT_ALGO_RANK_ORDER (collectives/algorithms/
 *      rank_order.c): DDP's all-reduce and ZeRO's reduce to an owner add
 *      each element in the same order, whoever owns it;
 *   4. the result is divided once, by k·N.
 * One process with k = N micro-steps does 1, 2 and 4 with the same
 * numbers in the same order as N ranks with k = 1 do 1, 3 and 4, so they
 * agree bit for bit. With k > 1 on N > 1 ranks the modes agree with each
 * other but not with one process of N·k micro-steps: that process sums
 * all N·k left to right, the ranks sum k, then N (another grouping).
 *
 * Cost. Memory: the running sum, Ψ floats, only when k > 1 (ZeRO-2/3 use
 * the accumulation buffer they already keep then). Time: a copy of the
 * gradients at the second micro-step, one add per element per later
 * micro-step, and the division; the rank-order collectives move the
 * ring's bytes but sum after the transfers instead of beneath them.
 * Host memory only: the CUDA backend is refused.
 */
#include <stdio.h>
#include <string.h>

#include "optim_internal.h"

dt_status optim_rank_order_enable(optim_rank_order *ro, const dt_model *m, char *err, size_t errlen)
{
    if (strncmp(m->be->name, "cuda", 4) == 0) {
        snprintf(err, errlen,
                 "deterministic sums run on host memory: the %s backend is not supported",
                 m->be->name);
        return DT_EINVAL;
    }
    *ro = (optim_rank_order){.on = true, .be = m->be};
    return DT_OK;
}

void optim_rank_order_free(optim_rank_order *ro)
{
    if (ro->aside)
        ro->be->free(ro->aside);
    ro->aside = NULL;
}

void optim_rank_order_op(const optim_rank_order *ro, dt_op *op)
{
    if (ro->on) {
        op->redop = DT_SUM;
        op->algo = DT_ALGO_RANK_ORDER;
    }
}

/* dst[i] = sum[i] + dst[i]: the running sum first, as one process adds. */
static void add_sum_first(float *dst, const float *sum, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = sum[i] + dst[i];
}

void optim_rank_order_add(float *sum, const float *next, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sum[i] = sum[i] + next[i];
}

dt_status optim_rank_order_before(optim_rank_order *ro, float *grads, size_t n, bool sync)
{
    ro->folding = false;
    if (!ro->on || ro->micro == 0)
        return DT_OK;
    if (ro->micro == 1) { /* the first micro-step's gradient becomes the sum */
        if (!ro->aside && !(ro->aside = ro->be->alloc(n * sizeof(float))))
            return DT_ENOMEM;
        memcpy(ro->aside, grads, n * sizeof(float));
    }
    memset(grads, 0, n * sizeof(float));
    ro->folding = sync;
    return DT_OK;
}

void optim_rank_order_fold(const optim_rank_order *ro, float *grads, size_t lo, size_t n)
{
    if (ro->folding)
        add_sum_first(grads + lo, ro->aside + lo, n);
}

void optim_rank_order_after(optim_rank_order *ro, float *grads, size_t n, bool sync, bool hooked)
{
    if (!ro->on)
        return;
    if (ro->micro > 0 && !sync) { /* sum += g_j; the next backward starts from zero */
        optim_rank_order_add(ro->aside, grads, n);
        memset(grads, 0, n * sizeof(float));
    } else if (ro->folding && !hooked) {
        optim_rank_order_fold(ro, grads, 0, n); /* no bucket left early: all at once */
    }
    ro->folding = false;
    ro->micro++;
}

void optim_rank_order_divide(optim_rank_order *ro, float *x, size_t n, int world)
{
    if (!ro->on)
        return;
    const float by = (float)((ro->micro > 0 ? ro->micro : 1) * world);
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] / by;
    ro->micro = 0;
}
