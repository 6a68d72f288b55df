/*
 * trainer.c — one rank's training loop body: data, model, data-parallel
 * optimizer, and the step.
 *
 * The global batch of a step is N ranks x K micro-steps x B sequences. Rows
 * are numbered globally (dt_dataset_batch is stateless: row r is a function
 * of the seed and r): micro-step j of rank r reads rows
 * step·NKB + (r·K + j)·B .. +B. So the same run on another world size with
 * the same N·K sees the same sequences, and one process with K' = N·K
 * reproduces an N-rank run (tests/test_ddp.c relies on exactly this).
 *
 * Each micro-step's backward gets dloss = 1/K, so the accumulated gradient
 * is this rank's mean; DDP's all-reduce (avg) or ZeRO-1's reduces (avg, each
 * gradient piece to the rank owning it) turn it into the global batch's
 * mean. Both sync only the last micro-step (no_sync before), and their
 * buckets go out during that backward. ZeRO-1's step leaves the parameter
 * all-gather in flight; the next forward waits for each block's
 * parameters as it reaches them, and anything else that reads the
 * parameters (evaluation, the replica check) calls mg_settle_params first
 * (a checkpoint's dt_zero1_state waits by itself). ZeRO-3 keeps no whole
 * model, in any phase: evaluation and the sample run on every rank
 * through the units (mg_eval_params: each forward gathers one unit at a
 * time, so every rank runs the same forwards; rank 0 prints), the
 * replica check streams its hash through them and a checkpoint saves
 * and loads the shard itself (checkpointing.c). A pipeline's ZeRO-3
 * still holds its stage whole around them (mg_params_hold). The logged loss's
 * all-reduce is launched before the optimizer step, so it does not queue
 * behind the gather.
 *
 * --deterministic (optim/rank_order.c): every backward gets dloss = 1;
 * the optimizer sums the micro-steps left to right and the ranks in rank
 * order, and divides once by k·N.
 *
 * Every rank starts from the same weights because the optimizer wrappers
 * broadcast rank 0's at creation; under ZeRO-3 the model is created
 * sharded and each rank draws its own shard of the same initial weights
 * (dt_zero3_init_shard), so no rank holds the whole model at start-up.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dt_clock.h"
#include "trainer.h"

static dt_status run_fail(mg_run *r, dt_status st, const char *what, const char *detail)
{
    snprintf(r->err, sizeof r->err, "rank %d: %s: %s", r->rank, what,
             detail && *detail ? detail : dt_status_name(st));
    return st;
}

/* llm.c token shards (--data a shard, or a glob of them): the model's
 * vocabulary becomes the data's (GPT-2's 50257) unless -V was given. */
static dt_status open_shards(mg_run *r)
{
    dt_status st = dt_dataset_open_shard_glob(&r->data, r->o.data);
    if (st != DT_OK)
        return st;
    if (!r->o.vocab_set)
        r->o.cfg.V = dt_dataset_vocab(r->data);
    if (r->rank == 0)
        printf("data: llm.c token shards %s: %zu train + %zu validation "
               "tokens, vocabulary %d\n",
               r->o.data, dt_dataset_tokens(r->data, DT_TRAIN), dt_dataset_tokens(r->data, DT_VAL),
               r->o.cfg.V);
    return DT_OK;
}

static dt_status open_data(mg_run *r)
{
    const mg_options *o = &r->o;
    dt_status st;
    if (!o->data) {
        st = dt_dataset_task(&r->data, DT_TASK_REVERSE, 5, 20000, 500, 7);
        r->is_task = true;
    } else if (strcmp(o->data, "random") == 0) {
        st = dt_dataset_random(&r->data, o->cfg.V, (size_t)1 << 16, o->seed);
    } else if (strpbrk(o->data, "*?[") || dt_dataset_is_shard_file(o->data)) {
        st = open_shards(r);
    } else {
        st = dt_dataset_open_text(&r->data, o->data, 0.1);
    }
    if (st != DT_OK)
        return run_fail(r, st, "data", r->data ? dt_dataset_error(r->data) : "out of memory");
    if (dt_dataset_max_token(r->data) >= o->cfg.V) {
        char msg[128];
        snprintf(msg, sizeof msg,
                 "the data has token ids up to %d, the "
                 "model's vocabulary is %d (set --vocab)",
                 dt_dataset_max_token(r->data), o->cfg.V);
        return run_fail(r, DT_EINVAL, "data", msg);
    }
    return DT_OK;
}

enum {
    DETERMINISTIC_BIT = 1 << 8,
    GRAD_BF16_BIT = 1 << 9,
    PRECISION_BF16_BIT = 1 << 10,
    ACT_BF16_BIT = 1 << 11
};
#define MODE_FLAGS (DETERMINISTIC_BIT | GRAD_BF16_BIT | PRECISION_BF16_BIT | ACT_BF16_BIT)

/* " --deterministic --grad-comm bf16 --precision bf16 --act-comm bf16" as
 * far as a mode word says so, into out. */
static const char *mode_flags(char *out, size_t len, int32_t mode)
{
    snprintf(out, len, "%s%s%s%s", (mode & DETERMINISTIC_BIT) ? " --deterministic" : "",
             (mode & GRAD_BF16_BIT) ? " --grad-comm bf16" : "",
             (mode & PRECISION_BF16_BIT) ? " --precision bf16" : "",
             (mode & ACT_BF16_BIT) ? " --act-comm bf16" : "");
    return out;
}

/*
 * Every rank must run the same data-parallel mode (and --deterministic or
 * not: its rank-order sums and the other reductions would pair the wrong
 * messages; --grad-comm and --act-comm bf16 or not: half the bytes; a
 * pipeline's stages would read a bf16 activation as fp32): a DDP rank's bucket
 * all-reduces and a ZeRO rank's reduces and gathers would meet as
 * collectives of other kinds and sizes, and fail far from the cause (or,
 * between ZeRO-1 and ZeRO-2, whose collectives agree, silently hold other
 * memory than asked). So before the first collective of training each
 * rank's mode is all-gathered, and every rank refuses a mismatch with the
 * same message naming the ranks and their modes.
 */
dt_status mg_check_modes(mg_run *r)
{
    if (!r->comm)
        return DT_OK;
    int32_t mine = (int32_t)r->o.parallel | (r->o.deterministic ? DETERMINISTIC_BIT : 0) |
                   (strcmp(r->o.grad_comm, "bf16") == 0 ? GRAD_BF16_BIT : 0) |
                   (strcmp(r->o.precision, "bf16") == 0 ? PRECISION_BF16_BIT : 0) |
                   (strcmp(r->o.act_comm, "bf16") == 0 ? ACT_BF16_BIT : 0),
            *all = calloc((size_t)r->world, sizeof *all);
    if (!all)
        return run_fail(r, DT_ENOMEM, "mode check", "out of memory");
    dt_status st = dt_allgather(r->comm, &mine, all, 1, DT_I32);
    if (st != DT_OK) {
        free(all);
        return run_fail(r, st, "mode check", dt_comm_error(r->comm));
    }
    for (int q = 1; q < r->world; q++)
        if (all[q] != all[0]) {
            char msg[300], f0[80], fq[80];
            snprintf(msg, sizeof msg,
                     "rank 0 runs --parallel %s%s, rank %d --parallel %s%s: every rank must run "
                     "the same mode",
                     mg_parallel_name((mg_parallel)(all[0] & ~MODE_FLAGS)),
                     mode_flags(f0, sizeof f0, all[0]), q,
                     mg_parallel_name((mg_parallel)(all[q] & ~MODE_FLAGS)),
                     mode_flags(fq, sizeof fq, all[q]));
            free(all);
            return run_fail(r, DT_EINVAL, "start-up", msg);
        }
    free(all);
    return DT_OK;
}

/* Ranks on this node, as the launchers say it (torchrun's name first);
 * a job started by hand with only WORLD_SIZE is taken to be on one node;
 * 1 when run alone. */
int mg_local_world_size(void)
{
    const char *names[] = {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                           "SLURM_NTASKS_PER_NODE", "WORLD_SIZE"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (getenv(names[i]) && atoi(getenv(names[i])) > 0)
            return atoi(getenv(names[i]));
    return 1;
}

int mg_local_rank(void)
{
    const char *names[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (getenv(names[i]))
            return atoi(getenv(names[i]));
    return 0;
}

/* --device cuda: this rank's GPU, or a message naming what is missing. The
 * model's parameters, gradients, activations and optimizer state (ZeRO-1's
 * shard too) then live on the device; DDP's buckets and ZeRO-1's
 * collectives take those device buffers, staged by the communicator. */
static dt_status open_backend(mg_run *r, const dt_backend **be)
{
    if (strcmp(r->o.device, "cuda-host") == 0)
        *be = dt_backend_cuda_host();
    if (strcmp(r->o.device, "cuda") != 0) {
        if (strcmp(r->o.device, "cpu") == 0)
            *be = dt_backend_cpu();
        return DT_OK;
    }
    char err[256] = "";
    dt_status st = dt_backend_cuda_open(be, mg_local_rank(), err, sizeof err);
    return st == DT_OK ? DT_OK : run_fail(r, st, "device", err);
}

dt_status mg_run_open(mg_run *r)
{
    const mg_options *o = &r->o;
    dt_status st = open_data(r);
    if (st != DT_OK)
        return st;
    if (o->pp > 0 && o->tp > 0)
        return mg_3d_open(r);
    if (o->pp > 0)
        return mg_pipe_open(r);
    if (o->tp > 0)
        return mg_tp_open(r);
    const dt_backend *be;
    if ((st = open_backend(r, &be)) != DT_OK)
        return st;
    bool sharded = o->parallel == MG_ZERO3; /* ZeRO-3: no whole model, even at start-up */
    st = sharded        ? dt_model_create_sharded(&r->m, &o->cfg, be, o->batch, o->recompute)
         : o->recompute ? dt_model_create_recompute(&r->m, &o->cfg, be, o->batch)
                        : dt_model_create(&r->m, &o->cfg, be, o->batch);
    if (st == DT_OK && strcmp(o->precision, "bf16") == 0)
        st = dt_model_set_precision(r->m, DT_PRECISION_BF16);
    if (st != DT_OK)
        return run_fail(r, st, "model", r->m ? dt_model_error(r->m) : NULL);
    if (!sharded)
        dt_model_init(r->m, o->seed);
    size_t n = (size_t)o->batch * (size_t)o->cfg.T;
    r->x = malloc(n * sizeof(int));
    r->y = malloc(n * sizeof(int));
    r->losses = calloc((size_t)o->steps, sizeof(float));
    if (!r->x || !r->y || !r->losses)
        return run_fail(r, DT_ENOMEM, "trainer", "out of memory");
    r->h = dt_adamw_defaults(o->lr);
    if (o->parallel == MG_DDP) {
        size_t bytes = (size_t)(o->bucket_mb * 1024 * 1024);
        st = dt_ddp_create(&r->ddp, r->m, r->comm, bytes);
        if (st == DT_OK && o->deterministic)
            st = dt_ddp_set_deterministic(r->ddp);
        if (st == DT_OK && strcmp(o->grad_comm, "bf16") == 0)
            st = dt_ddp_set_grad_bf16(r->ddp);
        if (st != DT_OK)
            return run_fail(r, st, "ddp", r->ddp ? dt_ddp_error(r->ddp) : NULL);
    } else {
        size_t bytes = (size_t)(o->bucket_mb * 1024 * 1024);
        st = o->parallel == MG_ZERO3   ? dt_zero3_create(&r->zero1, r->m, r->comm, bytes)
             : o->parallel == MG_ZERO2 ? dt_zero2_create(&r->zero1, r->m, r->comm, bytes)
                                       : dt_zero1_create_bucketed(&r->zero1, r->m, r->comm, bytes);
        if (st == DT_OK && sharded) /* each rank draws its own shard */
            st = dt_zero3_init_shard(r->zero1, o->seed);
        if (st == DT_OK && o->deterministic)
            st = dt_zero1_set_deterministic(r->zero1);
        if (st == DT_OK && strcmp(o->grad_comm, "bf16") == 0)
            st = dt_zero1_set_grad_bf16(r->zero1);
        if (st != DT_OK)
            return run_fail(r, st, mg_parallel_name(o->parallel),
                            r->zero1 ? dt_zero1_error(r->zero1) : NULL);
    }
    return DT_OK;
}

void mg_run_close(mg_run *r)
{
    mg_3d_close(r);
    mg_pipe_close(r);
    mg_tp_close(r);
    dt_ddp_destroy(r->ddp);
    dt_zero1_destroy(r->zero1);
    dt_model_destroy(r->m);
    dt_dataset_close(r->data);
    free(r->x);
    free(r->y);
    free(r->losses);
    free(r->bytes_sent_by_rank);
}

/* Forward and backward of micro-step j; DDP syncs on the last. */
static dt_status micro_step(mg_run *r, int step, int j, float *loss)
{
    const mg_options *o = &r->o;
    uint64_t G = (uint64_t)r->world * (uint64_t)o->grad_accum * (uint64_t)o->batch;
    uint64_t row = r->row0 + (uint64_t)(step - r->start_step) * G +
                   (uint64_t)(r->rank * o->grad_accum + j) * (uint64_t)o->batch;
    dt_status st = dt_dataset_batch(r->x, r->y, r->data, DT_TRAIN, o->seed, row, o->batch,
                                    o->cfg.T);
    if (st != DT_OK)
        return run_fail(r, st, "data", dt_dataset_error(r->data));
    double t0 = dt_now();
    st = r->zero1 ? dt_zero1_forward(r->zero1, r->x, r->y, o->batch, o->cfg.T)
                  : dt_model_forward(r->m, r->x, r->y, o->batch, o->cfg.T);
    if (st != DT_OK)
        return run_fail(r, st, "forward",
                        r->zero1 ? dt_zero1_error(r->zero1) : dt_model_error(r->m));
    double t1 = dt_now();
    mg_trace_add(r->trace, MG_EV_FORWARD, j, t0, t1);
    *loss += r->m->mean_loss / (float)o->grad_accum;
    /* --deterministic: the optimizer divides the sum once, by k·N */
    float dloss = o->deterministic ? 1.0f : 1.0f / (float)o->grad_accum;
    bool sync = j == o->grad_accum - 1;
    if (r->ddp) {
        st = dt_ddp_backward(r->ddp, dloss, sync);
        if (st != DT_OK)
            return run_fail(r, st, "backward", dt_ddp_error(r->ddp));
    } else if (r->zero1) {
        st = dt_zero1_backward(r->zero1, dloss, sync);
        if (st != DT_OK)
            return run_fail(r, st, "backward", dt_zero1_error(r->zero1));
    } else {
        st = dt_model_backward(r->m, dloss);
        if (st != DT_OK)
            return run_fail(r, st, "backward", dt_model_error(r->m));
    }
    mg_trace_add(r->trace, MG_EV_BACKWARD, j, t1, dt_now());
    return DT_OK;
}

/* What every communicator of this rank has moved so far: the world's and
 * each group's (a group counts its own traffic), each once: a group that
 * is the world itself (a pipeline of one replica) is not added twice. */
static void rank_traffic(const mg_run *r, dt_traffic *sum)
{
    const dt_comm *comms[] = {r->comm, r->pipe_comm, r->dp_comm, r->tp_comm, r->tp_dp_comm};
    *sum = (dt_traffic){0};
    for (size_t i = 0; i < sizeof comms / sizeof comms[0]; i++) {
        bool seen = false;
        for (size_t k = 0; k < i; k++)
            seen = seen || comms[k] == comms[i];
        if (!comms[i] || seen)
            continue;
        dt_traffic t;
        dt_comm_traffic(comms[i], &t);
        sum->sent_bytes += t.sent_bytes;
        sum->recv_bytes += t.recv_bytes;
    }
}

static dt_status dp_step(mg_run *r, int step, mg_step *out);

dt_status mg_train_step(mg_run *r, int step, mg_step *out)
{
    dt_traffic before, after;
    rank_traffic(r, &before);
    if (step == r->start_step) /* the run's traffic from here (traffic.c) */
        r->traffic_sent_first = before.sent_bytes;
    mg_trace_set_step(r->trace, step);
    dt_status st = r->three_d ? mg_3d_step(r, step, out)
                   : r->pipe  ? mg_pipe_step(r, step, out)
                   : r->tp    ? mg_tp_step(r, step, out)
                              : dp_step(r, step, out);
    rank_traffic(r, &after);
    out->bytes_sent = after.sent_bytes - before.sent_bytes;
    out->bytes_recv = after.recv_bytes - before.recv_bytes;
    r->last_bytes_sent = out->bytes_sent;
    return st;
}

dt_status mg_close_traffic(mg_run *r)
{
    dt_traffic now;
    if (r->comm && !r->pipe && !r->tp && !r->three_d) {
        dt_status st = dt_barrier(r->comm); /* after every op the steps queued */
        if (st != DT_OK)
            return run_fail(r, st, "traffic barrier", dt_comm_error(r->comm));
    }
    rank_traffic(r, &now);
    int64_t sum = (int64_t)(now.sent_bytes - r->traffic_sent_first); /* then every rank's */
    r->traffic_steps = r->o.steps - r->start_step;
    if (r->comm && !r->pipe && !r->tp && !r->three_d) {
        dt_status st = dt_allreduce(r->comm, &sum, 1, DT_I64, DT_SUM);
        if (st != DT_OK)
            return run_fail(r, st, "traffic sum", dt_comm_error(r->comm));
    }
    r->traffic_sent = (uint64_t)sum;
    return DT_OK;
}

dt_status mg_gather_traffic(mg_run *r)
{
    if (r->rank == 0 && !r->bytes_sent_by_rank &&
        !(r->bytes_sent_by_rank = calloc((size_t)r->world, sizeof(uint64_t))))
        return run_fail(r, DT_ENOMEM, "traffic", "out of memory");
    int64_t mine = (int64_t)r->last_bytes_sent;
    if (!r->comm) {
        r->bytes_sent_by_rank[0] = (uint64_t)mine;
        return DT_OK;
    }
    dt_status st = dt_gather(r->comm, &mine, r->bytes_sent_by_rank, 1, DT_I64, 0);
    return st == DT_OK ? DT_OK : run_fail(r, st, "traffic gather", dt_comm_error(r->comm));
}

/* A data-parallel step (DDP or ZeRO). */
static dt_status dp_step(mg_run *r, int step, mg_step *out)
{
    double t0 = dt_now();
    float loss = 0;
    dt_status st = DT_OK;
    dt_model_zero_grad(r->m);
    for (int j = 0; j < r->o.grad_accum && st == DT_OK; j++)
        st = micro_step(r, step, j, &loss);
    if (st != DT_OK)
        return st;
    /* the logged loss is the global batch's: 4 bytes, queued before the
     * parameter all-gather so that waiting for it does not wait for that */
    dt_work *loss_work = NULL;
    if (r->comm &&
        (st = dt_allreduce_async(r->comm, &loss, 1, DT_F32, DT_AVG, &loss_work)) != DT_OK)
        return run_fail(r, st, "loss all-reduce", dt_comm_error(r->comm));
    if (r->ddp) {
        st = dt_ddp_wait(r->ddp, &out->comm);
        if (st != DT_OK)
            return run_fail(r, st, "gradient all-reduce", dt_ddp_error(r->ddp));
        mg_trace_ddp(r->trace, r->ddp);
        double tu = dt_now();
        st = dt_model_update(r->m, &r->h, step + 1);
        if (st != DT_OK)
            return run_fail(r, st, "update", dt_model_error(r->m));
        mg_trace_add(r->trace, MG_EV_OPTIMIZER, -1, tu, dt_now());
    } else {
        double tu = dt_now();
        st = dt_zero1_step_async(r->zero1, &r->h, step + 1, &out->comm);
        if (st != DT_OK)
            return run_fail(r, st, "zero1 step", dt_zero1_error(r->zero1));
        mg_trace_add(r->trace, MG_EV_OPTIMIZER, -1, tu, dt_now());
        mg_trace_zero1(r->trace, r->zero1);
    }
    if (strcmp(r->m->be->name, "cuda") == 0) { /* kernels fail late */
        char err[256] = "";
        if ((st = dt_backend_cuda_check(err, sizeof err)) != DT_OK)
            return run_fail(r, st, "device", err);
    }
    out->ms = 1e3 * (dt_now() - t0);
    if (loss_work && (st = dt_work_wait(loss_work)) != DT_OK)
        return run_fail(r, st, "loss all-reduce", dt_comm_error(r->comm));
    out->loss = loss;
    r->losses[step] = loss;
    double tokens = (double)r->world * r->o.grad_accum * r->o.batch * r->o.cfg.T;
    out->tokens_per_s = tokens / (out->ms * 1e-3);
    return DT_OK;
}

static bool is_zero3(const mg_run *r)
{
    return r->zero1 && dt_zero1_stage(r->zero1) == 3;
}

dt_status mg_params_hold(mg_run *r, bool hold)
{
    if (r->three_d) /* the whole model, assembled from the grid's shares */
        return hold ? mg_3d_assemble(r) : DT_OK;
    dt_status st = is_zero3(r) ? dt_zero1_hold_params(r->zero1, hold) : DT_OK;
    if (st != DT_OK)
        return run_fail(r, st, "zero3: holding the whole model", dt_zero1_error(r->zero1));
    return DT_OK;
}

bool mg_eval_collective(const mg_run *r)
{
    return is_zero3(r) && !r->pipe;
}

bool mg_eval_units(const mg_run *r)
{
    return is_zero3(r) && !r->three_d;
}

dt_status mg_eval_params(mg_run *r, bool on)
{
    if (!mg_eval_units(r))
        return mg_params_hold(r, on);
    dt_zero1_arm_inference(r->zero1, on);
    if (!on && r->pipe) /* the executor's forwards and backwards gather again */
        dt_zero1_arm_params(r->zero1, true);
    dt_status st = dt_zero1_hold_params(r->zero1, false); /* reports a failure */
    return st == DT_OK ? DT_OK : run_fail(r, st, "zero3: evaluation", dt_zero1_error(r->zero1));
}

dt_status mg_settle_params(mg_run *r)
{
    if (is_zero3(r)) /* a hold or the units are collective: the caller made them */
        return r->m->params_memory || r->m->params_needed
                   ? DT_OK
                   : run_fail(r, DT_EINVAL, "zero3",
                              "the parameters are read without a hold or the units");
    dt_status st = r->zero1 ? dt_zero1_wait_params(r->zero1) : DT_OK;
    if (st != DT_OK)
        return run_fail(r, st, "parameter all-gather", dt_zero1_error(r->zero1));
    return DT_OK;
}

/* Prints a token as text when it is printable ASCII, else as <id>. */
static void put_token(FILE *f, int t)
{
    if (t == '\n')
        fputs("\\n", f);
    else if (t >= 32 && t < 127)
        fputc(t, f);
    else
        fprintf(f, "<%d>", t);
}

/* The task's prompt is an example up to its '='; otherwise T/2 tokens. */
static int sample_prompt_len(const mg_run *r, int T)
{
    for (int i = 0; r->is_task && i < T; i++)
        if (r->x[i] == '=')
            return i + 1;
    return T / 2;
}

/* Whether the digits before a task prompt's '=' read the same reversed:
 * such a prompt's answer is itself and shows no reversal. */
static bool prompt_is_palindrome(const int *x, int prompt)
{
    for (int i = 0, j = prompt - 2; i < j; i++, j--)
        if (x[i] != x[j])
            return false;
    return true;
}

/* Loads a validation row to sample after into r->x: the first of a few
 * rows whose task prompt is not a palindrome (so the sample shows the
 * digits reversed), or row 0. Returns the prompt's length, 0 on failure. */
static int load_sample_prompt(mg_run *r, int T)
{
    enum { ROWS_TRIED = 16 };
    for (uint64_t row = 0; row < ROWS_TRIED; row++) {
        if (dt_dataset_batch(r->x, r->y, r->data, DT_VAL, r->o.seed + 2, row, 1, T) != DT_OK)
            return 0;
        int prompt = sample_prompt_len(r, T);
        if (!r->is_task || !prompt_is_palindrome(r->x, prompt))
            return prompt;
    }
    return dt_dataset_batch(r->x, r->y, r->data, DT_VAL, r->o.seed + 2, 0, 1, T) == DT_OK
               ? sample_prompt_len(r, T)
               : 0;
}

void mg_sample(mg_run *r, FILE *f, int n)
{
    const mg_options *o = &r->o;
    int T = o->cfg.T, total = T + n;
    int *tok = malloc((size_t)total * sizeof(int));
    int prompt = tok ? load_sample_prompt(r, T) : 0;
    if (prompt == 0) {
        free(tok);
        return;
    }
    memcpy(tok, r->x, (size_t)prompt * sizeof(int));
    dt_rng rng;
    dt_rng_seed(&rng, o->seed + 3);
    int len = dt_generate(r->m, tok, prompt, n, r->is_task ? 0.0f : 1.0f, 0, r->is_task ? '\n' : -1,
                          &rng);
    if (!f) { /* a ZeRO-3 rank that only takes part in the forwards */
        free(tok);
        return;
    }
    fputs("sample: ", f);
    for (int i = 0; i < prompt; i++)
        put_token(f, tok[i]);
    fputs(" -> ", f);
    for (int i = prompt; i < len; i++)
        put_token(f, tok[i]);
    fputc('\n', f);
    free(tok);
}
