/*
 * test_optim_units.c — the pieces data parallelism is built from: the
 * model's backward progress hook, DDP's bucket layout, ZeRO-1's shards and
 * memory, ZeRO-2's gradient memory, and the replica check catching a drifted rank.
 *
 * The hook's contract is what makes overlap safe: when backward reports lo,
 * no gradient at or above lo may change any more. The test snapshots the
 * gradients above lo at every call and checks them against the final ones.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "dt_optim.h"
#include "rank_threads.h"

typedef struct hook_log {
    dt_model *m;
    size_t calls, los[256];
    float *snap[256]; /* gradients [lo, P) at the call */
} hook_log;

static void record(void *user, size_t lo)
{
    hook_log *h = user;
    if (h->calls >= 256)
        return;
    size_t P = h->m->num_params;
    float *all = malloc(P * sizeof(float));
    dt_model_get_grads(h->m, all);
    h->snap[h->calls] = all;
    h->los[h->calls++] = lo;
}

Test(grad_hook, reports_a_shrinking_final_tail_ending_at_zero, .timeout = 30)
{
    dt_config c = {.V = 8, .T = 5, .L = 2, .H = 1, .C = 5};
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &c, dt_backend_cpu(), 2), DT_OK);
    dt_model_init(m, 3);
    int x[10], y[10];
    for (int i = 0; i < 10; i++)
        x[i] = i % 8, y[i] = (i * 3) % 8;
    hook_log h = {.m = m};
    dt_model_set_grad_hook(m, record, &h);
    cr_assert_eq(dt_model_forward(m, x, y, 2, 5), DT_OK);
    dt_model_zero_grad(m);
    cr_assert_eq(dt_model_backward(m, 1.0f), DT_OK);
    size_t P = m->num_params;
    float *final = malloc(P * sizeof(float));
    dt_model_get_grads(m, final);
    cr_assert_gt(h.calls, (size_t)c.L);
    cr_expect_eq(h.los[h.calls - 1], 0);
    for (size_t i = 0; i < h.calls; i++) {
        if (i > 0)
            cr_expect_lt(h.los[i], h.los[i - 1], "call %zu", i);
        cr_expect(memcmp(h.snap[i] + h.los[i], final + h.los[i], (P - h.los[i]) * sizeof(float)) ==
                      0,
                  "gradients above %zu changed after the hook said final", h.los[i]);
        free(h.snap[i]);
    }
    /* head, final LayerNorm, 6 layers per block, embeddings */
    cr_expect_eq(h.calls, (size_t)(3 + 6 * c.L), "one call per layer with parameters");
    free(final);
    dt_model_destroy(m);
}

static void expect_buckets_tile(dt_ddp *d, const dt_model *m, size_t cap)
{
    size_t top = m->num_params;
    for (int i = 0; i < dt_ddp_num_buckets(d); i++) {
        size_t lo, n;
        dt_ddp_bucket(d, i, &lo, &n);
        cr_expect_eq(lo + n, top, "bucket %d does not follow its neighbour", i);
        bool starts_a_tensor = false, one_tensor = false;
        for (int t = 0; t < m->num_tensors; t++) {
            starts_a_tensor |= m->tensors[t].offset == lo;
            one_tensor |= m->tensors[t].offset == lo && m->tensors[t].numel == n;
        }
        cr_expect(starts_a_tensor, "bucket %d splits a tensor", i);
        cr_expect(n * sizeof(float) <= cap || one_tensor, "bucket %d: %zu B over the cap %zu", i,
                  n * sizeof(float), cap);
        top = lo;
    }
    cr_expect_eq(top, 0, "buckets do not reach the start of the buffer");
}

Test(ddp_buckets, tile_the_buffer_in_reverse_with_whole_tensors, .timeout = 30)
{
    dt_config c = dt_config_seed();
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &c, dt_backend_cpu(), 1), DT_OK);
    size_t caps[] = {4, 1024, 16384, 1 << 20};
    for (size_t i = 0; i < 4; i++) {
        dt_ddp *d;
        cr_assert_eq(dt_ddp_create(&d, m, NULL, caps[i]), DT_OK);
        expect_buckets_tile(d, m, caps[i]);
        if (i == 0)
            cr_expect_eq(dt_ddp_num_buckets(d), m->num_tensors);
        if (i == 3)
            cr_expect_eq(dt_ddp_num_buckets(d), 1);
        dt_ddp_destroy(d);
    }
    dt_model_destroy(m);
}

Test(zero1_shards, seed_model_on_four_ranks_keeps_89472_optimizer_bytes, .timeout = 30)
{
    /* a one-process ZeRO-1 has one shard; the 4-rank figure is checked in
     * the sharding arithmetic below and end to end by minigpt --preset seed */
    dt_config c = dt_config_seed();
    cr_assert_eq(dt_config_num_params(&c), 29824);
    cr_assert_eq(12 * 29824 / 4, 89472);
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &c, dt_backend_cpu(), 1), DT_OK);
    dt_zero1 *z;
    cr_assert_eq(dt_zero1_create(&z, m, NULL), DT_OK);
    size_t lo, n;
    dt_zero1_shard(z, &lo, &n);
    cr_expect_eq(lo, 0);
    cr_expect_eq(n, 29824);
    cr_expect_eq(dt_zero1_optimizer_bytes(z), 12 * 29824);
    dt_zero1_destroy(z);
    dt_model_destroy(m);
}

typedef struct shard_case {
    size_t lo[RANK_THREADS_MAX], n[RANK_THREADS_MAX], bytes[RANK_THREADS_MAX];
} shard_case;

static void shard_rank(rank_ctx *rc)
{
    shard_case *sc = rc->arg;
    dt_config c = dt_config_seed();
    dt_model *m;
    if (dt_model_create(&m, &c, dt_backend_cpu(), 1) != DT_OK) {
        rank_fail(rc, "model");
        dt_model_destroy(m);
        return;
    }
    dt_zero1 *z;
    if (dt_zero1_create(&z, m, rc->comm) != DT_OK)
        rank_fail(rc, "%s", dt_zero1_error(z));
    else {
        dt_zero1_shard(z, &sc->lo[rc->rank], &sc->n[rc->rank]);
        sc->bytes[rc->rank] = dt_zero1_optimizer_bytes(z);
    }
    dt_zero1_destroy(z);
    dt_model_destroy(m);
}

Test(zero1_shards, four_ranks_split_the_seed_model_in_equal_quarters, .timeout = 30)
{
    shard_case sc = {0};
    rank_job job;
    cr_assert_eq(rank_threads_run(&job, 4, shard_rank, &sc), 0, "%s", job.ranks[0].msg);
    for (int r = 0; r < 4; r++) {
        cr_expect_eq(sc.lo[r], (size_t)r * 7456);
        cr_expect_eq(sc.n[r], 7456);
        cr_expect_eq(sc.bytes[r], 89472, "rank %d: %zu B", r, sc.bytes[r]);
    }
}

/* ZeRO-2 on four ranks: the model's full gradient buffer is gone, and a
 * rank holds its gradient shard (7,456 floats) plus two bucket buffers. With
 * buckets of 16,896 B (the seed's largest hook unit, an MLP matrix and its
 * bias: 4C x C + 4C floats, alone) that is 29,824 + 2 x 16,896 B: about
 * half the full 119,296 B. */
static void zero2_memory_rank(rank_ctx *rc)
{
    dt_config c = dt_config_seed();
    dt_model *m;
    dt_zero1 *z = NULL;
    if (dt_model_create(&m, &c, dt_backend_cpu(), 1) != DT_OK ||
        dt_zero2_create(&z, m, rc->comm, 16896) != DT_OK)
        rank_fail(rc, "create: %s", z ? dt_zero1_error(z) : "model");
    else if (m->grads_memory != NULL || !m->grads_windowed)
        rank_fail(rc, "the model still holds a full gradient buffer");
    else if (dt_zero1_gradient_bytes(z) != 4 * 7456 + 2 * 16896)
        rank_fail(rc, "%zu gradient bytes", dt_zero1_gradient_bytes(z));
    else if (dt_zero1_stage(z) != 2)
        rank_fail(rc, "stage %d", dt_zero1_stage(z));
    dt_zero1_destroy(z);
    dt_model_destroy(m);
}

Test(zero2_shards, four_ranks_hold_a_gradient_shard_and_two_buckets, .timeout = 30)
{
    rank_job job;
    cr_assert_eq(rank_threads_run(&job, 4, zero2_memory_rank, NULL), 0, "%s", job.ranks[0].msg);
}

/* A plain backward on a ZeRO-2 model has nowhere to write: refused, named. */
Test(zero2_shards, a_plain_backward_without_a_window_is_refused, .timeout = 30)
{
    dt_config c = dt_config_seed();
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &c, dt_backend_cpu(), 1), DT_OK);
    dt_model_init(m, 1);
    dt_zero1 *z;
    cr_assert_eq(dt_zero2_create(&z, m, NULL, 0), DT_OK);
    int x[16] = {0}, y[16] = {1};
    cr_assert_eq(dt_model_forward(m, x, y, 1, 16), DT_OK);
    cr_expect_eq(dt_model_backward(m, 1.0f), DT_EINVAL);
    cr_expect(strstr(dt_model_error(m), "windowed") != NULL, "%s", dt_model_error(m));
    dt_zero1_destroy(z);
    dt_model_destroy(m);
}

static void drift_rank(rank_ctx *rc)
{
    dt_config c = {.V = 8, .T = 5, .L = 1, .H = 1, .C = 5};
    dt_model *m;
    if (dt_model_create(&m, &c, dt_backend_cpu(), 1) != DT_OK) {
        rank_fail(rc, "model");
        dt_model_destroy(m);
        return;
    }
    dt_model_init(m, 5);
    bool same = false;
    uint64_t h[RANK_THREADS_MAX];
    if (dt_check_replicas(rc->comm, m, &same, h) != DT_OK || !same)
        rank_fail(rc, "equal replicas reported different");
    if (rc->rank == 2) { /* one bit of one parameter */
        float p[1];
        memcpy(p, m->params_memory + 7, sizeof p);
        uint32_t bits;
        memcpy(&bits, p, 4);
        bits ^= 1;
        memcpy(m->params_memory + 7, &bits, 4);
    }
    if (dt_check_replicas(rc->comm, m, &same, h) != DT_OK || same)
        rank_fail(rc, "a one-bit drift on rank 2 went unnoticed");
    else if (h[0] != h[1] || h[2] == h[0])
        rank_fail(rc, "the hashes do not single out rank 2");
    dt_model_destroy(m);
}

Test(replicas, a_one_bit_drift_on_one_rank_is_caught, .timeout = 30)
{
    rank_job job;
    int failed = rank_threads_run(&job, 3, drift_rank, NULL);
    for (int r = 0; r < 3; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}

/* ---- ZeRO-3 with no whole model: start-up, hash, evaluation ---------------- */

/* A rank of a ZeRO-3 model created sharded, beside a whole model from the
 * same seed (the reference every rank builds for itself). */
typedef struct sharded_rank {
    dt_model *whole, *m;
    dt_zero1 *z;
} sharded_rank;

static const dt_config sharded_cfg = {.V = 11, .T = 5, .L = 2, .H = 1, .C = 7};

static bool sharded_open(rank_ctx *rc, sharded_rank *s)
{
    *s = (sharded_rank){0};
    if (dt_model_create(&s->whole, &sharded_cfg, dt_backend_cpu(), 2) != DT_OK ||
        dt_model_create_sharded(&s->m, &sharded_cfg, dt_backend_cpu(), 2, false) != DT_OK)
        return rank_fail(rc, "models");
    dt_model_init(s->whole, 5);
    if (dt_zero3_create(&s->z, s->m, rc->comm, 0) != DT_OK || dt_zero3_init_shard(s->z, 5) != DT_OK)
        return rank_fail(rc, "zero3: %s", s->z ? dt_zero1_error(s->z) : "out of memory");
    return true;
}

static void sharded_close(sharded_rank *s)
{
    dt_zero1_destroy(s->z);
    dt_model_destroy(s->m);
    dt_model_destroy(s->whole);
}

static void sharded_hash_rank(rank_ctx *rc)
{
    sharded_rank s;
    if (sharded_open(rc, &s)) {
        size_t lo, n;
        float *master, *mv, *vv;
        dt_zero1_shard(s.z, &lo, &n);
        dt_zero1_state(s.z, &master, &mv, &vv);
        bool same = false;
        uint64_t h[RANK_THREADS_MAX];
        uint64_t want = dt_params_hash(s.whole->params_memory, s.whole->num_params);
        if (memcmp(master, s.whole->params_memory + lo, n * sizeof(float)) != 0)
            rank_fail(rc, "the shard [%zu, %zu) is not the whole init's", lo, lo + n);
        else if (dt_zero1_check_replicas(s.z, &same, h) != DT_OK || !same)
            rank_fail(rc, "check: %s", dt_zero1_error(s.z));
        else if (h[rc->rank] != want)
            rank_fail(rc, "hash %016llx, the whole model's %016llx",
                      (unsigned long long)h[rc->rank], (unsigned long long)want);
        else if (s.m->params_memory)
            rank_fail(rc, "the model was held whole");
    }
    sharded_close(&s);
}

Test(zero3_sharded, starts_from_its_shard_of_the_whole_init_and_hashes_as_the_whole_model,
     .timeout = 30)
{
    rank_job job;
    int failed = rank_threads_run(&job, 3, sharded_hash_rank, NULL);
    for (int r = 0; r < 3; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}

static void sharded_eval_rank(rank_ctx *rc)
{
    sharded_rank s;
    if (sharded_open(rc, &s)) {
        dt_zero1_arm_inference(s.z, true);
        float a[11], b[11];
        for (int k = 0; k < 3 && !rc->failed; k++) { /* the head, then the next forward */
            int x[10];
            for (int i = 0; i < 10; i++)
                x[i] = (i * (k + 3)) % 11;
            if (dt_model_forward(s.m, x, NULL, 2, 5) != DT_OK ||
                dt_model_forward(s.whole, x, NULL, 2, 5) != DT_OK) {
                rank_fail(rc, "forward %d: %s", k, dt_model_error(s.m));
                break;
            }
            for (int t = 0; t < 10; t++) {
                dt_model_get_logits(s.m, a, t / 5, t % 5);
                dt_model_get_logits(s.whole, b, t / 5, t % 5);
                if (memcmp(a, b, sizeof a) != 0)
                    rank_fail(rc, "forward %d: logits at %d differ from the whole model's", k, t);
            }
            if (s.m->params_memory)
                rank_fail(rc, "forward %d held the model whole", k);
        }
        dt_zero1_arm_inference(s.z, false);
        if (dt_zero1_hold_params(s.z, false) != DT_OK)
            rank_fail(rc, "units: %s", dt_zero1_error(s.z));
    }
    sharded_close(&s);
}

Test(zero3_sharded, forwards_armed_for_inference_give_the_whole_models_logits_unit_by_unit,
     .timeout = 30)
{
    rank_job job;
    int failed = rank_threads_run(&job, 3, sharded_eval_rank, NULL);
    for (int r = 0; r < 3; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}
