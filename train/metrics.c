/*
 * metrics.c — the run's metrics as JSON Lines (one object per line).
 *
 * JSONL because a line is a complete record: a crashed run leaves a file
 * that is valid up to its last line, `tail -f` shows progress, and any tool
 * (jq, pandas.read_json(lines=True)) reads it. Objects are built with
 * jansson and written compactly; every line has "event" (config, step,
 * eval, summary) and the step it belongs to. Only rank 0 writes; each line
 * is flushed so a reader sees it at once (a few hundred bytes per step).
 *
 * A step line carries rank 0's traffic during the step: "bytes_sent" and
 * "bytes_received", the payload of every frame its communicators (the
 * world and each group) wrote and read, as the transport counts it
 * (dt_comm_traffic: headers not included). The summary line has every
 * rank's bytes sent in the last step, "last_step_bytes_sent_by_rank",
 * gathered after the run (so that gather is in no step's count).
 */
#include <stdlib.h>

#include <jansson.h>

#include "trainer.h"

struct mg_metrics {
    FILE *f;
};

static void emit(mg_metrics *mx, json_t *obj)
{
    if (mx && obj) {
        json_dumpf(obj, mx->f, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8));
        fputc('\n', mx->f);
        fflush(mx->f);
    }
    json_decref(obj);
}

mg_metrics *mg_metrics_open(const char *path, const mg_run *r)
{
    mg_metrics *mx = calloc(1, sizeof *mx);
    if (!mx || !(mx->f = fopen(path, "w"))) {
        free(mx);
        return NULL;
    }
    const mg_options *o = &r->o;
    emit(mx,
         json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:I, s:i, s:i, s:i, "
                   "s:f, s:s, s:s, s:f}",
                   "event", "config", "V", o->cfg.V, "C", o->cfg.C, "H", o->cfg.H, "L", o->cfg.L,
                   "T", o->cfg.T, "params", (json_int_t)r->m->num_params, "world_size", r->world,
                   "batch_per_rank", o->batch, "grad_accum", o->grad_accum, "lr", (double)o->lr,
                   "parallel", mg_parallel_name(o->parallel), "data", o->data ? o->data : "task",
                   "bucket_mb", o->bucket_mb));
    return mx;
}

void mg_metrics_step(mg_metrics *mx, int step, const mg_step *s)
{
    if (!mx)
        return;
    json_t *obj = json_pack("{s:s, s:i, s:f, s:f, s:f, s:f, s:f, s:i}", "event", "step", "step",
                            step + 1, "loss", (double)s->loss, "tokens_per_s", s->tokens_per_s,
                            "ms_per_step", s->ms, "comm_ms", s->comm.comm_ms, "exposed_ms",
                            s->comm.exposed_ms, "collectives", s->comm.ops);
    /* "hidden" is absent (not 0) when nothing was communicated */
    if (obj && s->comm.hidden >= 0)
        json_object_set_new(obj, "hidden", json_real(s->comm.hidden));
    if (obj) { /* rank 0's payload bytes, every communicator it holds */
        json_object_set_new(obj, "bytes_sent", json_integer((json_int_t)s->bytes_sent));
        json_object_set_new(obj, "bytes_received", json_integer((json_int_t)s->bytes_recv));
    }
    emit(mx, obj);
}

void mg_metrics_eval(mg_metrics *mx, int step, float val_loss, double acc)
{
    if (!mx)
        return;
    json_t *obj = json_pack("{s:s, s:i, s:f}", "event", "eval", "step", step, "val_loss",
                            (double)val_loss);
    if (obj && acc >= 0)
        json_object_set_new(obj, "accuracy", json_real(acc));
    emit(mx, obj);
}

void mg_metrics_summary(mg_metrics *mx, const mg_run *r, double secs, double mean_hidden,
                        double acc)
{
    if (!mx)
        return;
    json_t *obj = json_pack("{s:s, s:i, s:i, s:f, s:f}", "event", "summary", "steps",
                            r->o.steps - r->start_step, "first_step", r->start_step, "final_loss",
                            (double)r->losses[r->o.steps - 1], "seconds", secs);
    if (obj && mean_hidden >= 0)
        json_object_set_new(obj, "mean_hidden", json_real(mean_hidden));
    if (obj && acc >= 0)
        json_object_set_new(obj, "accuracy", json_real(acc));
    if (obj && r->bytes_sent_by_rank) { /* the last step's, rank by rank */
        json_t *a = json_array();
        for (int q = 0; q < r->world; q++)
            json_array_append_new(a, json_integer((json_int_t)r->bytes_sent_by_rank[q]));
        json_object_set_new(obj, "last_step_bytes_sent_by_rank", a);
    }
    if (obj && r->zero1)
        json_object_set_new(obj, "optimizer_bytes_per_rank",
                            json_integer((json_int_t)dt_zero1_optimizer_bytes(r->zero1)));
    emit(mx, obj);
}

void mg_metrics_close(mg_metrics *mx)
{
    if (!mx)
        return;
    fclose(mx->f);
    free(mx);
}
