/*
 * test_model.c — the MiniGPT model against PyTorch, against its own plain
 * reference kernels, and against finite differences.
 *
 * The anchor is tests/data/minigpt_golden.bin, written by
 * tests/make_golden.py with PyTorch (float64 maths on float32 weights):
 * the C model, in float32, must reproduce its logits, loss, gradients and
 * a 10-step AdamW loss curve. Norms used (stated once, here):
 *   logits     max|c - ref| / max|ref|          <= 1e-5  (inf-norm relative)
 *   loss       |c - ref| / |ref|                <= 1e-5
 *   gradients  ||c - ref||_2 / ||ref||_2        <= 1e-4  (per tensor)
 *   losses     |c - ref| / |ref|                <= 1e-5  (each of 10 steps)
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_model.h"
#include "model_internal.h" /* the reference kernels */
#include "golden_fixture.h"
#include "numeric_compare.h"

/* max|a - b| / max|b| */
static double rel_inf(const float *a, const float *b, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        r = fmax(r, fabs((double)b[i]));
    }
    return r > 0 ? d / r : d;
}

/* ---- layout --------------------------------------------------------------- */

Test(model, seed_config_has_29824_parameters, .timeout = 10)
{
    dt_config c = dt_config_seed();
    cr_assert_eq(dt_config_num_params(&c), 29824);
}

Test(model, tensor_table_tiles_the_flat_buffer_in_order, .timeout = 10)
{
    dt_config c = {.V = 11, .T = 7, .L = 3, .H = 2, .C = 6};
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &c, dt_backend_cpu(), 2), DT_OK);
    size_t off = 0;
    for (int i = 0; i < m->num_tensors; i++) {
        cr_assert_eq(m->tensors[i].offset, off, "%s", m->tensors[i].name);
        off += m->tensors[i].numel;
    }
    cr_assert_eq(off, m->num_params);
    cr_assert_eq(m->params.blocks[2].qkvw - m->params_memory,
                 (long)dt_model_find_tensor(m, "blocks.2.attn.qkv.weight")->offset);
    cr_assert_eq(m->grads.lm_head - m->grads_memory,
                 (long)dt_model_find_tensor(m, "lm_head.weight")->offset);
    dt_model_destroy(m);
}

Test(model, create_rejects_heads_not_dividing_width, .timeout = 10)
{
    dt_config c = {.V = 16, .T = 8, .L = 1, .H = 3, .C = 8};
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &c, dt_backend_cpu(), 1), DT_EINVAL);
    cr_assert(strstr(dt_model_error(m), "H") != NULL, "%s", dt_model_error(m));
    dt_model_destroy(m);
}

Test(model, forward_rejects_token_outside_vocabulary, .timeout = 10)
{
    dt_config c = dt_config_seed();
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &c, dt_backend_cpu(), 1), DT_OK);
    int in[16] = {0}, tg[16] = {0};
    in[5] = 64;
    cr_assert_eq(dt_model_forward(m, in, tg, 1, 16), DT_EINVAL);
    cr_assert(strstr(dt_model_error(m), "inputs[0][5] = 64") != NULL, "%s", dt_model_error(m));
    dt_model_destroy(m);
}

/* ---- golden: PyTorch ------------------------------------------------------- */

Test(golden, logits_and_loss_match_pytorch, .timeout = 30)
{
    fixture fx;
    dt_model *m = golden_model(&fx, dt_backend_cpu());
    golden_forward(m, &fx);
    const record *lg = fixture_get(&fx, "logits");
    size_t n = (size_t)m->last_B * m->last_T * m->cfg.V;
    cr_assert_eq(lg->count, n);
    float *logits = malloc(n * sizeof(float));
    m->be->to_host(logits, m->acts.logits, n * sizeof(float));
    double e_logits = rel_inf(logits, lg->data, n);
    float ref = *(const float *)fixture_get(&fx, "loss")->data;
    double e_loss = fabs((double)m->mean_loss - ref) / fabs(ref);
    cr_assert(e_logits <= 1e-5, "logits: inf-norm relative error %.3g", e_logits);
    cr_assert(e_loss <= 1e-5, "loss %.7f vs PyTorch %.7f: rel %.3g", m->mean_loss, ref, e_loss);
    free(logits);
    dt_model_destroy(m);
    fixture_free(&fx);
}

static void check_golden_gradients(const dt_backend *be)
{
    fixture fx;
    dt_model *m = golden_model(&fx, be);
    golden_forward(m, &fx);
    dt_model_zero_grad(m);
    cr_assert_eq(dt_model_backward(m, 1.0f), DT_OK);
    float *g = malloc(m->num_params * sizeof(float));
    dt_model_get_grads(m, g);
    for (int i = 0; i < m->num_tensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        char key[80];
        snprintf(key, sizeof key, "grad:%s", t->name);
        const record *r = fixture_get(&fx, key);
        double e = rel_l2(g + t->offset, r->data, t->numel);
        cr_expect(e <= 1e-4, "%s (%s): L2 relative error %.3g", t->name, be->name, e);
    }
    free(g);
    dt_model_destroy(m);
    fixture_free(&fx);
}

Test(golden, gradients_match_pytorch, .timeout = 30)
{
    check_golden_gradients(dt_backend_cpu());
}

Test(golden, reference_backend_gradients_match_pytorch, .timeout = 30)
{
    check_golden_gradients(dt_backend_cpu_reference());
}

Test(golden, ten_adamw_losses_match_pytorch, .timeout = 30)
{
    fixture fx;
    dt_model *m = golden_model(&fx, dt_backend_cpu());
    const float *hp = fixture_get(&fx, "adamw")->data;
    dt_adamw_hparams h = {.lr = hp[0],
                          .beta1 = hp[1],
                          .beta2 = hp[2],
                          .eps = hp[3],
                          .weight_decay = hp[4]};
    const record *ls = fixture_get(&fx, "losses");
    const float *ref = ls->data;
    for (uint32_t step = 1; step <= ls->count; step++) {
        golden_forward(m, &fx);
        double e = fabs((double)m->mean_loss - ref[step - 1]) / fabs(ref[step - 1]);
        cr_expect(e <= 1e-5,
                  "loss before update %u: %.7f vs PyTorch %.7f "
                  "(rel %.3g)",
                  step, m->mean_loss, ref[step - 1], e);
        dt_model_zero_grad(m);
        cr_assert_eq(dt_model_backward(m, 1.0f), DT_OK);
        cr_assert_eq(dt_model_update(m, &h, step), DT_OK);
    }
    dt_model_destroy(m);
    fixture_free(&fx);
}

/* ---- fast kernels against the plain reference ------------------------------- */

static void fill(float *x, size_t n, dt_rng *r)
{
    for (size_t i = 0; i < n; i++)
        x[i] = 2.0f * dt_rng_uniform(r) - 1.0f;
}

Test(kernels, sgemm_matmul_matches_plain_loops, .timeout = 10)
{
    enum { N = 13, C = 7, OC = 11 };
    dt_rng r;
    dt_rng_seed(&r, 5);
    float inp[N * C], w[OC * C], bias[OC], dout[N * OC];
    fill(inp, N * C, &r);
    fill(w, OC * C, &r);
    fill(bias, OC, &r);
    fill(dout, N * OC, &r);
    float o1[N * OC], o2[N * OC], di1[N * C], di2[N * C];
    float dw1[OC * C] = {0}, dw2[OC * C] = {0}, db1[OC] = {0}, db2[OC] = {0};
    dt_cpu_matmul_forward(o1, inp, w, bias, N, C, OC);
    dt_ref_matmul_forward(o2, inp, w, bias, N, C, OC);
    dt_cpu_matmul_backward(di1, dw1, db1, dout, inp, w, N, C, OC);
    dt_ref_matmul_backward(di2, dw2, db2, dout, inp, w, N, C, OC);
    cr_expect(rel_inf(o1, o2, N * OC) < 1e-6, "out");
    cr_expect(rel_inf(di1, di2, N * C) < 1e-6, "dinp");
    cr_expect(rel_inf(dw1, dw2, OC * C) < 1e-6, "dweight");
    cr_expect(rel_inf(db1, db2, OC) < 1e-6, "dbias");
}

/* One attention implementation against the plain loops on one shape. */
typedef void (*attention_fwd)(float *, float *, const float *, int, int, int, int);
typedef void (*attention_bwd)(float *, float *, const float *, const float *, const float *, int,
                              int, int, int);

static void expect_attention_matches_plain_loops(attention_fwd fwd, attention_bwd bwd, int B, int T,
                                                 int C, int NH)
{
    dt_rng r;
    dt_rng_seed(&r, 7);
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    float *buf = calloc(3 * nq + 3 * no + 3 * na, sizeof(float));
    cr_assert(buf);
    float *qkv = buf, *d1 = qkv + nq, *d2 = d1 + nq, *dout = d2 + nq, *o1 = dout + no;
    float *o2 = o1 + no, *a1 = o2 + no, *a2 = a1 + na, *s = a2 + na;
    fill(qkv, nq, &r);
    fill(dout, no, &r);
    fwd(o1, a1, qkv, B, T, C, NH);
    dt_ref_attention_forward(o2, a2, qkv, B, T, C, NH);
    bwd(d1, s, dout, qkv, a1, B, T, C, NH);
    dt_ref_attention_backward(d2, s, dout, qkv, a2, B, T, C, NH);
    cr_expect(rel_inf(o1, o2, no) < 1e-6, "out, T %d hs %d", T, C / NH);
    cr_expect(rel_inf(a1, a2, na) < 1e-6, "att, T %d hs %d", T, C / NH);
    cr_expect(rel_inf(d1, d2, nq) < 1e-6, "dqkv, T %d hs %d", T, C / NH);
    free(buf);
}

Test(kernels, sgemm_attention_matches_plain_loops, .timeout = 10)
{
    expect_attention_matches_plain_loops(dt_sgemm_attention_forward, dt_sgemm_attention_backward, 2,
                                         9, 12, 3); /* hs 4 */
    expect_attention_matches_plain_loops(dt_sgemm_attention_forward, dt_sgemm_attention_backward, 2,
                                         37, 48, 3); /* hs 16, two row blocks of 32 */
}

/* The register tiles (attention_tiles.c): T not a multiple of the tile's
 * 4 rows nor of 8 columns. */
static void tile_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    cr_assert_eq(dt_tiles_attention_forward(out, att, qkv, B, T, C, NH), 0);
}

static void tile_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                     const float *att, int B, int T, int C, int NH)
{
    cr_assert_eq(dt_tiles_attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH), 0);
}

Test(kernels, register_tile_attention_matches_plain_loops, .timeout = 10)
{
    if (!dt_attention_tiles_usable(19, 48, 3))
        cr_skip_test("this CPU lacks AVX2 or FMA: attention takes the sgemm path");
    expect_attention_matches_plain_loops(tile_fwd, tile_bwd, 2, 19, 48, 3); /* hs 16 */
    expect_attention_matches_plain_loops(tile_fwd, tile_bwd, 3, 37, 48, 2); /* hs 24 */
    expect_attention_matches_plain_loops(tile_fwd, tile_bwd, 2, 1, 16, 2);  /* one position */
}

/* Where the tiles cannot run (head size 4), the layer takes sgemm. */
Test(kernels, attention_with_a_head_size_off_the_tiles_takes_sgemm, .timeout = 10)
{
    cr_assert(!dt_attention_tiles_usable(9, 12, 3));
    expect_attention_matches_plain_loops(dt_cpu_attention_forward, dt_cpu_attention_backward, 2, 9,
                                         12, 3);
}

Test(kernels, fast_gelu_and_softmax_match_libm, .timeout = 10)
{
    enum { N = 4001 };
    static float x[N], y1[N], y2[N], d[N], g1[N], g2[N];
    for (int i = 0; i < N; i++) { /* -10 .. 10: both tails and the middle */
        x[i] = -10.0f + 20.0f * (float)i / (N - 1);
        d[i] = 1.0f;
    }
    dt_cpu_gelu_forward(y1, x, N);
    dt_ref_gelu_forward(y2, x, N);
    dt_cpu_gelu_backward(g1, d, x, N);
    dt_ref_gelu_backward(g2, d, x, N);
    for (int i = 0; i < N; i++) {
        cr_expect(fabsf(y1[i] - y2[i]) <= 1e-6f * (1.0f + fabsf(y2[i])), "gelu(%g) = %g, libm %g",
                  x[i], y1[i], y2[i]);
        cr_expect(fabsf(g1[i] - g2[i]) <= 1e-6f * (1.0f + fabsf(g2[i])), "gelu'(%g) = %g, libm %g",
                  x[i], g1[i], g2[i]);
    }
    enum { R = 3, V = 50 };
    float z[R * V], p1[R * V], p2[R * V], l1[R], l2[R];
    int tg[R] = {0, 7, 49};
    dt_rng r;
    dt_rng_seed(&r, 8);
    fill(z, R * V, &r);
    z[60] = 30.0f; /* a dominant logit: other probabilities near 1e-13 */
    dt_cpu_crossentropy_forward(p1, l1, z, tg, R, V);
    dt_ref_crossentropy_forward(p2, l2, z, tg, R, V);
    for (int i = 0; i < R * V; i++)
        cr_expect(fabsf(p1[i] - p2[i]) <= 1e-6f * p2[i] + 1e-30f, "probs[%d] %g vs %g", i, p1[i],
                  p2[i]);
    for (int i = 0; i < R; i++)
        cr_expect(fabsf(l1[i] - l2[i]) <= 1e-5f * fabsf(l2[i]), "loss");
}

Test(model, cpu_backend_matches_reference_backend, .timeout = 30)
{
    dt_config c = {.V = 19, .T = 11, .L = 2, .H = 3, .C = 12};
    enum { B = 3 };
    dt_model *m1, *m2;
    cr_assert_eq(dt_model_create(&m1, &c, dt_backend_cpu(), B), DT_OK);
    cr_assert_eq(dt_model_create(&m2, &c, dt_backend_cpu_reference(), B), DT_OK);
    dt_model_init(m1, 77);
    dt_model_init(m2, 77);
    int in[B * 11], tg[B * 11];
    dt_rng r;
    dt_rng_seed(&r, 3);
    for (int i = 0; i < B * 11; i++) {
        in[i] = (int)(dt_rng_next(&r) % 19);
        tg[i] = (int)(dt_rng_next(&r) % 19);
    }
    dt_model *ms[2] = {m1, m2};
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(dt_model_forward(ms[k], in, tg, B, 11), DT_OK);
        dt_model_zero_grad(ms[k]);
        cr_assert_eq(dt_model_backward(ms[k], 1.0f), DT_OK);
    }
    cr_expect(fabsf(m1->mean_loss - m2->mean_loss) <= 1e-5f * m2->mean_loss);
    size_t n = m1->num_params;
    double e = rel_l2(m1->grads_memory, m2->grads_memory, n);
    cr_expect(e <= 1e-5, "gradients differ: L2 relative %.3g", e);
    dt_model_destroy(m1);
    dt_model_destroy(m2);
}

/* ---- the strided GEMM (OpenBLAS underneath) against a plain triple loop -- */

/* c (M,N) = [c +] a (M,K) . b (K,N) with a and b read through strides. */
static void plain_gemm(float *c, const float *a, int a_rs, int a_cs, const float *b, int b_rs,
                       int b_cs, int M, int N, int K, int accumulate)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0;
            for (int k = 0; k < K; k++)
                s += a[i * a_rs + k * a_cs] * b[k * b_rs + j * b_cs];
            c[i * N + j] = accumulate ? c[i * N + j] + s : s;
        }
}

static void gemm_case(int M, int N, int K, int transpose_a, int transpose_b, int accumulate)
{
    float *a = malloc(sizeof(float) * (size_t)M * K), *b = malloc(sizeof(float) * (size_t)K * N);
    float *c = malloc(sizeof(float) * (size_t)M * N), *r = malloc(sizeof(float) * (size_t)M * N);
    uint32_t x = 12345;
    for (int i = 0; i < M * K; i++) {
        x = x * 1664525u + 1013904223u;
        a[i] = (float)(x >> 9) / 8388608.0f - 1;
    }
    for (int i = 0; i < K * N; i++) {
        x = x * 1664525u + 1013904223u;
        b[i] = (float)(x >> 9) / 8388608.0f - 1;
    }
    for (int i = 0; i < M * N; i++)
        c[i] = r[i] = (float)(i % 7);
    int a_rs = transpose_a ? 1 : K, a_cs = transpose_a ? M : 1;
    int b_rs = transpose_b ? 1 : N, b_cs = transpose_b ? K : 1;
    dt_cpu_gemm(c, N, a, a_rs, a_cs, b, b_rs, b_cs, M, N, K, accumulate);
    plain_gemm(r, a, a_rs, a_cs, b, b_rs, b_cs, M, N, K, accumulate);
    cr_expect_leq(rel_l2(c, r, (size_t)M * N), 1e-6, "M=%d N=%d K=%d ta=%d tb=%d acc=%d", M, N, K,
                  transpose_a, transpose_b, accumulate);
    free(a);
    free(b);
    free(c);
    free(r);
}

Test(model, strided_gemm_matches_plain_loops_on_odd_and_large_shapes, .timeout = 60)
{
    /* one row or column, odd edges of every register tile, and every
     * transpose and accumulate combination the kernels use */
    const int shapes[][3] = {{1, 1, 1},     {7, 5, 3},      {9, 17, 33},   {31, 16, 64},
                             {64, 15, 300}, {130, 16, 257}, {65, 97, 129}, {256, 33, 200}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 8; t++)
            gemm_case(shapes[s][0], shapes[s][1], shapes[s][2], t & 1, (t >> 1) & 1, (t >> 2) & 1);
}

/* ---- initialisation of a range (a ZeRO-3 shard) --------------------------- */

/* Odd sizes everywhere: wte (19 x 13) and wpe (11 x 13) have an odd count,
 * so ranges start and end inside Box-Muller pairs. */
static const dt_config odd_cfg = {.V = 19, .T = 11, .L = 2, .H = 1, .C = 13};

Test(model, init_range_gives_the_whole_inits_values_bitwise_for_any_range, .timeout = 30)
{
    size_t P = dt_config_num_params(&odd_cfg);
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &odd_cfg, dt_backend_cpu(), 1), DT_OK);
    dt_model_init(m, 2024);
    float *part = malloc(P * sizeof(float));
    cr_assert(part);
    for (size_t lo = 0; lo < P; lo += 37)
        for (size_t n = 1; lo + n <= P; n = n * 3 + 1) {
            cr_assert_eq(dt_model_init_range(part, &odd_cfg, lo, n, 2024), DT_OK);
            cr_assert_eq(memcmp(part, m->params_memory + lo, n * sizeof(float)), 0,
                         "range [%zu, %zu) of %zu differs from the whole init", lo, lo + n, P);
        }
    for (int p = 1; p <= 7; p++) { /* every ZeRO shard of 1..7 ranks */
        size_t s = (P + (size_t)p - 1) / (size_t)p;
        for (size_t lo = 0; lo < P; lo += s) {
            size_t n = P - lo < s ? P - lo : s;
            cr_assert_eq(dt_model_init_range(part, &odd_cfg, lo, n, 2024), DT_OK);
            cr_assert_eq(memcmp(part, m->params_memory + lo, n * sizeof(float)), 0,
                         "shard at %zu of %d ranks differs", lo, p);
        }
    }
    cr_expect_eq(dt_model_init_range(part, &odd_cfg, P - 1, 2, 2024), DT_EINVAL);
    free(part);
    dt_model_destroy(m);
}

Test(model, sharded_model_has_no_parameter_or_gradient_buffer_and_refuses_init, .timeout = 10)
{
    dt_model *m;
    cr_assert_eq(dt_model_create_sharded(&m, &odd_cfg, dt_backend_cpu(), 1, false), DT_OK);
    cr_expect_null(m->params_memory);
    cr_expect_null(m->grads_memory);
    cr_expect(m->params_windowed && m->grads_windowed);
    dt_model_init(m, 1);
    cr_expect(strstr(dt_model_error(m), "sharded"), "init's message: %s", dt_model_error(m));
    dt_model_destroy(m);
}
