/*
 * dt_tp_stage.h — a tensor-parallel share of one pipeline stage: the
 * piece of a 3-D run (dp x tp x pp) one rank holds. Part of the tensor
 * layer's interface (dt_tp.h has the whole-model share); kept apart so
 * the pipeline's needs (block ranges, activation sets) stay out of it.
 *
 * A stage owns blocks [l0, l1) of L, with the embeddings when l0 = 0 and
 * ln_f and the head when l1 = L, exactly as a plain pipeline stage; its
 * share of them is Megatron's split (model/tp_layout.c), and because the
 * share's flat layout keeps the full model's tensor order, the stage's
 * share is one contiguous range [lo, hi) of the whole model's share: the
 * stage allocates only that. Activations: act_slots sets and grad_slots
 * gradient sets (the schedule's peak), picked by dt_tp_stage_select, so a
 * pipeline schedule can keep several micro-batches alive.
 *
 * Every tp rank of a stage receives the whole (B, T, C) activation from
 * its counterpart in the stage before (the residual stream is replicated
 * inside a tp group), so a stage boundary costs T times a plain
 * pipeline's bytes, each tp rank sending its own copy. Megatron's
 * scatter-gather optimisation (send 1/T, all-gather after) is not built.
 *
 * The backward runs whole: a split backward (ZB-H1's B and W) is refused.
 */
#ifndef DT_TP_STAGE_H
#define DT_TP_STAGE_H

#include "dt_tp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_tp_stage {
    dt_tp_model core; /* cfg, comm, the stage's pointers; acts = the selected set */
    int l0, l1;       /* blocks owned */
    int act_slots, grad_slots;
    size_t lo, hi;       /* the stage's range of the whole share's layout */
    size_t set_floats;   /* one activation set, (max_B, T) */
    size_t grad_floats;  /* one gradient set: set_floats, fewer in bf16 */
    float *act_sets;     /* (act_slots, set_floats) */
    float *grad_sets;    /* (grad_slots, set_floats) */
    int *tokens;         /* (act_slots, 2, max_B, T): inputs, targets */
    int *shape;          /* (act_slots, 2): the B, T of each set's forward */
    int slot, grad_slot; /* selected */
} dt_tp_stage;

/*
 * Blocks [l0, l1) of cfg, this rank's share of them over tp_comm, with
 * act_slots / grad_slots sets of (max_B, cfg->T). Refuses by name what
 * dt_tp_create refuses. Always sets *out (NULL only on ENOMEM); on
 * failure read dt_tp_stage_error(*out), then dt_tp_stage_destroy.
 */
dt_status dt_tp_stage_create(dt_tp_stage **out, const dt_config *cfg, const dt_backend *be,
                             int max_B, int l0, int l1, int act_slots, int grad_slots,
                             dt_comm *tp_comm);
void dt_tp_stage_destroy(dt_tp_stage *s);
/* dt_tp_set_precision for the stage (its range of the share). */
dt_status dt_tp_stage_set_precision(dt_tp_stage *s, dt_precision p);
/* dt_tp_activation_bytes for the stage: its sets (and in bf16 the
 * workspaces and one store per activation slot). */
size_t dt_tp_stage_activation_bytes(const dt_tp_stage *s);
const char *dt_tp_stage_error(const dt_tp_stage *s);
/* This stage's part of dt_tp_init(seed)'s share, bitwise. */
dt_status dt_tp_stage_init(dt_tp_stage *s, uint64_t seed);

void dt_tp_stage_select(dt_tp_stage *s, int slot, int grad_slot);
float *dt_tp_stage_input(dt_tp_stage *s); /* (B, T, C) of the selected set */
const float *dt_tp_stage_output(const dt_tp_stage *s);
float *dt_tp_stage_output_grad(dt_tp_stage *s);
const float *dt_tp_stage_input_grad(const dt_tp_stage *s);

/* Forward of the selected set: the first stage reads inputs (B, T), the
 * last targets and sets *loss; 2 (l1 - l0) all-reduces of (B, T, C) over
 * the tp group, plus the embedding's and the cross-entropy's. */
dt_status dt_tp_stage_forward(dt_tp_stage *s, const int *inputs, const int *targets, int B, int T,
                              float *loss);
/* Whole backward of the selected sets' forward; adds into the gradients. */
dt_status dt_tp_stage_backward(dt_tp_stage *s, float dloss);
void dt_tp_stage_zero_grad(dt_tp_stage *s);
dt_status dt_tp_stage_update(dt_tp_stage *s, const dt_adamw_hparams *h, long step);

#ifdef __cplusplus
}
#endif
#endif /* DT_TP_STAGE_H */
