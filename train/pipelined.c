/*
 * pipelined.c — minigpt's pipelined step: `--pp P` cuts the model into P
 * stages and every step streams `--microbatches M` micro-batches through
 * them on the chosen schedule (pipeline/); `--dp D` (default world / P)
 * runs D such pipelines side by side, data-parallel.
 *
 * Groups. Rank g of the world of D x P is stage g / D of replica g % D
 * (Megatron-LM's order: a stage's replicas are neighbours). dt_comm_split
 * makes the pipeline group of each replica (stage s = its rank s) and the
 * data-parallel group of each stage (replica r = its rank r).
 *
 * Same arithmetic as `dtrain-launch -n D minigpt --grad-accum M`: replica
 * r's micro-batch j of step s reads the rows DDP rank r's micro-step j
 * reads, s·D·M·B + (r·M + j)·B .. +B; each micro-batch's loss is scaled by
 * 1/M, so a stage's gradient is its replica's mean. DDP then all-reduces
 * (avg) it over the stage's data-parallel group, its buckets launched
 * during the stage's last backward (its last W under ZB-H1: the executor
 * installs DDP's hook for that action only), or ZeRO-1 and ZeRO-2 reduce
 * each piece of it (a --bucket-mb bucket cut at the shard boundaries) to
 * its owner during that same last backward, by the same hook
 * (dt_zero1_arm; ZeRO-3 reduces in the step); each rank then runs AdamW
 * on its stage (or shard). The
 * last stages average their replicas' losses over their group, and the
 * last stage of each pipeline broadcasts that for the step line. The
 * validation loss and the task's accuracy stream each forward through
 * the stages, no rank holding the whole model (evaluation.c); the sample
 * is skipped.
 * A pipelined run prints each stage's blocks, memory and measured bubble
 * beside the closed form.
 * With --deterministic the stage's replicas are summed in rank order
 * and divided by D (the executor's 1/M scaling and its micro-batch sums
 * are the same in every mode): DDP, ZeRO-1, ZeRO-2 and ZeRO-3 end with the
 * same bits (optim/rank_order.c).
 * --recompute: each stage keeps of a block only its output per micro-batch
 * in flight, and one workspace for the rest, shared by them (model/).
 * --act-comm bf16: the executor sends the activations and their
 * gradients rounded to bf16 (pipeline/act_comm.c); the evaluation's
 * forwards still send fp32 (evaluation.c).
 * --precision bf16: each stage keeps a bf16 store of its blocks per
 * micro-batch in flight, widened before that micro-batch's backward; the
 * stages exchange the fp32 residual stream, so the run prints the loss
 * table of one bf16 process with --grad-accum M (model/precision.c).
 * Checkpoints: each rank saves its replica's share of its stage's range
 * (dt_ckpt_pipeline_slices, set up here); --trace and lesson.c read the
 * executor's timeline of each step.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trainer.h"
#include "dt_clock.h"

static dt_status pipe_fail(mg_run *r, dt_status st, const char *what, const char *detail)
{
    snprintf(r->err, sizeof r->err, "rank %d: %s: %s", r->rank, what, detail);
    return st;
}

/* A message of the pipeline layer, which names itself ("pipeline: 4
 * stages for 3 blocks ...", "pipeline stage 1: ..."): only the rank goes
 * in front, so "pipeline" is said once. */
static dt_status pipe_layer_fail(mg_run *r, dt_status st, const char *said)
{
    snprintf(r->err, sizeof r->err, "rank %d: %s", r->rank, *said ? said : dt_status_name(st));
    return st;
}

/* Micro-batches per step: --microbatches, else --grad-accum when it asks
 * for accumulation, else MG_MICROBATCHES_PER_STAGE per stage. One
 * micro-batch does not pipeline at all (every stage waits for the one
 * before it); M = 4P leaves a GPipe / 1F1B bubble of (P-1)/(M+P-1) < 20%,
 * the GPipe paper's M >= 4P. */
int mg_microbatches(const mg_options *o)
{
    if (o->microbatches > 0)
        return o->microbatches;
    return o->grad_accum > 1 ? o->grad_accum : MG_MICROBATCHES_PER_STAGE * o->pp;
}

/* Who saves which slice of a checkpoint: each stage's range of the flat
 * buffer, cut over its replicas (dt_ckpt_pipeline_slices). */
static dt_status checkpoint_slices(mg_run *r, const int *bounds)
{
    int P = r->o.pp;
    size_t *stage = malloc(((size_t)P + 1) * sizeof *stage);
    r->ckpt_slices = malloc(((size_t)r->world + 1) * sizeof *r->ckpt_slices);
    if (!stage || !r->ckpt_slices) {
        free(stage);
        return pipe_fail(r, DT_ENOMEM, "pipeline", "out of memory");
    }
    for (int s = 0; s < P; s++)
        dt_config_stage_range(&r->o.cfg, bounds[s], bounds[s + 1], &stage[s], &stage[s + 1]);
    dt_ckpt_pipeline_slices(r->ckpt_slices, stage, P, r->dp);
    free(stage);
    return DT_OK;
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
    dt_status st = dt_pipe_partition(bounds, &o->cfg, o->pp, pk, err, sizeof err);
    if (st == DT_OK && !(r->sched = dt_pipe_schedule_create(kind, o->pp, M, err, sizeof err)))
        st = DT_EINVAL;
    if (st != DT_OK) {
        free(bounds);
        return pipe_layer_fail(r, st, err);
    }
    int s = r->stage;
    dt_stage_spec sp = {bounds[s], bounds[s + 1], r->sched->act_slots[s], r->sched->grad_slots[s],
                        o->recompute};
    st = checkpoint_slices(r, bounds);
    free(bounds);
    if (st != DT_OK)
        return st;
    st = dt_model_create_stage(&r->m, &o->cfg, dt_backend_cpu(), o->batch, &sp);
    if (st == DT_OK && strcmp(o->precision, "bf16") == 0)
        st = dt_model_set_precision(r->m, DT_PRECISION_BF16); /* a bf16 store per slot */
    if (st != DT_OK)
        return pipe_fail(r, st, "model", r->m ? dt_model_error(r->m) : "out of memory");
    dt_model_init(r->m, o->seed); /* this stage's slice of the full init */
    return DT_OK;
}

/* D = --dp, or world / P; the world must be exactly D x P. */
static dt_status check_world(mg_run *r)
{
    const mg_options *o = &r->o;
    char msg[320];
    int P = o->pp, D = o->dp > 0 ? o->dp : r->world / P;
    if (D >= 1 && D * P == r->world) {
        r->dp = D;
        r->stage = r->rank / D;
        r->replica = r->rank % D;
        return DT_OK;
    }
    if (o->dp > 0)
        snprintf(msg, sizeof msg,
                 "--pp %d --dp %d needs a world of exactly "
                 "%d ranks (this one has %d); run dtrain-launch -n %d",
                 P, o->dp, P * o->dp, r->world, P * o->dp);
    else
        snprintf(msg, sizeof msg,
                 "--pp %d needs a world of a multiple of %d "
                 "ranks, one pipeline per data-parallel replica (this one "
                 "has %d); run dtrain-launch -n %d",
                 P, P, r->world, P * (r->world / P > 0 ? r->world / P : 1));
    return pipe_fail(r, DT_EINVAL, "pipeline", msg);
}

/* The pipeline group of this rank's replica and the data-parallel group
 * of its stage; a group of one rank is NULL, a group of the whole world
 * is the world's communicator. */
static dt_status open_groups(mg_run *r)
{
    int P = r->o.pp, D = r->dp;
    dt_status st = DT_OK;
    r->pipe_comm = P == 1 ? NULL : D == 1 ? r->comm : NULL;
    r->dp_comm = D == 1 ? NULL : P == 1 ? r->comm : NULL;
    if (P > 1 && D > 1)
        st = dt_comm_split(r->comm, r->replica, r->stage, &r->pipe_comm);
    if (st == DT_OK && P > 1 && D > 1)
        st = dt_comm_split(r->comm, r->stage, r->replica, &r->dp_comm);
    if (st != DT_OK)
        return pipe_fail(r, st,
                         "splitting the world into pipeline and "
                         "data-parallel groups",
                         dt_comm_error(r->comm));
    return DT_OK;
}

/* DDP or ZeRO-1, -2, -3 of this stage over its data-parallel group
 * (ZeRO-3: the executor's forwards and backwards gather each unit), with
 * --grad-comm bf16 its buckets or pieces rounded to bf16 as they leave. */
static dt_status open_optimizer(mg_run *r)
{
    const mg_options *o = &r->o;
    dt_status st;
    if (o->parallel == MG_DDP) {
        size_t bytes = (size_t)(o->bucket_mb * 1024 * 1024);
        st = dt_ddp_create(&r->ddp, r->m, r->dp_comm, bytes);
        if (st == DT_OK && o->deterministic)
            st = dt_ddp_set_deterministic(r->ddp);
        if (st == DT_OK && strcmp(o->grad_comm, "bf16") == 0)
            st = dt_ddp_set_grad_bf16(r->ddp);
        if (st != DT_OK)
            return pipe_fail(r, st, "ddp", r->ddp ? dt_ddp_error(r->ddp) : "out of memory");
    } else {
        size_t bytes = (size_t)(o->bucket_mb * 1024 * 1024);
        st = o->parallel == MG_ZERO3 ? dt_zero3_create(&r->zero1, r->m, r->dp_comm, bytes)
             : o->parallel == MG_ZERO2
                 ? dt_zero2_create(&r->zero1, r->m, r->dp_comm, bytes)
                 : dt_zero1_create_bucketed(&r->zero1, r->m, r->dp_comm, bytes);
        if (st == DT_OK && o->deterministic)
            st = dt_zero1_set_deterministic(r->zero1);
        if (st == DT_OK && strcmp(o->grad_comm, "bf16") == 0)
            st = dt_zero1_set_grad_bf16(r->zero1);
        if (st != DT_OK)
            return pipe_fail(r, st, mg_parallel_name(o->parallel),
                             r->zero1 ? dt_zero1_error(r->zero1) : "out of memory");
        dt_zero1_arm_params(r->zero1, true);
    }
    return DT_OK;
}

dt_status mg_pipe_open(mg_run *r)
{
    const mg_options *o = &r->o;
    int M = mg_microbatches(o);
    dt_status st = check_world(r);
    if (st == DT_OK)
        st = open_groups(r);
    if (st == DT_OK)
        st = open_stage(r, M);
    if (st != DT_OK)
        return st;
    size_t n = (size_t)M * o->batch * o->cfg.T;
    r->x = malloc(n * sizeof(int));
    r->y = malloc(n * sizeof(int));
    r->losses = calloc((size_t)o->steps, sizeof(float));
    if (!r->x || !r->y || !r->losses)
        return pipe_fail(r, DT_ENOMEM, "trainer", "out of memory");
    r->h = dt_adamw_defaults(o->lr);
    st = dt_pipe_create(&r->pipe, r->pipe_comm, r->m, r->sched);
    if (st != DT_OK)
        return pipe_layer_fail(r, st, dt_pipe_error(r->pipe));
    if (strcmp(o->act_comm, "bf16") == 0)
        dt_pipe_set_act_comm_bf16(r->pipe);
    return open_optimizer(r);
}

void mg_pipe_close(mg_run *r)
{
    dt_pipe_destroy(r->pipe);
    dt_pipe_schedule_destroy(r->sched);
    r->pipe = NULL;
    r->sched = NULL;
    if (r->pipe_comm != r->comm)
        dt_comm_destroy(r->pipe_comm);
    if (r->dp_comm != r->comm)
        dt_comm_destroy(r->dp_comm);
    r->pipe_comm = r->dp_comm = NULL;
    free(r->ckpt_slices);
    r->ckpt_slices = NULL;
}

/* The step's micro-batches into r->x, r->y: replica r's rows
 * step·D·M·B + (r·M + j)·B .. +B, j = 0 .. M-1, as DDP rank r's
 * micro-steps. The dataset's status; its error says what failed. */
dt_status mg_pipe_load_microbatches(mg_run *r, int step, int M)
{
    const mg_options *o = &r->o;
    size_t rows = (size_t)o->batch * o->cfg.T;
    uint64_t per_replica = (uint64_t)M * (uint64_t)o->batch;
    uint64_t row = r->row0 + (uint64_t)(step - r->start_step) * (uint64_t)r->dp * per_replica +
                   (uint64_t)r->replica * per_replica;
    dt_status st = DT_OK;
    for (int j = 0; j < M && st == DT_OK; j++)
        st = dt_dataset_batch(r->x + j * rows, r->y + j * rows, r->data, DT_TRAIN, o->seed,
                              row + (uint64_t)j * o->batch, o->batch, o->cfg.T);
    return st;
}

/*
 * Adds a step's stage times to the run's, for the bubble (the first step
 * warms up). A stage's step lasts from the start of its run until the
 * step's loss is shared: a stage that finishes its run early waits for the
 * others there (the loss broadcast's root check waits for every rank), and
 * that wait is bubble too. Timing the run alone would hide it: the last
 * stage's bubble read half the closed form. Evaluations and checkpoints,
 * between steps, are not part of any step.
 */
static void add_stats(mg_run *r, int step, double t0, double t1)
{
    dt_pipe_stats ps;
    dt_pipe_last_stats(r->pipe, &ps);
    if (step == r->start_step && r->o.steps - r->start_step > 1)
        return;
    r->pipe_wall_s += t1 - t0;
    r->pipe_compute_s += ps.op_s[DT_PIPE_F] + ps.op_s[DT_PIPE_B] + ps.op_s[DT_PIPE_W];
    r->pipe_fbw_s[0] += ps.op_s[DT_PIPE_F];
    r->pipe_fbw_s[1] += ps.op_s[DT_PIPE_B];
    r->pipe_fbw_s[2] += ps.op_s[DT_PIPE_W];
    r->pipe_steps++;
}

/* DDP, ZeRO-1 and ZeRO-2: arms the buckets (the pieces) to go out during
 * the stage's last backward. ZeRO-1 and -2 keep the stage's whole gradient
 * sum, so their pieces are reduced in place in it, as DDP's buckets are;
 * ZeRO-3 still reduces them in the step. */
static dt_status arm_sync(mg_run *r)
{
    dt_grad_ready_fn fn = NULL;
    void *user = NULL;
    dt_status st = DT_OK;
    if (r->ddp && (st = dt_ddp_arm(r->ddp, &fn, &user)) != DT_OK)
        return pipe_fail(r, st, "ddp", dt_ddp_error(r->ddp));
    if (r->zero1 && dt_zero1_stage(r->zero1) < 3 &&
        (st = dt_zero1_arm(r->zero1, &fn, &user)) != DT_OK)
        return pipe_fail(r, st, mg_parallel_name(r->o.parallel), dt_zero1_error(r->zero1));
    dt_pipe_set_grad_hook(r->pipe, fn, user);
    return DT_OK;
}

/* After the step's last backward: the gradient's mean over the stage's
 * replicas, and AdamW on the stage (DDP) or on this rank's shard (ZeRO-1). */
static dt_status sync_and_update(mg_run *r, int step, mg_step *out)
{
    dt_status st;
    double t0;
    if (r->ddp) {
        if ((st = dt_ddp_wait(r->ddp, &out->comm)) != DT_OK)
            return pipe_fail(r, st, "gradient all-reduce", dt_ddp_error(r->ddp));
        mg_trace_ddp(r->trace, r->ddp);
        t0 = dt_now();
        if ((st = dt_model_update(r->m, &r->h, step + 1)) != DT_OK)
            return pipe_fail(r, st, "update", dt_model_error(r->m));
    } else {
        t0 = dt_now();
        if ((st = dt_zero1_step(r->zero1, &r->h, step + 1, &out->comm)) != DT_OK)
            return pipe_fail(r, st, "zero1 step", dt_zero1_error(r->zero1));
        mg_trace_zero1(r->trace, r->zero1);
    }
    mg_trace_add(r->trace, MG_EV_OPTIMIZER, -1, t0, dt_now());
    return DT_OK;
}

/* The step's loss for every rank: the last stages average their replicas'
 * (as DDP averages its ranks'), then each pipeline's last stage tells
 * the others. */
static dt_status share_loss(mg_run *r, float *loss)
{
    dt_status st = DT_OK;
    if (r->stage == r->o.pp - 1 && r->dp_comm &&
        (st = dt_allreduce(r->dp_comm, loss, 1, DT_F32, DT_AVG)) != DT_OK)
        return pipe_fail(r, st, "loss all-reduce", dt_comm_error(r->dp_comm));
    if (r->pipe_comm && (st = dt_broadcast(r->pipe_comm, loss, 1, DT_F32, r->o.pp - 1)) != DT_OK)
        return pipe_fail(r, st, "loss broadcast", dt_comm_error(r->pipe_comm));
    return DT_OK;
}

dt_status mg_pipe_step(mg_run *r, int step, mg_step *out)
{
    const mg_options *o = &r->o;
    int M = mg_microbatches(o), last = r->stage == o->pp - 1;
    size_t rows = (size_t)o->batch * o->cfg.T;
    const int *in[M], *tg[M];
    double t0 = dt_now(), t_run;
    dt_status st = mg_pipe_load_microbatches(r, step, M);
    if (st != DT_OK)
        return pipe_fail(r, st, "data", dt_dataset_error(r->data));
    for (int j = 0; j < M; j++)
        in[j] = r->x + j * rows, tg[j] = r->y + j * rows;
    float loss = 0;
    dt_model_zero_grad(r->m);
    if ((st = arm_sync(r)) != DT_OK)
        return st;
    t_run = dt_now();
    st = dt_pipe_run(r->pipe, r->stage == 0 ? in : NULL, last ? tg : NULL, o->batch, o->cfg.T,
                     &loss);
    if (st != DT_OK)
        return pipe_layer_fail(r, st, dt_pipe_error(r->pipe));
    mg_trace_pipe(r->trace, r->pipe, r->sched, r->stage);
    out->comm.hidden = -1;
    if ((st = sync_and_update(r, step, out)) != DT_OK)
        return st;
    out->ms = 1e3 * (dt_now() - t0);
    if ((st = share_loss(r, &loss)) != DT_OK)
        return st;
    add_stats(r, step, t_run, dt_now());
    out->loss = loss;
    r->losses[step] = loss;
    out->tokens_per_s = (double)r->dp * M * rows / (out->ms * 1e-3);
    return DT_OK;
}

/* --check-replicas for a pipeline: the ranks of each stage's data-parallel
 * group hold bitwise identical parameters; one verdict for the world. */
dt_status mg_pipe_check_replicas(mg_run *r, int step, bool quiet, bool units)
{
    bool same = true;
    uint64_t *hashes = calloc((size_t)r->dp, sizeof *hashes);
    if (!hashes)
        return pipe_fail(r, DT_ENOMEM, "replica check", "out of memory");
    dt_status st = DT_OK;
    if (r->dp_comm && units) { /* ZeRO-3: through the stage's units */
        st = dt_zero1_check_replicas(r->zero1, &same, hashes);
        if (st != DT_OK)
            return pipe_fail(r, st, "replica check", dt_zero1_error(r->zero1));
    } else if (r->dp_comm) {
        st = dt_check_replicas(r->dp_comm, r->m, &same, hashes);
    }
    int32_t v = same;
    if (st == DT_OK && r->comm)
        st = dt_allreduce(r->comm, &v, 1, DT_I32, DT_MIN);
    if (st == DT_OK && !same) {
        fprintf(stderr,
                "minigpt: rank %d: after step %d the %d replicas of "
                "stage %d hold different parameters:",
                r->rank, step, r->dp, r->stage);
        for (int q = 0; q < r->dp; q++)
            fprintf(stderr, " %d:%016llx", q, (unsigned long long)hashes[q]);
        fprintf(stderr, "\n");
    }
    free(hashes);
    if (st != DT_OK)
        return pipe_fail(r, st, "replica check", dt_comm_error(r->comm));
    if (!v)
        return pipe_fail(r, DT_EPROTO, "replica check",
                         "the replicas of a "
                         "stage differ (their ranks print the hashes)");
    if (!quiet && r->rank == 0 && r->dp > 1 && r->o.pp > 1)
        printf("replicas: the %d ranks of each of the %d stages hold bitwise "
               "identical parameters\n",
               r->dp, r->o.pp);
    else if (!quiet && r->rank == 0 && r->dp > 1)
        printf("replicas: the %d ranks of the one stage hold bitwise identical parameters\n",
               r->dp);
    return DT_OK;
}

/* The bubble as a fraction of the step, with unit costs F = 1, B = 2
 * (ZB-H1: input half 1, W 1; for m >= p only). */
double mg_closed_form_bubble(dt_pipe_kind k, int p, int m)
{
    double work = 3.0 * m, idle = k == DT_PIPE_ZB ? p - 1 : 3.0 * (p - 1);
    return idle / (work + idle);
}

/* What each stage tells rank 0; PF_F, PF_B, PF_W: one micro-batch's F,
 * whole B and W on the stage, in seconds. */
enum {
    PF_L0,
    PF_L1,
    PF_PARAMS,
    PF_ACT_SETS,
    PF_GRAD_SETS,
    PF_WALL,
    PF_COMPUTE,
    PF_F,
    PF_B,
    PF_W,
    PF_FIELDS
};

/*
 * The schedule run on paper with each stage's own measured F, B and W and
 * free transfers: the bubble the schedule itself leaves once the stages
 * are unequal (the last one also runs the head and the loss), so that
 * measured minus simulated is what the executor and the wire add.
 * sim[q] gets stage q's simulated bubble, or NAN if the simulation fails.
 */
static void simulated_bubbles(const dt_pipe_schedule *s, const double *all, double *sim)
{
    double *fbw = malloc(3 * (size_t)s->p * sizeof *fbw);
    for (int q = 0; q < s->p; q++)
        sim[q] = NAN;
    if (!fbw)
        return;
    for (int q = 0; q < s->p; q++)
        for (int k = 0; k < 3; k++)
            fbw[3 * q + k] = all[(size_t)q * PF_FIELDS + PF_F + k];
    dt_pipe_costs c = {.latency = 0, .stage = fbw};
    dt_pipe_sim run;
    bool ok = dt_pipe_simulate(s, &c, &run) == DT_OK && run.makespan > 0;
    for (int q = 0; ok && q < s->p; q++)
        sim[q] = 1 - run.busy[q] / run.makespan;
    dt_pipe_sim_free(s, &run); /* also a run of no steps: makespan 0 */
    free(fbw);
}

/* all: [p][PF_FIELDS] gathered, then p doubles of room for the simulation */
static void print_pipeline(FILE *f, const mg_run *r, double *all)
{
    const dt_pipe_schedule *s = r->sched;
    double *sim = all + (size_t)s->p * PF_FIELDS;
    simulated_bubbles(s, all, sim);
    fprintf(f,
            "pipeline: %s, %d stages, %d micro-batch%s (replica 0 of "
            "%d); bubble = idle share of the step (measured: 1 - "
            "compute / step time, run to shared loss, steps after the first; "
            "closed form with B = 2F%s; simulated: the schedule with each stage's "
            "measured F, B, W and free transfers)\n",
            dt_pipe_kind_name(s->kind), s->p, s->m, s->m == 1 ? "" : "es", r->dp,
            s->kind == DT_PIPE_ZB ? ", W = F" : "");
    fprintf(f, "  %5s %9s %11s %9s %9s %9s %12s %10s\n", "stage", "blocks", "params", "act sets",
            "grad sets", "bubble", "closed form", "simulated");
    for (int q = 0; q < s->p; q++) {
        const double *v = all + (size_t)q * PF_FIELDS;
        char blocks[24];
        snprintf(blocks, sizeof blocks, "[%d, %d)", (int)v[PF_L0], (int)v[PF_L1]);
        double bubble = v[PF_WALL] > 0 ? 1 - v[PF_COMPUTE] / v[PF_WALL] : 0;
        char closed[16] = "-"; /* ZB-H1 has none for m < p */
        if (s->kind != DT_PIPE_ZB || s->m >= s->p)
            snprintf(closed, sizeof closed, "%.1f%%",
                     100 * mg_closed_form_bubble(s->kind, s->p, s->m));
        fprintf(f, "  %5d %9s %11.0f %9.0f %9.0f %8.1f%% %12s %9.1f%%\n", q, blocks, v[PF_PARAMS],
                v[PF_ACT_SETS], v[PF_GRAD_SETS], 100 * bubble, closed, 100 * sim[q]);
    }
}

dt_status mg_report_pipeline(FILE *f, const mg_run *r)
{
    const dt_model *m = r->m;
    double per_mb = r->pipe_steps > 0 ? 1.0 / ((double)r->pipe_steps * r->sched->m) : 0;
    double mine[PF_FIELDS] = {m->l0,
                              m->l1,
                              (double)m->num_params,
                              m->act_slots,
                              m->grad_slots,
                              r->pipe_wall_s,
                              r->pipe_compute_s,
                              r->pipe_fbw_s[0] * per_mb,
                              (r->pipe_fbw_s[1] + r->pipe_fbw_s[2]) * per_mb,
                              r->pipe_fbw_s[2] * per_mb};
    int P = r->o.pp;
    double *all = calloc((size_t)P * (PF_FIELDS + 1), sizeof *all);
    if (!all)
        return DT_ENOMEM;
    dt_status st = DT_OK;
    if (r->pipe_comm) /* this replica's stages; replica 0's are printed */
        st = dt_gather(r->pipe_comm, mine, all, PF_FIELDS, DT_F64, 0);
    else
        memcpy(all, mine, sizeof mine);
    if (st == DT_OK && r->rank == 0)
        print_pipeline(f, r, all);
    free(all);
    return st;
}
