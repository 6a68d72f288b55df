/*
 * tensor_parallel.c — minigpt --tp T [--dp D]: Megatron's tensor
 * parallelism (tensor/dt_tp.h), with data parallelism across replicas.
 *
 * The rank grid is Megatron's: tp ranks adjacent, then dp (then pp, in a
 * later version): world rank = replica · T + tp_rank, so a tp group, the
 * chattiest (four all-reduces of activations per block per micro-step),
 * is T consecutive ranks, on one node when a node holds T. Both groups
 * come from dt_comm_split of the world: the tp group of a replica, and
 * the dp group of the ranks holding the same share in every replica.
 *
 * A step: every rank of a tp group runs the same micro-batches (their
 * rows of the data stream are the replica's), forward and backward on its
 * share; after the last micro-step the dp group averages the share's
 * gradients (DDP on the dp axis, one all-reduce of the share, not
 * overlapped with backward in this version), and AdamW updates the share.
 *
 * Evaluation runs on the shares (evaluation.c: the tp forward, its
 * vocabulary-parallel loss and argmax). Sampling and the replica check
 * still read a whole dt_model (r->m): after every step the tp group
 * all-gathers its shares and each rank assembles the full parameters
 * into r->m, one all-gather of P/T floats per rank per step, the price
 * of reusing those paths unchanged (worth removing once they run on the
 * shares too).
 * --parallel zero1 shards the optimizer over the dp axis instead
 * (tp_zero1.c); zero2 and zero3 are refused by name, --pp by the command
 * line. Checkpoints: tp_checkpoint.c.
 *
 * --trace: each micro-step's forward and backward, every f and g inside
 * them as its own slice (the tensor layer calls mg_trace_tp after each
 * all-reduce, with the bytes this rank sent for it), the dp all-reduce,
 * the optimizer step and the all-gather of the shares (trace.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_clock.h"
#include "trainer.h"

static dt_status tp_fail(mg_run *r, dt_status st, const char *what, const char *detail)
{
    snprintf(r->err, sizeof r->err, "rank %d: %s: %s", r->rank, what,
             detail && *detail ? detail : dt_status_name(st));
    return st;
}

/* What this version does not combine with --tp, named. */
static const char *unsupported(const mg_options *o)
{
    if (o->parallel != MG_DDP && o->parallel != MG_ZERO1)
        return o->parallel == MG_ZERO3 ? "--parallel zero3 (the dp axis runs DDP or ZeRO-1)"
                                       : "--parallel zero2 (the dp axis runs DDP or ZeRO-1)";
    if (strcmp(o->device, "cuda") == 0)
        return "--device cuda";
    return NULL;
}

/* The grid: tp ranks adjacent, then dp. */
static dt_status open_groups(mg_run *r)
{
    int T = r->o.tp, D = r->o.dp ? r->o.dp : r->world / T;
    char msg[160];
    if (D * T != r->world) {
        snprintf(msg, sizeof msg, "--dp %d x --tp %d is not the world size %d", D, T, r->world);
        return tp_fail(r, DT_EINVAL, "tensor parallel", msg);
    }
    r->dp = D;
    r->replica = r->rank / T;
    if (!r->comm)
        return DT_OK; /* one process: --tp 1 */
    dt_status st = dt_comm_split(r->comm, r->replica, r->rank % T, &r->tp_comm);
    if (st == DT_OK && D > 1)
        st = dt_comm_split(r->comm, r->rank % T, r->replica, &r->tp_dp_comm);
    return st == DT_OK ? DT_OK : tp_fail(r, st, "tensor parallel: split", dt_comm_error(r->comm));
}

/* In bf16 the precision line; then "activations and their gradients per
 * rank: N B (fp32)", and in bf16 what holds them and the rounded
 * parameter copy's bytes. */
void mg_tp_memory_line(const char *where, size_t bytes, const dt_tp_model *m)
{
    if (m->bf16)
        printf("precision: bf16 compute on each share, fp32 master weights, gradients and AdamW "
               "state; path: %s\n",
               dt_bf16_path());
    if (m->bf16)
        printf("activations and their gradients %s: %zu B (bf16 store, one-block fp32 "
               "workspaces); rounded parameter copy %zu B\n",
               where, bytes, m->num_params * sizeof(float));
    else
        printf("activations and their gradients %s: %zu B (fp32)\n", where, bytes);
}

dt_status mg_tp_open(mg_run *r)
{
    const mg_options *o = &r->o;
    const char *no = unsupported(o);
    if (no)
        return tp_fail(r, DT_EINVAL, "--tp", no);
    if (o->tp > r->world) {
        char msg[96];
        snprintf(msg, sizeof msg, "--tp %d needs at least %d ranks, the world has %d", o->tp, o->tp,
                 r->world);
        return tp_fail(r, DT_EINVAL, "--tp", msg);
    }
    dt_status st = open_groups(r);
    if (st != DT_OK)
        return st;
    const dt_backend *be = strcmp(o->device, "cuda-host") == 0 ? dt_backend_cuda_host()
                                                               : dt_backend_cpu();
    if (!r->tp_comm)
        return tp_fail(r, DT_EINVAL, "--tp", "needs a job of --tp ranks at least (dtrain-launch)");
    st = dt_tp_create(&r->tp, &o->cfg, be, o->batch, r->tp_comm);
    if (st == DT_OK && strcmp(o->precision, "bf16") == 0)
        st = dt_tp_set_precision(r->tp, DT_PRECISION_BF16);
    if (st == DT_OK)
        st = dt_tp_init(r->tp, o->seed);
    if (st != DT_OK)
        return tp_fail(r, st, "model", dt_tp_error(r->tp));
    if (r->trace) { /* every f and g as a slice */
        r->tp->trace = mg_trace_tp;
        r->tp->trace_user = r->trace;
    }
    st = dt_model_create(&r->m, &o->cfg, be, o->batch); /* the assembled copy */
    if (st != DT_OK)
        return tp_fail(r, st, "model", r->m ? dt_model_error(r->m) : NULL);
    dt_model_init(r->m, o->seed);
    size_t n = (size_t)o->batch * (size_t)o->cfg.T, share = r->tp->num_params;
    r->x = malloc(n * sizeof(int));
    r->y = malloc(n * sizeof(int));
    r->losses = calloc((size_t)o->steps, sizeof(float));
    r->tp_shares = malloc(share * (size_t)o->tp * sizeof(float));
    if (!r->x || !r->y || !r->losses || !r->tp_shares)
        return tp_fail(r, DT_ENOMEM, "trainer", "out of memory");
    r->h = dt_adamw_defaults(o->lr);
    if (r->rank == 0)
        printf("tensor parallel: %d replica%s x %d tp ranks (tp ranks adjacent), share of %zu "
               "of %zu parameters per rank\n",
               r->dp, r->dp == 1 ? "" : "s", o->tp, share, r->m->num_params);
    if (r->rank == 0)
        mg_tp_memory_line("per rank", dt_tp_activation_bytes(r->tp), r->tp);
    if (o->parallel != MG_ZERO1)
        return DT_OK;
    if (!r->tp_dp_comm)
        return tp_fail(r, DT_EINVAL, "--parallel zero1", "needs --dp 2 or more replicas to shard");
    return mg_tp_zero1_open(r, r->tp, 0); /* tp_zero1.c: the whole share */
}

void mg_tp_close(mg_run *r)
{
    dt_tp_destroy(r->tp);
    r->tp = NULL;
    free(r->tp_shares);
    r->tp_shares = NULL;
    mg_tp_ckpt_free(r);
    mg_tp_zero1_close(r);
    dt_comm_destroy(r->tp_dp_comm);
    dt_comm_destroy(r->tp_comm);
    r->tp_dp_comm = r->tp_comm = NULL;
}

/* A collective on c, traced as `kind` with its bytes and this rank's
 * payload sent. */
static dt_status traced(mg_run *r, dt_comm *c, int kind, size_t bytes, dt_status (*op)(mg_run *))
{
    dt_traffic a, b;
    dt_comm_traffic(c, &a);
    double t0 = dt_now();
    dt_status st = op(r);
    dt_comm_traffic(c, &b);
    if (st == DT_OK)
        mg_trace_add_comm(r->trace, kind, -1, -1, bytes, b.sent_bytes - a.sent_bytes, t0, dt_now());
    return st;
}

static dt_status gather_shares(mg_run *r)
{
    return dt_allgather(r->tp_comm, r->tp->params_memory, r->tp_shares, r->tp->num_params, DT_F32);
}

static dt_status average_grads(mg_run *r)
{
    return dt_allreduce(r->tp_dp_comm, r->tp->grads_memory, r->tp->num_params, DT_F32, DT_AVG);
}

/* Every share of the tp group into r->m's full parameters, unsliced in
 * place: --tp runs only on backends whose memory the host reads
 * (dt_tp_create refuses the others), so no whole-model staging buffer
 * (4P bytes, 650 MB at GPT-2 small's 162M) is allocated at each step. */
dt_status mg_tp_assemble(mg_run *r)
{
    dt_tp_model *m = r->tp;
    dt_status st = traced(r, r->tp_comm, MG_EV_TP_GATHER,
                          m->num_params * (size_t)m->tp * sizeof(float), gather_shares);
    if (st != DT_OK)
        return tp_fail(r, st, "tensor parallel: all-gather of the shares",
                       dt_comm_error(r->tp_comm));
    for (int q = 0; q < m->tp; q++)
        dt_tp_layout_unslice(r->m->params_memory, r->tp_shares + (size_t)q * m->num_params,
                             m->tensors, m->num_tensors, m->tp, q);
    return DT_OK;
}

/* Micro-step j: this replica's rows, forward and backward on the share. */
static dt_status micro_step(mg_run *r, int step, int j, float *loss)
{
    const mg_options *o = &r->o;
    uint64_t G = (uint64_t)r->dp * (uint64_t)o->grad_accum * (uint64_t)o->batch;
    uint64_t row = r->row0 + (uint64_t)(step - r->start_step) * G +
                   (uint64_t)(r->replica * o->grad_accum + j) * (uint64_t)o->batch;
    dt_status st = dt_dataset_batch(r->x, r->y, r->data, DT_TRAIN, o->seed, row, o->batch,
                                    o->cfg.T);
    if (st != DT_OK)
        return tp_fail(r, st, "data", dt_dataset_error(r->data));
    double t0 = dt_now();
    if ((st = dt_tp_forward(r->tp, r->x, r->y, o->batch, o->cfg.T)) != DT_OK)
        return tp_fail(r, st, "step", dt_tp_error(r->tp));
    double t1 = dt_now();
    mg_trace_add(r->trace, MG_EV_FORWARD, j, t0, t1);
    if ((st = dt_tp_backward(r->tp, 1.0f / (float)o->grad_accum)) != DT_OK)
        return tp_fail(r, st, "step", dt_tp_error(r->tp));
    mg_trace_add(r->trace, MG_EV_BACKWARD, j, t1, dt_now());
    *loss += r->tp->mean_loss / (float)o->grad_accum;
    return DT_OK;
}

dt_status mg_tp_step(mg_run *r, int step, mg_step *out)
{
    double t0 = dt_now();
    float loss = 0;
    dt_status st = DT_OK;
    dt_tp_zero_grad(r->tp);
    for (int j = 0; j < r->o.grad_accum && st == DT_OK; j++)
        st = micro_step(r, step, j, &loss);
    if (st != DT_OK)
        return st;
    if (r->tpz) { /* ZeRO-1 on the dp axis, AdamW included (tp_zero1.c) */
        if ((st = mg_tp_zero1_step(r, step, &loss)) != DT_OK)
            return st;
    } else if (r->tp_dp_comm) { /* DDP on the dp axis: the mean of the replicas */
        st = traced(r, r->tp_dp_comm, MG_EV_TP_DP, r->tp->num_params * sizeof(float),
                    average_grads);
        if (st == DT_OK)
            st = dt_allreduce(r->tp_dp_comm, &loss, 1, DT_F32, DT_AVG);
        if (st != DT_OK)
            return tp_fail(r, st, "data parallel: gradient all-reduce",
                           dt_comm_error(r->tp_dp_comm));
    }
    double tu = dt_now();
    if (!r->tpz && (st = dt_tp_update(r->tp, &r->h, step + 1)) != DT_OK)
        return tp_fail(r, st, "update", dt_tp_error(r->tp));
    if (!r->tpz)
        mg_trace_add(r->trace, MG_EV_OPTIMIZER, -1, tu, dt_now());
    if ((st = mg_tp_assemble(r)) != DT_OK)
        return st;
    out->ms = 1e3 * (dt_now() - t0);
    out->loss = loss;
    r->losses[step] = loss;
    double tokens = (double)r->dp * r->o.grad_accum * r->o.batch * r->o.cfg.T;
    out->tokens_per_s = tokens / (out->ms * 1e-3);
    out->comm.hidden = -1;
    return DT_OK;
}
