/*
 * test_model_decode.c — decoding: the KV cache (kv_cache.c) against the
 * plain path that runs a forward pass per token (sample.c), and the task's
 * evaluation (task.c): teacher-forced in batches of prompts, dealt out in
 * shares, in lockstep where the forwards are collectives.
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
#include "model_internal.h" /* the task's validation examples */

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

/* The seed's model (max_B 16, T 16) trained 200 steps on a 3-digit
 * reversal task, so that some answers are right and some wrong. */
static dt_model *trained_task_model(dt_dataset **d)
{
    dt_config c = dt_config_seed();
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &c, dt_backend_cpu(), 16), DT_OK);
    cr_assert_eq(dt_dataset_task(d, DT_TASK_REVERSE, 3, 500, 60, 7), DT_OK);
    dt_model_init(m, 1);
    enum { B = 16 };
    int in[B * 16], tg[B * 16];
    dt_adamw_hparams h = dt_adamw_defaults(3e-3f);
    for (int s = 1; s <= 200; s++) {
        dt_dataset_batch(in, tg, *d, DT_TRAIN, 3, (uint64_t)s * B, B, c.T);
        cr_assert_eq(dt_model_forward(m, in, tg, B, c.T), DT_OK);
        dt_model_zero_grad(m);
        dt_model_backward(m, 1.0f);
        dt_model_update(m, &h, s);
    }
    return m;
}

/* Counts forwards: the parameter hook's last call of each has hi = Ψ. */
static void count_forward(void *user, size_t hi)
{
    int *counter = user;
    counter[0] += hi == (size_t)counter[1];
}

Test(task_shares, counts_of_every_share_sum_to_the_whole_evaluations, .timeout = 120)
{
    dt_dataset *d;
    dt_model *m = trained_task_model(&d);
    size_t graded;
    long whole = dt_task_count_exact(m, d, 40, 0, 1, false, &graded);
    cr_assert_eq(graded, 40);
    cr_assert(whole > 0, "no prompt answered right: the shares' sum would prove nothing");
    for (int parts = 2; parts <= 3; parts++) {
        long sum = 0;
        for (int p = 0; p < parts; p++) {
            size_t g;
            long got = dt_task_count_exact(m, d, 40, p, parts, false, &g);
            cr_assert(got >= 0 && g == 40, "share %d of %d: %ld, graded %zu", p, parts, got, g);
            sum += got;
        }
        cr_expect_eq(sum, whole, "%d shares: %ld right, the whole: %ld", parts, sum, whole);
    }
    cr_expect_eq(dt_task_accuracy(m, d, 40), (double)whole / 40);
    dt_dataset_close(d);
    dt_model_destroy(m);
}

/* Teacher forcing is greedy decoding's test in one forward: the count is
 * the one that decoding each answer token by token (the plain path) and
 * comparing finds. */
Test(task_shares, grading_counts_what_greedy_decoding_gets_right, .timeout = 120)
{
    dt_dataset *d;
    dt_model *m = trained_task_model(&d);
    enum { N = 60 };
    const uint16_t *val = d->tokens + d->n_train;
    long decoded = 0;
    for (size_t i = 0; i < N; i++) {
        const uint16_t *ex = val + d->starts[DT_VAL][i];
        int buf[32], n = 0;
        while (ex[n] != '=')
            buf[n] = ex[n], n++;
        buf[n] = '=';
        dt_rng unused;
        dt_rng_seed(&unused, 0);
        int got = dt_generate_plain(m, buf, n + 1, n + 1, 0.0f, 0, '\n', &unused);
        bool exact = got == 2 * n + 2;
        for (int k = n + 1; exact && k < got; k++)
            exact = buf[k] == ex[k];
        decoded += exact;
    }
    size_t graded;
    long right = dt_task_count_exact(m, d, N, 0, 1, false, &graded);
    cr_assert(decoded > 0 && decoded < N, "%ld of %d right: a test of nothing", decoded, N);
    cr_expect_eq(right, decoded, "graded %ld right, greedy decoding %ld", right, decoded);
    dt_dataset_close(d);
    dt_model_destroy(m);
}

/* 40 prompts of at most 8 tokens (7 fed) and the allocation's 16 x 16
 * tokens: 36 prompts a forward, so two forwards, not one per prompt. */
Test(task_shares, one_forward_grades_a_batch_of_prompts, .timeout = 120)
{
    dt_dataset *d;
    dt_model *m = trained_task_model(&d);
    int counter[2] = {0, (int)m->num_params};
    dt_model_set_params_hook(m, count_forward, counter);
    size_t graded;
    cr_assert_geq(dt_task_count_exact(m, d, 40, 0, 1, false, &graded), 0);
    cr_expect_eq(counter[0], 2, "%d forwards for 40 prompts", counter[0]);
    dt_model_set_params_hook(m, NULL, NULL);
    dt_dataset_close(d);
    dt_model_destroy(m);
}

/* ZeRO-3's forwards are collectives: in lockstep every share runs the
 * longest share's forwards (two batches over three shares: one each, the
 * third idle), and the counts still sum to the whole's. */
Test(task_shares, lockstep_shares_run_as_many_forwards_each, .timeout = 120)
{
    dt_dataset *d;
    dt_model *m = trained_task_model(&d);
    size_t graded;
    long whole = dt_task_count_exact(m, d, 40, 0, 1, false, &graded), sum = 0;
    for (int p = 0; p < 3; p++) {
        int counter[2] = {0, (int)m->num_params};
        dt_model_set_params_hook(m, count_forward, counter);
        long got = dt_task_count_exact(m, d, 40, p, 3, true, &graded);
        dt_model_set_params_hook(m, NULL, NULL);
        cr_expect_eq(counter[0], 1, "share %d of 3 ran %d forwards", p, counter[0]);
        cr_assert_geq(got, 0);
        sum += got;
    }
    cr_expect_eq(sum, whole, "lockstep shares: %ld right, the whole: %ld", sum, whole);
    dt_dataset_close(d);
    dt_model_destroy(m);
}
