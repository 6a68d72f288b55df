/*
 * tp_vocab.c — the layers split by vocabulary: the token embedding and
 * the parallel cross-entropy (Megatron's VocabParallelEmbedding and
 * vocab_parallel_cross_entropy).
 *
 * Rank r holds rows [v0, v0 + V/tp) of wte and of lm_head, v0 = r V/tp.
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
 */
#include <math.h>
#include <string.h>

#include "tp_internal.h"

dt_status tp_vocab_embed_forward(dt_tp_model *m, int B, int T)
{
    int C = m->cfg.C, Vl = m->cfg.V / m->tp, v0 = m->rank * Vl, N = B * T;
    float *out = m->acts.encoded;
    for (int n = 0; n < N; n++) {
        int v = m->inputs[n] - v0;
        float *row = out + (size_t)n * C;
        if (v >= 0 && v < Vl)
            memcpy(row, m->params.wte + (size_t)v * C, (size_t)C * sizeof(float));
        else
            memset(row, 0, (size_t)C * sizeof(float));
    }
    dt_status st = tp_allreduce(m, out, (size_t)N * C, DT_SUM, DT_TP_EMBEDDING, -1);
    if (st != DT_OK)
        return st;
    for (int n = 0; n < N; n++) {
        const float *pe = m->params.wpe + (size_t)(n % T) * C;
        for (int c = 0; c < C; c++)
            out[(size_t)n * C + c] += pe[c];
    }
    return DT_OK;
}

void tp_vocab_embed_backward(dt_tp_model *m, int B, int T)
{
    int C = m->cfg.C, Vl = m->cfg.V / m->tp, v0 = m->rank * Vl, N = B * T;
    for (int n = 0; n < N; n++) {
        const float *d = m->grad_acts.encoded + (size_t)n * C;
        int v = m->inputs[n] - v0;
        float *dpe = m->grads.wpe + (size_t)(n % T) * C;
        float *dwe = v >= 0 && v < Vl ? m->grads.wte + (size_t)v * C : NULL;
        for (int c = 0; c < C; c++) {
            if (dwe)
                dwe[c] += d[c];
            dpe[c] += d[c];
        }
    }
}

/* Row maxima of the local logits into mx (N). */
static void local_row_max(float *mx, const float *logits, int N, int Vl)
{
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * Vl;
        float v = z[0];
        for (int i = 1; i < Vl; i++)
            v = z[i] > v ? z[i] : v;
        mx[n] = v;
    }
}

/* probs = exp(z - max) (unnormalised), their row sums into sum (N), and
 * the target's logit into zt (N) where this rank holds the target. */
static void local_exp_sums(float *sum, float *zt, float *probs, const float *logits,
                           const float *mx, const int *targets, int v0, int N, int Vl)
{
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * Vl;
        float *p = probs + (size_t)n * Vl, s = 0.0f;
        for (int i = 0; i < Vl; i++) {
            p[i] = expf(z[i] - mx[n]);
            s += p[i];
        }
        sum[n] = s;
        int v = targets ? targets[n] - v0 : -1;
        zt[n] = v >= 0 && v < Vl ? z[v] : 0.0f;
    }
}

dt_status tp_vocab_crossentropy_forward(dt_tp_model *m, int with_targets, int N)
{
    int Vl = m->cfg.V / m->tp, v0 = m->rank * Vl;
    float *mx = m->ce_stats, *sum = mx + N, *zt = sum + N;
    dt_acts *a = &m->acts;
    local_row_max(mx, a->logits, N, Vl);
    dt_status st = tp_allreduce(m, mx, (size_t)N, DT_MAX, DT_TP_LOGIT_MAX, -1);
    if (st != DT_OK)
        return st;
    local_exp_sums(sum, zt, a->probs, a->logits, mx, with_targets ? m->targets : NULL, v0, N, Vl);
    st = tp_allreduce(m, sum, 2 * (size_t)N, DT_SUM, DT_TP_LOGIT_SUMS, -1);
    if (st != DT_OK)
        return st;
    double total = 0.0;
    for (int n = 0; n < N; n++) {
        float inv = 1.0f / sum[n], *p = a->probs + (size_t)n * Vl;
        for (int i = 0; i < Vl; i++)
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

void tp_vocab_crossentropy_backward(dt_tp_model *m, float dloss, int N)
{
    int Vl = m->cfg.V / m->tp, v0 = m->rank * Vl;
    float scale = dloss / (float)N;
    for (int n = 0; n < N; n++) {
        const float *p = m->acts.probs + (size_t)n * Vl;
        float *d = m->grad_acts.logits + (size_t)n * Vl;
        for (int i = 0; i < Vl; i++)
            d[i] = p[i] * scale;
        int v = m->targets[n] - v0;
        if (v >= 0 && v < Vl)
            d[v] -= scale;
    }
}
