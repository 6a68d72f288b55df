/*
 * zero1.c — ZeRO stage 1: AdamW state sharded over the ranks, its
 * communication overlapped with backward and with the next forward.
 *
 * Stage 2 (dt_zero2_create) is this file with grad_shards.c in place of
 * the in-place reduces below and no master copy (but in bf16); stage 3 (dt_zero3_create)
 * is stage 2 whose master is all a rank keeps of the weights, param_units.c
 * gathering each unit just before it is read, in place of the gathers.
 *
 * The idea (Rajbhandari et al., "ZeRO", 2020, stage 1). Under DDP every
 * rank keeps AdamW's m and v (and, with low-precision weights, an fp32
 * master) for every parameter and runs the same update p times over.
 * Instead rank r owns a 1/p shard of the flat buffer: it needs the mean
 * gradient only there, keeps master, m and v only for it, updates it, and
 * everyone exchanges the updated shards. Same bytes on the wire as DDP's
 * ring all-reduce; optimizer memory 12Ψ/p instead of 12Ψ.
 *
 * Shards: s = ceil(Ψ/p); rank r owns [r·s, (r+1)·s) clipped to Ψ (n_r
 * valid elements, 0 on the last ranks when Ψ < p). The checkpoint layer
 * and resharding rely on exactly this layout (zero_layout.c computes it).
 *
 * Gradients: the flat gradient is cut like DDP's buckets (whole tensors
 * from the tail, at most bucket_bytes) and each bucket again at shard
 * boundaries. Backward's progress hook (dt_zero1_backward) launches a
 * piece the moment its gradients are final, an async reduce (avg) to its
 * owner in place in the gradient buffer (no staging: AdamW reads the
 * owner's slice). All pieces move what a ring reduce-scatter moves,
 * (p-1)/p · 4Ψ bytes per rank; a binomial tree puts ⌈log2 p⌉ hops on a
 * piece's critical path, hidden behind backward.
 *
 * Parameters: after AdamW on the shard, one allgatherv (counts = the
 * piece ∩ each shard) per stage forward reads (embeddings, each block,
 * ln_f + head; neighbours merged up to bucket_bytes), straight into the
 * model's buffer (a bf16 model's in bf16: zero_bf16_params.c below).
 * dt_zero1_step waits for them; dt_zero1_step_async
 * leaves them in flight and dt_zero1_forward waits for each piece just
 * before forward reads it (the parameter hook) — FSDP's prefetch.
 *
 * --deterministic (rank_order.c): the pieces are summed in rank order,
 * the step's earlier micro-steps added into each just before it leaves,
 * and the owner divides its shard by k·N before AdamW.
 *
 * --grad-comm bf16 (grad_comm.c): each piece is rounded to bf16 just
 * before it leaves and reduced as bf16; its owner widens the mean back
 * into the gradient buffer at the step. ZeRO-2 and 3: grad_shards.c.
 *
 * Ordering: every rank builds the same pieces and launches them in the
 * same order (reduces as backward reaches them, gathers in forward order).
 * Memory: master, m, v: 12·s bytes; the tree reduce borrows 2·(piece)
 * bytes of communicator scratch on ranks with children. Timing: the
 * overlap clock (overlap_clock.c), pieces polled at each hook.
 *
 * The master is where bf16 weights part from their fp32 master: of a model
 * that computes in bf16 (model/precision.c) the gathers carry the master
 * rounded to bf16 and every replica holds those roundings (ZeRO-3's units
 * too, param_units.c); checkpoints and the replica hash take the master.
 * In fp32 it holds the parameters' own values. ZeRO-2 keeps none in fp32
 * (AdamW updates the model's own slice, the gathers send from there: the
 * same bits) but one in bf16; ZeRO-3's is its weights.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_optim.h"
#include "dt_clock.h"
#include "optim_internal.h"

typedef optim_zero_piece piece; /* zero_layout.c; struct dt_zero1: optim_internal.h */

const char *optim_zero1_cause(const dt_zero1 *z, dt_status st)
{
    return z->comm && *dt_comm_error(z->comm) ? dt_comm_error(z->comm) : dt_status_name(st);
}

dt_status optim_zero1_fail(dt_zero1 *z, dt_status st, const char *what)
{
    if (z->st == DT_OK) {
        z->st = st;
        snprintf(z->err, sizeof z->err, "zero%d (rank %d): %s: %s", z->stage, z->rank, what,
                 optim_zero1_cause(z, st));
    }
    return st;
}

/* ZeRO-2's gradient path failed: its message becomes ours. */
static dt_status gs_failed(dt_zero1 *z, dt_status st)
{
    if (z->st == DT_OK) {
        z->st = st;
        snprintf(z->err, sizeof z->err, "%s",
                 z->gs ? optim_grad_shards_error(z->gs) : "zero2: out of memory");
    }
    return st;
}

/* ZeRO-3's parameter path failed (or not): its message becomes ours. */
static dt_status pu_check(dt_zero1 *z)
{
    dt_status st = z->pu ? optim_param_units_status(z->pu) : DT_OK;
    if (st != DT_OK && z->st == DT_OK) {
        z->st = st;
        snprintf(z->err, sizeof z->err, "%s", optim_param_units_error(z->pu));
    }
    return z->st;
}

/* ZeRO-1 (own_master: with an fp32 master of the shard) or the optimizer
 * half of ZeRO-2 (whose master is the model's own slice of parameters). */
static dt_status create(dt_zero1 **out, dt_model *m, dt_comm *comm, size_t bucket_bytes,
                        bool own_master)
{
    dt_zero1 *z = calloc(1, sizeof *z);
    *out = z;
    if (!z)
        return DT_ENOMEM;
    const dt_backend *be = m->be;
    z->m = m;
    z->comm = comm;
    z->rank = comm ? dt_comm_rank(comm) : 0;
    z->world = comm ? dt_comm_size(comm) : 1;
    size_t P = m->num_params, p = (size_t)z->world;
    z->s = (P + p - 1) / p;
    z->lo = (size_t)z->rank * z->s;
    z->n = optim_zero_shard_count(P, z->s, z->rank);
    z->counts = calloc(p, sizeof *z->counts);
    z->stage = own_master ? 1 : 2;
    z->own_master = own_master || (m->bf16 && z->world > 1); /* bf16 params: not the master */
    z->master = z->own_master ? be->alloc(z->s * sizeof(float))
                              : m->params_memory + (z->n ? z->lo : 0);
    z->adam_m = be->alloc(z->s * sizeof(float));
    z->adam_v = be->alloc(z->s * sizeof(float));
    if (!z->counts || !z->master || !z->adam_m || !z->adam_v)
        return optim_zero1_fail(z, DT_ENOMEM, "create: out of memory for the shard");
    for (int r = 0; r < z->world; r++)
        z->counts[r] = optim_zero_shard_count(P, z->s, r);
    size_t cap = (bucket_bytes ? bucket_bytes : DT_DDP_DEFAULT_BUCKET_BYTES) / sizeof(float);
    z->nreduce = optim_zero_reduces(&z->reduces, m, cap ? cap : 1, z->s, z->world);
    z->ngather = optim_zero_gathers(&z->gathers, &z->gather_counts, m, cap ? cap : 1, z->s,
                                    z->counts, z->world);
    if (z->nreduce < 0 || z->ngather < 0)
        return optim_zero1_fail(z, DT_ENOMEM, "create: out of memory for buckets");
    if (!m->params_memory) /* sharded (ZeRO-3): each rank fills its own shard */
        return DT_OK;
    if (z->world > 1) {
        dt_status st = dt_broadcast(comm, m->params_memory, P, DT_F32, 0);
        if (st != DT_OK)
            return optim_zero1_fail(z, st, "create: broadcast of the parameters");
    }
    if (z->n > 0 && z->own_master)
        be->copy(z->master, m->params_memory + z->lo, z->n * sizeof(float));
    return DT_OK;
}

/* ZeRO-1 and -2 of a bf16 model gather bf16 (zero_bf16_params.c). */
static dt_status gather_bf16(dt_zero1 *z, dt_status st)
{
    if (st != DT_OK || optim_zero_bf16_enable(z) == DT_OK)
        return st;
    return optim_zero1_fail(z, DT_ENOMEM, "create: out of memory for the bf16 gather");
}

dt_status dt_zero1_create_bucketed(dt_zero1 **out, dt_model *m, dt_comm *comm, size_t bucket_bytes)
{
    dt_status st = create(out, m, comm, bucket_bytes, true);
    return gather_bf16(*out, st);
}

dt_status dt_zero1_create(dt_zero1 **out, dt_model *m, dt_comm *comm)
{
    return dt_zero1_create_bucketed(out, m, comm, 0);
}

dt_status dt_zero2_create(dt_zero1 **out, dt_model *m, dt_comm *comm, size_t bucket_bytes)
{
    /* a pipeline stage keeps its micro-batches' sum whole; its pieces
     * default to a quarter of a shard too, so several go out during the
     * last backward (dt_zero1_arm) */
    bool stage = m->pipeline_stage;
    size_t world = comm ? (size_t)dt_comm_size(comm) : 1;
    size_t quarter = (m->num_params + world - 1) / world / 4 * sizeof(float);
    dt_status st = create(out, m, comm, bucket_bytes || !stage ? bucket_bytes : quarter, false);
    dt_zero1 *z = *out;
    if ((st = gather_bf16(z, st)) != DT_OK || stage)
        return st;
    /* by default a quarter of a shard: the buckets in flight add half a
     * shard to the shard (25 MB buckets would hold more than ZeRO-1) */
    size_t cap = bucket_bytes ? bucket_bytes / sizeof(float) : z->s / 4;
    st = optim_grad_shards_create(&z->gs, m, comm, cap ? cap : 1, z->s);
    return st != DT_OK ? gs_failed(z, st) : DT_OK;
}

dt_status dt_zero3_create(dt_zero1 **out, dt_model *m, dt_comm *comm, size_t bucket_bytes)
{
    dt_status st = create(out, m, comm, bucket_bytes, true); /* the master: the parameters */
    dt_zero1 *z = *out;
    if (st != DT_OK)
        return st;
    z->stage = 3;
    z->ngather = 0; /* the units replace the step's gathers */
    size_t cap = bucket_bytes ? bucket_bytes / sizeof(float) : z->s / 4;
    bool stage = m->pipeline_stage; /* a pipeline stage keeps its gradients */
    st = stage ? DT_OK : optim_grad_shards_create(&z->gs, m, comm, cap ? cap : 1, z->s);
    if (st != DT_OK)
        return gs_failed(z, st);
    st = optim_param_units_create(&z->pu, m, comm, z->s, z->master);
    if (st != DT_OK && !z->pu)
        return optim_zero1_fail(z, st, "create: out of memory");
    return pu_check(z);
}

dt_status dt_zero3_init_shard(dt_zero1 *z, uint64_t seed)
{
    if (!z->pu || z->m->l0 != 0 || z->m->l1 != z->m->cfg.L)
        return optim_zero1_fail(z, DT_EINVAL, "init: not ZeRO-3 of a whole model");
    enum { CHUNK = 1 << 18 }; /* floats staged at a time: 1 MiB */
    size_t k = z->n < CHUNK ? z->n : CHUNK;
    float *host = malloc((k ? k : 1) * sizeof(float));
    if (!host)
        return optim_zero1_fail(z, DT_ENOMEM, "init: out of memory");
    dt_status st = DT_OK;
    for (size_t at = 0; at < z->n && st == DT_OK; at += k) {
        size_t c = z->n - at < k ? z->n - at : k;
        st = dt_model_init_range(host, &z->m->cfg, z->lo + at, c, seed);
        if (st == DT_OK)
            z->m->be->from_host(z->master + at, host, c * sizeof(float));
    }
    free(host);
    return st == DT_OK ? DT_OK : optim_zero1_fail(z, st, "init: drawing the shard");
}

/* Waits for a launched piece, noting its timing; the first failure is
 * kept. */
static void settle(dt_zero1 *z, piece *pc, const char *what)
{
    dt_status st = optim_overlap_clock_wait(&z->clock, &pc->work, &pc->done, pc->t_submit,
                                            &pc->t_done);
    if (st != DT_OK)
        optim_zero1_fail(z, st, what);
}

/* Notes, for the timing, which launched pieces have finished. */
static void poll(piece *list, int from, int to)
{
    for (int i = from; i < to; i++)
        if (!list[i].done && dt_work_test(list[i].work)) {
            list[i].done = true;
            list[i].t_done = dt_now();
        }
}

static void launch(dt_zero1 *z, piece *pc, const dt_op *op, const char *what)
{
    pc->done = false;
    pc->t_submit = dt_now();
    dt_status st = dt_submit(z->comm, op, &pc->work);
    if (st != DT_OK) {
        pc->work = NULL;
        optim_zero1_fail(z, st, what);
    }
}

/* Launches every reduce piece lying in [lo, Ψ) not launched yet. */
static void launch_reduces(dt_zero1 *z, size_t lo)
{
    while (z->reduced < z->nreduce && z->reduces[z->reduced].lo >= lo && z->st == DT_OK) {
        piece *pc = &z->reduces[z->reduced];
        optim_rank_order_fold(&z->ro, z->m->grads_memory, pc->lo, pc->n);
        dt_op op = {.kind = DT_OP_REDUCE,
                    .recv = z->m->grads_memory + pc->lo,
                    .count = pc->n,
                    .dtype = DT_F32,
                    .redop = DT_AVG,
                    .root = pc->owner};
        optim_rank_order_op(&z->ro, &op);
        optim_grad_comm_pack(&z->gc, &op, pc->lo);
        launch(z, pc, &op, "backward: launching a gradient piece's reduce");
        z->reduced++;
    }
}

/* The model's backward hook: gradients [lo, Ψ) are final. */
static void on_grads_ready(void *user, size_t lo)
{
    dt_zero1 *z = user;
    poll(z->reduces, 0, z->reduced);
    launch_reduces(z, lo);
}

bool dt_zero1_piece_times(const dt_zero1 *z, int i, double *submit, double *done)
{
    *submit = *done = 0;
    if (z->gs || i < 0 || i >= z->nreduce) /* ZeRO-2, -3: grad_shards.c's buckets */
        return false;
    const piece *pc = &z->reduces[i];
    *submit = pc->t_submit;
    *done = pc->t_done;
    return pc->t_submit > 0 && pc->done;
}

dt_status dt_zero1_arm(dt_zero1 *z, dt_grad_ready_fn *fn, void **user)
{
    *fn = NULL;
    *user = z;
    if (z->st != DT_OK)
        return z->st;
    if (z->gs)
        return optim_zero1_fail(z, DT_EINVAL,
                                "arm: the gradients are sharded (no full sum to reduce)");
    z->syncing = z->world > 1;
    z->reduced = 0;
    *fn = z->syncing ? on_grads_ready : NULL;
    return DT_OK;
}

dt_status dt_zero1_backward(dt_zero1 *z, float dloss, bool sync)
{
    if (z->st != DT_OK)
        return z->st;
    if (z->syncing)
        return optim_zero1_fail(z, DT_EINVAL, "backward: the last synced backward had no step");
    dt_zero1_wait_params(z); /* backward reads the parameters */
    if (z->pu)               /* ZeRO-3: each unit gathered just before its backward */
        dt_model_set_params_back_hook(z->m, optim_param_units_backward_hook, z->pu);
    dt_status st;
    if (z->gs) {
        if ((st = optim_grad_shards_backward(z->gs, dloss, sync)) != DT_OK)
            gs_failed(z, st);
    } else {
        bool comm = sync && z->world > 1;
        z->syncing = comm;
        z->reduced = 0;
        dt_model *m = z->m;
        if (optim_rank_order_before(&z->ro, m->grads_memory, m->num_params, sync) != DT_OK)
            return optim_zero1_fail(z, DT_ENOMEM, "backward: out of memory for the running sum");
        dt_model_set_grad_hook(m, comm ? on_grads_ready : NULL, z);
        st = dt_model_backward(m, dloss);
        dt_model_set_grad_hook(m, NULL, NULL);
        optim_rank_order_after(&z->ro, m->grads_memory, m->num_params, sync, comm);
        if (st != DT_OK && z->st == DT_OK) {
            z->st = st;
            snprintf(z->err, sizeof z->err, "zero%d: %s", z->stage, dt_model_error(z->m));
        }
    }
    if (z->pu)
        dt_model_set_params_back_hook(z->m, NULL, NULL);
    return pu_check(z);
}

/* Waits for the gather pieces that start below hi, in launch order. */
static void wait_gathers_below(dt_zero1 *z, size_t hi)
{
    poll(z->gathers, z->settled, z->gathered);
    while (z->settled < z->gathered && z->gathers[z->settled].lo < hi) {
        settle(z, &z->gathers[z->settled], "all-gather of the updated parameters");
        optim_zero_bf16_widen(z, &z->gathers[z->settled++]); /* bf16: into fp32 */
    }
}

/* The model's parameter hook: forward is about to read [0, hi). */
static void on_params_needed(void *user, size_t hi)
{
    wait_gathers_below(user, hi);
}

dt_status dt_zero1_wait_params(dt_zero1 *z)
{
    wait_gathers_below(z, (size_t)-1);
    return z->st;
}

dt_status dt_zero1_forward(dt_zero1 *z, const int *inputs, const int *targets, int B, int T)
{
    if (z->pu && z->m->params_memory) /* held whole: back to units */
        dt_zero1_hold_params(z, false);
    dt_model_set_params_hook(z->m, z->pu ? optim_param_units_forward_hook : on_params_needed,
                             z->pu ? (void *)z->pu : z);
    dt_status st = dt_model_forward(z->m, inputs, targets, B, T);
    dt_model_set_params_hook(z->m, NULL, NULL);
    if (pu_check(z) != DT_OK)
        return z->st;
    if (st != DT_OK) {
        z->st = st;
        snprintf(z->err, sizeof z->err, "zero1: %s", dt_model_error(z->m));
    }
    return st;
}

void dt_zero1_destroy(dt_zero1 *z)
{
    if (!z)
        return;
    for (int i = 0; i < z->reduced; i++)
        if (z->reduces && z->reduces[i].work)
            dt_work_wait(z->reduces[i].work);
    if (z->gathers)
        dt_zero1_wait_params(z);
    const dt_backend *be = z->m->be;
    void *dev[] = {z->own_master ? z->master : NULL, z->adam_m, z->adam_v};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            be->free(dev[i]);
    optim_grad_shards_destroy(z->gs);
    optim_param_units_destroy(z->pu);
    optim_rank_order_free(&z->ro);
    optim_grad_comm_free(&z->gc);
    optim_zero_bf16_free(z);
    free(z->reduces);
    free(z->gathers);
    free(z->gather_counts);
    free(z->counts);
    free(z);
}

const char *dt_zero1_error(const dt_zero1 *z)
{
    return z->err;
}

void dt_zero1_state(dt_zero1 *z, float **master, float **m, float **v)
{
    dt_zero1_wait_params(z); /* the gather reads the master */
    if (z->pu)
        optim_param_units_forget(z->pu); /* the caller may load into it */
    optim_zero_bf16_master_in_params(z); /* bf16: a checkpoint's parameters are the master */
    *master = z->master;
    *m = z->adam_m;
    *v = z->adam_v;
}

void dt_zero1_arm_params(dt_zero1 *z, bool on)
{
    if (!z->pu)
        return;
    if (on && z->m->params_memory)
        dt_zero1_hold_params(z, false);
    dt_model_set_params_hook(z->m, on ? optim_param_units_forward_hook : NULL, z->pu);
    dt_model_set_params_back_hook(z->m, on ? optim_param_units_backward_hook : NULL, z->pu);
}

void dt_zero1_arm_inference(dt_zero1 *z, bool on)
{
    if (!z->pu)
        return;
    if (z->m->params_memory)
        dt_zero1_hold_params(z, false);
    optim_param_units_inference(z->pu, on);
    dt_model_set_params_hook(z->m, on ? optim_param_units_forward_hook : NULL, z->pu);
    dt_model_set_params_back_hook(z->m, NULL, NULL);
}

dt_status dt_zero1_hold_params(dt_zero1 *z, bool hold)
{
    if (z->st != DT_OK)
        return z->st;
    if (!z->pu)
        return hold ? dt_zero1_wait_params(z) : DT_OK;
    optim_param_units_hold(z->pu, hold);
    return pu_check(z);
}

/* Waits for every reduce piece (launching those backward did not), so
 * this rank's shard of the gradient buffer holds the mean. */
static void reduce_gradients(dt_zero1 *z)
{
    if (!z->syncing)
        z->reduced = 0; /* a plain backward: nothing launched yet */
    launch_reduces(z, 0);
    for (int i = 0; i < z->reduced; i++) {
        piece *pc = &z->reduces[i];
        if (pc->work)
            settle(z, pc, "step: reduce of a gradient piece");
        if (pc->owner == z->rank && z->st == DT_OK) /* the mean, back to f32 */
            optim_grad_comm_unpack(&z->gc, z->m->grads_memory + pc->lo, pc->lo, pc->n);
    }
    if (z->st == DT_OK && z->reduced != z->nreduce)
        optim_zero1_fail(z, DT_EPROTO, "step: a gradient piece was never reduced");
    z->syncing = false;
    z->reduced = 0;
}

/* Launches the stage-by-stage all-gather of the updated shard. */
static void launch_gathers(dt_zero1 *z)
{
    for (int k = 0; k < z->ngather && z->st == DT_OK; k++) {
        piece *g = &z->gathers[k];
        size_t from = g->lo > z->lo ? g->lo - z->lo : 0;
        dt_op op = {.kind = DT_OP_ALLGATHERV,
                    .send = g->counts[z->rank] ? z->master + from : z->master,
                    .recv = z->m->params_memory + g->lo,
                    .counts = g->counts,
                    .dtype = DT_F32};
        optim_zero_bf16_op(z, g, &op); /* bf16: the master rounded */
        launch(z, g, &op, "step: launching a stage's parameter all-gather");
        if (g->work)
            z->gathered = k + 1;
    }
}

static void take_stats(dt_zero1 *z, dt_comm_stats *stats)
{
    if (stats) {
        *stats = (dt_comm_stats){.ops = z->clock.ops, .hidden = -1};
        if (z->clock.ops > 0) {
            stats->comm_ms = 1e3 * z->clock.busy_s;
            stats->exposed_ms = 1e3 * z->clock.exposed_s;
            stats->hidden = dt_optim_hidden_share(stats->comm_ms, stats->exposed_ms);
        }
    }
    z->clock.busy_s = z->clock.exposed_s = 0;
    z->clock.ops = 0;
}

/* Reduce, AdamW on the shard, launch of the gather. */
static dt_status step_launch(dt_zero1 *z, const dt_adamw_hparams *h, long step)
{
    if (z->st != DT_OK)
        return z->st;
    if (step < 1)
        return optim_zero1_fail(z, DT_EINVAL, "step: AdamW steps count from 1");
    const dt_backend *be = z->m->be;
    dt_model *m = z->m;
    dt_zero1_wait_params(z);
    if (z->pu) { /* a hold ends; the gathers in flight read the shard AdamW writes */
        optim_param_units_hold(z->pu, false);
        optim_param_units_take_clock(z->pu, &z->clock);
        if (pu_check(z) != DT_OK)
            return z->st;
    }
    const float *grad = z->gs ? NULL : m->grads_memory + z->lo; /* ZeRO-2, 3: no full buffer */
    if (z->gs) {
        dt_status st = optim_grad_shards_wait(z->gs, &z->clock.busy_s, &z->clock.exposed_s,
                                              &z->clock.ops);
        if (st != DT_OK)
            return gs_failed(z, st);
        grad = optim_grad_shards_mean(z->gs);
    } else if (z->world > 1) {
        reduce_gradients(z);
    }
    if (z->st != DT_OK)
        return z->st;
    if (!z->gs) /* ZeRO-2, 3: grad_shards.c divided its shard */
        optim_rank_order_divide(&z->ro, m->grads_memory + (z->n ? z->lo : 0), z->n, z->world);
    if (z->n > 0)
        be->adamw(z->master, grad, z->adam_m, z->adam_v, z->n, step, h);
    z->settled = z->gathered = 0;
    if (z->pu)
        optim_param_units_prefetch(z->pu); /* unit 0, for the next forward */
    else if (z->world > 1) {
        optim_zero_bf16_round_shard(z);
        launch_gathers(z);
    } else if (z->n > 0 && z->own_master)
        be->copy(m->params_memory + z->lo, z->master, z->n * sizeof(float));
    return z->st;
}

dt_status dt_zero1_step_async(dt_zero1 *z, const dt_adamw_hparams *h, long step,
                              dt_comm_stats *stats)
{
    dt_status st = step_launch(z, h, step);
    take_stats(z, stats);
    return st;
}

dt_status dt_zero1_step(dt_zero1 *z, const dt_adamw_hparams *h, long step, dt_comm_stats *stats)
{
    dt_status st = step_launch(z, h, step);
    if (st == DT_OK)
        st = dt_zero1_wait_params(z);
    take_stats(z, stats);
    return st;
}

dt_status dt_zero1_set_grad_bf16(dt_zero1 *z)
{
    char err[160];
    if (z->ro.on)
        return optim_zero1_fail(z, DT_EINVAL, "bf16 gradients round: not with --deterministic");
    z->grad_bf16 = true;
    if (z->gs) {
        dt_status st = optim_grad_shards_bf16(z->gs);
        return st == DT_OK ? DT_OK : gs_failed(z, st);
    }
    dt_status st = optim_grad_comm_enable(&z->gc, z->m, z->comm, z->m->num_params, err, sizeof err);
    return st == DT_OK ? DT_OK : optim_zero1_fail(z, st, err);
}

dt_status dt_zero1_set_deterministic(dt_zero1 *z)
{
    char err[160];
    if (z->grad_bf16)
        return optim_zero1_fail(z, DT_EINVAL,
                                "--deterministic sums fp32 gradients: not with bf16 ones");
    dt_status st = optim_rank_order_enable(&z->ro, z->m, err, sizeof err);
    if (st != DT_OK)
        return optim_zero1_fail(z, st, err);
    st = z->gs ? optim_grad_shards_deterministic(z->gs) : DT_OK;
    return st == DT_OK ? DT_OK : gs_failed(z, st);
}
