/*
 * tp_vocab.c — the layers split by vocabulary: the token embedding and
 * the parallel cross-entropy (Megatron's VocabParallelEmbedding and
 * vocab_parallel_cross_entropy).
 *
 * Rank r holds Vt = ceil(V/tp) rows of wte and of lm_head, ids [v0, v0 +
 * Vt), v0 = r Vt, of which the first `real` are ids of the vocabulary and
 * the rest padding (model/tp_layout.c: before the real rows in wte, after
 * them in lm_head). The embedding never looks a padding row up (ids are
 * < V). The head's matmul runs over all Vt rows (a width of 1 would be a
 * degenerate GEMM; padding is at most tp - 1 rows), so its padding rows
 * give logits, zeros, which the cross-entropy leaves out: no padding
 * column is in a row max, a softmax sum or a loss; its probability is 0,
 * so it is never a prediction; its logit gradient is 0, so the head's
 * padding rows get zero gradients and add nothing to the input's.
 *
 * Embedding: each rank writes its own rows for the tokens it holds and
 * zeros for the others, and an all-reduce (g) sums the (N, C) result:
 * exactly one rank contributes each row, so the sum is the looked-up row
 * bit for bit. wpe is replicated and added after the sum. Backward needs
 * no communication: the gradient of the encoded stream is whole on every
 * rank, and each rank adds it into the wte rows it holds.
 *
 * Cross-entropy: the head's logits stay split, (N, V/tp) per rank. The
 * softmax needs three numbers per row from the whole vocabulary, so the
 * ranks all-reduce those instead of the logits: the row max (MAX), then
 * the sum of exp(z - max) and the target's logit (SUM, one call of 2N
 * floats; only the rank holding the target contributes it). Then
 *   loss = log(sum) + max - z_target,   probs_r = exp(z_r - max) / sum
 * and backward is local: dlogits_r = (probs_r - onehot_r) dloss / N.
 * Cost: 3N floats of all-reduce per forward against N V of logits.
 *
 * Argmax (greedy decoding, evaluation's exact-match grading): each rank
 * takes the max of its real columns (the first, on a tie), the group
 * all-reduces the row maxima (MAX), and each rank offers the global id of
 * its first column that reaches the global max, or V where none does; an
 * all-reduce (MIN) of those picks the lowest id: the whole model's argmax,
 * ties to the lower id. Padding columns (logit 0) are never candidates,
 * so they cannot win over a vocabulary of negative logits. Cost: 2N
 * floats of all-reduce against N V of logits (ids < 2^24 are exact in a
 * float).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tp_internal.h"

tp_vocab tp_vocab_of(const dt_tp_model *m)
{
    tp_vocab v = {.rows = dt_tp_vocab_rows(&m->cfg, m->tp),
                  .real = dt_tp_vocab_real(&m->cfg, m->tp, m->rank)};
    v.v0 = m->rank * v.rows;
    v.pad = v.rows - v.real;
    return v;
}

dt_status tp_vocab_embed_forward(dt_tp_model *m, int B, int T)
{
    tp_vocab vb = tp_vocab_of(m);
    int C = m->cfg.C, N = B * T;
    const float *wte = m->compute.wte + (size_t)vb.pad * C; /* its real rows */
    float *out = m->acts.encoded;
    for (int n = 0; n < N; n++) {
        int v = m->inputs[n] - vb.v0;
        float *row = out + (size_t)n * C;
        if (v >= 0 && v < vb.real)
            memcpy(row, wte + (size_t)v * C, (size_t)C * sizeof(float));
        else
            memset(row, 0, (size_t)C * sizeof(float));
    }
    dt_status st = tp_allreduce(m, out, (size_t)N * C, DT_SUM, DT_TP_EMBEDDING, -1);
    if (st != DT_OK)
        return st;
    for (int n = 0; n < N; n++) {
        const float *pe = m->compute.wpe + (size_t)(n % T) * C;
        for (int c = 0; c < C; c++)
            out[(size_t)n * C + c] += pe[c];
    }
    return DT_OK;
}

void tp_vocab_embed_backward(dt_tp_model *m, int B, int T)
{
    tp_vocab vb = tp_vocab_of(m);
    int C = m->cfg.C, N = B * T;
    float *dwte = m->grads.wte + (size_t)vb.pad * C;
    for (int n = 0; n < N; n++) {
        const float *d = m->grad_acts.encoded + (size_t)n * C;
        int v = m->inputs[n] - vb.v0;
        float *dpe = m->grads.wpe + (size_t)(n % T) * C;
        float *dwe = v >= 0 && v < vb.real ? dwte + (size_t)v * C : NULL;
        for (int c = 0; c < C; c++) {
            if (dwe)
                dwe[c] += d[c];
            dpe[c] += d[c];
        }
    }
}

/* Row maxima of the local logits' real columns into mx (N); rows of w
 * (the rank's Vt), of which the first r are real. */
static void local_row_max(float *mx, const float *logits, int N, int w, int r)
{
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * w;
        float v = z[0];
        for (int i = 1; i < r; i++)
            v = z[i] > v ? z[i] : v;
        mx[n] = v;
    }
}

/* probs = exp(z - max) (unnormalised) of the real columns, 0 in the
 * padding ones, their row sums into sum (N), and the target's logit into
 * zt (N) where this rank holds the target. */
static void local_exp_sums(float *sum, float *zt, float *probs, const float *logits,
                           const float *mx, const int *targets, int v0, int N, int w, int r)
{
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * w;
        float *p = probs + (size_t)n * w, s = 0.0f;
        for (int i = 0; i < r; i++) {
            p[i] = expf(z[i] - mx[n]);
            s += p[i];
        }
        for (int i = r; i < w; i++)
            p[i] = 0.0f;
        sum[n] = s;
        int v = targets ? targets[n] - v0 : -1;
        zt[n] = v >= 0 && v < r ? z[v] : 0.0f;
    }
}

dt_status tp_vocab_crossentropy_forward(dt_tp_model *m, int with_targets, int N)
{
    tp_vocab vb = tp_vocab_of(m);
    int w = vb.rows, r = vb.real;
    float *mx = m->ce_stats, *sum = mx + N, *zt = sum + N;
    dt_acts *a = &m->acts;
    local_row_max(mx, a->logits, N, w, r);
    dt_status st = tp_allreduce(m, mx, (size_t)N, DT_MAX, DT_TP_LOGIT_MAX, -1);
    if (st != DT_OK)
        return st;
    local_exp_sums(sum, zt, a->probs, a->logits, mx, with_targets ? m->targets : NULL, vb.v0, N, w,
                   r);
    st = tp_allreduce(m, sum, 2 * (size_t)N, DT_SUM, DT_TP_LOGIT_SUMS, -1);
    if (st != DT_OK)
        return st;
    double total = 0.0;
    for (int n = 0; n < N; n++) {
        float inv = 1.0f / sum[n], *p = a->probs + (size_t)n * w;
        for (int i = 0; i < r; i++)
            p[i] *= inv;
        if (with_targets) {
            a->losses[n] = logf(sum[n]) + mx[n] - zt[n];
            total += a->losses[n];
        }
    }
    if (with_targets)
        m->mean_loss = (float)(total / N);
    return DT_OK;
}

/* dlogits = (probs - onehot) dloss / N; 0 in the padding columns (their
 * probs are 0 and no target is there), so the head's padding rows get a
 * zero gradient and add nothing to the input's. */
void tp_vocab_crossentropy_backward(dt_tp_model *m, float dloss, int N)
{
    tp_vocab vb = tp_vocab_of(m);
    int w = vb.rows, v0 = vb.v0;
    float scale = dloss / (float)N;
    for (int n = 0; n < N; n++) {
        const float *p = m->acts.probs + (size_t)n * w;
        float *d = m->grad_acts.logits + (size_t)n * w;
        for (int i = 0; i < w; i++)
            d[i] = p[i] * scale;
        int v = m->targets[n] - v0;
        if (v >= 0 && v < vb.real)
            d[v] -= scale;
    }
}

/* The first real column of each row that reaches its max (the row's
 * global max after the all-reduce) as a global id, or V where none does. */
static void local_first_at(float *id, const float *logits, const float *mx, int N, int w, int r,
                           int v0, int V)
{
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * w;
        int i = 0;
        while (i < r && z[i] != mx[n])
            i++;
        id[n] = (float)(i < r ? v0 + i : V);
    }
}

dt_status dt_tp_argmax(dt_tp_model *m, int *ids)
{
    tp_vocab vb = tp_vocab_of(m);
    int N = m->last_B * m->last_T;
    if (N < 1) {
        snprintf(m->err, sizeof m->err, "rank %d: argmax: no forward to read", m->rank);
        return DT_EINVAL;
    }
    float *mx = m->ce_stats, *id = mx + N; /* the cross-entropy is done with them */
    local_row_max(mx, m->acts.logits, N, vb.rows, vb.real);
    dt_status st = tp_allreduce(m, mx, (size_t)N, DT_MAX, DT_TP_LOGIT_MAX, -1);
    if (st != DT_OK)
        return st;
    local_first_at(id, m->acts.logits, mx, N, vb.rows, vb.real, vb.v0, m->cfg.V);
    if ((st = tp_allreduce(m, id, (size_t)N, DT_MIN, DT_TP_LOGIT_MAX, -1)) != DT_OK)
        return st;
    for (int n = 0; n < N; n++)
        ids[n] = (int)id[n];
    return DT_OK;
}
