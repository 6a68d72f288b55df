/*
 * test_tensor_parallel.c — a MiniGPT split over a tp group of 2 or 4
 * ranks (threads of this process over loopback TCP, the group made with
 * dt_comm_split) is the same model as one process.
 *
 * The split changes the order of the sums (a row-parallel matmul's output
 * is a sum of tp partial products), so the comparison is not bitwise but
 * relative: the loss within 1e-4, every parameter's gradient and every
 * parameter after one AdamW step within 1e-5 (relative L2 per tensor,
 * numeric_compare.h), each rank's share put back into the full layout.
 * What every rank computes alike — LayerNorms, wpe, the MLP's output
 * bias — must stay bitwise identical across the group. A vocabulary tp
 * does not divide (V 13) is padded: the same comparisons hold, and the
 * padding rows get no probability and zero gradients, and the group's
 * greedy token (dt_tp_argmax) is never one of them.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "dt_tp.h"
#include "numeric_compare.h"
#include "rank_threads.h"

enum { B = 2, MAX_TP = 4 };
static const dt_config cfg = {.V = 64, .T = 16, .L = 2, .H = 4, .C = 32};
/* A vocabulary no tp divides: padded to 14 rows at tp 2, 16 at tp 4
 * (4 rows each, the last rank's 1 real and 3 padding). */
static const dt_config odd = {.V = 13, .T = 16, .L = 2, .H = 4, .C = 32};
static const uint64_t SEED = 7;
static const float LR = 1e-3f;

typedef struct scenario {
    dt_config cfg;
    int x[B * 16], y[B * 16];
    float *grads[MAX_TP], *params[MAX_TP]; /* each rank's share, after backward / the step */
    float loss[MAX_TP];
    double prob_mass[MAX_TP][B * 16]; /* each row's probabilities on the rank's rows */
    size_t share;                     /* floats in one share */
} scenario;

static void make_batch(scenario *s)
{
    dt_rng r;
    dt_rng_seed(&r, 3);
    for (int i = 0; i < B * s->cfg.T; i++) {
        s->x[i] = (int)(dt_rng_next(&r) % (uint64_t)s->cfg.V);
        s->y[i] = (int)(dt_rng_next(&r) % (uint64_t)s->cfg.V);
    }
    s->x[0] = s->y[1] = s->cfg.V - 1; /* the last id, on the last rank */
}

/* One rank: its share's forward, backward and one AdamW step. */
static void tp_rank(rank_ctx *rc)
{
    scenario *s = rc->arg;
    dt_comm *tpc = NULL;
    if (dt_comm_split(rc->comm, 0, rc->rank, &tpc) != DT_OK) {
        rank_fail(rc, "split: %s", dt_comm_error(rc->comm));
        return;
    }
    dt_tp_model *m = NULL;
    dt_adamw_hparams h = dt_adamw_defaults(LR);
    if (dt_tp_create(&m, &s->cfg, dt_backend_cpu(), B, tpc) != DT_OK ||
        dt_tp_init(m, SEED) != DT_OK || dt_tp_forward(m, s->x, s->y, B, s->cfg.T) != DT_OK ||
        dt_tp_backward(m, 1.0f) != DT_OK) {
        rank_fail(rc, "rank %d: %s", rc->rank, dt_tp_error(m));
    } else {
        s->loss[rc->rank] = m->mean_loss;
        int rows = dt_tp_vocab_rows(&s->cfg, m->tp),
            real = dt_tp_vocab_real(&s->cfg, m->tp, m->rank);
        for (int n = 0; n < B * s->cfg.T; n++)
            for (int i = 0; i < real; i++)
                s->prob_mass[rc->rank][n] += m->acts.probs[(size_t)n * rows + i];
        memcpy(s->grads[rc->rank], m->grads_memory, s->share * sizeof(float));
        dt_tp_update(m, &h, 1);
        memcpy(s->params[rc->rank], m->params_memory, s->share * sizeof(float));
    }
    dt_tp_destroy(m);
    dt_comm_destroy(tpc);
}

/* The one-process reference: loss, gradients, parameters after the step. */
static float reference(const scenario *s, float *grads, float *params)
{
    dt_model *m = NULL;
    cr_assert_eq(dt_model_create(&m, &s->cfg, dt_backend_cpu(), B), DT_OK);
    dt_model_init(m, SEED);
    cr_assert_eq(dt_model_forward(m, s->x, s->y, B, s->cfg.T), DT_OK);
    cr_assert_eq(dt_model_backward(m, 1.0f), DT_OK);
    dt_model_get_grads(m, grads);
    dt_adamw_hparams h = dt_adamw_defaults(LR);
    cr_assert_eq(dt_model_update(m, &h, 1), DT_OK);
    dt_model_get_params(m, params);
    float loss = m->mean_loss;
    dt_model_destroy(m);
    return loss;
}

typedef struct outcome {
    scenario s;
    dt_tp_tensor tab[2 + 10 * 2 + 3];
    int n;
    float ref_loss, *ref_grads, *ref_params, *got_grads, *got_params;
} outcome;

/* Runs tp ranks and the reference on c; the shares put back in full
 * layout. */
static outcome *run_tp_on(const dt_config *c, int tp)
{
    outcome *o = calloc(1, sizeof *o);
    size_t P = dt_config_num_params(c);
    o->s.cfg = *c;
    make_batch(&o->s);
    o->s.share = dt_tp_num_params(c, tp);
    o->n = dt_tp_layout_build(o->tab, c, tp);
    cr_assert_eq(o->n, dt_tp_layout_num_tensors(c));
    for (int r = 0; r < tp; r++) {
        o->s.grads[r] = calloc(o->s.share, sizeof(float));
        o->s.params[r] = calloc(o->s.share, sizeof(float));
    }
    rank_job job;
    int failed = rank_threads_run(&job, tp, tp_rank, &o->s);
    for (int r = 0; r < tp; r++)
        cr_assert(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
    o->ref_grads = calloc(P, sizeof(float));
    o->ref_params = calloc(P, sizeof(float));
    o->got_grads = calloc(P, sizeof(float));
    o->got_params = calloc(P, sizeof(float));
    o->ref_loss = reference(&o->s, o->ref_grads, o->ref_params);
    for (int r = 0; r < tp; r++) {
        dt_tp_layout_unslice(o->got_grads, o->s.grads[r], o->tab, o->n, tp, r);
        dt_tp_layout_unslice(o->got_params, o->s.params[r], o->tab, o->n, tp, r);
    }
    return o;
}

static outcome *run_tp(int tp)
{
    return run_tp_on(&cfg, tp);
}

static void free_outcome(outcome *o, int tp)
{
    for (int r = 0; r < tp; r++) {
        free(o->s.grads[r]);
        free(o->s.params[r]);
    }
    free(o->ref_grads);
    free(o->ref_params);
    free(o->got_grads);
    free(o->got_params);
    free(o);
}

/* Every tensor of got within tol of ref (relative L2); prints the worst. */
static void expect_tensors_close(const outcome *o, const float *got, const float *ref,
                                 const char *what, int tp)
{
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < o->n; i++) {
        const dt_tensor_info *t = &o->tab[i].full;
        double e = rel_l2(got + t->offset, ref + t->offset, t->numel);
        cr_expect_leq(e, 1e-5, "tp %d: %s of %s: relative error %.3g", tp, what, t->name, e);
        if (e >= worst) {
            worst = e;
            worst_name = t->name;
        }
    }
    fprintf(stderr, "tp %d: %s: max relative error %.3g (%s)\n", tp, what, worst, worst_name);
}

static void expect_matches_one_process_on(const dt_config *c, int tp)
{
    outcome *o = run_tp_on(c, tp);
    for (int r = 0; r < tp; r++) {
        double e = fabs((double)o->s.loss[r] - o->ref_loss) / fabs((double)o->ref_loss);
        cr_expect_leq(e, 1e-4, "tp %d rank %d: loss %.9g vs %.9g", tp, r, o->s.loss[r],
                      o->ref_loss);
        fprintf(stderr, "tp %d rank %d: loss relative error %.3g\n", tp, r, e);
    }
    expect_tensors_close(o, o->got_grads, o->ref_grads, "gradient", tp);
    expect_tensors_close(o, o->got_params, o->ref_params, "parameter after one AdamW step", tp);
    free_outcome(o, tp);
}

static void expect_matches_one_process(int tp)
{
    expect_matches_one_process_on(&cfg, tp);
}

Test(tensor_parallel, tp2_matches_one_process, .timeout = 120)
{
    expect_matches_one_process(2);
}

Test(tensor_parallel, tp4_matches_one_process, .timeout = 120)
{
    expect_matches_one_process(4);
}

Test(tensor_parallel, tp2_on_a_vocabulary_it_does_not_divide_matches_one_process, .timeout = 120)
{
    expect_matches_one_process_on(&odd, 2);
}

Test(tensor_parallel, tp4_on_a_vocabulary_it_does_not_divide_matches_one_process, .timeout = 120)
{
    expect_matches_one_process_on(&odd, 4);
}

/* The softmax runs over the vocabulary's V ids only: the real rows'
 * probabilities, summed over the ranks, are 1 for every token, so no
 * padding row is ever a prediction (or a token to sample). */
Test(tensor_parallel, padding_rows_get_no_probability, .timeout = 120)
{
    int tp = 4;
    outcome *o = run_tp_on(&odd, tp);
    for (int n = 0; n < B * odd.T; n++) {
        double total = 0;
        for (int r = 0; r < tp; r++)
            total += o->s.prob_mass[r][n];
        cr_expect(fabs(total - 1.0) < 1e-5, "token %d: probabilities sum to %.9g", n, total);
    }
    free_outcome(o, tp);
}

/* The padding rows of wte and lm_head (where slice puts them: before the
 * real rows in wte, after them in lm_head) are zeros after a step, and
 * their gradients are zeros: no kernel touched them. */
Test(tensor_parallel, padding_rows_have_zero_gradients_and_stay_zero, .timeout = 120)
{
    int tp = 4, C = odd.C, Vt = dt_tp_vocab_rows(&odd, tp);
    cr_assert_eq(Vt, 4);
    outcome *o = run_tp_on(&odd, tp);
    for (int r = 0; r < tp; r++) {
        int pad = Vt - dt_tp_vocab_real(&odd, tp, r);
        cr_expect_eq(pad, r == tp - 1 ? 3 : 0, "rank %d", r);
        const dt_tp_tensor *wte = &o->tab[0], *head = &o->tab[o->n - 1];
        size_t at[2] = {wte->local.offset, head->local.offset + (size_t)(Vt - pad) * C};
        for (int k = 0; k < 2; k++)
            for (size_t i = 0; i < (size_t)pad * C; i++) {
                cr_expect_eq(o->s.grads[r][at[k] + i], 0.0f, "rank %d %s pad %zu: gradient", r,
                             k ? "lm_head" : "wte", i);
                cr_expect_eq(o->s.params[r][at[k] + i], 0.0f, "rank %d %s pad %zu: parameter", r,
                             k ? "lm_head" : "wte", i);
            }
    }
    free_outcome(o, tp);
}

/* Replicated tensors (split == DT_TP_REPLICATED): the same bits on every
 * rank, gradients and parameters after the step. */
static void expect_replicas_bitwise(int tp)
{
    outcome *o = run_tp(tp);
    int replicated = 0;
    for (int i = 0; i < o->n; i++) {
        const dt_tp_tensor *t = &o->tab[i];
        if (t->split != DT_TP_REPLICATED)
            continue;
        replicated++;
        size_t off = t->local.offset, bytes = t->local.numel * sizeof(float);
        for (int r = 1; r < tp; r++) {
            cr_expect(memcmp(o->s.grads[r] + off, o->s.grads[0] + off, bytes) == 0,
                      "tp %d: gradient of %s differs between ranks 0 and %d", tp, t->full.name, r);
            cr_expect(memcmp(o->s.params[r] + off, o->s.params[0] + off, bytes) == 0,
                      "tp %d: %s differs between ranks 0 and %d after the step", tp, t->full.name,
                      r);
        }
    }
    cr_expect_eq(replicated, 1 + 5 * cfg.L + 2, "wpe, 5 per block, ln_f's 2");
    free_outcome(o, tp);
}

Test(tensor_parallel, tp2_replicated_tensors_bitwise_equal_across_ranks, .timeout = 120)
{
    expect_replicas_bitwise(2);
}

Test(tensor_parallel, tp4_replicated_tensors_bitwise_equal_across_ranks, .timeout = 120)
{
    expect_replicas_bitwise(4);
}

Test(tensor_parallel, share_is_the_full_model_divided)
{
    dt_tp_tensor tab[2 + 10 * 2 + 3];
    int n = dt_tp_layout_build(tab, &cfg, 4);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        cr_expect_eq(tab[i].local.offset, total, "%s is not contiguous", tab[i].full.name);
        total += tab[i].local.numel;
        size_t parts = tab[i].split == DT_TP_REPLICATED ? 1 : 4;
        cr_expect_eq(tab[i].local.numel * parts, tab[i].full.numel, "%s", tab[i].full.name);
    }
    cr_expect_eq(total, dt_tp_num_params(&cfg, 4));
}

/* Every rank's share put back gives the full buffer, element for element. */
static void expect_slices_cover(const dt_config *c, int tp)
{
    size_t P = dt_config_num_params(c), S = dt_tp_num_params(c, tp);
    float *full = malloc(P * sizeof(float)), *back = calloc(P, sizeof(float));
    float *share = malloc(S * sizeof(float));
    dt_tp_tensor tab[2 + 10 * 2 + 3];
    int n = dt_tp_layout_build(tab, c, tp);
    for (size_t i = 0; i < P; i++)
        full[i] = (float)i;
    for (int r = 0; r < tp; r++) {
        dt_tp_layout_slice(share, full, tab, n, tp, r);
        dt_tp_layout_unslice(back, share, tab, n, tp, r);
    }
    cr_expect(memcmp(full, back, P * sizeof(float)) == 0, "tp %d", tp);
    free(full);
    free(back);
    free(share);
}

Test(tensor_parallel, slice_then_unslice_is_the_identity)
{
    expect_slices_cover(&cfg, 2);
    expect_slices_cover(&cfg, 4);
}

Test(tensor_parallel, slice_then_unslice_is_the_identity_with_a_padded_vocabulary)
{
    expect_slices_cover(&odd, 2);
    expect_slices_cover(&odd, 4);
}

/* A share less its padding (what a checkpoint keeps) holds V rows between
 * the tp ranks, and the shares are all one size. */
Test(tensor_parallel, kept_parts_of_the_shares_hold_the_unpadded_model)
{
    for (int tp = 2; tp <= 4; tp += 2) {
        size_t kept = 0, S = dt_tp_num_params(&odd, tp), lo, n;
        for (int r = 0; r < tp; r++) {
            dt_tp_share_kept(&odd, tp, r, &lo, &n);
            cr_expect_eq(lo + n + lo, S, "tp %d rank %d: padding at both ends", tp, r);
            kept += n;
        }
        size_t Vt = (size_t)dt_tp_vocab_rows(&odd, tp), C = (size_t)odd.C;
        cr_expect_eq(kept, (size_t)tp * S - 2 * ((size_t)tp * Vt - (size_t)odd.V) * C, "tp %d", tp);
    }
}

static void expect_refused(dt_config c, int tp, const char *name)
{
    char err[256] = "";
    cr_expect_eq(dt_tp_config_check(&c, tp, err, sizeof err), DT_EINVAL, "tp %d accepted", tp);
    cr_expect(strstr(err, name) != NULL, "message '%s' does not name %s", err, name);
}

Test(tensor_parallel, tp_not_dividing_heads_is_refused_by_name)
{
    expect_refused(cfg, 3, "heads H = 4");
}

Test(tensor_parallel, tp_not_dividing_vocabulary_pads_it)
{
    dt_config c = cfg;
    c.V = 66;
    cr_expect_eq(dt_tp_config_check(&c, 4, NULL, 0), DT_OK);
    cr_expect_eq(dt_tp_vocab_rows(&c, 4), 17);
    cr_expect_eq(dt_tp_vocab_real(&c, 4, 3), 15);
}

Test(tensor_parallel, tp_leaving_a_rank_no_vocabulary_row_is_refused_by_name)
{
    dt_config c = cfg;
    c.V = 5; /* 2 rows each over 4: rank 3 would hold ids 6 and 7 */
    expect_refused(c, 4, "leaves rank 3 no row of the vocabulary V = 5");
}

static void refused_create_rank(rank_ctx *rc)
{
    dt_config c = cfg;
    c.H = 8; /* 8 heads over tp 3 */
    dt_tp_model *m = NULL;
    dt_status st = dt_tp_create(&m, &c, dt_backend_cpu(), B, rc->comm);
    if (st != DT_EINVAL || !strstr(dt_tp_error(m), "does not divide the heads H = 8"))
        rank_fail(rc, "create gave %s: %s", dt_status_name(st), dt_tp_error(m));
    dt_tp_destroy(m);
}

Test(tensor_parallel, create_on_a_group_not_dividing_heads_is_refused_by_name, .timeout = 60)
{
    rank_job job;
    rank_threads_run(&job, 3, refused_create_rank, NULL);
    for (int r = 0; r < 3; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
}

/* The greedy token over the group: a model whose every real logit is
 * negative (lnf's output a constant 1, every real lm_head row negative),
 * so a padding row's logit, 0, is the largest number of the padded
 * vocabulary; ids 5 and 9 tie for the largest real logit, on ranks 1 and
 * 2 at tp 4. Each rank runs a forward of (rows, T) and dt_tp_argmax. */
typedef struct argmax_case {
    int rows, T;
    int ids[MAX_TP][B * 16];
} argmax_case;

static float tied_logit_weight(int id)
{
    int d5 = abs(id - 5), d9 = abs(id - 9);
    return -1.0f - 0.01f * (float)(d5 < d9 ? d5 : d9);
}

static void argmax_rank(rank_ctx *rc)
{
    argmax_case *ac = rc->arg;
    dt_tp_model *m = NULL;
    int x[B * 16] = {0};
    if (dt_tp_create(&m, &odd, dt_backend_cpu(), B, rc->comm) != DT_OK ||
        dt_tp_init(m, SEED) != DT_OK) {
        rank_fail(rc, "rank %d: %s", rc->rank, dt_tp_error(m));
        dt_tp_destroy(m);
        return;
    }
    int C = odd.C, real = dt_tp_vocab_real(&odd, m->tp, m->rank);
    int v0 = m->rank * dt_tp_vocab_rows(&odd, m->tp);
    for (int c = 0; c < C; c++)
        m->params.lnfw[c] = 0.0f, m->params.lnfb[c] = 1.0f;
    for (int i = 0; i < real; i++) /* the real rows come first in lm_head */
        for (int c = 0; c < C; c++)
            m->params.lm_head[(size_t)i * C + c] = tied_logit_weight(v0 + i);
    for (int i = 0; i < ac->rows * ac->T; i++)
        x[i] = i % odd.V;
    if (dt_tp_forward(m, x, NULL, ac->rows, ac->T) != DT_OK ||
        dt_tp_argmax(m, ac->ids[rc->rank]) != DT_OK)
        rank_fail(rc, "rank %d: %s", rc->rank, dt_tp_error(m));
    dt_tp_destroy(m);
}

static void expect_argmax_5(int rows, int T)
{
    int tp = 4;
    argmax_case ac = {.rows = rows, .T = T};
    rank_job job;
    rank_threads_run(&job, tp, argmax_rank, &ac);
    for (int r = 0; r < tp; r++) {
        cr_assert(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
        for (int n = 0; n < rows * T; n++)
            cr_expect_eq(ac.ids[r][n], 5, "rank %d, position %d: greedy token %d, not 5", r, n,
                         ac.ids[r][n]);
    }
}

Test(tensor_parallel, argmax_never_picks_a_padding_row_and_ties_go_to_the_lower_id, .timeout = 60)
{
    expect_argmax_5(B, odd.T);
}

/* Evaluation's grading cuts more, shorter rows than training's batch
 * (B·T tokens within max_B·T), as the whole model allows. */
Test(tensor_parallel, a_forward_of_more_shorter_rows_than_max_b_runs, .timeout = 60)
{
    expect_argmax_5(2 * B, odd.T / 2);
}
