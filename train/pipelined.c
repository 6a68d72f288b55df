/*
 * pipelined.c — minigpt's pipelined step: `--pp P` cuts the model into P
 * stages, one per rank, and every step streams `--microbatches M`
 * micro-batches through them on the chosen schedule (pipeline/).
 *
 * Same arithmetic as one process with `--grad-accum M`: micro-batch j of
 * step s reads rows s·M·B + j·B .. +B (rank 0 of data parallelism), each
 * micro-batch's loss is scaled by 1/M, the last stage adds the losses in
 * micro-batch order and broadcasts their mean for the step line. Each rank
 * then runs AdamW on its own stage's parameters: with one pipeline (data
 * parallelism 1, world = P) there is no gradient to synchronise. The
 * validation loss, the task's accuracy and the sample need the whole model
 * on one rank, so a pipelined run skips them; it prints instead each
 * stage's blocks, memory and measured bubble beside the closed form.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trainer.h"
#include "dt_clock.h"

static dt_status pipe_fail(mg_run *r, dt_status st, const char *what,
                           const char *detail)
{
    snprintf(r->err, sizeof r->err, "rank %d: %s: %s", r->rank, what, detail);
    return st;
}

int mg_microbatches(const mg_options *o)
{
    return o->microbatches > 0 ? o->microbatches : o->grad_accum;
}

/* The schedule and this rank's stage of the model. */
static dt_status open_stage(mg_run *r, int M)
{
    const mg_options *o = &r->o;
    char err[256];
    int *bounds = malloc(((size_t)o->pp + 1) * sizeof(int));
    dt_pipe_kind kind;
    dt_pipe_partition_kind pk;
    dt_pipe_kind_parse(o->schedule, &kind); /* cli.c checked both */
    dt_pipe_partition_parse(o->pp_partition, &pk);
    if (!bounds)
        return pipe_fail(r, DT_ENOMEM, "pipeline", "out of memory");
    dt_status st = dt_pipe_partition(bounds, &o->cfg, o->pp, pk, err,
                                     sizeof err);
    if (st == DT_OK && !(r->sched = dt_pipe_schedule_create(kind, o->pp, M,
                                                            err, sizeof err)))
        st = DT_EINVAL;
    if (st != DT_OK) {
        free(bounds);
        return pipe_fail(r, st, "pipeline", err);
    }
    int s = r->rank;
    dt_stage_spec sp = {bounds[s], bounds[s + 1], r->sched->act_slots[s],
                        r->sched->grad_slots[s]};
    free(bounds);
    st = dt_model_create_stage(&r->m, &o->cfg, dt_backend_cpu(), o->batch,
                               &sp);
    if (st != DT_OK)
        return pipe_fail(r, st, "model",
                         r->m ? dt_model_error(r->m) : "out of memory");
    dt_model_init(r->m, o->seed); /* this stage's slice of the full init */
    return DT_OK;
}

dt_status mg_pipe_open(mg_run *r)
{
    const mg_options *o = &r->o;
    int M = mg_microbatches(o);
    if (r->world != o->pp) {
        char msg[256];
        snprintf(msg, sizeof msg, "--pp %d needs a world of exactly %d ranks "
                 "(this one has %d): pipeline stages do not compose with "
                 "data parallelism yet; run dtrain-launch -n %d", o->pp,
                 o->pp, r->world, o->pp);
        return pipe_fail(r, DT_EINVAL, "pipeline", msg);
    }
    dt_status st = open_stage(r, M);
    if (st != DT_OK)
        return st;
    size_t n = (size_t)M * o->batch * o->cfg.T;
    r->x = malloc(n * sizeof(int));
    r->y = malloc(n * sizeof(int));
    r->losses = calloc((size_t)o->steps, sizeof(float));
    if (!r->x || !r->y || !r->losses)
        return pipe_fail(r, DT_ENOMEM, "trainer", "out of memory");
    r->h = dt_adamw_defaults(o->lr);
    st = dt_pipe_create(&r->pipe, r->comm, r->m, r->sched);
    if (st != DT_OK)
        return pipe_fail(r, st, "pipeline", dt_pipe_error(r->pipe));
    return DT_OK;
}

void mg_pipe_close(mg_run *r)
{
    dt_pipe_destroy(r->pipe);
    dt_pipe_schedule_destroy(r->sched);
    r->pipe = NULL;
    r->sched = NULL;
}

/* The step's micro-batches: rows step·M·B + j·B .. +B, j = 0 .. M-1. */
static dt_status load_microbatches(mg_run *r, int step, int M)
{
    const mg_options *o = &r->o;
    size_t rows = (size_t)o->batch * o->cfg.T;
    uint64_t row = r->row0 + (uint64_t)(step - r->start_step) * M * o->batch;
    for (int j = 0; j < M; j++) {
        dt_status st = dt_dataset_batch(r->x + j * rows, r->y + j * rows,
                                        r->data, DT_TRAIN, o->seed,
                                        row + (uint64_t)j * o->batch,
                                        o->batch, o->cfg.T);
        if (st != DT_OK)
            return pipe_fail(r, st, "data", dt_dataset_error(r->data));
    }
    return DT_OK;
}

/* Adds this step's stage times to the run's (the first step warms up). */
static void add_stats(mg_run *r, int step)
{
    dt_pipe_stats ps;
    dt_pipe_last_stats(r->pipe, &ps);
    if (step == r->start_step && r->o.steps - r->start_step > 1)
        return;
    r->pipe_wall_s += ps.wall_s;
    r->pipe_compute_s += ps.op_s[DT_PIPE_F] + ps.op_s[DT_PIPE_B] +
                         ps.op_s[DT_PIPE_W];
}

dt_status mg_pipe_step(mg_run *r, int step, mg_step *out)
{
    const mg_options *o = &r->o;
    int M = mg_microbatches(o), last = r->rank == o->pp - 1;
    size_t rows = (size_t)o->batch * o->cfg.T;
    const int *in[M], *tg[M];
    double t0 = dt_now();
    dt_status st = load_microbatches(r, step, M);
    if (st != DT_OK)
        return st;
    for (int j = 0; j < M; j++)
        in[j] = r->x + j * rows, tg[j] = r->y + j * rows;
    float loss = 0;
    dt_model_zero_grad(r->m);
    st = dt_pipe_run(r->pipe, r->rank == 0 ? in : NULL, last ? tg : NULL,
                     o->batch, o->cfg.T, &loss);
    if (st != DT_OK)
        return pipe_fail(r, st, "pipeline", dt_pipe_error(r->pipe));
    add_stats(r, step);
    st = dt_model_update(r->m, &r->h, step + 1);
    if (st != DT_OK)
        return pipe_fail(r, st, "update", dt_model_error(r->m));
    out->ms = 1e3 * (dt_now() - t0);
    if (r->comm && (st = dt_broadcast(r->comm, &loss, 1, DT_F32,
                                      o->pp - 1)) != DT_OK)
        return pipe_fail(r, st, "loss broadcast", dt_comm_error(r->comm));
    out->loss = loss;
    out->comm.hidden = -1;
    r->losses[step] = loss;
    out->tokens_per_s = (double)M * rows / (out->ms * 1e-3);
    return DT_OK;
}

/* The bubble as a fraction of the step, with unit costs F = 1, B = 2
 * (ZB-H1: input half 1, W 1; for m >= p only). */
static double closed_form_bubble(dt_pipe_kind k, int p, int m)
{
    double work = 3.0 * m, idle = k == DT_PIPE_ZB ? p - 1 : 3.0 * (p - 1);
    return idle / (work + idle);
}

enum { PF_L0, PF_L1, PF_PARAMS, PF_ACT_SETS, PF_GRAD_SETS, PF_WALL,
       PF_COMPUTE, PF_FIELDS };

dt_status mg_report_pipeline(FILE *f, const mg_run *r)
{
    const dt_model *m = r->m;
    double mine[PF_FIELDS] = {m->l0, m->l1, (double)m->num_params,
                              m->act_slots, m->grad_slots, r->pipe_wall_s,
                              r->pipe_compute_s};
    double *all = calloc((size_t)r->world * PF_FIELDS, sizeof *all);
    if (!all)
        return DT_ENOMEM;
    dt_status st = DT_OK;
    if (r->comm)
        st = dt_gather(r->comm, mine, all, PF_FIELDS, DT_F64, 0);
    else
        memcpy(all, mine, sizeof mine);
    const dt_pipe_schedule *s = r->sched;
    if (st == DT_OK && r->rank == 0) {
        fprintf(f, "pipeline: %s, %d stages, %d micro-batches; bubble = idle "
                   "share of the step (measured: 1 - compute/wall, mean over "
                   "steps after the first; closed form with B = 2F%s)\n",
                dt_pipe_kind_name(s->kind), s->p, s->m,
                s->kind == DT_PIPE_ZB ? ", W = F" : "");
        fprintf(f, "  %5s %9s %11s %9s %9s %9s %12s\n", "stage", "blocks",
                "params", "act sets", "grad sets", "bubble", "closed form");
        for (int q = 0; q < r->world; q++) {
            double *v = all + (size_t)q * PF_FIELDS;
            char blocks[24];
            snprintf(blocks, sizeof blocks, "[%d, %d)", (int)v[PF_L0],
                     (int)v[PF_L1]);
            double bubble = v[PF_WALL] > 0 ? 1 - v[PF_COMPUTE] / v[PF_WALL]
                                           : 0;
            char closed[16] = "-"; /* ZB-H1 has none for m < p */
            if (s->kind != DT_PIPE_ZB || s->m >= s->p)
                snprintf(closed, sizeof closed, "%.1f%%",
                         100 * closed_form_bubble(s->kind, s->p, s->m));
            fprintf(f, "  %5d %9s %11.0f %9.0f %9.0f %8.1f%% %12s\n", q,
                    blocks, v[PF_PARAMS], v[PF_ACT_SETS], v[PF_GRAD_SETS],
                    100 * bubble, closed);
        }
    }
    free(all);
    return st;
}
