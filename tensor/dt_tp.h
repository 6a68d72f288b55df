/*
 * dt_tp.h — the public interface of dtrain's tensor-parallel layer: one
 * MiniGPT split across the ranks of a tp group, as Megatron-LM lays it out.
 *
 * Each rank holds its share of the parameters (model/tp_layout.c: attention
 * split by heads, the MLP by its hidden width, the embedding and the head
 * by vocabulary, LayerNorms replicated) and runs the whole model's story
 * on it, with Megatron's two conjugate operators around every split
 * sublayer (attention, MLP):
 *
 *   f: identity forward, all-reduce of the input gradient backward
 *      (before a column-parallel matmul, whose input every rank has whole)
 *   g: all-reduce forward, identity backward
 *      (after a row-parallel matmul, whose output each rank has a part of)
 *
 * so a block costs two all-reduces of (B, T, C) floats forward and two
 * backward. The vocabulary-split embedding adds one forward (each rank
 * looks up only its own rows, zeros elsewhere); the head's f one backward;
 * the parallel cross-entropy all-reduces 3 (B, T) rows of statistics
 * (row max, sum of exponentials, target logit), so no rank ever holds the
 * full (B, T, V) logits. Ring all-reduce cost per rank: 2 (tp-1)/tp of the
 * bytes, so per step about 4 L + 2 full activations of (B, T, C) floats.
 *
 * Replicated computation (LayerNorms, residuals, wpe, mlp.proj.bias) sees
 * bitwise identical inputs on every rank (an all-reduce gives every rank
 * the same bits), so replicated parameters stay bitwise identical across
 * the group without being reduced.
 *
 * This first version runs on host-memory backends (cpu, cpu-reference,
 * cuda-host): the vocabulary-parallel layers are host loops. No hooks, no
 * activation slots: one micro-batch at a time.
 */
#ifndef DT_TP_H
#define DT_TP_H

#include "dt_comm.h"
#include "dt_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where a tp all-reduce happens: Megatron's g after each row-parallel
 * matmul and the embedding (forward), f before each column-parallel one
 * (backward), and the cross-entropy's row statistics. */
typedef enum dt_tp_site {
    DT_TP_EMBEDDING,  /* forward: the token embedding's rows */
    DT_TP_ATTN_OUT,   /* forward, g: the attention output */
    DT_TP_MLP_OUT,    /* forward, g: the MLP output */
    DT_TP_LOGIT_MAX,  /* forward: the logits' row maxima */
    DT_TP_LOGIT_SUMS, /* forward: the softmax sums and target logits */
    DT_TP_HEAD_GRAD,  /* backward, f: the head's input gradient */
    DT_TP_MLP_GRAD,   /* backward, f: the MLP's input gradient */
    DT_TP_ATTN_GRAD,  /* backward, f: the attention's input gradient */
    DT_TP_NUM_SITES
} dt_tp_site;

/* "g: the attention output" */
const char *dt_tp_site_name(dt_tp_site s);

/* Called after each tp all-reduce, on the thread that ran it: where (layer
 * -1 outside a block), the buffer's bytes, the payload bytes this rank sent
 * for it (dt_comm_traffic), and when it ran (dt_now() seconds). */
typedef void (*dt_tp_trace_fn)(void *user, dt_tp_site site, int layer, size_t bytes, uint64_t sent,
                               double t0, double t1);

typedef struct dt_tp_model {
    dt_config cfg;
    const dt_backend *be;
    dt_comm *comm; /* the tp group (not owned) */
    int tp, rank;  /* group size, this rank in it */
    int max_B;

    size_t num_params;       /* this rank's share: dt_tp_num_params */
    float *params_memory;    /* (num_params), tensors in the full model's order */
    float *grads_memory;     /* (num_params), same layout */
    dt_params params, grads; /* pointers into them, local shapes */
    dt_params compute;       /* what the layers read: params, or (bf16) the rounded copy */
    bool bf16;               /* dt_tp_set_precision(BF16): tp_precision.c */
    float *rounded_memory;   /* (num_params) in bf16: the masters rounded, each forward */
    float *act_ws, *grad_ws; /* bf16: one block's inner tensors and their gradients, fp32 */
    uint16_t *store_memory;  /* bf16 (num_store): the blocks' stored tensors, every slot */
    size_t num_store;
    uint16_t *store; /* the selected slot's store, block store_l0 first */
    int store_l0;
    dt_tp_tensor *tensors; /* [num_tensors]: how each is split */
    int num_tensors;

    size_t num_acts, num_grad_acts;        /* equal in fp32; bf16 keeps fewer gradients */
    float *acts_memory, *grad_acts_memory; /* (num_acts), (num_grad_acts) */
    dt_acts acts, grad_acts;               /* local shapes: qkv (B,T,3C/tp), fch (B,T,4C/tp),
                                logits, probs (B,T,Vt), Vt = ceil(V/tp), att (B,H/tp,T,T) */
    float *ce_stats;                       /* (3, B, T): row max, sum of exp, target logit */
    int *inputs, *targets;                 /* (max_B, T) host copies of the last batch */
    float *adam_m, *adam_v;                /* (num_params); NULL until the first update */

    int last_B, last_T, have_targets;
    float mean_loss;      /* of the last forward with targets */
    dt_tp_trace_fn trace; /* NULL, or called after every all-reduce (the caller sets it) */
    void *trace_user;
    char err[512];
} dt_tp_model;

/*
 * The share of this rank of tp_comm (size tp) of a MiniGPT of cfg, for
 * batches up to max_B. Refuses by name a cfg whose heads tp does not
 * divide (a vocabulary it does not divide is padded: model/tp_layout.c),
 * and a backend whose memory the host cannot read. Always sets *out (NULL only on ENOMEM); on failure read
 * dt_tp_error(*out), then dt_tp_destroy. Collective: none.
 */
dt_status dt_tp_create(dt_tp_model **out, const dt_config *cfg, const dt_backend *be, int max_B,
                       dt_comm *tp_comm);
void dt_tp_destroy(dt_tp_model *m);
/* --precision bf16 on the share (tensor/tp_precision.c, model/precision.c's
 * rule): parameters read rounded to bf16 from the fp32 masters, stored
 * activations rounded as written and kept as bf16, fp32 accumulation,
 * residual stream, statistics, logits, loss and gradients. Once, before
 * the first forward; DT_EINVAL otherwise, DT_ENOMEM (it reallocates the
 * activations, and holds one more share of fp32: the rounded copy). */
dt_status dt_tp_set_precision(dt_tp_model *m, dt_precision p);
/* Bytes of activations and their gradients the share holds (in bf16 also
 * the one-block workspaces and the bf16 store). */
size_t dt_tp_activation_bytes(const dt_tp_model *m);
const char *dt_tp_error(const dt_tp_model *m);
/* This rank's share of what dt_model_init(seed) gives the whole model. */
dt_status dt_tp_init(dt_tp_model *m, uint64_t seed);

/* Forward on host token ids (B, T); with targets sets m->mean_loss (the
 * same on every rank). Every rank of the group calls it with the same
 * batch: 2 L + 1 all-reduces of (B, T, C), 2 of (B, T) statistics. */
dt_status dt_tp_forward(dt_tp_model *m, const int *inputs, const int *targets, int B, int T);
/* Backward of the last forward (with targets); adds into m->grads.
 * 2 L + 1 all-reduces of (B, T, C). */
dt_status dt_tp_backward(dt_tp_model *m, float dloss);
void dt_tp_zero_grad(dt_tp_model *m);
/* The whole model's greedy token at each of the last forward's (B, T)
 * positions into ids (B T), ties to the lower id, as dt_sample_logits at
 * temperature 0 picks it; never a padding row. Every rank of the group
 * calls it after the same forward: 2 all-reduces of (B, T) floats. */
dt_status dt_tp_argmax(dt_tp_model *m, int *ids);
/* AdamW on the share (no communication: every gradient is already whole
 * for the elements this rank holds). step >= 1. */
dt_status dt_tp_update(dt_tp_model *m, const dt_adamw_hparams *h, long step);

#ifdef __cplusplus
}
#endif
#endif /* DT_TP_H */
