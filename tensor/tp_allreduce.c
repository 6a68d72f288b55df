/*
 * tp_allreduce.c — the one collective of tensor parallelism: Megatron's
 * g in forward and f in backward, an in-place all-reduce of a (B, T, C)
 * activation (or of the cross-entropy's row statistics) over the tp group.
 *
 * Every call is blocking: the next layer needs the sum. The all-reduce
 * gives every rank the same bits, which is what keeps the replicated
 * computation after it — and so the replicated parameters — identical
 * across the group. Cost (ring): 2 (tp-1)/tp n floats sent per rank,
 * 2 (tp-1) latency steps.
 */
#include <stdio.h>

#include "tp_internal.h"

dt_status tp_allreduce(dt_tp_model *m, float *buf, size_t n, dt_redop op, const char *what)
{
    dt_status st = dt_allreduce(m->comm, buf, n, DT_F32, op);
    if (st != DT_OK)
        snprintf(m->err, sizeof m->err, "tensor parallel rank %d/%d: all-reduce of %s: %s: %s",
                 m->rank, m->tp, what, dt_status_name(st), dt_comm_error(m->comm));
    return st;
}
