/*
 * three_d.c — minigpt --dp D --tp T --pp P: the three axes together, on
 * Megatron-LM's rank grid.
 *
 *   world rank = stage · D · T + replica · T + tp rank
 *
 * tp ranks adjacent (the chattiest group: four all-reduces of activations
 * per block per micro-batch, on one node when a node holds T), then the
 * replicas of a stage, then the stages (a pipeline only sends activations
 * across its few boundaries). Three dt_comm_split calls of the world make
 * this rank's groups:
 *
 *   tp group   color stage · D + replica,  key tp rank   (T ranks)
 *   dp group   color stage · T + tp rank,  key replica   (D ranks)
 *   pp group   color replica · T + tp rank, key stage    (P ranks)
 *
 * Each stage is a tp group: its ranks hold the shares of the stage's
 * blocks (tensor/dt_tp_stage.h), and the pipeline executor drives each
 * share through the stage interface (dt_pipe_stage), so tp rank t of
 * stage s talks to tp rank t of stages s ± 1 (each tp rank sends its own
 * copy of the replicated activation: T times a plain pipeline's bytes).
 * The f and g all-reduces run inside the stage's forwards and backwards.
 *
 * A step is pipelined.c's: replica r's micro-batch j reads the rows of
 * DDP rank r's micro-step j, each micro-batch's loss is scaled by 1/M, the
 * schedule runs every micro-batch's backward in order, and after the run
 * the dp group averages the share's gradients (DDP, one all-reduce of the
 * share, not overlapped with backward), AdamW updates it, and the last
 * stage shares the loss. Under --parallel zero1 the dp group instead runs
 * tp_zero1.c on the stage's range of the share (reduce-scatter, AdamW on
 * this rank's piece with an fp32 master, all-gather): on 2 replicas the
 * same bits as DDP, with 3/4 of its optimizer state per rank. So --tp 2 --pp 2 ends on the bits of --tp 2
 * --grad-accum M, and 2 x 2 x 2 on those of --dp 2 --tp 2 --grad-accum M.
 *
 * Evaluation, the replica check and the sample read a whole dt_model
 * (r->m). mg_params_hold assembles it only when they need it: the pp
 * group all-gathers the stage ranges of the share (the share's layout
 * keeps the model's tensor order, so the ranges concatenate), then the tp
 * group all-gathers the shares. Training steps pay nothing for it.
 *
 * Checkpoints: each rank saves its replica's piece of its stage's range
 * of its tp share (three_d_checkpoint.c, laid out here from the stages'
 * blocks); under zero1 that piece is its optimizer shard.
 *
 * Not built, refused by name: ZeRO-2 and ZeRO-3, the cuda backend, ZB-H1
 * (a split backward; a tp stage runs its backward whole).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_clock.h"
#include "dt_tp_stage.h"
#include "trainer.h"

struct mg_3d {
    dt_tp_stage *stage; /* this rank's share of its stage */
    dt_pipe_schedule *sched;
    dt_pipe *pipe;
    int tp_rank, M;
    size_t *stage_counts; /* [P] each stage's part of the share */
    float *share;         /* (share) the assembled share of this tp rank */
    float *shares;        /* (T, share) */
};

static dt_status fail3(mg_run *r, dt_status st, const char *what, const char *detail)
{
    snprintf(r->err, sizeof r->err, "rank %d: %s: %s", r->rank, what,
             detail && *detail ? detail : dt_status_name(st));
    return st;
}

/* What this version does not combine with a 3-D grid, named. */
static const char *unsupported(const mg_options *o)
{
    if (o->parallel != MG_DDP && o->parallel != MG_ZERO1)
        return "--parallel zero2/zero3 (the dp axis of a 3-D run runs DDP or zero1)";
    if (strcmp(o->device, "cpu") != 0)
        return "--device cuda or cuda-host in a 3-D run (it runs on the cpu backend)";
    if (strcmp(o->schedule, "zb") == 0)
        return "--schedule zb (a tensor-parallel stage runs its backward whole; use gpipe "
               "or 1f1b)";
    return NULL;
}

static dt_status check_grid(mg_run *r)
{
    const mg_options *o = &r->o;
    int T = o->tp, P = o->pp, D = o->dp > 0 ? o->dp : r->world / (T * P);
    if (D < 1 || D * T * P != r->world) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "--dp %d x --tp %d x --pp %d is not the world size %d; run dtrain-launch -n %d", D,
                 T, P, r->world, (D < 1 ? 1 : D) * T * P);
        return fail3(r, DT_EINVAL, "3-D grid", msg);
    }
    if (!r->comm)
        return fail3(r, DT_EINVAL, "3-D grid",
                     "needs a job of 2 ranks at least (dtrain-launch); one process is plain "
                     "minigpt");
    r->dp = D;
    r->stage = r->rank / (D * T);
    r->replica = r->rank / T % D;
    return DT_OK;
}

/* The three groups of the grid. */
static dt_status open_groups(mg_run *r, int tp_rank)
{
    int D = r->dp, T = r->o.tp, s = r->stage, q = r->replica;
    dt_status st = dt_comm_split(r->comm, s * D + q, tp_rank, &r->tp_comm);
    if (st == DT_OK)
        st = dt_comm_split(r->comm, s * T + tp_rank, q, &r->tp_dp_comm);
    if (st == DT_OK)
        st = dt_comm_split(r->comm, q * T + tp_rank, s, &r->pipe_comm);
    return st == DT_OK ? DT_OK : fail3(r, st, "3-D grid: split", dt_comm_error(r->comm));
}

/* The executor's message names itself ("pipeline stage 1: ..."): only the
 * rank goes in front, so "pipeline" is said once. */
static dt_status pipe_err(mg_run *r, dt_status st, const char *err)
{
    snprintf(r->err, sizeof r->err, "rank %d: %s", r->rank, *err ? err : dt_status_name(st));
    return st;
}

/* ---- the stage interface over a tp share ------------------------------ */

static void st_select(void *self, int slot, int grad_slot)
{
    dt_tp_stage_select(self, slot, grad_slot);
}
static float *st_input(void *self, int B, int T)
{
    (void)B, (void)T;
    return dt_tp_stage_input(self);
}
static const float *st_output(const void *self)
{
    return dt_tp_stage_output(self);
}
static float *st_output_grad(void *self)
{
    return dt_tp_stage_output_grad(self);
}
static const float *st_input_grad(const void *self)
{
    return dt_tp_stage_input_grad(self);
}
static dt_status st_forward(void *self, const int *in, const int *tg, int B, int T, float *loss)
{
    return dt_tp_stage_forward(self, in, tg, B, T, loss);
}
static dt_status st_backward(void *self, float dloss, dt_backward_part part)
{
    dt_tp_stage *s = self;
    if (part != DT_BACKWARD_ALL) {
        snprintf(s->core.err, sizeof s->core.err,
                 "a tensor-parallel stage runs its backward whole, not split");
        return DT_EINVAL;
    }
    return dt_tp_stage_backward(s, dloss);
}
static const char *st_error(const void *self)
{
    return dt_tp_stage_error(self);
}

static const dt_pipe_stage_ops tp_stage_ops = {
    .select = st_select,
    .input = st_input,
    .output = st_output,
    .output_grad = st_output_grad,
    .input_grad = st_input_grad,
    .forward = st_forward,
    .backward = st_backward,
    .set_grad_hook = NULL, /* the dp all-reduce runs after the step */
    .error = st_error,
};

/* ---- open ------------------------------------------------------------- */

/* Partition, schedule, this rank's share of its stage, the executor. */
static dt_status open_stage(mg_run *r, struct mg_3d *d)
{
    const mg_options *o = &r->o;
    int P = o->pp, *bounds = malloc(((size_t)P + 1) * sizeof(int));
    char err[256];
    dt_pipe_kind kind;
    dt_pipe_partition_kind pk;
    dt_pipe_kind_parse(o->schedule, &kind); /* cli.c checked both */
    dt_pipe_partition_parse(o->pp_partition, &pk);
    if (!bounds)
        return fail3(r, DT_ENOMEM, "pipeline", "out of memory");
    dt_status st = dt_pipe_partition(bounds, &o->cfg, P, pk, err, sizeof err);
    if (st == DT_OK && !(d->sched = dt_pipe_schedule_create(kind, P, d->M, err, sizeof err)))
        st = DT_EINVAL;
    int l0 = bounds[r->stage], l1 = bounds[r->stage + 1];
    if (st != DT_OK) {
        free(bounds);
        return fail3(r, st, "3-D grid", err);
    }
    st = dt_tp_stage_create(&d->stage, &o->cfg, dt_backend_cpu(), o->batch, l0, l1,
                            d->sched->act_slots[r->stage], d->sched->grad_slots[r->stage],
                            r->tp_comm);
    if (st == DT_OK && strcmp(o->precision, "bf16") == 0)
        st = dt_tp_stage_set_precision(d->stage, DT_PRECISION_BF16);
    if (st == DT_OK)
        st = dt_tp_stage_init(d->stage, o->seed);
    if (st != DT_OK) {
        free(bounds);
        return fail3(r, st, "model", dt_tp_stage_error(d->stage));
    }
    st = mg_3d_ckpt_layout(r, bounds); /* the stage checked the grid's tp */
    free(bounds);
    if (st != DT_OK)
        return fail3(r, st, "3-D grid", "checkpoint layout: out of memory");
    if (r->trace) { /* every f and g as a slice */
        d->stage->core.trace = mg_trace_tp;
        d->stage->core.trace_user = r->trace;
    }
    dt_pipe_stage ps = {.ops = &tp_stage_ops,
                        .self = d->stage,
                        .l0 = l0,
                        .l1 = l1,
                        .L = o->cfg.L,
                        .C = o->cfg.C,
                        .act_slots = d->stage->act_slots,
                        .grad_slots = d->stage->grad_slots};
    st = dt_pipe_create_stage(&d->pipe, r->pipe_comm, &ps, d->sched);
    /* the stages' (B, T, C) tensors travel as a plain pipeline's do */
    if (st == DT_OK && strcmp(o->act_comm, "bf16") == 0)
        dt_pipe_set_act_comm_bf16(d->pipe);
    return st == DT_OK ? DT_OK : pipe_err(r, st, dt_pipe_error(d->pipe));
}

/* Buffers: the micro-batches, the losses, the assembly's. */
static dt_status open_buffers(mg_run *r, struct mg_3d *d)
{
    const mg_options *o = &r->o;
    size_t n = (size_t)d->M * o->batch * o->cfg.T, share = dt_tp_num_params(&o->cfg, o->tp);
    r->x = malloc(n * sizeof(int));
    r->y = malloc(n * sizeof(int));
    r->losses = calloc((size_t)o->steps, sizeof(float));
    d->stage_counts = calloc((size_t)o->pp, sizeof(size_t));
    d->share = malloc(share * sizeof(float));
    d->shares = malloc(share * (size_t)o->tp * sizeof(float));
    if (!r->x || !r->y || !r->losses || !d->stage_counts || !d->share || !d->shares)
        return fail3(r, DT_ENOMEM, "trainer", "out of memory");
    uint64_t mine = d->stage->core.num_params, all[o->pp];
    dt_status st = dt_allgather(r->pipe_comm, &mine, all, 1, DT_I64);
    if (st != DT_OK)
        return fail3(r, st, "3-D grid: stage sizes", dt_comm_error(r->pipe_comm));
    for (int s = 0; s < o->pp; s++)
        d->stage_counts[s] = (size_t)all[s];
    return DT_OK;
}

dt_status mg_3d_open(mg_run *r)
{
    const mg_options *o = &r->o;
    const char *no = unsupported(o);
    if (no)
        return fail3(r, DT_EINVAL, "--tp with --pp", no);
    dt_status st = check_grid(r);
    if (st != DT_OK)
        return st;
    struct mg_3d *d = calloc(1, sizeof *d);
    if (!(r->three_d = d))
        return fail3(r, DT_ENOMEM, "trainer", "out of memory");
    d->tp_rank = r->rank % o->tp;
    d->M = mg_microbatches(o);
    if ((st = open_groups(r, d->tp_rank)) != DT_OK || (st = open_stage(r, d)) != DT_OK ||
        (st = open_buffers(r, d)) != DT_OK)
        return st;
    st = dt_model_create(&r->m, &o->cfg, dt_backend_cpu(), o->batch); /* the assembled copy */
    if (st != DT_OK)
        return fail3(r, st, "model", r->m ? dt_model_error(r->m) : NULL);
    dt_model_init(r->m, o->seed);
    r->h = dt_adamw_defaults(o->lr);
    if (r->rank == 0)
        printf("3-D grid: %d replica%s x %d tp ranks x %d stages (world rank = stage x %d + "
               "replica x %d + tp rank), %s, %d micro-batches; rank 0 holds %zu of %zu "
               "parameters\n",
               r->dp, r->dp == 1 ? "" : "s", o->tp, o->pp, r->dp * o->tp, o->tp, o->schedule, d->M,
               d->stage->core.num_params, r->m->num_params);
    if (r->rank == 0)
        mg_tp_memory_line("on rank 0", dt_tp_stage_activation_bytes(d->stage), &d->stage->core);
    if (o->parallel != MG_ZERO1)
        return DT_OK;
    if (r->dp < 2)
        return fail3(r, DT_EINVAL, "--parallel zero1", "needs --dp 2 or more replicas to shard");
    return mg_tp_zero1_open(r, &d->stage->core, d->stage->lo);
}

void mg_3d_close(mg_run *r)
{
    struct mg_3d *d = r->three_d;
    if (!d)
        return;
    dt_pipe_destroy(d->pipe);
    dt_pipe_schedule_destroy(d->sched);
    dt_tp_stage_destroy(d->stage);
    free(d->stage_counts);
    free(d->share);
    free(d->shares);
    free(d);
    r->three_d = NULL;
    mg_tp_zero1_close(r);
    mg_tp_ckpt_free(r); /* the checkpoint layout */
    dt_comm_destroy(r->pipe_comm);
    dt_comm_destroy(r->tp_dp_comm);
    dt_comm_destroy(r->tp_comm);
    r->pipe_comm = r->tp_dp_comm = r->tp_comm = NULL;
}

struct dt_tp_stage *mg_3d_stage(mg_run *r)
{
    return r->three_d->stage;
}

/* ---- a step ----------------------------------------------------------- */

/* DDP on the dp axis: the share's gradients averaged over the replicas,
 * one all-reduce, traced with the bytes this rank sent. */
static dt_status average_grads(mg_run *r)
{
    dt_tp_model *m = &r->three_d->stage->core;
    dt_traffic a, b;
    dt_comm_traffic(r->tp_dp_comm, &a);
    double t0 = dt_now();
    dt_status st = dt_allreduce(r->tp_dp_comm, m->grads_memory, m->num_params, DT_F32, DT_AVG);
    if (st != DT_OK)
        return fail3(r, st, "data parallel: gradient all-reduce", dt_comm_error(r->tp_dp_comm));
    dt_comm_traffic(r->tp_dp_comm, &b);
    mg_trace_add_comm(r->trace, MG_EV_TP_DP, -1, -1, m->num_params * sizeof(float),
                      b.sent_bytes - a.sent_bytes, t0, dt_now());
    return DT_OK;
}

/* The last stages average their replicas' losses, then each pipeline's
 * last stage tells its other stages. */
static dt_status share_loss(mg_run *r, float *loss)
{
    dt_status st = DT_OK;
    if (r->stage == r->o.pp - 1 && r->dp > 1 &&
        (st = dt_allreduce(r->tp_dp_comm, loss, 1, DT_F32, DT_AVG)) != DT_OK)
        return fail3(r, st, "loss all-reduce", dt_comm_error(r->tp_dp_comm));
    if (r->o.pp > 1 && (st = dt_broadcast(r->pipe_comm, loss, 1, DT_F32, r->o.pp - 1)) != DT_OK)
        return fail3(r, st, "loss broadcast", dt_comm_error(r->pipe_comm));
    return DT_OK;
}

/* The dp axis and AdamW: DDP's all-reduce and the stage's update, or
 * ZeRO-1 on the stage's range (tp_zero1.c, AdamW included). */
static dt_status update(mg_run *r, struct mg_3d *d, int step)
{
    if (r->tpz)
        return mg_tp_zero1_step(r, step, NULL); /* share_loss averages the loss */
    dt_status st;
    if (r->dp > 1 && (st = average_grads(r)) != DT_OK)
        return st;
    double tu = dt_now();
    if ((st = dt_tp_stage_update(d->stage, &r->h, step + 1)) != DT_OK)
        return fail3(r, st, "update", dt_tp_stage_error(d->stage));
    mg_trace_add(r->trace, MG_EV_OPTIMIZER, -1, tu, dt_now());
    return DT_OK;
}

dt_status mg_3d_step(mg_run *r, int step, mg_step *out)
{
    const mg_options *o = &r->o;
    struct mg_3d *d = r->three_d;
    int M = d->M, last = r->stage == o->pp - 1;
    size_t rows = (size_t)o->batch * o->cfg.T;
    const int *in[M], *tg[M];
    double t0 = dt_now();
    dt_status st = mg_pipe_load_microbatches(r, step, M);
    if (st != DT_OK)
        return fail3(r, st, "data", dt_dataset_error(r->data));
    for (int j = 0; j < M; j++)
        in[j] = r->x + j * rows, tg[j] = r->y + j * rows;
    float loss = 0;
    dt_tp_stage_zero_grad(d->stage);
    st = dt_pipe_run(d->pipe, r->stage == 0 ? in : NULL, last ? tg : NULL, o->batch, o->cfg.T,
                     &loss);
    if (st != DT_OK)
        return pipe_err(r, st, dt_pipe_error(d->pipe));
    mg_trace_pipe(r->trace, d->pipe, d->sched, r->stage);
    if ((st = update(r, d, step)) != DT_OK || (st = share_loss(r, &loss)) != DT_OK)
        return st;
    out->ms = 1e3 * (dt_now() - t0);
    out->loss = loss;
    r->losses[step] = loss;
    out->tokens_per_s = (double)r->dp * M * rows / (out->ms * 1e-3);
    out->comm.hidden = -1;
    return DT_OK;
}

/* ---- the whole model, for what reads it -------------------------------- */

dt_status mg_3d_assemble(mg_run *r)
{
    const mg_options *o = &r->o;
    struct mg_3d *d = r->three_d;
    dt_tp_model *m = &d->stage->core;
    size_t share = dt_tp_num_params(&o->cfg, o->tp), P = r->m->num_params;
    dt_status st = dt_allgatherv(r->pipe_comm, m->params_memory, d->share, d->stage_counts, DT_F32);
    if (st != DT_OK)
        return fail3(r, st, "3-D grid: all-gather of the stages", dt_comm_error(r->pipe_comm));
    st = dt_allgather(r->tp_comm, d->share, d->shares, share, DT_F32);
    if (st != DT_OK)
        return fail3(r, st, "3-D grid: all-gather of the shares", dt_comm_error(r->tp_comm));
    float *full = malloc(P * sizeof(float));
    if (!full)
        return fail3(r, DT_ENOMEM, "assemble", "out of memory");
    for (int q = 0; q < o->tp; q++)
        dt_tp_layout_unslice(full, d->shares + (size_t)q * share, m->tensors, m->num_tensors, o->tp,
                             q);
    dt_model_set_params(r->m, full);
    free(full);
    return DT_OK;
}
