/*
 * test_tensor_parallel_bf16.c — bf16 compute on a tensor-parallel share
 * (tensor/tp_precision.c), on tp groups of 2 threads over loopback TCP:
 *
 *   - every parameter is read rounded to bf16: masters moved by less than
 *     half a bf16 ulp from their rounding (x (1 + 2^-10)) give the loss
 *     and gradients of the rounded masters bitwise, where fp32 tells the
 *     two apart;
 *   - every stored layer output is a bf16 value (its low 16 bits zero),
 *     the residual stream is not rounded;
 *   - a 3-D stage that holds the whole model computes the share's bits
 *     (the stage rounds as the share does);
 *   - a share is switched once, before its first forward;
 *   - its activations, stored as bf16, take at most 0.55x fp32's bytes on
 *     the 865k config.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "dt_tp.h"
#include "dt_tp_stage.h"
#include "rank_threads.h"

enum { B = 2, T = 16, TP = 2 };
static const dt_config cfg = {.V = 64, .T = T, .L = 2, .H = 4, .C = 32};
static const uint64_t SEED = 7;

typedef enum masters { INIT, ROUNDED, NUDGED } masters;

typedef struct scenario {
    bool bf16, stage;
    masters w;
    int x[B * T], y[B * T];
    float loss[TP];
    float *grads[TP];
    size_t share;
    int not_bf16[TP];      /* stored-output elements that are not bf16 values */
    int residual_bf16[TP]; /* residual-stream elements that happen to be */
} scenario;

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float rounded(float f) /* to nearest bf16, ties to even (finite f) */
{
    uint32_t u = bits(f);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void make_batch(scenario *s)
{
    dt_rng r;
    dt_rng_seed(&r, 3);
    for (int i = 0; i < B * T; i++) {
        s->x[i] = (int)(dt_rng_next(&r) % (uint64_t)cfg.V);
        s->y[i] = (int)(dt_rng_next(&r) % (uint64_t)cfg.V);
    }
}

/* Sets the masters as the scenario says: the init's, their rounding, or
 * the rounding moved up by 2^-10 of itself (under half an ulp: 2^-9). */
static void set_masters(float *p, size_t n, masters w)
{
    for (size_t i = 0; w != INIT && i < n; i++)
        p[i] = w == ROUNDED ? rounded(p[i]) : rounded(p[i]) * (1.0f + 1.0f / 1024);
}

static int count_not_bf16(const float *x, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += (bits(x[i]) & 0xffffu) != 0;
    return k;
}

/* The stored outputs of the share's forward that bf16 rounds. */
static void check_acts(scenario *s, int rank, const dt_tp_model *m)
{
    size_t N = B * T, C = (size_t)cfg.C, Cl = C / TP, att = B * (cfg.H / TP) * T * T;
    int k = count_not_bf16(m->acts.lnf, N * C), res = 0;
    for (int l = 0; l < cfg.L; l++) {
        const dt_block_acts *a = &m->acts.blocks[l];
        const float *f[] = {a->ln1, a->qkv, a->atty,     a->att,   a->attproj,
                            a->ln2, a->fch, a->fch_gelu, a->fcproj};
        size_t n[] = {N * C, 3 * N * Cl, N * Cl, att, N * C, N * C, 4 * N * Cl, 4 * N * Cl, N * C};
        for (int i = 0; i < 9; i++)
            k += count_not_bf16(f[i], n[i]);
        res += (int)(N * C) - count_not_bf16(a->residual3, N * C);
    }
    s->not_bf16[rank] = k;
    s->residual_bf16[rank] = res;
}

static dt_status share_step(scenario *s, dt_comm *tpc, int rank)
{
    dt_tp_model *m = NULL;
    dt_status st = dt_tp_create(&m, &cfg, dt_backend_cpu(), B, tpc);
    if (st == DT_OK && s->bf16)
        st = dt_tp_set_precision(m, DT_PRECISION_BF16);
    if (st == DT_OK && (st = dt_tp_init(m, SEED)) == DT_OK) {
        set_masters(m->params_memory, m->num_params, s->w);
        if ((st = dt_tp_forward(m, s->x, s->y, B, T)) == DT_OK)
            st = dt_tp_backward(m, 1.0f);
    }
    if (st == DT_OK) {
        s->loss[rank] = m->mean_loss;
        memcpy(s->grads[rank], m->grads_memory, s->share * sizeof(float));
        check_acts(s, rank, m);
    }
    dt_tp_destroy(m);
    return st;
}

/* The whole model as one stage of a 3-D run. */
static dt_status stage_step(scenario *s, dt_comm *tpc, int rank)
{
    dt_tp_stage *g = NULL;
    dt_status st = dt_tp_stage_create(&g, &cfg, dt_backend_cpu(), B, 0, cfg.L, 1, 1, tpc);
    if (st == DT_OK && s->bf16)
        st = dt_tp_stage_set_precision(g, DT_PRECISION_BF16);
    if (st == DT_OK && (st = dt_tp_stage_init(g, SEED)) == DT_OK) {
        set_masters(g->core.params_memory, g->core.num_params, s->w);
        if ((st = dt_tp_stage_forward(g, s->x, s->y, B, T, &s->loss[rank])) == DT_OK)
            st = dt_tp_stage_backward(g, 1.0f);
    }
    if (st == DT_OK)
        memcpy(s->grads[rank], g->core.grads_memory, s->share * sizeof(float));
    dt_tp_stage_destroy(g);
    return st;
}

static void tp_rank(rank_ctx *rc)
{
    scenario *s = rc->arg;
    dt_comm *tpc = NULL;
    if (dt_comm_split(rc->comm, 0, rc->rank, &tpc) != DT_OK) {
        rank_fail(rc, "split: %s", dt_comm_error(rc->comm));
        return;
    }
    dt_status st = s->stage ? stage_step(s, tpc, rc->rank) : share_step(s, tpc, rc->rank);
    if (st != DT_OK)
        rank_fail(rc, "rank %d: %s", rc->rank, dt_status_name(st));
    dt_comm_destroy(tpc);
}

static scenario *run(bool bf16, bool stage, masters w)
{
    scenario *s = calloc(1, sizeof *s);
    *s = (scenario){.bf16 = bf16, .stage = stage, .w = w, .share = dt_tp_num_params(&cfg, TP)};
    make_batch(s);
    for (int r = 0; r < TP; r++)
        s->grads[r] = calloc(s->share, sizeof(float));
    rank_job job;
    int failed = rank_threads_run(&job, TP, tp_rank, s);
    for (int r = 0; r < TP; r++)
        cr_assert(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
    return s;
}

static bool same_bits(const scenario *a, const scenario *b)
{
    for (int r = 0; r < TP; r++)
        if (bits(a->loss[r]) != bits(b->loss[r]) ||
            memcmp(a->grads[r], b->grads[r], a->share * sizeof(float)) != 0)
            return false;
    return true;
}

static void free_run(scenario *s)
{
    for (int r = 0; r < TP; r++)
        free(s->grads[r]);
    free(s);
}

Test(tensor_parallel_bf16, every_parameter_is_read_rounded, .timeout = 60)
{
    scenario *r = run(true, false, ROUNDED), *n = run(true, false, NUDGED);
    cr_expect(same_bits(r, n),
              "bf16: masters within half an ulp of their rounding gave other bits (loss %.9g vs "
              "%.9g)",
              n->loss[0], r->loss[0]);
    free_run(r);
    free_run(n);
    /* the nudge is seen where nothing rounds: the check above can fail */
    r = run(false, false, ROUNDED);
    n = run(false, false, NUDGED);
    cr_expect(!same_bits(r, n), "fp32: the nudged masters gave the rounded masters' bits");
    free_run(r);
    free_run(n);
}

Test(tensor_parallel_bf16, stored_outputs_are_bf16_values_and_the_residual_stream_is_not,
     .timeout = 60)
{
    scenario *s = run(true, false, INIT);
    for (int r = 0; r < TP; r++) {
        cr_expect_eq(s->not_bf16[r], 0, "rank %d: %d stored elements are not bf16 values", r,
                     s->not_bf16[r]);
        cr_expect_lt(s->residual_bf16[r], B * T * cfg.C, "rank %d: the residual stream is rounded",
                     r);
    }
    free_run(s);
    s = run(false, false, INIT);
    cr_expect_gt(s->not_bf16[0], 0, "fp32: every stored output is a bf16 value");
    free_run(s);
}

Test(tensor_parallel_bf16, a_stage_holding_the_whole_model_computes_the_shares_bits, .timeout = 60)
{
    scenario *share = run(true, false, INIT), *stage = run(true, true, INIT);
    cr_expect(same_bits(share, stage), "the bf16 stage's loss %.9g, the share's %.9g",
              stage->loss[0], share->loss[0]);
    free_run(share);
    free_run(stage);
    share = run(false, false, INIT);
    stage = run(true, true, INIT);
    cr_expect(!same_bits(share, stage), "the bf16 stage computed the fp32 share's bits");
    free_run(share);
    free_run(stage);
}

static void switch_after_forward(rank_ctx *rc)
{
    scenario *s = rc->arg;
    dt_comm *tpc = NULL;
    dt_tp_model *m = NULL;
    if (dt_comm_split(rc->comm, 0, rc->rank, &tpc) != DT_OK ||
        dt_tp_create(&m, &cfg, dt_backend_cpu(), B, tpc) != DT_OK || dt_tp_init(m, SEED) ||
        dt_tp_forward(m, s->x, s->y, B, T) != DT_OK)
        rank_fail(rc, "rank %d: setup failed", rc->rank);
    else if (dt_tp_set_precision(m, DT_PRECISION_BF16) != DT_EINVAL ||
             !strstr(dt_tp_error(m), "before its first forward"))
        rank_fail(rc, "rank %d: switched after a forward: %s", rc->rank, dt_tp_error(m));
    dt_tp_destroy(m);
    dt_comm_destroy(tpc);
}

Test(tensor_parallel_bf16, a_share_is_switched_before_its_first_forward_only, .timeout = 60)
{
    scenario s = {0};
    make_batch(&s);
    rank_job job;
    rank_threads_run(&job, TP, switch_after_forward, &s);
    for (int r = 0; r < TP; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
}

/* The 865k config (V256 C128 H4 L4 T64), batch 8, tp 2: the share's
 * activations and their gradients in bf16 (bf16 store, one-block fp32
 * workspaces) against fp32's, held to issue 37's 0.55x. */
typedef struct bytes_case {
    size_t fp32[TP], bf16[TP];
} bytes_case;

static void bytes_rank(rank_ctx *rc)
{
    bytes_case *b = rc->arg;
    const dt_config big = {.V = 256, .T = 64, .L = 4, .H = 4, .C = 128};
    dt_comm *tpc = NULL;
    dt_tp_model *f = NULL, *h = NULL;
    if (dt_comm_split(rc->comm, 0, rc->rank, &tpc) != DT_OK ||
        dt_tp_create(&f, &big, dt_backend_cpu(), 8, tpc) != DT_OK ||
        dt_tp_create(&h, &big, dt_backend_cpu(), 8, tpc) != DT_OK ||
        dt_tp_set_precision(h, DT_PRECISION_BF16) != DT_OK)
        rank_fail(rc, "rank %d: create failed", rc->rank);
    else {
        b->fp32[rc->rank] = dt_tp_activation_bytes(f);
        b->bf16[rc->rank] = dt_tp_activation_bytes(h);
    }
    dt_tp_destroy(f);
    dt_tp_destroy(h);
    dt_comm_destroy(tpc);
}

Test(tensor_parallel_bf16, activations_take_at_most_055_of_fp32s_bytes_on_the_865k_config,
     .timeout = 60)
{
    bytes_case b = {0};
    rank_job job;
    rank_threads_run(&job, TP, bytes_rank, &b);
    for (int r = 0; r < TP; r++) {
        cr_assert(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
        cr_expect_leq((double)b.bf16[r], 0.55 * (double)b.fp32[r], "rank %d: %zu B vs fp32's %zu B",
                      r, b.bf16[r], b.fp32[r]);
    }
}
