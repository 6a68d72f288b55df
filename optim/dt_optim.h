/*
 * dt_optim.h — the public interface of dtrain's optimizer layer: data
 * parallelism over a dt_model and a dt_comm.
 *
 * Data parallelism keeps one replica of the model per rank; each rank runs
 * forward and backward on its own slice of the global batch, then the ranks
 * agree on the mean gradient and apply the same AdamW step, so the replicas
 * stay identical. Two ways to agree, one file each:
 *
 *   DDP (ddp.c)      all-reduce (avg) the whole gradient, in buckets that
 *                    start while backward is still running; every rank then
 *                    runs AdamW on every parameter. Memory per rank:
 *                    params 4Ψ + grads 4Ψ + AdamW m, v 8Ψ (Ψ = parameters).
 *                    Traffic per step: one all-reduce of 4Ψ bytes,
 *                    2(p-1)/p · 4Ψ per rank on a ring.
 *   ZeRO-1 (zero1.c) reduce (avg) the gradient in buckets, each to the rank
 *                    owning it, overlapped with backward, so each rank
 *                    holds the mean of its 1/p shard only; AdamW on that shard
 *                    (fp32 master copy, m, v: 12 B per element, 12Ψ/p per
 *                    rank), then all-gather the updated parameters, stage
 *                    by stage, overlapped with the next forward. The
 *                    same traffic as DDP's all-reduce (a ring all-reduce IS
 *                    reduce-scatter + all-gather), p times less optimizer
 *                    state.
 *   ZeRO-2 (grad_shards.c, driven by zero1.c) the same, without ever
 *                    holding the whole gradient: backward writes bucket by
 *                    bucket into two pooled buffers, each reduced to its
 *                    owners at once; a rank keeps its 1/p of the mean.
 *                    params 4Ψ + grads 4Ψ/p + buckets + m, v 8Ψ/p.
 *   ZeRO-3 (param_units.c, driven by zero1.c) ZeRO-2 whose parameters
 *                    live sharded too: each unit (embeddings, a block,
 *                    the head) is all-gathered just before forward reads
 *                    it and again before backward does, the next unit
 *                    prefetched, and dropped after. params 4Ψ/p + two
 *                    units + grads 4Ψ/p + buckets + m, v 8Ψ/p.
 *
 * Both equal one process training on the global batch with gradient
 * accumulation (tests/test_ddp.c pins this down to 1e-6), because the mean
 * over ranks of per-rank mean gradients is the mean over the global batch.
 *
 * A NULL communicator means a single process: nothing is sent, the
 * arithmetic is the same. Collectives run on host memory: these functions
 * take the model's flat buffers as they are, which is right for the CPU
 * backend (a device backend will stage through pinned host buffers).
 * Functions that can fail return dt_status and leave a message readable
 * with the object's *_error function.
 */
#ifndef DT_OPTIM_H
#define DT_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dt_comm.h"
#include "dt_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Communication timing of one optimizer step, for the trainer's log. */
typedef struct dt_comm_stats {
    double comm_ms;    /* time collectives were running (busy time) */
    double exposed_ms; /* of it, time the training thread sat waiting */
    double hidden;     /* 1 - exposed/comm: share overlapped with compute;
                          -1 when nothing was communicated */
    int ops;           /* collectives launched */
} dt_comm_stats;

/* ---- DDP: bucketed, overlapped all-reduce ---------------------------------- */

#define DT_DDP_DEFAULT_BUCKET_BYTES ((size_t)25 << 20) /* PyTorch's 25 MB */

typedef struct dt_ddp dt_ddp;

/*
 * Wraps model m for data parallelism over comm (NULL: one process).
 * Broadcasts m's parameters from rank 0, so every replica starts equal,
 * and cuts the flat gradient into buckets of whole tensors, at most
 * bucket_bytes each (0 = DT_DDP_DEFAULT_BUCKET_BYTES; a tensor larger than
 * that is a bucket of its own), in reverse parameter order — the order
 * backward finishes them. Blocks for the broadcast. Always sets *out (NULL only on DT_ENOMEM).
 */
dt_status dt_ddp_create(dt_ddp **out, dt_model *m, dt_comm *comm, size_t bucket_bytes);
/* Waits for nothing: call dt_ddp_wait first. */
void dt_ddp_destroy(dt_ddp *d);
const char *dt_ddp_error(const dt_ddp *d);
int dt_ddp_num_buckets(const dt_ddp *d);
/* Bucket i's range [*lo, *lo + *n) in the flat buffer; bucket 0 is the
 * tail (launched first). */
void dt_ddp_bucket(const dt_ddp *d, int i, size_t *lo, size_t *n);
/* When bucket i's all-reduce of the last synced backward was launched and
 * seen finished (seconds, CLOCK_MONOTONIC), for traces; false if it was
 * not launched (no sync, or one rank). Valid after dt_ddp_wait. */
bool dt_ddp_bucket_times(const dt_ddp *d, int i, double *submit, double *done);

/*
 * dt_model_backward of the last forward, adding into m's gradients. With
 * sync, it installs m's backward hook for the call, and each bucket's async all-reduce (avg) is launched the moment backward
 * has finished every gradient in it; without (PyTorch's no_sync, for the
 * first micro-steps of gradient accumulation) nothing is sent. Does not
 * wait for the all-reduces: dt_ddp_wait does, before the optimizer reads
 * the gradients.
 */
dt_status dt_ddp_backward(dt_ddp *d, float dloss, bool sync);
/*
 * For a caller that runs the final backward itself (a pipeline stage, whose
 * last B or W finishes its gradients): prepares the buckets as a synced
 * dt_ddp_backward would and returns the progress hook to install on m for
 * that backward (*fn NULL when there is nothing to send: one rank). Then
 * dt_ddp_wait as usual.
 */
dt_status dt_ddp_arm(dt_ddp *d, dt_grad_ready_fn *fn, void **user);
/*
 * --deterministic (rank_order.c): from now on every backward must get
 * dloss = 1; the micro-steps are summed left to right, the ranks in rank
 * order (DT_ALGO_RANK_ORDER), and dt_ddp_wait divides once by k·N (k:
 * the backwards since the last wait, 1 for a caller that ran them itself
 * through dt_ddp_arm). Bitwise the result of one process accumulating N
 * micro-steps (k = 1), and of ZeRO-1, -2, -3 with the same flag. Host
 * memory only: DT_EINVAL for a CUDA backend.
 */
dt_status dt_ddp_set_deterministic(dt_ddp *d);
/*
 * --grad-comm bf16 (grad_comm.c), before the first backward: each bucket
 * is rounded to bf16 and all-reduced (avg) as bf16, summed in f32 and
 * rounded once by the collectives; dt_ddp_wait widens the mean back into
 * the fp32 gradients. Half the gradient bytes; PyTorch DDP's bf16
 * compression hook. Host memory (the CPU backend) only; not with
 * --deterministic. A world of one sends nothing and rounds nothing.
 */
dt_status dt_ddp_set_grad_bf16(dt_ddp *d);
/* Waits for every bucket launched by the last synced backward; on return
 * m's gradients are the mean over ranks. stats (may be NULL) gets the
 * timing. The first failed all-reduce's status is returned. */
dt_status dt_ddp_wait(dt_ddp *d, dt_comm_stats *stats);

/* ---- ZeRO-1: sharded optimizer state, overlapped ------------------------------ */

typedef struct dt_zero1 dt_zero1;

/*
 * Shards AdamW over comm's ranks (NULL: one process, one shard). Rank r
 * owns [r·s, (r+1)·s) of the flat buffer with s = ceil(Ψ/p), clipped to Ψ.
 * The gradient is cut like DDP's buckets (whole tensors from the tail, at
 * most bucket_bytes; 0 = DT_DDP_DEFAULT_BUCKET_BYTES), each bucket again at
 * shard boundaries: a piece is reduced (avg) to the rank that owns it. The
 * parameter all-gather is cut at forward's stages (embeddings, each block,
 * head), neighbours merged up to bucket_bytes. Broadcasts m's parameters from rank 0, then copies this rank's
 * shard into the fp32 master. Blocks for the broadcast. Always sets *out
 * (NULL only on DT_ENOMEM). dt_zero1_create: default bucket size.
 */
dt_status dt_zero1_create_bucketed(dt_zero1 **out, dt_model *m, dt_comm *comm, size_t bucket_bytes);
dt_status dt_zero1_create(dt_zero1 **out, dt_model *m, dt_comm *comm);
/*
 * ZeRO-2 (grad_shards.c): ZeRO-1 whose gradients are sharded too. The
 * model's full gradient buffer is freed (dt_model_window_grads); backward
 * writes each bucket into a small pooled buffer, which is reduced (avg)
 * piece by piece to the owners while backward goes on, and each owner
 * keeps its piece of the mean in a gradient shard of s elements. Gradient
 * memory per rank: 4s + two buckets (plus a full local sum while
 * accumulating, k > 1); bucket_bytes 0 means a quarter of a shard (a
 * bucket is whole hook units: a larger unit is a bucket alone). Everything below works on it as on ZeRO-1, except
 * that backward must be dt_zero1_backward (the model has no gradients of
 * its own). It keeps no fp32 master beside the fp32 parameters (AdamW
 * updates the model's own slice, the gathers send from there): optimizer
 * state m, v: 8s bytes. dt_zero1_state's master is that slice — but for a
 * model that computes in bf16, whose gathers carry the master rounded to
 * bf16 (zero_bf16_params.c): then it keeps one (4s bytes more). Its
 * checkpoints are ZeRO-1's, bit for bit. On a pipeline stage (m made by
 * dt_model_create_stage, of any blocks) the gradients stay whole: the executor adds the
 * stage's micro-batches into them, a sum every rank must hold until the
 * last one is in, so stage 2 saves no gradient memory there (DeepSpeed
 * refuses ZeRO-2 with pipelines for this reason); the caller arms the
 * reduces for the stage's last backward (dt_zero1_arm) and each piece
 * goes to its owner as soon as that backward has finished it.
 */
dt_status dt_zero2_create(dt_zero1 **out, dt_model *m, dt_comm *comm, size_t bucket_bytes);
/*
 * ZeRO-3 (param_units.c): ZeRO-2 whose parameters are sharded too. The
 * fp32 master of the shard is all a rank keeps of the weights; the
 * model's parameter buffer is freed (dt_model_window_params) and each
 * unit (embeddings, each block, ln_f + head) is all-gathered into one of
 * two unit buffers just before dt_zero1_forward or dt_zero1_backward
 * reads it, the next unit's gather launched meanwhile. Forward and
 * backward must be dt_zero1_forward and dt_zero1_backward; forwards with
 * no backward run through the units too (dt_zero1_arm_inference), the
 * replica hash streams through them (dt_zero1_check_replicas), and a
 * caller that needs the whole model holds it (dt_zero1_hold_params).
 * Gradients as ZeRO-2's (bucket_bytes likewise). Bitwise ZeRO-1 and -2;
 * its checkpoints are ZeRO-1's. On a pipeline stage (m made by
 * dt_model_create_stage, even of all L blocks), whose executor runs
 * forward and backward itself over its micro-batches, the gradients stay
 * whole (the stage accumulates its micro-batches, where ZeRO-2 would hold
 * a full local sum too) and the step reduces them to the owners as ZeRO-1's plain step does; the
 * caller installs the parameter hooks with dt_zero1_arm_params.
 */
dt_status dt_zero3_create(dt_zero1 **out, dt_model *m, dt_comm *comm, size_t bucket_bytes);
/*
 * ZeRO-3 of a model created sharded (dt_model_create_sharded), which has
 * no whole buffer to broadcast: dt_zero3_create leaves the shard zero and
 * this fills it with this rank's range of the initial weights of seed
 * (dt_model_init_range: bitwise what dt_model_init on the whole model
 * and dt_zero3_create on it give), through a 1 MiB host buffer. Local:
 * no communication, so no rank ever holds more than its shard. DT_EINVAL
 * when z is not ZeRO-3 of a whole model.
 */
dt_status dt_zero3_init_shard(dt_zero1 *z, uint64_t seed);
/*
 * For a caller that runs the final backward itself (a pipeline stage,
 * whose last B or W finishes its gradient sum): prepares the reduces as a
 * synced dt_zero1_backward would and returns the progress hook to install
 * on m for that backward (*fn NULL when there is nothing to send: one
 * rank). The step then waits for them and launches any not launched.
 * DT_EINVAL when the gradients are sharded (no full sum in m).
 */
dt_status dt_zero1_arm(dt_zero1 *z, dt_grad_ready_fn *fn, void **user);
/* ZeRO-3 for a caller that runs m's forward and backward itself (a
 * pipeline's executor): on installs the parameter hooks that gather each
 * unit just before it is read (and ends a hold), off removes them.
 * Nothing under ZeRO-1 and -2. */
void dt_zero1_arm_params(dt_zero1 *z, bool on);
int dt_zero1_stage(const dt_zero1 *z); /* 1, 2 or 3 */
/* --deterministic, as dt_ddp_set_deterministic: the step divides this
 * rank's shard of the sum by k·N. Any stage. */
dt_status dt_zero1_set_deterministic(dt_zero1 *z);
/* --grad-comm bf16, as dt_ddp_set_grad_bf16, for every stage: each
 * gradient piece is reduced to its owner as bf16, and the owner widens
 * the mean back into fp32 before AdamW. Parameters travel in fp32. */
dt_status dt_zero1_set_grad_bf16(dt_zero1 *z);
/*
 * ZeRO-3: hold (true) all-gathers the whole model into a full buffer that
 * m's parameters then point at, for evaluation, sampling, a checkpoint or
 * a hash; release (false) frees it (the next dt_zero1_forward or step
 * does too). Blocks; every rank must call it. Stages 1 and 2 hold their
 * full parameters always: hold waits for their gather, release does
 * nothing.
 */
dt_status dt_zero1_hold_params(dt_zero1 *z, bool hold);
/*
 * ZeRO-3 for forwards with no backward (evaluation, sampling) run by the
 * caller through dt_model_forward: on installs forward's parameter hook,
 * so each unit is all-gathered just before it is read (the next one in
 * flight; after the head, the next forward's embeddings) and no rank
 * holds the whole model; off removes it. Each forward is collective:
 * every rank must run the same forwards in the same order (the same
 * number of them, whatever their inputs). Ends a hold. Nothing under
 * ZeRO-1 and -2 (their parameters are whole).
 */
void dt_zero1_arm_inference(dt_zero1 *z, bool on);
/* Bytes of parameters this rank holds between uses: the model's 4Ψ under
 * ZeRO-1 and -2; the shard and the two unit buffers under ZeRO-3. */
size_t dt_zero1_param_bytes(const dt_zero1 *z);
/* Waits for what is in flight, then frees. */
void dt_zero1_destroy(dt_zero1 *z);
const char *dt_zero1_error(const dt_zero1 *z);
int dt_zero1_num_buckets(const dt_zero1 *z); /* gradient pieces */
/* When gradient piece i's reduce to its owner in the last step was
 * launched and seen finished (seconds, CLOCK_MONOTONIC), for traces;
 * false if it was not launched (one rank), or when the pieces are
 * ZeRO-2's or -3's buckets (grad_shards.c). Valid after the step. */
bool dt_zero1_piece_times(const dt_zero1 *z, int i, double *submit, double *done);
/* This rank's shard of the flat buffer: [*lo, *lo + *n), n may be < s on
 * the last ranks (even 0 when Ψ < p). */
void dt_zero1_shard(const dt_zero1 *z, size_t *lo, size_t *n);
/* This rank's optimizer state, for checkpoints: the fp32 master, m and v
 * of its shard, n valid elements each (dt_zero1_shard), device memory
 * (host on the CPU backend). Writable: a resumed run loads into them.
 * Waits for a parameter all-gather in flight first (it reads the master). */
void dt_zero1_state(dt_zero1 *z, float **master, float **m, float **v);
/* ZeRO-1/2 of a bf16 model: the replicas hold the masters rounded to bf16
 * (the gathers'); this all-gathers the fp32 masters exactly into every
 * replica, so that a checkpoint saves, and --verify-resume reloads, the
 * masters (collective, blocking: every rank calls it; 4Ψ(N-1)/N bytes).
 * Otherwise it only waits for the gathers in flight. */
dt_status dt_zero1_masters_to_params(dt_zero1 *z);
/* Bytes of optimizer state on this rank: master, m, v of s elements
 * (ZeRO-2: m, v; ZeRO-3: m, v, its master counted as parameters). */
size_t dt_zero1_optimizer_bytes(const dt_zero1 *z);
/* Bytes of gradient staging beside the model's own gradients: 0, the
 * reduces run in place (kept for the trainer's memory table). */
size_t dt_zero1_staging_bytes(const dt_zero1 *z);
/* Bytes of gradients this rank holds: the model's 4Ψ under ZeRO-1 (and
 * ZeRO-3 on a pipeline stage); the shard, the bucket pool (and any
 * accumulation buffer) under ZeRO-2 and -3. */
size_t dt_zero1_gradient_bytes(const dt_zero1 *z);

/*
 * dt_model_forward, waiting for each stage's parameters (from the last
 * dt_zero1_step_async) just before forward reads them.
 */
dt_status dt_zero1_forward(dt_zero1 *z, const int *inputs, const int *targets, int B, int T);
/*
 * dt_model_backward of the last forward, adding into m's gradients. With
 * sync, each gradient piece's async reduce to its owner is launched from
 * backward's hook the moment its gradients are final; without (no_sync,
 * the first micro-steps of accumulation) nothing is sent. A plain
 * dt_model_backward works too: the step then reduces everything itself.
 */
dt_status dt_zero1_backward(dt_zero1 *z, float dloss, bool sync);
/*
 * One optimizer step after backward has accumulated this rank's gradients
 * in m: waits for the reduces (launching any backward did not), AdamW
 * (step >= 1) on the master shard, then the all-gather of the parameters
 * into every rank's m. dt_zero1_step blocks until the parameters are
 * complete. dt_zero1_step_async returns with the gather in flight: until
 * dt_zero1_forward has run (or dt_zero1_wait_params), nothing may read m's
 * parameters. On a non-owner rank the gradient buffer still holds its own
 * local sums afterwards. stats (may be NULL): the reduces of this step and
 * the gathers waited since the last stats.
 */
dt_status dt_zero1_step(dt_zero1 *z, const dt_adamw_hparams *h, long step, dt_comm_stats *stats);
dt_status dt_zero1_step_async(dt_zero1 *z, const dt_adamw_hparams *h, long step,
                              dt_comm_stats *stats);
/* Waits for the parameter all-gather in flight, if any. */
dt_status dt_zero1_wait_params(dt_zero1 *z);

/* ---- replica consistency ---------------------------------------------------- */

/* 64-bit FNV-1a of the bytes of n floats: equal hashes <=> (almost surely)
 * bitwise equal parameters. */
uint64_t dt_params_hash(const float *params, size_t n);
/* The same hash continued over n more floats: dt_params_hash(p, a + b) ==
 * dt_params_hash_more(dt_params_hash(p, a), p + a, b), and
 * dt_params_hash(p, 0) == DT_PARAMS_HASH_BASIS. A model held in pieces
 * is hashed piece by piece. */
#define DT_PARAMS_HASH_BASIS 14695981039346656037ULL /* FNV-1a's offset basis */
uint64_t dt_params_hash_more(uint64_t h, const float *params, size_t n);
/*
 * All-gathers every rank's parameter hash and sets *same to whether they
 * are all equal (a bitwise check that the replicas have not drifted);
 * hashes (may be NULL) gets the p values. Blocks. With comm NULL, *same is
 * true.
 */
dt_status dt_check_replicas(dt_comm *comm, const dt_model *m, bool *same, uint64_t *hashes);
/*
 * dt_check_replicas of the model z trains. Under ZeRO-3 no rank holds the
 * whole model: each unit is all-gathered in turn (the next one in flight)
 * and the hash streamed through it, so a rank holds its shard and two
 * units, and the hash is the whole model's, as under ZeRO-1 (every rank
 * must call it). Under ZeRO-1 and -2 it waits for the parameter gather,
 * then hashes the model's buffer.
 */
dt_status dt_zero1_check_replicas(dt_zero1 *z, bool *same, uint64_t *hashes);

#ifdef __cplusplus
}
#endif
#endif /* DT_OPTIM_H */
