/*
 * test_threads.c — a rank's compute threads (model/threads.c): how many
 * there are by default, whose setting a team size is, and that the bits
 * of a training step do not depend on it.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "dt_model.h"
#include "model_internal.h"

/* Big enough that every parallel kernel cuts its work: N*C = 49152
 * activations per layer, the MLP's products cut in 2 pieces, 64x64
 * attention. */
static const dt_config cfg = {.V = 64, .T = 64, .L = 2, .H = 4, .C = 96};
enum { B = 8, STEPS = 2 };

/* STEPS AdamW steps on fixed data with `threads` compute threads; the
 * parameters and last gradients, copied out. */
static float *train(int threads, float **grads)
{
    dt_threads_use(threads);
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &cfg, dt_backend_cpu(), B), DT_OK);
    dt_model_init(m, 5);
    int in[B * 64], tg[B * 64];
    for (int i = 0; i < B * 64; i++) {
        in[i] = (i * 7 + 3) % 64;
        tg[i] = (i * 13 + 1) % 64;
    }
    dt_adamw_hparams h = dt_adamw_defaults(1e-3f);
    float *mom = calloc(m->num_params, sizeof(float)), *var = calloc(m->num_params, sizeof(float));
    for (long s = 1; s <= STEPS; s++) {
        cr_assert_eq(dt_model_forward(m, in, tg, B, 64), DT_OK);
        dt_model_zero_grad(m);
        cr_assert_eq(dt_model_backward(m, 1.0f), DT_OK);
        dt_backend_cpu()->adamw(m->params_memory, m->grads_memory, mom, var, m->num_params, s, &h);
    }
    size_t bytes = m->num_params * sizeof(float);
    float *p = malloc(bytes);
    *grads = malloc(bytes);
    memcpy(p, m->params_memory, bytes);
    memcpy(*grads, m->grads_memory, bytes);
    free(mom);
    free(var);
    dt_model_destroy(m);
    dt_threads_use(1);
    return p;
}

Test(threads, a_training_step_gives_the_same_bits_on_one_two_and_three_threads, .timeout = 120)
{
    float *g1, *g2, *g3;
    float *p1 = train(1, &g1), *p2 = train(2, &g2), *p3 = train(3, &g3);
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &cfg, dt_backend_cpu(), B), DT_OK);
    size_t bytes = m->num_params * sizeof(float);
    dt_model_destroy(m);
    cr_expect(memcmp(g1, g2, bytes) == 0, "gradients differ between 1 and 2 threads");
    cr_expect(memcmp(g1, g3, bytes) == 0, "gradients differ between 1 and 3 threads");
    cr_expect(memcmp(p1, p2, bytes) == 0, "parameters differ between 1 and 2 threads");
    cr_expect(memcmp(p1, p3, bytes) == 0, "parameters differ between 1 and 3 threads");
    free(p1), free(p2), free(p3), free(g1), free(g2), free(g3);
}

Test(threads, a_cut_product_gives_the_same_bits_on_one_and_three_threads, .timeout = 60)
{
    /* every transpose combination; cut by rows (M > N) and by columns,
     * into 4 pieces (82 MFLOP), the last one shorter */
    enum { M = 1603, N = 197, K = 130 };
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N);
    float *c1 = malloc(sizeof(float) * M * N), *c3 = malloc(sizeof(float) * M * N);
    for (int i = 0; i < M * K; i++)
        a[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (int i = 0; i < K * N; i++)
        b[i] = (float)((i * 53) % 97) / 48.0f - 1.0f;
    for (int t = 0; t < 8; t++) {
        int ta = t & 1, tb = (t >> 1) & 1, acc = (t >> 2) & 1;
        int a_rs = ta ? 1 : K, a_cs = ta ? M : 1, b_rs = tb ? 1 : N, b_cs = tb ? K : 1;
        for (int i = 0; i < M * N; i++)
            c1[i] = c3[i] = (float)(i % 5);
        dt_threads_use(1);
        dt_cpu_gemm_par(c1, N, a, a_rs, a_cs, b, b_rs, b_cs, M, N, K, acc);
        dt_threads_use(3);
        dt_cpu_gemm_par(c3, N, a, a_rs, a_cs, b, b_rs, b_cs, M, N, K, acc);
        cr_expect(memcmp(c1, c3, sizeof(float) * M * N) == 0, "ta=%d tb=%d acc=%d", ta, tb, acc);
        /* and the transposed shape, cut by columns */
        for (int i = 0; i < M * N; i++)
            c1[i] = c3[i] = (float)(i % 5);
        dt_threads_use(1);
        dt_cpu_gemm_par(c1, M, b, b_cs, b_rs, a, a_cs, a_rs, N, M, K, acc);
        dt_threads_use(3);
        dt_cpu_gemm_par(c3, M, b, b_cs, b_rs, a, a_cs, a_rs, N, M, K, acc);
        cr_expect(memcmp(c1, c3, sizeof(float) * M * N) == 0, "by columns: ta=%d tb=%d acc=%d", ta,
                  tb, acc);
    }
    dt_threads_use(1);
    free(a), free(b), free(c1), free(c3);
}

Test(threads, the_default_shares_this_processs_cores_among_the_nodes_ranks, .timeout = 10)
{
    cpu_set_t set;
    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
    int cores = CPU_COUNT(&set);
    cr_expect_eq(dt_threads_default(1), cores);
    cr_expect_eq(dt_threads_default(2), cores / 2 > 0 ? cores / 2 : 1);
    cr_expect_eq(dt_threads_default(cores + 1), 1, "more ranks than cores: one thread each");
    cr_expect_eq(dt_threads_default(0), cores, "no launcher: the process is the node's only rank");
}

static void *team_of_three(void *out)
{
    dt_threads_use(3);
    *(int *)out = dt_threads_current();
    return NULL;
}

Test(threads, a_team_size_belongs_to_the_thread_that_set_it, .timeout = 10)
{
    /* ranks run as threads in tests: one rank's setting is not another's */
    dt_threads_use(2);
    int theirs = 0;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, team_of_three, &theirs), 0);
    pthread_join(t, NULL);
    cr_expect_eq(theirs, 3);
    cr_expect_eq(dt_threads_current(), 2);
    dt_threads_use(1);
}
