/*
 * test_cuda_kernels.c — the CUDA backend's kernels, forward and backward,
 * against the CPU reference (dt_backend_cpu_reference), on odd shapes, and
 * the whole model on them against the PyTorch golden fixture.
 *
 * Which backend runs the kernels: "cuda-host" by default — the kernel
 * bodies of model/cuda_*.h run as host loops, with the same row-major ->
 * column-major GEMM mapping as on the device — so CI checks the GPU's
 * arithmetic without a GPU. With DT_KERNEL_BACKEND=cuda (bench/gpu_check.sh
 * sets it) the same tests run on the real device through cudaMalloc'd
 * buffers; without a device each of them then fails, naming what is
 * missing. Inputs always cross through the backend's from_host/to_host,
 * never by dereferencing its pointers.
 *
 * Tolerance: max|kernel - reference| / max|reference| <= 1e-5 per output.
 * On the host the element and row bodies agree bitwise with the reference
 * (same operations, same order); the GEMMs and attention's backward sum in
 * another order, and a GPU's expf/erff differ in the last bits.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dt_model.h"
#include "golden_fixture.h"
#include "model_internal.h"

#define TOL 1e-5

/* ---- the backend under test, and moving data through it --------------------- */

static const dt_backend *under_test(void)
{
    const char *want = getenv("DT_KERNEL_BACKEND");
    if (!want || strcmp(want, "cuda-host") == 0)
        return dt_backend_cuda_host();
    cr_assert_str_eq(want, "cuda", "DT_KERNEL_BACKEND: cuda-host or cuda");
    const dt_backend *be = NULL;
    char err[256] = "";
    cr_assert_eq(dt_backend_cuda_open(&be, 0, err, sizeof err), DT_OK, "%s", err);
    return be;
}

/* After the kernels: on a device, a failed launch or fault surfaces here. */
static void check_device(const dt_backend *be)
{
    char err[256] = "";
    if (strcmp(be->name, "cuda") == 0)
        cr_assert_eq(dt_backend_cuda_check(err, sizeof err), DT_OK, "%s", err);
}

static void *dev_copy(const dt_backend *be, const void *host, size_t bytes)
{
    void *d = be->alloc(bytes);
    cr_assert_not_null(d, "%s: alloc(%zu)", be->name, bytes);
    be->from_host(d, host, bytes);
    return d;
}

static float *dev_floats(const dt_backend *be, const float *host, size_t n)
{
    return dev_copy(be, host, n * sizeof(float));
}

/* Copies n floats of the device buffer d back, into a malloc'd array. */
static float *back(const dt_backend *be, const float *d, size_t n)
{
    float *h = malloc(n * sizeof(float));
    be->to_host(h, d, n * sizeof(float));
    return h;
}

static void fill(float *x, size_t n, uint64_t seed)
{
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        x[i] = 2.0f * dt_rng_uniform(&r) - 1.0f;
}

static float *random_floats(size_t n, uint64_t seed)
{
    float *x = malloc(n * sizeof(float));
    fill(x, n, seed);
    return x;
}

static double rel_inf(const float *a, const float *b, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        r = fmax(r, fabs((double)b[i]));
    }
    return r > 0 ? d / r : d;
}

/* The device result d (n floats) against the host reference ref. */
static void expect_close(const dt_backend *be, const float *d, const float *ref, size_t n,
                         const char *what)
{
    float *h = back(be, d, n);
    double e = rel_inf(h, ref, n);
    cr_expect(e <= TOL, "%s on %s: relative error %.3g (tolerance %.0e)", what, be->name, e, TOL);
    free(h);
}

/* Odd shapes: nothing is a power of two or a multiple of a block size. */
enum { B = 3, T = 7, C = 12, NH = 3, V = 37, N = B * T };

/* ---- encoder ------------------------------------------------------------------- */

Test(cuda_kernels, encoder_forward_and_backward_match_reference, .timeout = 30)
{
    const dt_backend *be = under_test();
    int inp[N];
    for (int i = 0; i < N; i++) /* repeats: 0, 5, 10, ... mod V */
        inp[i] = (i * 5) % 11;
    float *wte = random_floats(V * C, 1), *wpe = random_floats(T * C, 2);
    float *dout = random_floats(N * C, 3);
    float *dwte = random_floats(V * C, 4), *dwpe = random_floats(T * C, 5);
    float out[N * C];
    int *d_inp = dev_copy(be, inp, sizeof inp);
    float *d_wte = dev_floats(be, wte, V * C), *d_wpe = dev_floats(be, wpe, T * C);
    float *d_out = be->alloc(sizeof out), *d_dout = dev_floats(be, dout, N * C);
    float *d_dwte = dev_floats(be, dwte, V * C), *d_dwpe = dev_floats(be, dwpe, T * C);
    be->encoder_forward(d_out, d_inp, d_wte, d_wpe, B, T, C);
    be->encoder_backward(d_dwte, d_dwpe, d_dout, d_inp, B, T, C);
    check_device(be);
    dt_ref_encoder_forward(out, inp, wte, wpe, B, T, C);
    dt_ref_encoder_backward(dwte, dwpe, dout, inp, B, T, C); /* adds, as the kernel */
    expect_close(be, d_out, out, N * C, "encoder out");
    expect_close(be, d_dwte, dwte, V * C, "encoder dwte (repeated tokens)");
    expect_close(be, d_dwpe, dwpe, T * C, "encoder dwpe");
    void *dev[] = {d_inp, d_wte, d_wpe, d_out, d_dout, d_dwte, d_dwpe};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        be->free(dev[i]);
    free(wte), free(wpe), free(dout), free(dwte), free(dwpe);
}

/* ---- layernorm ------------------------------------------------------------------- */

Test(cuda_kernels, layernorm_forward_and_backward_match_reference, .timeout = 30)
{
    const dt_backend *be = under_test();
    float *inp = random_floats(N * C, 11), *w = random_floats(C, 12);
    float *b = random_floats(C, 13), *dout = random_floats(N * C, 14);
    /* backward adds into all three: start them from nonzero values */
    float *dinp = random_floats(N * C, 15), *dw = random_floats(C, 16);
    float *db = random_floats(C, 17);
    float out[N * C], mean[N], rstd[N];
    float *d_inp = dev_floats(be, inp, N * C), *d_w = dev_floats(be, w, C);
    float *d_b = dev_floats(be, b, C), *d_dout = dev_floats(be, dout, N * C);
    float *d_out = be->alloc(sizeof out), *d_mean = be->alloc(sizeof mean);
    float *d_rstd = be->alloc(sizeof rstd);
    float *d_dinp = dev_floats(be, dinp, N * C), *d_dw = dev_floats(be, dw, C);
    float *d_db = dev_floats(be, db, C);
    be->layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C);
    be->layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C);
    check_device(be);
    dt_ref_layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    dt_ref_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    expect_close(be, d_out, out, N * C, "layernorm out");
    expect_close(be, d_mean, mean, N, "layernorm mean");
    expect_close(be, d_rstd, rstd, N, "layernorm rstd");
    expect_close(be, d_dinp, dinp, N * C, "layernorm dinp (added)");
    expect_close(be, d_dw, dw, C, "layernorm dw");
    expect_close(be, d_db, db, C, "layernorm db");
    void *dev[] = {d_inp, d_w, d_b, d_dout, d_out, d_mean, d_rstd, d_dinp, d_dw, d_db};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        be->free(dev[i]);
    free(inp), free(w), free(b), free(dout), free(dinp), free(dw), free(db);
}

/* ---- matmul (the GEMM argument mapping) ------------------------------------------- */

/* out = inp . w^T (+ bias); backward with or without dinp and dbias. */
static void check_matmul(int n, int c, int oc, bool bias, bool want_dinp)
{
    const dt_backend *be = under_test();
    size_t ni = (size_t)n * c, nw = (size_t)oc * c, no = (size_t)n * oc;
    float *inp = random_floats(ni, 21), *w = random_floats(nw, 22);
    float *bs = random_floats(oc, 23), *dout = random_floats(no, 24);
    float *dw = random_floats(nw, 25), *db = random_floats(oc, 26);
    float *out = malloc(no * sizeof(float)), *dinp = malloc(ni * sizeof(float));
    float *d_inp = dev_floats(be, inp, ni), *d_w = dev_floats(be, w, nw);
    float *d_bs = dev_floats(be, bs, oc), *d_dout = dev_floats(be, dout, no);
    float *d_dw = dev_floats(be, dw, nw), *d_db = dev_floats(be, db, oc);
    float *d_out = be->alloc(no * sizeof(float)), *d_dinp = be->alloc(ni * sizeof(float));
    be->matmul_forward(d_out, d_inp, d_w, bias ? d_bs : NULL, n, c, oc);
    be->matmul_backward(want_dinp ? d_dinp : NULL, d_dw, bias ? d_db : NULL, d_dout, d_inp, d_w, n,
                        c, oc);
    check_device(be);
    dt_ref_matmul_forward(out, inp, w, bias ? bs : NULL, n, c, oc);
    dt_ref_matmul_backward(want_dinp ? dinp : NULL, dw, bias ? db : NULL, dout, inp, w, n, c, oc);
    expect_close(be, d_out, out, no, "matmul out");
    if (want_dinp)
        expect_close(be, d_dinp, dinp, ni, "matmul dinp");
    expect_close(be, d_dw, dw, nw, "matmul dw (accumulated)");
    expect_close(be, d_db, db, oc, bias ? "matmul dbias" : "matmul dbias untouched");
    void *dev[] = {d_inp, d_w, d_bs, d_dout, d_dw, d_db, d_out, d_dinp};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        be->free(dev[i]);
    free(inp), free(w), free(bs), free(dout), free(dw), free(db), free(out), free(dinp);
}

Test(cuda_kernels, matmul_with_bias_matches_reference, .timeout = 30)
{
    check_matmul(N, C, 4 * C + 1, true, true);
}

Test(cuda_kernels, matmul_without_bias_matches_reference, .timeout = 30)
{
    check_matmul(N, 4 * C, C, false, true);
}

Test(cuda_kernels, matmul_backward_without_dinp_leaves_only_dw, .timeout = 30)
{
    check_matmul(5, 3, 17, true, false);
}

/* ---- attention ---------------------------------------------------------------------- */

Test(cuda_kernels, attention_forward_and_backward_match_reference, .timeout = 30)
{
    const dt_backend *be = under_test();
    size_t nq = (size_t)N * 3 * C, na = (size_t)B * NH * T * T, no = (size_t)N * C;
    float *qkv = random_floats(nq, 31), *dout = random_floats(no, 32);
    float *out = malloc(no * 4), *att = malloc(na * 4), *scratch = malloc(na * 4);
    float *dqkv = malloc(nq * 4);
    float *d_qkv = dev_floats(be, qkv, nq), *d_dout = dev_floats(be, dout, no);
    float *d_out = be->alloc(no * 4), *d_att = be->alloc(na * 4);
    float *d_scratch = be->alloc(na * 4);
    /* dqkv starts as garbage (qkv's values): backward must write it all */
    float *d_dqkv = dev_floats(be, qkv, nq);
    be->attention_forward(d_out, d_att, d_qkv, B, T, C, NH);
    be->attention_backward(d_dqkv, d_scratch, d_dout, d_qkv, d_att, B, T, C, NH);
    check_device(be);
    dt_ref_attention_forward(out, att, qkv, B, T, C, NH);
    dt_ref_attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH);
    expect_close(be, d_out, out, no, "attention out");
    expect_close(be, d_att, att, na, "attention softmax (zeros above the diagonal)");
    expect_close(be, d_dqkv, dqkv, nq, "attention dqkv");
    void *dev[] = {d_qkv, d_dout, d_out, d_att, d_scratch, d_dqkv};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        be->free(dev[i]);
    free(qkv), free(dout), free(out), free(att), free(scratch), free(dqkv);
}

/* ---- GELU and residual ------------------------------------------------------------- */

Test(cuda_kernels, gelu_and_residual_match_reference, .timeout = 30)
{
    const dt_backend *be = under_test();
    enum { M = 4001 };
    float *x = malloc(M * 4), *dout = random_floats(M, 41), *other = random_floats(M, 42);
    for (int i = 0; i < M; i++) /* -10 .. 10: both tails and the middle */
        x[i] = -10.0f + 20.0f * (float)i / (M - 1);
    float *y = malloc(M * 4), *dx = malloc(M * 4), *sum = malloc(M * 4);
    float *d_x = dev_floats(be, x, M), *d_dout = dev_floats(be, dout, M);
    float *d_other = dev_floats(be, other, M);
    float *d_y = be->alloc(M * 4), *d_dx = be->alloc(M * 4), *d_sum = be->alloc(M * 4);
    be->gelu_forward(d_y, d_x, M);
    be->gelu_backward(d_dx, d_dout, d_x, M);
    be->residual_forward(d_sum, d_x, d_other, M);
    check_device(be);
    dt_ref_gelu_forward(y, x, M);
    dt_ref_gelu_backward(dx, dout, x, M);
    dt_ref_residual_forward(sum, x, other, M);
    expect_close(be, d_y, y, M, "gelu");
    expect_close(be, d_dx, dx, M, "gelu backward");
    expect_close(be, d_sum, sum, M, "residual");
    void *dev[] = {d_x, d_dout, d_other, d_y, d_dx, d_sum};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        be->free(dev[i]);
    free(x), free(dout), free(other), free(y), free(dx), free(sum);
}

/* ---- softmax + cross-entropy --------------------------------------------------------- */

Test(cuda_kernels, crossentropy_forward_and_backward_match_reference, .timeout = 30)
{
    const dt_backend *be = under_test();
    float *logits = random_floats(N * V, 51);
    logits[2 * V + 4] = 60.0f; /* a row whose other probabilities underflow */
    int tg[N];
    for (int i = 0; i < N; i++)
        tg[i] = (i * 7) % V;
    float probs[N * V], losses[N], dlogits[N * V];
    float *d_logits = dev_floats(be, logits, N * V), *d_probs = be->alloc(sizeof probs);
    float *d_losses = be->alloc(sizeof losses), *d_dl = be->alloc(sizeof dlogits);
    int *d_tg = dev_copy(be, tg, sizeof tg);
    be->crossentropy_forward(d_probs, d_losses, d_logits, d_tg, N, V);
    be->crossentropy_backward(d_dl, d_probs, d_tg, 0.25f, N, V);
    check_device(be);
    dt_ref_crossentropy_forward(probs, losses, logits, tg, N, V);
    dt_ref_crossentropy_backward(dlogits, probs, tg, 0.25f, N, V);
    expect_close(be, d_probs, probs, N * V, "softmax probs");
    expect_close(be, d_losses, losses, N, "cross-entropy losses");
    expect_close(be, d_dl, dlogits, N * V, "cross-entropy dlogits");
    /* without targets: probabilities only, losses untouched */
    float *d_l2 = dev_floats(be, losses, N);
    be->crossentropy_forward(d_probs, d_l2, d_logits, NULL, N, V);
    check_device(be);
    expect_close(be, d_probs, probs, N * V, "softmax probs without targets");
    expect_close(be, d_l2, losses, N, "losses untouched without targets");
    void *dev[] = {d_logits, d_probs, d_losses, d_dl, d_tg, d_l2};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        be->free(dev[i]);
    free(logits);
}

/* ---- AdamW ---------------------------------------------------------------------------- */

Test(cuda_kernels, adamw_over_five_steps_matches_reference, .timeout = 30)
{
    const dt_backend *be = under_test();
    enum { P = 1001 };
    float *p = random_floats(P, 61), *g = random_floats(P, 62);
    float *m = calloc(P, 4), *v = calloc(P, 4);
    float *d_p = dev_floats(be, p, P), *d_g = dev_floats(be, g, P);
    float *d_m = dev_floats(be, m, P), *d_v = dev_floats(be, v, P);
    dt_adamw_hparams h = dt_adamw_defaults(1e-2f);
    for (long step = 1; step <= 5; step++) {
        be->adamw(d_p, d_g, d_m, d_v, P, step, &h);
        dt_adamw_step(p, g, m, v, P, step, &h);
    }
    check_device(be);
    expect_close(be, d_p, p, P, "adamw params");
    expect_close(be, d_m, m, P, "adamw m");
    expect_close(be, d_v, v, P, "adamw v");
    void *dev[] = {d_p, d_g, d_m, d_v};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        be->free(dev[i]);
    free(p), free(g), free(m), free(v);
}

/* ---- the whole model: PyTorch's golden fixture ------------------------------------------- */

Test(cuda_golden, gradients_match_pytorch, .timeout = 120)
{
    const dt_backend *be = under_test();
    fixture fx;
    dt_model *m = golden_model(&fx, be);
    golden_forward(m, &fx);
    dt_model_zero_grad(m);
    cr_assert_eq(dt_model_backward(m, 1.0f), DT_OK);
    check_device(be);
    float *g = malloc(m->num_params * sizeof(float));
    dt_model_get_grads(m, g);
    for (int i = 0; i < m->num_tensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        char key[80];
        snprintf(key, sizeof key, "grad:%s", t->name);
        const record *r = fixture_get(&fx, key);
        double d = 0, ref = 0;
        for (size_t k = 0; k < t->numel; k++) {
            float x = ((const float *)r->data)[k];
            d += ((double)g[t->offset + k] - x) * ((double)g[t->offset + k] - x);
            ref += (double)x * x;
        }
        double e = ref > 0 ? sqrt(d / ref) : sqrt(d);
        cr_expect(e <= 1e-4, "%s (%s): L2 relative error %.3g", t->name, be->name, e);
    }
    free(g);
    dt_model_destroy(m);
    fixture_free(&fx);
}

Test(cuda_golden, ten_adamw_losses_match_pytorch, .timeout = 120)
{
    const dt_backend *be = under_test();
    fixture fx;
    dt_model *m = golden_model(&fx, be);
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
        cr_expect(e <= 1e-5, "%s: loss before update %u: %.7f vs PyTorch %.7f (rel %.3g)", be->name,
                  step, m->mean_loss, ref[step - 1], e);
        dt_model_zero_grad(m);
        cr_assert_eq(dt_model_backward(m, 1.0f), DT_OK);
        cr_assert_eq(dt_model_update(m, &h, step), DT_OK);
    }
    check_device(be);
    dt_model_destroy(m);
    fixture_free(&fx);
}

/* ---- opening the real backend ------------------------------------------------------------ */

/* Here (no driver) the failure must say what is missing; on a GPU machine
 * opening works, and a device number past the last one is refused by name. */
Test(cuda_backend, open_names_what_is_missing_or_the_devices_there_are, .timeout = 30)
{
    const dt_backend *be = NULL;
    char err[256] = "";
    dt_status st = dt_backend_cuda_open(&be, 0, err, sizeof err);
    if (!dt_backend_cuda_built()) {
        cr_assert_neq(st, DT_OK);
        cr_expect(strstr(err, "-Dcuda=enabled") != NULL, "%s", err);
    } else if (st != DT_OK) {
        cr_assert_null(be);
        cr_expect(strstr(err, "driver") || strstr(err, "device"),
                  "the message names neither driver nor device: %s", err);
    } else {
        cr_assert_str_eq(be->name, "cuda");
        st = dt_backend_cuda_open(&be, 4096, err, sizeof err);
        cr_expect_neq(st, DT_OK);
        cr_expect(strstr(err, "4096") != NULL, "%s", err);
    }
}
