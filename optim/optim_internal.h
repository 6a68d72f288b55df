/*
 * optim_internal.h — helpers shared by the optimizer layer's files, not
 * part of its public interface: the one formula for the share of
 * communication hidden, ZeRO-2's gradient path (grad_shards.c) and
 * ZeRO-3's parameter path (param_units.c), which zero1.c drives, and
 * zero1.c's state, whose bytes zero_memory.c reports.
 */
#ifndef DT_OPTIM_INTERNAL_H
#define DT_OPTIM_INTERNAL_H

#include "dt_clock.h" /* dt_now, for the communication timings */
#include "dt_optim.h"

/* The timing of launched collectives (overlap_clock.c): seconds the link
 * was busy, seconds waited for, collectives waited; prev_done is the
 * latest completion seen. */
typedef struct optim_overlap_clock {
    double busy_s, exposed_s, prev_done;
    int ops;
} optim_overlap_clock;
/* Waits for *work (then NULL) and adds its timing to c; a piece seen done
 * earlier (*done, *t_done) adds no exposed time. */
dt_status optim_overlap_clock_wait(optim_overlap_clock *c, dt_work **work, bool *done,
                                   double t_submit, double *t_done);

/* 1 - exposed/comm clipped to [0, 1]: the share of the time collectives
 * ran that the training thread did not spend waiting for them. */
static inline double dt_optim_hidden_share(double comm_ms, double exposed_ms)
{
    if (comm_ms <= 0)
        return exposed_ms > 0 ? 0.0 : 1.0;
    double h = 1.0 - exposed_ms / comm_ms;
    return h < 0 ? 0.0 : h > 1 ? 1.0 : h;
}

/* ---- zero_layout.c: ZeRO's shards and pieces, used by zero1.c ----------- */

/* One collective on a range of the flat buffer. */
typedef struct optim_zero_piece {
    size_t lo, n;   /* elements */
    int owner;      /* reduce: the rank whose shard holds [lo, lo+n) */
    size_t *counts; /* gather: [world] intersection with each shard */
    dt_work *work;  /* in flight, or NULL */
    bool done;
    double t_submit, t_done;
} optim_zero_piece;
/* Valid elements of rank r's shard: [r·s, (r+1)·s) clipped to Ψ. */
size_t optim_zero_shard_count(size_t num_params, size_t s, int r);
/* Reduce pieces in backward's order; the count, -1 on ENOMEM. */
int optim_zero_reduces(optim_zero_piece **out, const dt_model *m, size_t cap, size_t s, int world);
/* Gather pieces in forward's order, their counts[world] in *counts_out;
 * the count, -1 on ENOMEM. */
int optim_zero_gathers(optim_zero_piece **out, size_t **counts_out, const dt_model *m, size_t cap,
                       size_t s, const size_t *shard_counts, int world);

/* ---- rank_order.c: one summation order for every mode (--deterministic) -- */

typedef struct optim_rank_order {
    bool on;
    bool folding; /* this backward adds the running sum into each bucket */
    int micro;    /* backwards of this step so far */
    float *aside; /* (Ψ) the running sum of the micro-steps before, k > 1 */
    const dt_backend *be;
} optim_rank_order;
/* Turns it on for m (DT_EINVAL with a message for a CUDA backend). */
dt_status optim_rank_order_enable(optim_rank_order *ro, const dt_model *m, char *err,
                                  size_t errlen);
void optim_rank_order_free(optim_rank_order *ro);
/* When on: op sums (DT_SUM) in rank order (DT_ALGO_RANK_ORDER). */
void optim_rank_order_op(const optim_rank_order *ro, dt_op *op);
/* sum[i] = sum[i] + next[i]. */
void optim_rank_order_add(float *sum, const float *next, size_t n);
/* Full gradient buffers (DDP, ZeRO-1): before a backward (from the second
 * micro-step on: the sum kept aside, the gradients zeroed); fold adds the
 * sum into [lo, lo+n) just before that range leaves (a synced backward);
 * after a backward (hooked: every range was folded from the hook). */
dt_status optim_rank_order_before(optim_rank_order *ro, float *grads, size_t n, bool sync);
void optim_rank_order_fold(const optim_rank_order *ro, float *grads, size_t lo, size_t n);
void optim_rank_order_after(optim_rank_order *ro, float *grads, size_t n, bool sync, bool hooked);
/* x /= k·world (k: the backwards since the last divide, at least 1); a
 * new step begins. Nothing when off. */
void optim_rank_order_divide(optim_rank_order *ro, float *x, size_t n, int world);

/* ---- grad_comm.c: gradients sent as bf16 (--grad-comm bf16) -------------- */

typedef struct optim_grad_comm {
    bool on;
    uint16_t *buf; /* (n) bf16 copies of the ranges in flight */
    size_t n;
} optim_grad_comm;
/* Turns it on with room for n elements, when comm has two ranks or more
 * (DT_EINVAL with a message for a CUDA backend). */
dt_status optim_grad_comm_enable(optim_grad_comm *gc, const dt_model *m, const dt_comm *comm,
                                 size_t n, char *err, size_t errlen);
void optim_grad_comm_free(optim_grad_comm *gc);
/* When on: rounds op's f32 range (recv, count) into buf + at, and points
 * op at it as DT_BF16. The caller keeps buf + at alone until the op is
 * done. */
void optim_grad_comm_pack(const optim_grad_comm *gc, dt_op *op, size_t at);
/* When on: g[0..n) = buf[at..at+n) widened (after the op). */
void optim_grad_comm_unpack(const optim_grad_comm *gc, float *g, size_t at, size_t n);

/* ---- grad_shards.c: ZeRO-2's gradient path, used by zero1.c ---------------- */

typedef struct optim_grad_shards optim_grad_shards;
/* Takes the model's gradients into windows (its full buffer is freed) and
 * builds the buckets (cap elements) and their pieces for shards of s
 * elements. Always sets *out (NULL only on DT_ENOMEM). */
dt_status optim_grad_shards_create(optim_grad_shards **out, dt_model *m, dt_comm *comm, size_t cap,
                                   size_t s);
void optim_grad_shards_destroy(optim_grad_shards *g); /* waits for what is in flight */
const char *optim_grad_shards_error(const optim_grad_shards *g);
/* Gradient bytes held: the shard, the bucket pool, the accumulation. */
size_t optim_grad_shards_bytes(const optim_grad_shards *g);
int optim_grad_shards_num_buckets(const optim_grad_shards *g);
/* Backward of the last forward; with sync, each bucket reduced to its
 * owners from backward's hook. */
dt_status optim_grad_shards_backward(optim_grad_shards *g, float dloss, bool sync);
/* Waits for every piece; adds the timing to *busy_s, *exposed_s, *ops.
 * Then optim_grad_shards_mean is this rank's shard of the mean. */
dt_status optim_grad_shards_wait(optim_grad_shards *g, double *busy_s, double *exposed_s, int *ops);
const float *optim_grad_shards_mean(const optim_grad_shards *g);
/* --deterministic (rank_order.c): sums in one order, divides by k·N. */
dt_status optim_grad_shards_deterministic(optim_grad_shards *g);
/* --grad-comm bf16 (grad_comm.c): every piece travels as bf16. */
dt_status optim_grad_shards_bf16(optim_grad_shards *g);

/* ---- param_units.c: ZeRO-3's parameter path, used by zero1.c ------------- */

typedef struct optim_param_units optim_param_units;
/* Cuts m into units (embeddings, each block, ln_f + head), allocates two
 * unit buffers and frees the model's parameter buffer: from then on the
 * parameters are shard (s elements, this rank's [rank·s, ...) of the flat
 * layout, kept by the caller) and what is gathered. Always sets *out
 * (NULL only on DT_ENOMEM). */
dt_status optim_param_units_create(optim_param_units **out, dt_model *m, dt_comm *comm, size_t s,
                                   const float *shard);
void optim_param_units_destroy(optim_param_units *u); /* waits for what is in flight */
const char *optim_param_units_error(const optim_param_units *u);
dt_status optim_param_units_status(const optim_param_units *u);
size_t optim_param_units_bytes(const optim_param_units *u); /* the two unit buffers */
int optim_param_units_count(const optim_param_units *u);
/* Forward's and backward's parameter hooks (user = u): map the unit
 * about to be read, launch the gather of the one after it. */
void optim_param_units_forward_hook(void *user, size_t hi);
void optim_param_units_backward_hook(void *user, size_t lo);
/* Waits for every gather in flight (they read the shard) and forgets
 * what the buffers hold: before the shard changes (AdamW, a load). */
void optim_param_units_forget(optim_param_units *u);
/* After the shard changed: forgets, then launches the gathers of units 0
 * and 1 for the next forward. */
void optim_param_units_prefetch(optim_param_units *u);
/* hold: the whole model gathered into a full buffer (blocking, every
 * rank); release: that buffer freed. */
dt_status optim_param_units_hold(optim_param_units *u, bool hold);
/* Forwards with no backward after them (evaluation, sampling): after the
 * head the next forward's first unit is prefetched. Forgets the buffers. */
void optim_param_units_inference(optim_param_units *u, bool on);
/* replicas.c: all-gathers mine, sets *same to whether every rank's is
 * equal, hashes (may be NULL) gets them (dt_check_replicas' comparison). */
dt_status optim_compare_hashes(dt_comm *comm, uint64_t mine, bool *same, uint64_t *hashes);
/* dt_params_hash of the whole model, streamed one unit gathered at a time
 * (ends a hold). Collective: every rank calls it. */
dt_status optim_param_units_hash(optim_param_units *u, uint64_t *hash);
/* Adds the gathers' timing since the last call to *into. */
void optim_param_units_take_clock(optim_param_units *u, optim_overlap_clock *into);


/* ---- zero1.c's failures, shared with zero_replicas.c ----------------------- */

/* The cause of a failed collective of z: the communicator's message, or
 * st's name. fail keeps the first failure (z->st) with "zeroS (rank r):
 * what: cause" as z's message and returns st. */
const char *optim_zero1_cause(const dt_zero1 *z, dt_status st);
dt_status optim_zero1_fail(dt_zero1 *z, dt_status st, const char *what);

/* ---- zero_bf16_params.c: ZeRO-1/2's gathers in bf16, used by zero1.c ------ */

/* Gathers in bf16 when the model computes in bf16 (world > 1, not
 * ZeRO-3): the send buffer; DT_ENOMEM if it cannot be had. */
dt_status optim_zero_bf16_enable(dt_zero1 *z);
void optim_zero_bf16_free(dt_zero1 *z);
size_t optim_zero_bf16_bytes(const dt_zero1 *z); /* the send buffer */
/* When on: the updated master rounded into the send buffer (before the
 * gathers); a gather piece's op pointed at it and at the first half of
 * the piece's parameters, as DT_BF16; after the piece's op, widened in
 * place into its fp32 parameters. */
void optim_zero_bf16_round_shard(dt_zero1 *z);
void optim_zero_bf16_op(const dt_zero1 *z, const optim_zero_piece *g, dt_op *op);
void optim_zero_bf16_widen(const dt_zero1 *z, const optim_zero_piece *g);
/* When on: this rank's master copied over its slice of the parameters
 * (a checkpoint saves the master); every parameter rounded in place (what
 * the model reads); the masters all-gathered exactly in fp32 into every
 * replica (collective, blocking). */
void optim_zero_bf16_master_in_params(dt_zero1 *z);
void optim_zero_bf16_round_params(dt_zero1 *z);
dt_status optim_zero_bf16_gather_masters(dt_zero1 *z);

/* ---- zero1.c's state, read by zero_memory.c ------------------------------- */

struct dt_zero1 {
    dt_model *m;
    dt_comm *comm; /* NULL: one process */
    int rank, world;
    size_t s;                       /* shard size (padded) */
    size_t lo, n;                   /* this rank's valid range of the flat buffer */
    size_t *counts;                 /* [world]: each rank's valid count */
    float *master;                  /* (s) fp32 master of the shard */
    bool own_master;                /* ZeRO-2: master is the model's own slice, but in bf16 */
    bool param_bf16;                /* ZeRO-1/2 gather in bf16 (zero_bf16_params.c) */
    uint16_t *send16;               /* (s) the master rounded, while a gather is in flight */
    float *adam_m, *adam_v;         /* (s) */
    optim_zero_piece *reduces;      /* [nreduce], in backward order (tail first) */
    int nreduce, reduced;           /* launched this backward */
    optim_zero_piece *gathers;      /* [ngather], in forward order */
    size_t *gather_counts;          /* [ngather * world] */
    int ngather, gathered, settled; /* launched / waited */
    bool syncing;                   /* the current backward launches reduces */
    optim_grad_shards *gs;          /* ZeRO-2, 3: the gradient shard, or NULL */
    optim_param_units *pu;          /* ZeRO-3: the parameter units, or NULL */
    int stage;                      /* 1, 2 or 3 */
    optim_overlap_clock clock;      /* since the last stats */
    optim_rank_order ro;            /* --deterministic (rank_order.c) */
    optim_grad_comm gc;             /* ZeRO-1's --grad-comm bf16 (Ψ); ZeRO-2, 3: gs's */
    bool grad_bf16;                 /* --grad-comm bf16, any stage */
    dt_status st;
    char err[512];
};

#endif /* DT_OPTIM_INTERNAL_H */
