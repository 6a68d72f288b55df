/*
 * sample.c — sampling: text generation with temperature and top-k. The
 * uniform draws come from the caller's dt_rng (rng.c), so the same seed
 * gives the same samples on every machine and in every thread.
 *
 * Sampling one token from logits z (V):
 *   temperature <= 0   argmax (lowest id on ties): greedy decoding
 *   otherwise          p_i ~ exp((z_i - max z) / temperature) over the
 *                      tokens whose logit is >= the k-th largest (top_k;
 *                      ties at the threshold are all kept), one uniform
 *                      draw walks the cumulative sum.
 * Cost: O(V log V) for top-k (a sort of a copy), O(V) otherwise; a
 * generated token costs one forward pass over the last T tokens (no KV
 * cache: MiniGPT's contexts are short, and clarity wins).
 */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "dt_model.h"

static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

static int argmax(const float *z, int V)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (z[i] > z[best])
            best = i;
    return best;
}

int dt_sample_logits(const float *logits, int V, float temperature, int top_k, dt_rng *rng)
{
    if (temperature <= 0.0f)
        return argmax(logits, V);
    float maxv = logits[argmax(logits, V)];
    float threshold = -INFINITY;
    if (top_k > 0 && top_k < V) {
        float *sorted = malloc((size_t)V * sizeof(float));
        if (!sorted) /* no memory: fall back to greedy, still a valid id */
            return argmax(logits, V);
        memcpy(sorted, logits, (size_t)V * sizeof(float));
        qsort(sorted, (size_t)V, sizeof(float), cmp_desc);
        threshold = sorted[top_k - 1];
        free(sorted);
    }
    double total = 0.0;
    for (int i = 0; i < V; i++)
        if (logits[i] >= threshold)
            total += exp((double)(logits[i] - maxv) / temperature);
    double coin = dt_rng_uniform(rng) * total, cum = 0.0;
    int last = argmax(logits, V); /* rounding guard: the walk may end early */
    for (int i = 0; i < V; i++) {
        if (logits[i] < threshold)
            continue;
        cum += exp((double)(logits[i] - maxv) / temperature);
        last = i;
        if (coin < cum)
            return i;
    }
    return last;
}

int dt_generate(dt_model *m, int *tokens, int n_prompt, int n_new, float temperature, int top_k,
                int stop, dt_rng *rng)
{
    int V = m->cfg.V, T = m->cfg.T, len = n_prompt;
    if (n_prompt < 1) {
        snprintf(m->err, sizeof m->err, "minigpt: generate: the prompt needs at least one token");
        return -1;
    }
    float *logits = malloc((size_t)V * sizeof(float));
    if (!logits) {
        snprintf(m->err, sizeof m->err, "minigpt: generate: out of memory");
        return -1;
    }
    for (int i = 0; i < n_new; i++) {
        int ctx = len < T ? len : T;
        if (dt_model_forward(m, tokens + len - ctx, NULL, 1, ctx) != DT_OK) {
            len = -1;
            break;
        }
        dt_model_get_logits(m, logits, 0, ctx - 1);
        int next = dt_sample_logits(logits, V, temperature, top_k, rng);
        tokens[len++] = next;
        if (next == stop)
            break;
    }
    free(logits);
    return len;
}
