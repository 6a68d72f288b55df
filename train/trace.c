/*
 * trace.c — minigpt --trace FILE: what every rank did, when, as a Chrome
 * trace-event JSON file (opens in Perfetto or chrome://tracing).
 *
 * Each rank records slices in memory while it trains: a pipeline stage
 * every action of its schedule (F, B, W, each send and receive from its
 * post to its completion, STEP's wait for the last sends) from the
 * executor's timeline; data parallelism each micro-step's forward and
 * backward; both each DDP bucket's all-reduce (launch to completion as
 * this rank saw it), each ZeRO gradient piece's reduce to its owner
 * ("reduce piece", likewise; ZeRO-1, and ZeRO-2 and -3 on a pipeline stage),
 * and the optimizer step (ZeRO's includes waiting for those reduces and
 * its all-gather); tensor parallelism each micro-step's
 * forward and backward and, inside them, every f and g all-reduce as its
 * own slice named for its site ("g: the MLP output", layer in args), then
 * the step's all-gather of the shares and, with --dp, the all-reduce of
 * the share's gradients. A collective's slice carries "bytes" (its
 * buffer) and "sent" (the payload this rank sent for it, as the transport
 * counted it). At the end the ranks send their slices
 * to rank 0 (a gather of the counts, then one message per rank), which
 * writes one "X" (complete) event per slice, one track per rank:
 *
 *   {"traceEvents": [{"name": "F", "cat": "compute", "ph": "X",
 *     "ts": 1234.5, "dur": 210.0, "pid": 0, "tid": 1,
 *     "args": {"mb": 3, "step": 0}}, ...], "displayTimeUnit": "ms"}
 *
 * Timestamps are microseconds on CLOCK_MONOTONIC, from the earliest slice
 * of the job: the ranks of one machine share that clock, so the tracks
 * line up; ranks on other machines would each be right but offset.
 *
 * Cost: 48 bytes a slice in memory (a pipelined step of m micro-batches
 * is about 7m slices per stage), nothing sent until the end.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "trainer.h"

#define TRACE_TAG 0x7ace0000u

typedef struct mg_event {
    double t0, t1;       /* seconds, CLOCK_MONOTONIC */
    int64_t bytes, sent; /* a collective's buffer and this rank's payload sent; -1 none */
    int32_t kind;        /* a dt_pipe_op, or an mg_event_kind */
    int32_t arg;         /* micro-batch, micro-step, bucket or layer; -1 none */
    int32_t step;
    int32_t site; /* MG_EV_TP_ALLREDUCE: a dt_tp_site; else -1 */
} mg_event;

struct mg_trace {
    mg_event *ev;
    size_t n, cap;
    int step; /* the step slices are being recorded for */
};

mg_trace *mg_trace_open(void)
{
    return calloc(1, sizeof(mg_trace));
}

void mg_trace_close(mg_trace *t)
{
    if (t)
        free(t->ev);
    free(t);
}

void mg_trace_set_step(mg_trace *t, int step)
{
    if (t)
        t->step = step;
}

void mg_trace_add_comm(mg_trace *t, int kind, int arg, int site, uint64_t bytes, uint64_t sent,
                       double t0, double t1)
{
    if (!t || t1 < t0 || t0 <= 0)
        return;
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 1024;
        mg_event *ev = realloc(t->ev, cap * sizeof *ev);
        if (!ev)
            return; /* a trace short of memory loses slices, not the run */
        t->ev = ev;
        t->cap = cap;
    }
    t->ev[t->n++] = (mg_event){t0, t1, (int64_t)bytes, (int64_t)sent, kind, arg, t->step, site};
}

void mg_trace_add(mg_trace *t, int kind, int arg, double t0, double t1)
{
    mg_trace_add_comm(t, kind, arg, -1, (uint64_t)-1, (uint64_t)-1, t0, t1);
}

void mg_trace_tp(void *user, dt_tp_site site, int layer, size_t bytes, uint64_t sent, double t0,
                 double t1)
{
    mg_trace_add_comm(user, MG_EV_TP_ALLREDUCE, layer, (int)site, bytes, sent, t0, t1);
}

void mg_trace_pipe(mg_trace *t, const dt_pipe *p, const dt_pipe_schedule *s, int stage)
{
    const double *t0, *t1;
    if (!t)
        return;
    dt_pipe_last_timeline(p, &t0, &t1);
    for (int i = 0; i < s->n[stage]; i++) {
        const dt_pipe_action *a = &s->actions[stage][i];
        mg_trace_add(t, (int)a->op, a->mb, t0[i], t1[i]);
    }
}

void mg_trace_ddp(mg_trace *t, const dt_ddp *d)
{
    for (int i = 0; t && d && i < dt_ddp_num_buckets(d); i++) {
        double a, b;
        if (dt_ddp_bucket_times(d, i, &a, &b))
            mg_trace_add(t, MG_EV_ALLREDUCE, i, a, b);
    }
}

void mg_trace_zero1(mg_trace *t, const dt_zero1 *z)
{
    for (int i = 0; t && z && i < dt_zero1_num_buckets(z); i++) {
        double a, b;
        if (dt_zero1_piece_times(z, i, &a, &b))
            mg_trace_add(t, MG_EV_REDUCE, i, a, b);
    }
}

static const char *kind_name(const mg_event *e)
{
    int k = e->kind;
    switch (k) {
    case MG_EV_TP_ALLREDUCE: return dt_tp_site_name((dt_tp_site)e->site);
    case MG_EV_TP_GATHER: return "all-gather of the shares";
    case MG_EV_TP_DP: return "dp all-reduce of the share's gradients";
    case MG_EV_TP_DP_SCATTER: return "dp reduce-scatter of the share's gradients";
    case MG_EV_TP_DP_GATHER: return "dp all-gather of the share's pieces";
    case MG_EV_FORWARD: return "forward";
    case MG_EV_BACKWARD: return "backward";
    case MG_EV_ALLREDUCE: return "allreduce bucket";
    case MG_EV_REDUCE: return "reduce piece";
    case MG_EV_OPTIMIZER: return "optimizer step";
    default: return k >= 0 && k < DT_PIPE_NUM_OPS ? dt_pipe_op_name((dt_pipe_op)k) : "?";
    }
}

static const char *kind_category(int k)
{
    switch (k) {
    case DT_PIPE_SEND_ACT:
    case DT_PIPE_RECV_ACT:
    case DT_PIPE_SEND_GRAD:
    case DT_PIPE_RECV_GRAD:
    case DT_PIPE_STEP: return "p2p";
    case MG_EV_ALLREDUCE:
    case MG_EV_REDUCE:
    case MG_EV_TP_ALLREDUCE:
    case MG_EV_TP_GATHER:
    case MG_EV_TP_DP:
    case MG_EV_TP_DP_SCATTER:
    case MG_EV_TP_DP_GATHER: return "collective";
    case MG_EV_OPTIMIZER: return "optimizer";
    default: return "compute";
    }
}

/* Rank 0: every rank's slices, all[q] with n[q] of them. */
static dt_status collect(const mg_run *r, const mg_trace *t, mg_event **all, int64_t *n)
{
    int64_t mine = (int64_t)t->n;
    dt_status st = DT_OK;
    if (r->comm)
        st = dt_gather(r->comm, &mine, n, 1, DT_I64, 0);
    else
        n[0] = mine;
    if (st != DT_OK || r->rank != 0) {
        if (st == DT_OK && r->comm && mine > 0)
            st = dt_send(r->comm, t->ev, (size_t)mine * sizeof(mg_event), DT_U8, 0, TRACE_TAG);
        return st;
    }
    all[0] = t->ev;
    for (int q = 1; q < r->world && st == DT_OK; q++) {
        all[q] = malloc((size_t)(n[q] > 0 ? n[q] : 1) * sizeof(mg_event));
        if (!all[q])
            return DT_ENOMEM;
        if (n[q] > 0)
            st = dt_recv(r->comm, all[q], (size_t)n[q] * sizeof(mg_event), DT_U8, q, TRACE_TAG,
                         NULL);
    }
    return st;
}

/* The track's name: the rank, and in a pipeline its stage and replica. */
static json_t *track_name(const mg_run *r, int q)
{
    char name[64];
    if (r->pipe)
        snprintf(name, sizeof name, "rank %d (stage %d, replica %d)", q, q / r->dp, q % r->dp);
    else if (r->tp)
        snprintf(name, sizeof name, "rank %d (tp rank %d, replica %d)", q, q % r->o.tp,
                 q / r->o.tp);
    else
        snprintf(name, sizeof name, "rank %d", q);
    return json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "name", "thread_name", "ph", "M", "pid", 0,
                     "tid", q, "args", "name", name);
}

static json_t *to_json(const mg_run *r, mg_event **all, const int64_t *n)
{
    double origin = 0;
    for (int q = 0; q < r->world; q++)
        for (int64_t i = 0; i < n[q]; i++)
            if (origin == 0 || all[q][i].t0 < origin)
                origin = all[q][i].t0;
    json_t *events = json_array();
    for (int q = 0; q < r->world; q++) {
        json_array_append_new(events, track_name(r, q));
        for (int64_t i = 0; i < n[q]; i++) {
            const mg_event *e = &all[q][i];
            const char *arg = e->kind == MG_EV_ALLREDUCE      ? "bucket"
                              : e->kind == MG_EV_REDUCE       ? "piece"
                              : e->kind == MG_EV_TP_ALLREDUCE ? "layer"
                              : e->kind < DT_PIPE_NUM_OPS     ? "mb"
                                                              : "micro_step";
            json_t *args = json_pack("{s:i}", "step", e->step);
            if (e->arg >= 0)
                json_object_set_new(args, arg, json_integer(e->arg));
            if (e->bytes >= 0)
                json_object_set_new(args, "bytes", json_integer(e->bytes));
            if (e->sent >= 0)
                json_object_set_new(args, "sent", json_integer(e->sent));
            json_array_append_new(events,
                                  json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i, s:o}", "name",
                                            kind_name(e), "cat", kind_category(e->kind), "ph", "X",
                                            "ts", 1e6 * (e->t0 - origin), "dur",
                                            1e6 * (e->t1 - e->t0), "pid", 0, "tid", q, "args",
                                            args));
        }
    }
    return json_pack("{s:o, s:s}", "traceEvents", events, "displayTimeUnit", "ms");
}

dt_status mg_trace_write(mg_trace *t, mg_run *r, const char *path)
{
    mg_event **all = calloc((size_t)r->world, sizeof *all);
    int64_t *n = calloc((size_t)r->world, sizeof *n);
    dt_status st = all && n ? collect(r, t, all, n) : DT_ENOMEM;
    if (st == DT_OK && r->rank == 0) {
        json_t *doc = to_json(r, all, n);
        if (!doc || json_dump_file(doc, path, JSON_COMPACT) != 0) {
            snprintf(r->err, sizeof r->err, "rank 0: trace: cannot write %s", path);
            st = DT_ESYS;
        } else {
            printf("trace: %s (open it in Perfetto or chrome://tracing)\n", path);
        }
        json_decref(doc);
    } else if (st != DT_OK) {
        snprintf(r->err, sizeof r->err,
                 "rank %d: trace: "
                 "collecting the slices: %s",
                 r->rank, r->comm ? dt_comm_error(r->comm) : dt_status_name(st));
    }
    for (int q = 1; all && q < r->world; q++)
        free(all[q]);
    free(all);
    free(n);
    return st;
}
