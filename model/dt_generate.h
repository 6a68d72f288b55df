/*
 * dt_generate.h — part of the model layer's public interface (dt_model.h
 * includes it): generating tokens from a model.
 *
 * A deterministic RNG (splitmix64), sampling one token from a row of
 * logits (greedy, temperature, top-k), and two ways to extend a prompt:
 * the plain one, a forward pass over the last T tokens per new token
 * (O(T) rows of work each), and a key/value cache that keeps every
 * block's keys and values of the positions decoded so far (2·L·T·C
 * floats), so a new token costs one row of work. Both give the same
 * tokens.
 */
#ifndef DT_GENERATE_H
#define DT_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "dt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_model dt_model; /* dt_model.h */

/* Deterministic RNG state for sampling and data (splitmix64). */
typedef struct dt_rng {
    uint64_t state;
} dt_rng;
void dt_rng_seed(dt_rng *r, uint64_t seed);
uint64_t dt_rng_next(dt_rng *r);
float dt_rng_uniform(dt_rng *r); /* [0, 1) */
/* Advances r as `draws` calls of dt_rng_next would, in O(1). */
void dt_rng_skip(dt_rng *r, uint64_t draws);

/* Sample a token from one row of logits (V). temperature <= 0 means greedy
 * (argmax); top_k <= 0 or >= V keeps all tokens. */
int dt_sample_logits(const float *logits, int V, float temperature, int top_k, dt_rng *rng);
/* Extend tokens[0..n_prompt) to tokens[0..n_prompt+n_new), each token
 * predicted from the last cfg.T tokens before it. Uses sequence 0 of the
 * activations. If stop >= 0, stops after emitting that token. Returns the
 * new length, or -1 on error (message on m). Decodes through a KV cache
 * (below) while the sequence fits the context and the model supports it,
 * by dt_generate_plain's forward passes otherwise: the same tokens. */
int dt_generate(dt_model *m, int *tokens, int n_prompt, int n_new, float temperature, int top_k,
                int stop, dt_rng *rng);
/* The reference: one forward pass over the last cfg.T tokens per token. */
int dt_generate_plain(dt_model *m, int *tokens, int n_prompt, int n_new, float temperature,
                      int top_k, int stop, dt_rng *rng);

/* ---- incremental decoding (kv_cache.c) ------------------------------------ */

/*
 * A key/value cache over m: each block's keys and values of the positions
 * decoded so far (2·L·T·C floats), so the next token costs one row of
 * work. Prefill runs the prompt through dt_model_forward (it uses m's
 * activations); append runs one token at position len. Both leave the
 * next token's logits (V, host) in dt_kv_cache_logits. Positions [0, T)
 * only. Supported on the CPU backends, for a whole model without
 * recomputation, its parameters held (create refuses others: DT_EINVAL).
 */
typedef struct dt_kv_cache dt_kv_cache;
bool dt_kv_cache_supported(const dt_model *m);
dt_status dt_kv_cache_create(dt_kv_cache **out, dt_model *m);
void dt_kv_cache_destroy(dt_kv_cache *kv);
dt_status dt_kv_cache_prefill(dt_kv_cache *kv, const int *tokens, int n); /* 1 <= n <= T */
dt_status dt_kv_cache_append(dt_kv_cache *kv, int token);
int dt_kv_cache_len(const dt_kv_cache *kv);
const float *dt_kv_cache_logits(const dt_kv_cache *kv);

#ifdef __cplusplus
}
#endif
#endif /* DT_GENERATE_H */
