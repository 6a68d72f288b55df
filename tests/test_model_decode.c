/*
 * test_model_decode.c — decoding: the KV cache (kv_cache.c) against the
 * plain path that runs a forward pass per token (sample.c), and the task's
 * evaluation dealt out in shares (task.c).
 *
 * The cache's logits come from one-row matmuls and its own attention loop,
 * so they agree with a full forward to rounding, not bitwise: they are
 * compared with a relative tolerance of 1e-4 of the row's largest
 * magnitude (float32 sums of a few hundred terms err by ~1e-6), and the
 * generated tokens must be identical.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dt_model.h"

/* A model wider and deeper than the seed's, so that every kernel sums
 * over more than one vector of terms; random weights from seed. */
static dt_model *decode_model(dt_config *c, uint64_t seed)
{
    *c = (dt_config){.V = 96, .T = 24, .L = 3, .H = 4, .C = 48};
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, c, dt_backend_cpu(), 1), DT_OK);
    dt_model_init(m, seed);
    return m;
}

static void prompt_tokens(int *x, int n, int V, uint64_t seed)
{
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (int i = 0; i < n; i++)
        x[i] = (int)(dt_rng_next(&r) % (uint64_t)V);
}

static float max_abs(const float *z, int n)
{
    float m = 0.0f;
    for (int i = 0; i < n; i++)
        m = fabsf(z[i]) > m ? fabsf(z[i]) : m;
    return m;
}

Test(kv_cache, logits_at_every_position_match_a_full_forward, .timeout = 30)
{
    dt_config c;
    dt_model *m = decode_model(&c, 3);
    int tok[24];
    prompt_tokens(tok, c.T, c.V, 11);
    float *want = malloc((size_t)c.V * sizeof(float));
    dt_kv_cache *kv;
    cr_assert_eq(dt_kv_cache_create(&kv, m), DT_OK, "%s", dt_model_error(m));
    cr_assert_eq(dt_kv_cache_prefill(kv, tok, 5), DT_OK, "%s", dt_model_error(m));
    for (int t = 5; t <= c.T; t++) {
        float got[96];
        memcpy(got, dt_kv_cache_logits(kv), sizeof got);
        cr_assert_eq(dt_model_forward(m, tok, NULL, 1, t), DT_OK);
        dt_model_get_logits(m, want, 0, t - 1);
        float tol = 1e-4f * max_abs(want, c.V);
        for (int i = 0; i < c.V; i++)
            cr_assert(fabsf(got[i] - want[i]) <= tol,
                      "position %d, logit %d: cache %.7g, forward %.7g", t - 1, i, (double)got[i],
                      (double)want[i]);
        if (t < c.T)
            cr_assert_eq(dt_kv_cache_append(kv, tok[t]), DT_OK, "%s", dt_model_error(m));
    }
    cr_assert_eq(dt_kv_cache_len(kv), c.T);
    dt_kv_cache_destroy(kv);
    free(want);
    dt_model_destroy(m);
}

Test(kv_cache, greedy_generation_gives_the_plain_paths_tokens, .timeout = 30)
{
    dt_config c;
    dt_model *m = decode_model(&c, 5);
    /* prompts of 1 token, a few, and the whole context; 40 new tokens
     * run past T, where the window slides and the plain path takes over */
    int lens[] = {1, 4, 24};
    for (int k = 0; k < 3; k++) {
        int a[64], b[64];
        prompt_tokens(a, lens[k], c.V, 20 + (uint64_t)k);
        memcpy(b, a, sizeof a);
        dt_rng ra, rb;
        dt_rng_seed(&ra, 1);
        dt_rng_seed(&rb, 1);
        int na = dt_generate(m, a, lens[k], 40, 0.0f, 0, -1, &ra);
        int nb = dt_generate_plain(m, b, lens[k], 40, 0.0f, 0, -1, &rb);
        cr_assert_eq(na, lens[k] + 40, "%s", dt_model_error(m));
        cr_assert_eq(nb, na);
        for (int i = 0; i < na; i++)
            cr_assert_eq(a[i], b[i], "prompt of %d: token %d: cache %d, plain %d", lens[k], i, a[i],
                         b[i]);
    }
    dt_model_destroy(m);
}

Test(kv_cache, sampled_generation_gives_the_plain_paths_tokens, .timeout = 30)
{
    dt_config c;
    dt_model *m = decode_model(&c, 7);
    int a[40], b[40];
    prompt_tokens(a, 6, c.V, 31);
    memcpy(b, a, sizeof a);
    dt_rng ra, rb;
    dt_rng_seed(&ra, 9);
    dt_rng_seed(&rb, 9);
    int na = dt_generate(m, a, 6, 34, 1.0f, 20, -1, &ra);
    int nb = dt_generate_plain(m, b, 6, 34, 1.0f, 20, -1, &rb);
    cr_assert_eq(na, 40, "%s", dt_model_error(m));
    cr_assert_eq(nb, na);
    for (int i = 0; i < na; i++)
        cr_assert_eq(a[i], b[i], "token %d: cache %d, plain %d", i, a[i], b[i]);
    dt_model_destroy(m);
}

Test(kv_cache, generation_stops_after_the_stop_token_on_both_paths, .timeout = 30)
{
    dt_config c;
    dt_model *m = decode_model(&c, 5);
    int a[64], b[64];
    prompt_tokens(a, 3, c.V, 20);
    memcpy(b, a, sizeof a);
    dt_rng r;
    dt_rng_seed(&r, 1);
    int n = dt_generate_plain(m, b, 3, 10, 0.0f, 0, -1, &r);
    cr_assert_eq(n, 13);
    int stop = b[7]; /* the fifth greedy token: both paths end with it */
    memcpy(b, a, sizeof a);
    int na = dt_generate(m, a, 3, 10, 0.0f, 0, stop, &r);
    int nb = dt_generate_plain(m, b, 3, 10, 0.0f, 0, stop, &r);
    cr_assert_eq(na, nb, "cache %d tokens, plain %d", na, nb);
    cr_assert(na <= 8 && a[na - 1] == stop, "ended at %d with %d", na, a[na - 1]);
    dt_model_destroy(m);
}

Test(kv_cache, a_recomputing_model_is_refused_and_generates_by_the_plain_path, .timeout = 30)
{
    dt_config c = dt_config_seed();
    dt_model *m;
    cr_assert_eq(dt_model_create_recompute(&m, &c, dt_backend_cpu(), 1), DT_OK);
    dt_model_init(m, 5);
    dt_kv_cache *kv;
    cr_expect_eq(dt_kv_cache_create(&kv, m), DT_EINVAL);
    cr_expect_null(kv);
    cr_expect(strstr(dt_model_error(m), "recomputation"), "%s", dt_model_error(m));
    int tok[12] = {1, 2, 3};
    dt_rng r;
    dt_rng_seed(&r, 4);
    cr_expect_eq(dt_generate(m, tok, 3, 9, 0.0f, 0, -1, &r), 12, "%s", dt_model_error(m));
    dt_model_destroy(m);
}

Test(kv_cache, appending_past_the_context_is_refused, .timeout = 30)
{
    dt_config c;
    dt_model *m = decode_model(&c, 3);
    int tok[24] = {0};
    dt_kv_cache *kv;
    cr_assert_eq(dt_kv_cache_create(&kv, m), DT_OK);
    cr_assert_eq(dt_kv_cache_prefill(kv, tok, c.T), DT_OK);
    cr_expect_eq(dt_kv_cache_append(kv, 1), DT_EINVAL);
    cr_expect(strstr(dt_model_error(m), "position 24"), "%s", dt_model_error(m));
    dt_kv_cache_destroy(kv);
    dt_model_destroy(m);
}

/* ---- the task's evaluation in shares -------------------------------------- */

Test(task_shares, counts_of_every_share_sum_to_the_whole_evaluations, .timeout = 120)
{
    dt_config c = dt_config_seed();
    dt_model *m;
    dt_dataset *d;
    cr_assert_eq(dt_model_create(&m, &c, dt_backend_cpu(), 16), DT_OK);
    cr_assert_eq(dt_dataset_task(&d, DT_TASK_REVERSE, 3, 500, 60, 7), DT_OK);
    dt_model_init(m, 1);
    /* trained a little, so that some answers are right and some wrong */
    enum { B = 16 };
    int in[B * 16], tg[B * 16];
    dt_adamw_hparams h = dt_adamw_defaults(3e-3f);
    for (int s = 1; s <= 200; s++) {
        dt_dataset_batch(in, tg, d, DT_TRAIN, 3, (uint64_t)s * B, B, c.T);
        cr_assert_eq(dt_model_forward(m, in, tg, B, c.T), DT_OK);
        dt_model_zero_grad(m);
        dt_model_backward(m, 1.0f);
        dt_model_update(m, &h, s);
    }
    size_t graded;
    long whole = dt_task_count_exact(m, d, 40, 0, 1, &graded);
    cr_assert_eq(graded, 40);
    cr_assert(whole > 0, "no prompt answered right: the shares' sum would prove nothing");
    for (int parts = 2; parts <= 3; parts++) {
        long sum = 0;
        for (int p = 0; p < parts; p++) {
            size_t g;
            long got = dt_task_count_exact(m, d, 40, p, parts, &g);
            cr_assert(got >= 0 && g == 40, "share %d of %d: %ld, graded %zu", p, parts, got, g);
            sum += got;
        }
        cr_expect_eq(sum, whole, "%d shares: %ld right, the whole: %ld", parts, sum, whole);
    }
    cr_expect_eq(dt_task_accuracy(m, d, 40), (double)whole / 40);
    dt_dataset_close(d);
    dt_model_destroy(m);
}
