/*
 * tp_allreduce.c — the one collective of tensor parallelism: Megatron's
 * g in forward and f in backward, an in-place all-reduce of a (B, T, C)
 * activation (or of the cross-entropy's row statistics) over the tp group.
 *
 * Every call is blocking: the next layer needs the sum. The all-reduce
 * gives every rank the same bits, which is what keeps the replicated
 * computation after it — and so the replicated parameters — identical
 * across the group. Cost (ring): 2 (tp-1)/tp n floats sent per rank,
 * 2 (tp-1) latency steps; up to 64 KiB the communicator runs recursive
 * doubling instead, log2 tp times n.
 *
 * Each call is named by its site (dt_tp_site) and, when the caller set
 * m->trace, reported to it with its times and the bytes this rank sent
 * for it (two readings of the tp group's counters, which only this layer
 * uses during a forward or backward): that is how minigpt --trace shows
 * every f and g as its own slice.
 */
#include <stdio.h>

#include "dt_clock.h"
#include "tp_internal.h"

static const char *const site_names[DT_TP_NUM_SITES] = {
    [DT_TP_EMBEDDING] = "the token embedding",
    [DT_TP_ATTN_OUT] = "g: the attention output",
    [DT_TP_MLP_OUT] = "g: the MLP output",
    [DT_TP_LOGIT_MAX] = "the logits' row maxima",
    [DT_TP_LOGIT_SUMS] = "the softmax sums and target logits",
    [DT_TP_HEAD_GRAD] = "f: the head's input grad",
    [DT_TP_MLP_GRAD] = "f: the MLP's input grad",
    [DT_TP_ATTN_GRAD] = "f: the attention's input grad",
};

const char *dt_tp_site_name(dt_tp_site s)
{
    return s >= 0 && s < DT_TP_NUM_SITES ? site_names[s] : "?";
}

dt_status tp_allreduce(dt_tp_model *m, float *buf, size_t n, dt_redop op, dt_tp_site site,
                       int layer)
{
    dt_traffic a = {0}, b = {0};
    double t0 = 0;
    if (m->trace) {
        dt_comm_traffic(m->comm, &a);
        t0 = dt_now();
    }
    dt_status st = dt_allreduce(m->comm, buf, n, DT_F32, op);
    if (st != DT_OK) {
        char where[24] = "";
        if (layer >= 0)
            snprintf(where, sizeof where, " (layer %d)", layer);
        snprintf(m->err, sizeof m->err, "tensor parallel rank %d/%d: all-reduce of %s%s: %s: %s",
                 m->rank, m->tp, dt_tp_site_name(site), where, dt_status_name(st),
                 dt_comm_error(m->comm));
        return st;
    }
    if (m->trace) {
        double t1 = dt_now();
        dt_comm_traffic(m->comm, &b);
        m->trace(m->trace_user, site, layer, n * sizeof(float), b.sent_bytes - a.sent_bytes, t0,
                 t1);
    }
    return DT_OK;
}
