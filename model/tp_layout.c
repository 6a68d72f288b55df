/*
 * tp_layout.c — a tensor-parallel rank's share of MiniGPT's parameters.
 *
 * Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) splits every big
 * matmul of a block across the tp ranks of a group, so each rank holds
 * 1/tp of its weights and computes 1/tp of its flops. The split follows
 * what the layer does with its output:
 *
 *   attn.qkv.weight  (3C, C)   column-parallel: rank r keeps its heads'
 *                              rows of q, of k and of v (3 pieces of C/tp
 *                              rows), stacked q|k|v: (3C/tp, C), so the
 *                              attention kernel runs on it unchanged with
 *                              C/tp channels and H/tp heads
 *   attn.proj.weight (C, C)    row-parallel: columns [r C/tp, (r+1) C/tp)
 *   mlp.fc.weight    (4C, C)   column-parallel: rows [r 4C/tp, ...), and
 *   mlp.fc.bias      (4C)      its bias split the same way
 *   mlp.proj.weight  (C, 4C)   row-parallel: columns [r 4C/tp, ...)
 *   mlp.proj.bias    (C)       replicated, added once after the sum
 *   wte, lm_head     (V, C)    split by vocabulary: Vt = ceil(V/tp) rows
 *                              each, ids [r Vt, ...) (see "padding")
 *   wpe, ln*         replicated
 *
 * A rank's share is its own flat buffer, in the full model's tensor order
 * and with the full model's names (shapes are the local ones), so the
 * model's conventions (one buffer, a table of ranges, forward order) hold
 * for a shard too. The table remembers how each tensor was split, and one
 * copy routine moves a shard between the full layout and the local one,
 * either way: dt_tp_layout_slice (full -> share: initialisation, loading)
 * and dt_tp_layout_unslice (share -> full: the tests' comparisons and, later,
 * checkpoints). Cost: one pass over the parameters, host memory.
 *
 * A shape is refused, by name, unless tp divides the heads (heads divide
 * C, so tp then divides C/H-sized head groups, the width C and the MLP
 * width 4C too).
 *
 * Padding. A vocabulary tp does not divide (GPT-2's 50257) is padded, as
 * Megatron pads it (make-vocab-size-divisible-by): to Vt·tp rows, Vt =
 * ceil(V/tp), so every rank holds Vt rows of wte and of lm_head and every
 * share has the same size (the tp group all-gathers shares, the dp group
 * all-reduces them). Rank r's rows are the ids [r Vt, min(V, (r+1) Vt)):
 * its real rows, dt_tp_vocab_real of them; the rest, at most tp - 1 rows
 * on the last ranks, are padding. Padding rows are zeros that nothing
 * uses: the embedding never looks one up (ids are < V), the parallel
 * cross-entropy leaves the head's padding logits out of every max, sum
 * and loss (tensor/tp_vocab.c: a padding row is never a prediction, never
 * sampled) and gives them a zero gradient, so their rows' gradients are
 * zero and AdamW keeps them zero. Where they sit: after the real rows in lm_head's slice (the
 * share's last tensor) and before them in wte's (its first), so a share
 * is [wte padding | real part | lm_head padding] and its real part is one
 * contiguous range (dt_tp_share_kept): what a checkpoint stores, so a
 * checkpoint holds the unpadded model, V rows, whatever the tp.
 * Cost: at most 2 (tp - 1) C idle floats per share.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_model.h"
#include "model_internal.h"

dt_status dt_tp_config_check(const dt_config *c, int tp, char *err, size_t errlen)
{
    if (dt_config_check(c, err, errlen) != DT_OK)
        return DT_EINVAL;
    const char *what = NULL;
    int n = 0;
    if (tp < 1)
        what = "the tensor-parallel size", n = tp;
    else if (c->H % tp != 0)
        what = "heads H", n = c->H;
    if (!what && dt_tp_vocab_real(c, tp, tp - 1) < 1) {
        if (err && errlen)
            snprintf(err, errlen,
                     "tensor parallel: tp = %d leaves rank %d no row of the vocabulary V = %d "
                     "(%d rows each)",
                     tp, tp - 1, c->V, dt_tp_vocab_rows(c, tp));
        return DT_EINVAL;
    }
    if (!what)
        return DT_OK;
    if (err && errlen) {
        if (tp < 1)
            snprintf(err, errlen, "tensor parallel: tp = %d must be >= 1", tp);
        else
            snprintf(err, errlen, "tensor parallel: tp = %d does not divide the %s = %d", tp, what,
                     n);
    }
    return DT_EINVAL;
}

int dt_tp_vocab_rows(const dt_config *c, int tp)
{
    return (c->V + tp - 1) / tp;
}

int dt_tp_vocab_real(const dt_config *c, int tp, int rank)
{
    int Vt = dt_tp_vocab_rows(c, tp), left = c->V - rank * Vt;
    return left < 0 ? 0 : left < Vt ? left : Vt;
}

static int is_vocab(dt_tp_split s)
{
    return s == DT_TP_VOCAB_IN || s == DT_TP_VOCAB_OUT;
}

/* How tensor i of the full table is split (see the file comment). */
static dt_tp_split split_of(const dt_tensor_info *t)
{
    const char *s = t->name;
    if (strstr(s, "attn.qkv.weight"))
        return DT_TP_ROWS_QKV;
    if (strstr(s, ".proj.weight"))
        return DT_TP_COLS;
    if (strcmp(s, "wte.weight") == 0)
        return DT_TP_VOCAB_IN;
    if (strcmp(s, "lm_head.weight") == 0)
        return DT_TP_VOCAB_OUT;
    if (strstr(s, "mlp.fc."))
        return DT_TP_ROWS;
    return DT_TP_REPLICATED;
}

int dt_tp_layout_num_tensors(const dt_config *c)
{
    return dt_layout_num_tensors(c);
}

int dt_tp_layout_build(dt_tp_tensor *tab, const dt_config *c, int tp)
{
    int n = dt_layout_num_tensors(c);
    dt_tensor_info *full = calloc((size_t)n, sizeof *full);
    if (!full)
        return -1;
    dt_layout_build(full, NULL, NULL, c);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        dt_tp_tensor *t = &tab[i];
        t->full = full[i];
        t->split = split_of(&full[i]);
        t->local = full[i];
        if (t->split == DT_TP_COLS)
            t->local.shape[1] /= tp;
        else if (is_vocab(t->split))
            t->local.shape[0] = dt_tp_vocab_rows(c, tp);
        else if (t->split != DT_TP_REPLICATED)
            t->local.shape[0] /= tp;
        t->local.numel = is_vocab(t->split)
                             ? (size_t)t->local.shape[0] * (size_t)c->C
                             : t->full.numel / (t->split == DT_TP_REPLICATED ? 1 : (size_t)tp);
        t->local.offset = off;
        off += t->local.numel;
    }
    free(full);
    return n;
}

size_t dt_tp_num_params(const dt_config *c, int tp)
{
    size_t whole = dt_config_num_params(c), C = (size_t)c->C, V = (size_t)c->V;
    size_t split = (size_t)c->L * (12 * C * C + 4 * C), Vt = (size_t)dt_tp_vocab_rows(c, tp);
    return whole - 2 * V * C - split + split / (size_t)tp + 2 * Vt * C;
}

void dt_tp_share_kept(const dt_config *c, int tp, int rank, size_t *lo, size_t *n)
{
    size_t pad = (size_t)(dt_tp_vocab_rows(c, tp) - dt_tp_vocab_real(c, tp, rank)) * (size_t)c->C;
    *lo = pad;
    *n = dt_tp_num_params(c, tp) - 2 * pad;
}

/* Real rows of rank's slice of vocabulary tensor t (local: Vt rows). */
static size_t vocab_real(const dt_tp_tensor *t, int rank)
{
    long V = t->full.shape[0], Vt = t->local.shape[0], left = V - (long)rank * Vt;
    return left < 0 ? 0 : (size_t)(left < Vt ? left : Vt);
}

/*
 * Run k of rank's share of tensor t: a contiguous stretch of both layouts,
 * at *full_off in the full buffer and *local_off in the share. Returns its
 * length, 0 past the last run. A row split is one run (three for qkv: one
 * per q, k, v piece); a column split is one run per row.
 */
static size_t share_run(const dt_tp_tensor *t, int tp, int rank, size_t k, size_t *full_off,
                        size_t *local_off)
{
    size_t cols = t->full.ndim == 2 ? (size_t)t->full.shape[1] : 1;
    size_t rows = (size_t)t->full.shape[0], utp = (size_t)tp, r = (size_t)rank;
    *full_off = t->full.offset;
    *local_off = t->local.offset;
    if (t->split == DT_TP_REPLICATED)
        return k == 0 ? t->full.numel : 0;
    if (t->split == DT_TP_COLS) {
        size_t lc = cols / utp;
        *full_off += k * cols + r * lc;
        *local_off += k * lc;
        return k < rows ? lc : 0;
    }
    if (is_vocab(t->split)) { /* the real rows; padding before them in wte */
        size_t Vt = (size_t)t->local.shape[0], real = vocab_real(t, rank);
        *full_off += r * Vt * cols;
        *local_off += t->split == DT_TP_VOCAB_IN ? (Vt - real) * cols : 0;
        return k == 0 ? real * cols : 0;
    }
    size_t pieces = t->split == DT_TP_ROWS_QKV ? 3 : 1;
    size_t piece_rows = rows / pieces, lrows = piece_rows / utp;
    *full_off += (k * piece_rows + r * lrows) * cols;
    *local_off += k * lrows * cols;
    return k < pieces ? lrows * cols : 0;
}

void dt_tp_layout_slice(float *local, const float *full, const dt_tp_tensor *tab, int n, int tp,
                        int rank)
{
    size_t fo, lo, len;
    for (int i = 0; i < n; i++) {
        const dt_tp_tensor *t = &tab[i];
        if (is_vocab(t->split)) /* padding rows: zeros */
            memset(local + t->local.offset, 0, t->local.numel * sizeof(float));
        for (size_t k = 0; (len = share_run(t, tp, rank, k, &fo, &lo)) > 0; k++)
            memcpy(local + lo, full + fo, len * sizeof(float));
    }
}

void dt_tp_layout_unslice(float *full, const float *local, const dt_tp_tensor *tab, int n, int tp,
                          int rank)
{
    size_t fo, lo, len;
    for (int i = 0; i < n; i++)
        for (size_t k = 0; (len = share_run(&tab[i], tp, rank, k, &fo, &lo)) > 0; k++)
            memcpy(full + fo, local + lo, len * sizeof(float));
}

int dt_tp_layout_init(float *local, const dt_tp_tensor *tab, const dt_config *c, int tp, int rank,
                      uint64_t seed)
{
    float *full = malloc(dt_config_num_params(c) * sizeof(float));
    if (!full || dt_layout_init_stage(full, c, 0, c->L, seed) != 0) {
        free(full);
        return -1;
    }
    dt_tp_layout_slice(local, full, tab, dt_layout_num_tensors(c), tp, rank);
    free(full);
    return 0;
}
