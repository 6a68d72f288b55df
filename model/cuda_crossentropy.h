/*
 * cuda_crossentropy.h — softmax + cross-entropy over the vocabulary, as
 * per-thread bodies (see cuda_common.h).
 *
 * Forward: one thread per row (N): max, exponentials and their sum, the
 * normalised probabilities, and the loss in log-sum-exp form
 * (log(sum) + max - z[target]), exact even where probs[target] underflows.
 * Backward: one thread per element of dlogits (N*V):
 * (probs - onehot(target)) * dloss / N.
 */
#ifndef DT_CUDA_CROSSENTROPY_H
#define DT_CUDA_CROSSENTROPY_H

#include "cuda_common.h"

/* probs (N, V) row n; losses (N) entry n, if targets */
static inline DT_HD void dtk_crossentropy_forward_row(float *probs, float *losses,
                                                      const float *logits, const int *targets,
                                                      int n, int V)
{
    const float *z = logits + (size_t)n * V;
    float *p = probs + (size_t)n * V;
    float maxv = z[0];
    for (int i = 1; i < V; i++)
        maxv = z[i] > maxv ? z[i] : maxv;
    float sum = 0.0f;
    for (int i = 0; i < V; i++) {
        p[i] = expf(z[i] - maxv);
        sum += p[i];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < V; i++)
        p[i] *= inv;
    if (targets)
        losses[n] = logf(sum) + maxv - z[targets[n]];
}

/* dlogits (N, V) element idx; scale = dloss / N */
static inline DT_HD void dtk_crossentropy_backward_elem(float *dlogits, const float *probs,
                                                        const int *targets, float scale, size_t idx,
                                                        int V)
{
    size_t n = idx / (size_t)V;
    int i = (int)(idx % (size_t)V);
    float d = probs[idx] * scale;
    dlogits[idx] = i == targets[n] ? d - scale : d;
}

#endif /* DT_CUDA_CROSSENTROPY_H */
