/*
 * tp_internal.h — functions shared between the tensor-parallel layer's
 * files, not part of its interface.
 */
#ifndef DT_TP_INTERNAL_H
#define DT_TP_INTERNAL_H

#include "dt_tp.h"

/* tp_model.c: points blocks [l0, l1) of a at base + off, each block's
 * tensors in dt_block_acts order with the share's local widths, for
 * (B, T); returns the offset after them (base may be NULL: sizes only). */
size_t tp_carve_blocks(dt_acts *a, float *base, size_t off, int l0, int l1, const dt_config *c,
                       int tp, size_t B, size_t T, float *ws, bool grads);
/* With ws (bf16), each block keeps only its statistics and residual
 * stream at base (of gradients, residual3's only); its other tensors
 * point at ws, one block's worth of tp_block_ws_floats. */
size_t tp_block_ws_floats(const dt_config *c, int tp, size_t B, size_t T, bool grads);

/* tp_allreduce.c: in-place all-reduce of n floats over the tp group; on
 * failure the message (naming what was reduced) is on m. */
dt_status tp_allreduce(dt_tp_model *m, float *buf, size_t n, dt_redop op, dt_tp_site site,
                       int layer);

/* tp_block.c: block l of a share, forward (residual (N, C) in,
 * acts.blocks[l].residual3 out) and backward (dres3 in, dresidual_in
 * out, adding into the block's parameter gradients). */
dt_status tp_block_forward(dt_tp_model *m, int l, const float *residual, int B, int T);
dt_status tp_block_backward(dt_tp_model *m, int l, const float *dres3, const float *residual_in,
                            float *dresidual_in);

/* tp_vocab.c: this rank's rows of the padded vocabulary: `rows` (Vt) of
 * wte and lm_head, ids [v0, v0 + real) of them real, `pad` padding rows
 * (model/tp_layout.c). The logits and probs are (N, real). */
typedef struct tp_vocab {
    int rows, real, v0, pad;
} tp_vocab;
tp_vocab tp_vocab_of(const dt_tp_model *m);

/* tp_vocab.c: the vocabulary-split embedding and the parallel
 * cross-entropy over the share's logits (N, V/tp). */
dt_status tp_vocab_embed_forward(dt_tp_model *m, int B, int T);
void tp_vocab_embed_backward(dt_tp_model *m, int B, int T);
dt_status tp_vocab_crossentropy_forward(dt_tp_model *m, int with_targets, int N);
void tp_vocab_crossentropy_backward(dt_tp_model *m, float dloss, int N);

/* tp_model.c: switch m to precision p with a store of `store` elements
 * and the one-block workspaces (tp_block_ws_floats at (max_B, T)),
 * through tp_precision_alloc; the two workspaces' floats (0 in fp32). */
dt_status tp_precision_switch(dt_tp_model *m, dt_precision p, size_t store);
size_t tp_workspace_floats(const dt_tp_model *m);

/* tp_precision.c: bf16 compute on a share. alloc switches m to p with
 * a store of `store` elements and workspaces of ws and grad_ws floats
 * (tp_precision_switch sizes them; the caller then points m->compute at
 * m->rounded_memory and re-carves its activations around the
 * workspaces); round_params refreshes the rounded copy of the masters
 * (before each forward); round_acts rounds x (n) in place; pack moves
 * block l's stored tensors from the workspace into the store after its
 * forward, unpack back before its backward; all do nothing in fp32.
 * store_block: one block's stored elements for (B, T). */
dt_status tp_precision_alloc(dt_tp_model *m, dt_precision p, size_t store, size_t ws,
                             size_t grad_ws);
void tp_precision_free(dt_tp_model *m);
void tp_round_params(dt_tp_model *m);
void tp_round_acts(const dt_tp_model *m, float *x, size_t n);
size_t tp_store_block(const dt_config *c, int tp, size_t B, size_t T);
void tp_store_pack(dt_tp_model *m, int l, int B, int T);
void tp_store_unpack(dt_tp_model *m, int l, int B, int T);

#endif /* DT_TP_INTERNAL_H */
