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
 * Cost: O(V log V) for top-k (a sort of a copy), O(V) otherwise.
 *
 * Generation: dt_generate_plain is the reference, one forward pass over
 * the last T tokens per generated token (O(P·T) each). dt_generate
 * decodes through a KV cache (kv_cache.c) while the sequence fits the
 * context, one row of work per token, and finishes by the plain path once
 * the window slides (learned absolute positions: every cached position
 * would change). Both sample from the same rng in the same order.
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

/* Checks the prompt and allocates one row of logits; NULL on error. */
static float *generate_start(dt_model *m, int n_prompt)
{
    if (n_prompt < 1) {
        snprintf(m->err, sizeof m->err, "minigpt: generate: the prompt needs at least one token");
        return NULL;
    }
    float *logits = malloc((size_t)m->cfg.V * sizeof(float));
    if (!logits)
        snprintf(m->err, sizeof m->err, "minigpt: generate: out of memory");
    return logits;
}

/* Plain steps from length len until n_new tokens past n_prompt (or stop). */
static int generate_plain_from(dt_model *m, int *tokens, int len, int end, float temperature,
                               int top_k, int stop, dt_rng *rng, float *logits)
{
    int V = m->cfg.V, T = m->cfg.T;
    while (len < end) {
        int ctx = len < T ? len : T;
        if (dt_model_forward(m, tokens + len - ctx, NULL, 1, ctx) != DT_OK)
            return -1;
        dt_model_get_logits(m, logits, 0, ctx - 1);
        int next = dt_sample_logits(logits, V, temperature, top_k, rng);
        tokens[len++] = next;
        if (next == stop)
            break;
    }
    return len;
}

int dt_generate_plain(dt_model *m, int *tokens, int n_prompt, int n_new, float temperature,
                      int top_k, int stop, dt_rng *rng)
{
    float *logits = generate_start(m, n_prompt);
    if (!logits)
        return -1;
    int len = generate_plain_from(m, tokens, n_prompt, n_prompt + n_new, temperature, top_k, stop,
                                  rng, logits);
    free(logits);
    return len;
}

/* Cached steps while the sequence fits the context: the prompt (its last
 * T tokens when longer; then the plain path does it all), then one token
 * at a time. Returns the length reached; *done when stop was emitted. */
static int generate_cached(dt_model *m, dt_kv_cache *kv, int *tokens, int n_prompt, int end,
                           float temperature, int top_k, int stop, dt_rng *rng, bool *done)
{
    int V = m->cfg.V, T = m->cfg.T, len = n_prompt;
    *done = false;
    if (len > T || len >= end)
        return len;
    if (dt_kv_cache_prefill(kv, tokens, len) != DT_OK)
        return -1;
    for (;;) {
        int next = dt_sample_logits(dt_kv_cache_logits(kv), V, temperature, top_k, rng);
        tokens[len++] = next;
        if (next == stop || len == end) {
            *done = true;
            return len;
        }
        if (len > T) /* the window slides: positions change */
            return len;
        if (dt_kv_cache_append(kv, next) != DT_OK)
            return -1;
    }
}

int dt_generate(dt_model *m, int *tokens, int n_prompt, int n_new, float temperature, int top_k,
                int stop, dt_rng *rng)
{
    if (!dt_kv_cache_supported(m))
        return dt_generate_plain(m, tokens, n_prompt, n_new, temperature, top_k, stop, rng);
    float *logits = generate_start(m, n_prompt);
    dt_kv_cache *kv = NULL;
    if (!logits || dt_kv_cache_create(&kv, m) != DT_OK) {
        free(logits);
        return -1;
    }
    bool done = n_new <= 0;
    int end = n_prompt + n_new, len = n_prompt;
    if (!done)
        len = generate_cached(m, kv, tokens, n_prompt, end, temperature, top_k, stop, rng, &done);
    if (len >= 0 && !done)
        len = generate_plain_from(m, tokens, len, end, temperature, top_k, stop, rng, logits);
    dt_kv_cache_destroy(kv);
    free(logits);
    return len;
}
