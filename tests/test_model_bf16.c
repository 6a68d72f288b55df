/*
 * test_model_bf16.c — MiniGPT with bf16 compute (dt_model_set_precision,
 * model/precision.c) against a plain fp32 forward on bf16-rounded weights
 * and activations, written out here layer by layer from the reference
 * kernels; its gradients against fp32's; its activation memory against
 * fp32's; and what it refuses.
 *
 * Rounding here is done a second way, from the bits by hand (the two
 * bf16 neighbours of x and the nearer one, ties to the even one), so the
 * kernels' bias trick is checked, not restated.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dt_model.h"
#include "model_internal.h"
#include "numeric_compare.h"

/* x rounded to the nearest bf16, ties to even (finite x only). */
static float plain_bf16(float x)
{
    uint32_t u, lo_bits, hi_bits;
    memcpy(&u, &x, sizeof u);
    lo_bits = u & 0xffff0000u;
    hi_bits = lo_bits + 0x10000u;
    float lo, hi;
    memcpy(&lo, &lo_bits, sizeof lo);
    memcpy(&hi, &hi_bits, sizeof hi);
    double dlo = fabs((double)x - lo), dhi = fabs((double)hi - x);
    if (dlo < dhi)
        return lo;
    if (dhi < dlo)
        return hi;
    return (lo_bits >> 16) & 1u ? hi : lo;
}

static void plain_round(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = plain_bf16(x[i]);
}

static float *rounded_copy(const float *w, size_t n)
{
    float *r = malloc(n * sizeof(float));
    cr_assert(r);
    memcpy(r, w, n * sizeof(float));
    plain_round(r, n);
    return r;
}

static void fill_tokens(int *x, int *y, int n, int V, unsigned seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (int)((seed >> 8) % (unsigned)V);
        y[i] = (int)((seed >> 20) % (unsigned)V);
    }
}

/* out (N, OC) = inp . w_bf16^T + bias, rounded */
static void plain_matmul(float *out, const float *inp, const float *w, const float *bias, int N,
                         int C, int OC)
{
    float *wr = rounded_copy(w, (size_t)OC * C);
    dt_ref_matmul_forward(out, inp, wr, bias, N, C, OC);
    plain_round(out, (size_t)N * OC);
    free(wr);
}

/* The bf16 forward, plainly: the reference kernels in forward's order,
 * each output rounded (but LayerNorm's statistics, logits, probs, losses);
 * returns the mean loss, logits into logits (N, V). p must already hold
 * every parameter rounded (rounded_params): the bf16 model reads them so. */
static float plain_bf16_forward(float *logits, const dt_params *p, const dt_config *c, const int *x,
                                const int *y, int B, int T)
{
    int C = c->C, V = c->V, NH = c->H, N = B * T;
    size_t NC = (size_t)N * C, att = (size_t)B * NH * T * T;
    float *res = malloc(NC * sizeof(float)), *ln = malloc(NC * sizeof(float));
    float *qkv = malloc(3 * NC * sizeof(float)), *atty = malloc(NC * sizeof(float));
    float *a = malloc(att * sizeof(float)), *proj = malloc(NC * sizeof(float));
    float *res2 = malloc(NC * sizeof(float)), *h = malloc(4 * NC * sizeof(float));
    float *g = malloc(4 * NC * sizeof(float)), *mean = malloc((size_t)N * sizeof(float));
    float *rstd = malloc((size_t)N * sizeof(float));
    float *probs = malloc((size_t)N * V * sizeof(float)), *losses = malloc(N * sizeof(float));
    cr_assert(res && ln && qkv && atty && a && proj && res2 && h && g && mean && rstd && probs &&
              losses);
    dt_ref_encoder_forward(res, x, p->wte, p->wpe, B, T, C); /* the residual stream: fp32 */
    for (int l = 0; l < c->L; l++) {
        const dt_block_params *w = &p->blocks[l];
        dt_ref_layernorm_forward(ln, mean, rstd, res, w->ln1w, w->ln1b, N, C);
        plain_round(ln, NC);
        plain_matmul(qkv, ln, w->qkvw, NULL, N, C, 3 * C);
        dt_ref_attention_forward(atty, a, qkv, B, T, C, NH);
        plain_round(atty, NC);
        plain_matmul(proj, atty, w->attprojw, NULL, N, C, C);
        dt_ref_residual_forward(res2, res, proj, NC);
        dt_ref_layernorm_forward(ln, mean, rstd, res2, w->ln2w, w->ln2b, N, C);
        plain_round(ln, NC);
        plain_matmul(h, ln, w->fcw, w->fcb, N, C, 4 * C);
        dt_ref_gelu_forward(g, h, 4 * NC);
        plain_round(g, 4 * NC);
        plain_matmul(proj, g, w->fcprojw, w->fcprojb, N, 4 * C, C);
        dt_ref_residual_forward(res, res2, proj, NC);
    }
    dt_ref_layernorm_forward(ln, mean, rstd, res, p->lnfw, p->lnfb, N, C);
    plain_round(ln, NC);
    float *wr = rounded_copy(p->lm_head, (size_t)V * C);
    dt_ref_matmul_forward(logits, ln, wr, NULL, N, C, V); /* logits stay fp32 */
    dt_ref_crossentropy_forward(probs, losses, logits, y, N, V);
    double sum = 0;
    for (int i = 0; i < N; i++)
        sum += losses[i];
    float *bufs[] = {res, ln, qkv, atty, a, proj, res2, h, g, mean, rstd, probs, losses, wr};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    return (float)(sum / N);
}

/* An fp32 model (of the reference kernels) whose parameters are m's
 * rounded to bf16 by hand: its params are what the bf16 model reads. */
static dt_model *rounded_params(const dt_model *m)
{
    dt_model *r;
    cr_assert_eq(dt_model_create(&r, &m->cfg, dt_backend_cpu_reference(), m->max_B), DT_OK);
    float *host = malloc(m->num_params * sizeof(float));
    cr_assert(host);
    dt_model_get_params(m, host);
    plain_round(host, m->num_params);
    dt_model_set_params(r, host);
    free(host);
    return r;
}

static dt_model *bf16_model(const dt_config *c, const dt_backend *be, int B, uint64_t seed)
{
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, c, be, B), DT_OK);
    dt_model_init(m, seed);
    cr_assert_eq(dt_model_set_precision(m, DT_PRECISION_BF16), DT_OK, "%s", dt_model_error(m));
    return m;
}

Test(model_bf16, rounding_goes_to_the_nearest_bf16_and_ties_to_even, .timeout = 10)
{
    const float tie_down = 1.0f + 0x1p-8f;         /* halfway between 1 and 1 + 2^-7 */
    const float tie_up = 1.0f + 3 * 0x1p-8f;       /* halfway, the even neighbour above */
    const float above = 1.0f + 0x1p-8f + 0x1p-20f; /* just past halfway */
    float x[6] = {tie_down, tie_up, above, -tie_up, INFINITY, NAN}, r[6];
    dt_bf16_round(r, x, 6);
    cr_expect_eq(r[0], 1.0f);
    cr_expect_eq(r[1], 1.0f + 0x1p-6f);
    cr_expect_eq(r[2], 1.0f + 0x1p-7f);
    cr_expect_eq(r[3], -(1.0f + 0x1p-6f));
    cr_expect(isinf(r[4]) && r[4] > 0);
    cr_expect(isnan(r[5]), "a NaN must stay a NaN, not become inf");
    for (int i = 0; i < 4; i++)
        cr_expect_eq(r[i], plain_bf16(x[i]), "element %d", i);
}

/* The reference backend: the model's bf16 forward is bitwise the plain
 * one (the same kernels in the same order, the same roundings). */
Test(model_bf16, forward_is_an_fp32_forward_on_rounded_weights_and_activations, .timeout = 60)
{
    dt_config c = dt_config_seed();
    int B = 3, T = c.T, N = B * T;
    dt_model *m = bf16_model(&c, dt_backend_cpu_reference(), B, 7);
    int *x = malloc(N * sizeof(int)), *y = malloc(N * sizeof(int));
    float *logits = malloc((size_t)N * c.V * sizeof(float));
    float *row = malloc((size_t)c.V * sizeof(float));
    cr_assert(x && y && logits && row);
    fill_tokens(x, y, N, c.V, 5);
    cr_assert_eq(dt_model_forward(m, x, y, B, T), DT_OK, "%s", dt_model_error(m));
    dt_model *r = rounded_params(m);
    float loss = plain_bf16_forward(logits, &r->params, &c, x, y, B, T);
    dt_model_destroy(r);
    cr_expect_eq(m->mean_loss, loss, "loss %.9g, the plain bf16 forward's %.9g", m->mean_loss,
                 loss);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            dt_model_get_logits(m, row, b, t);
            cr_assert_eq(memcmp(row, logits + ((size_t)b * T + t) * c.V, c.V * sizeof(float)), 0,
                         "logits of sequence %d position %d differ", b, t);
        }
    free(x);
    free(y);
    free(logits);
    free(row);
    dt_model_destroy(m);
}

/* fp32 and bf16 from the same weights and batch: bf16's loss within 1%,
 * and each parameter gradient within 5% (relative L2) of fp32's. The
 * fast backend; backward widens each block from its bf16 store. */
Test(model_bf16, gradients_are_fp32s_to_bf16_accuracy, .timeout = 60)
{
    dt_config c = dt_config_seed();
    int B = 4, T = c.T, N = B * T;
    dt_model *f, *h = bf16_model(&c, dt_backend_cpu(), B, 11);
    cr_assert_eq(dt_model_create(&f, &c, dt_backend_cpu(), B), DT_OK);
    dt_model_init(f, 11);
    int *x = malloc(N * sizeof(int)), *y = malloc(N * sizeof(int));
    float *gf = malloc(f->num_params * sizeof(float)), *gh = malloc(f->num_params * sizeof(float));
    cr_assert(x && y && gf && gh);
    fill_tokens(x, y, N, c.V, 9);
    dt_model *both[2] = {f, h};
    for (int k = 0; k < 2; k++) {
        dt_model_zero_grad(both[k]);
        cr_assert_eq(dt_model_forward(both[k], x, y, B, T), DT_OK);
        cr_assert_eq(dt_model_backward(both[k], 1.0f), DT_OK);
    }
    cr_expect(fabsf(h->mean_loss - f->mean_loss) <= 0.01f * f->mean_loss, "loss bf16 %g fp32 %g",
              h->mean_loss, f->mean_loss);
    dt_model_get_grads(f, gf);
    dt_model_get_grads(h, gh);
    for (int i = 0; i < f->num_tensors; i++) {
        const dt_tensor_info *t = &f->tensors[i];
        double e = rel_l2(gh + t->offset, gf + t->offset, t->numel);
        cr_expect(e <= 0.05, "%s: bf16 gradient %.4f from fp32's (relative L2)", t->name, e);
    }
    free(x);
    free(y);
    free(gf);
    free(gh);
    dt_model_destroy(f);
    dt_model_destroy(h);
}

/* Every parameter is read rounded (matmul weights, LayerNorm gains and
 * shifts, biases, wte and wpe, the head), in forward and in backward: a
 * bf16 model whose fp32 masters are off the bf16 grid computes the loss
 * and the gradients of one whose masters are their roundings, bitwise.
 * (ZeRO gathers rounded parameters; DDP rounds its masters on use.) */
Test(model_bf16, every_parameter_is_read_rounded_in_forward_and_backward, .timeout = 60)
{
    dt_config c = dt_config_seed();
    int B = 2, T = c.T, N = B * T;
    dt_model *off = bf16_model(&c, dt_backend_cpu(), B, 13);
    dt_model *on = bf16_model(&c, dt_backend_cpu(), B, 13);
    size_t P = off->num_params;
    float *host = malloc(P * sizeof(float)),
          *g[2] = {malloc(P * sizeof(float)), malloc(P * sizeof(float))};
    int *x = malloc(N * sizeof(int)), *y = malloc(N * sizeof(int));
    cr_assert(host && g[0] && g[1] && x && y);
    dt_model_get_params(off, host);
    for (size_t i = 0; i < P; i++) /* off the grid: gains of 1, biases of 0 would round to */
        host[i] += 0x1p-11f * (float)(1 + i % 5); /* themselves */
    dt_model_set_params(off, host);
    plain_round(host, P);
    dt_model_set_params(on, host);
    fill_tokens(x, y, N, c.V, 3);
    dt_model *both[2] = {off, on};
    for (int k = 0; k < 2; k++) {
        dt_model_zero_grad(both[k]);
        cr_assert_eq(dt_model_forward(both[k], x, y, B, T), DT_OK);
        cr_assert_eq(dt_model_backward(both[k], 1.0f), DT_OK);
        dt_model_get_grads(both[k], g[k]);
    }
    cr_expect_eq(off->mean_loss, on->mean_loss, "loss %.9g, on rounded masters %.9g",
                 off->mean_loss, on->mean_loss);
    for (int i = 0; i < off->num_tensors; i++) {
        const dt_tensor_info *t = &off->tensors[i];
        cr_expect_eq(memcmp(g[0] + t->offset, g[1] + t->offset, t->numel * sizeof(float)), 0,
                     "%s: the gradient differs from the one on rounded masters", t->name);
    }
    free(host);
    free(g[0]);
    free(g[1]);
    free(x);
    free(y);
    dt_model_destroy(off);
    dt_model_destroy(on);
}

/* Recomputation rounds the recomputed block as forward rounded it: the
 * same loss and gradient bits as the bf16 store gives, in fewer bytes. */
Test(model_bf16, recomputation_gives_the_stores_gradients_bitwise_in_fewer_bytes, .timeout = 60)
{
    dt_config c = dt_config_seed();
    int B = 4, T = c.T, N = B * T;
    dt_model *s = bf16_model(&c, dt_backend_cpu(), B, 5), *r;
    cr_assert_eq(dt_model_create_recompute(&r, &c, dt_backend_cpu(), B), DT_OK);
    dt_model_init(r, 5);
    cr_assert_eq(dt_model_set_precision(r, DT_PRECISION_BF16), DT_OK, "%s", dt_model_error(r));
    int *x = malloc(N * sizeof(int)), *y = malloc(N * sizeof(int));
    float *gs = malloc(s->num_params * sizeof(float)), *gr = malloc(s->num_params * sizeof(float));
    cr_assert(x && y && gs && gr);
    fill_tokens(x, y, N, c.V, 4);
    dt_model *both[2] = {s, r};
    for (int k = 0; k < 2; k++) {
        dt_model_zero_grad(both[k]);
        cr_assert_eq(dt_model_forward(both[k], x, y, B, T), DT_OK);
        cr_assert_eq(dt_model_backward(both[k], 1.0f), DT_OK);
    }
    cr_expect_eq(r->mean_loss, s->mean_loss, "loss with recomputation %.9g, store %.9g",
                 r->mean_loss, s->mean_loss);
    dt_model_get_grads(s, gs);
    dt_model_get_grads(r, gr);
    cr_expect_eq(memcmp(gr, gs, s->num_params * sizeof(float)), 0, "the gradients differ");
    cr_expect_lt(dt_model_activation_bytes(r), dt_model_activation_bytes(s), "%zu B, store %zu B",
                 dt_model_activation_bytes(r), dt_model_activation_bytes(s));
    free(x);
    free(y);
    free(gs);
    free(gr);
    dt_model_destroy(s);
    dt_model_destroy(r);
}

/* A fixed batch, 30 AdamW steps: bf16 learns it as fp32 does. */
Test(model_bf16, a_bf16_model_fits_a_batch, .timeout = 60)
{
    dt_config c = dt_config_seed();
    int B = 2, T = c.T, N = B * T;
    dt_model *m = bf16_model(&c, dt_backend_cpu(), B, 3);
    int *x = malloc(N * sizeof(int)), *y = malloc(N * sizeof(int));
    cr_assert(x && y);
    fill_tokens(x, y, N, c.V, 1);
    dt_adamw_hparams hp = dt_adamw_defaults(1e-2f);
    float first = 0;
    for (long s = 1; s <= 30; s++) {
        dt_model_zero_grad(m);
        cr_assert_eq(dt_model_forward(m, x, y, B, T), DT_OK);
        if (s == 1)
            first = m->mean_loss;
        cr_assert_eq(dt_model_backward(m, 1.0f), DT_OK);
        cr_assert_eq(dt_model_update(m, &hp, s), DT_OK);
    }
    cr_expect(m->mean_loss < 0.5f * first, "loss %g after 30 steps, %g at the first", m->mean_loss,
              first);
    free(x);
    free(y);
    dt_model_destroy(m);
}

/* Issue 37's memory acceptance, on the 865k config at batch 8: bf16's
 * activations and their gradients take at most 0.55x fp32's bytes. */
Test(model_bf16, activations_take_at_most_055_of_fp32s_bytes_on_the_865k_config, .timeout = 30)
{
    dt_config c = {.V = 256, .T = 64, .L = 4, .H = 4, .C = 128};
    dt_model *f, *h;
    cr_assert_eq(dt_model_create(&f, &c, dt_backend_cpu(), 8), DT_OK);
    cr_assert_eq(dt_model_create(&h, &c, dt_backend_cpu(), 8), DT_OK);
    cr_assert_eq(dt_model_set_precision(h, DT_PRECISION_BF16), DT_OK);
    double ratio = (double)dt_model_activation_bytes(h) / (double)dt_model_activation_bytes(f);
    cr_expect(ratio <= 0.55, "bf16 %zu B, fp32 %zu B: %.3fx", dt_model_activation_bytes(h),
              dt_model_activation_bytes(f), ratio);
    dt_model_destroy(f);
    dt_model_destroy(h);
}

Test(model_bf16, what_it_does_not_cover_is_refused_naming_it, .timeout = 30)
{
    dt_config c = dt_config_seed();
    dt_model *m;
    int x[16] = {0}, y[16] = {0};
    cr_assert_eq(dt_model_create(&m, &c, dt_backend_cpu(), 1), DT_OK);
    cr_assert_eq(dt_model_forward(m, x, y, 1, 16), DT_OK);
    cr_expect_eq(dt_model_set_precision(m, DT_PRECISION_BF16), DT_EINVAL);
    cr_expect(strstr(dt_model_error(m), "before the first forward"), "%s", dt_model_error(m));
    dt_model_destroy(m);
}
