/*
 * dt_tp_layout.h — part of the model layer's public interface (dt_model.h
 * includes it): how a tensor-parallel rank's share of MiniGPT is laid
 * out (tp_layout.c).
 *
 * Megatron's split of each tensor over tp ranks: column-parallel matmuls
 * (qkv, mlp.fc) and the vocabulary-split embedding and head keep a block of
 * rows (qkv: of each of q, k and v), row-parallel ones (attn.proj,
 * mlp.proj weights) a block of columns; LayerNorms, wpe and mlp.proj.bias
 * are replicated. A share is a flat buffer in the full model's tensor
 * order; the communication lives a layer up (tensor/dt_tp.h). Building a
 * table is O(tensors); slicing and unslicing copy a share's elements once.
 */
#ifndef DT_TP_LAYOUT_H
#define DT_TP_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "dt_model.h" /* dt_config, dt_tensor_info */

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_tp_split {
    DT_TP_REPLICATED = 0,
    DT_TP_ROWS,     /* rows [rank R/tp, (rank+1) R/tp) */
    DT_TP_ROWS_QKV, /* that, in each of the three (C, C) pieces q, k, v */
    DT_TP_COLS,     /* columns [rank K/tp, (rank+1) K/tp) */
    /* Rows of the padded vocabulary (Vt = dt_tp_vocab_rows each): the
     * rank's real rows, then (head) or after (embedding) its padding rows,
     * so that a share's padding sits at its two ends (tp_layout.c). */
    DT_TP_VOCAB_IN,  /* wte: padding rows first */
    DT_TP_VOCAB_OUT, /* lm_head: padding rows last */
} dt_tp_split;

typedef struct dt_tp_tensor {
    dt_tensor_info full;  /* the tensor in the full model's layout */
    dt_tensor_info local; /* the share: local shape, offset in the share */
    dt_tp_split split;
} dt_tp_tensor;

/* DT_EINVAL with a message naming what tp does not divide (the heads;
 * dividing H it divides C and the MLP width 4C), a tp that would leave a
 * rank no real row of the vocabulary, or what else is wrong with cfg. The
 * vocabulary need not divide: it is padded (dt_tp_vocab_rows). */
dt_status dt_tp_config_check(const dt_config *cfg, int tp, char *err, size_t errlen);
/* Rows of the vocabulary per rank: ceil(V / tp), the padded vocabulary
 * tp of them; of rank's, dt_tp_vocab_real are ids [rank Vt, ...). */
int dt_tp_vocab_rows(const dt_config *cfg, int tp);
int dt_tp_vocab_real(const dt_config *cfg, int tp, int rank);
size_t dt_tp_num_params(const dt_config *cfg, int tp); /* one rank's share, padded */
/* The part of rank's share a checkpoint keeps: [*lo, *lo + *n), the share
 * without its padding rows (lo = the embedding's padding, n = the share
 * less both pieces of padding); all of it when tp divides V. */
void dt_tp_share_kept(const dt_config *cfg, int tp, int rank, size_t *lo, size_t *n);
int dt_tp_layout_num_tensors(const dt_config *cfg);
/* Fills tab (dt_tp_layout_num_tensors entries) for a checked (cfg, tp);
 * returns the count, -1 on ENOMEM. Every rank's table is the same. */
int dt_tp_layout_build(dt_tp_tensor *tab, const dt_config *cfg, int tp);
/* full (dt_config_num_params) -> rank's share (dt_tp_num_params), and back
 * (unslice writes only the share's elements of full). slice writes zeros
 * into the share's padding rows; unslice never reads them. */
void dt_tp_layout_slice(float *local, const float *full, const dt_tp_tensor *tab, int n, int tp,
                        int rank);
void dt_tp_layout_unslice(float *full, const float *local, const dt_tp_tensor *tab, int n, int tp,
                          int rank);
/* rank's share of what dt_model_init(seed) gives the full model, bitwise;
 * -1 on ENOMEM. */
int dt_tp_layout_init(float *local, const dt_tp_tensor *tab, const dt_config *cfg, int tp, int rank,
                      uint64_t seed);

#ifdef __cplusplus
}
#endif

#endif /* DT_TP_LAYOUT_H */
