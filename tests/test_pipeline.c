/*
 * test_pipeline.c — pipeline schedules as data, checked on the lists
 * alone: every micro-batch's actions appear once and in dependency order,
 * no list deadlocks against its neighbours even when a send waits for its
 * receiver (dt_pipe_simulate), live activations peak where the theory
 * says, and the simulated bubble with unit costs is the closed form. Then
 * how blocks are partitioned over stages, and the executor's own checks
 * on one stage (no network: the multi-rank runs are in
 * test_pipeline_train.c).
 *
 * Cases: p = 1..8 stages, m in {1, p-1, p, 2p+1, 32} micro-batches, for
 * GPipe, 1F1B and ZB-H1. Unit costs: F = 1, B = 2 (whole), W = 1 (so the
 * split B is 1).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_pipe.h"

static const dt_pipe_costs unit = {.f = 1, .b = 2, .w = 1, .latency = 0};

static int min_i(int a, int b)
{
    return a < b ? a : b;
}

/* Calls fn on every (kind, p, m) case; fn gets a fresh schedule. */
static void each_case(void (*fn)(const dt_pipe_schedule *))
{
    for (int k = 0; k < DT_PIPE_NUM_KINDS; k++)
        for (int p = 1; p <= 8; p++) {
            int ms[] = {1, p - 1 > 0 ? p - 1 : 1, p, 2 * p + 1, 32};
            for (int i = 0; i < 5; i++) {
                char err[256];
                dt_pipe_schedule *s = dt_pipe_schedule_create((dt_pipe_kind)k, p, ms[i], err,
                                                              sizeof err);
                cr_assert_not_null(s, "%s", err);
                fn(s);
                dt_pipe_schedule_destroy(s);
            }
        }
}

/* Position of (op, mb) in stage st's list, -1 if absent; asserts it
 * appears at most once. */
static int find(const dt_pipe_schedule *s, int st, dt_pipe_op op, int mb)
{
    int at = -1;
    for (int i = 0; i < s->n[st]; i++)
        if (s->actions[st][i].op == op && s->actions[st][i].mb == mb) {
            cr_assert_eq(at, -1, "%s p=%d m=%d stage %d: %s%d twice", dt_pipe_kind_name(s->kind),
                         s->p, s->m, st, dt_pipe_op_name(op), mb);
            at = i;
        }
    return at;
}

static void check_order(const dt_pipe_schedule *s)
{
    const char *k = dt_pipe_kind_name(s->kind);
    for (int st = 0; st < s->p; st++) {
        cr_assert_eq(s->actions[st][s->n[st] - 1].op, DT_PIPE_STEP);
        for (int mb = 0; mb < s->m; mb++) {
            int f = find(s, st, DT_PIPE_F, mb), b = find(s, st, DT_PIPE_B, mb);
            int w = find(s, st, DT_PIPE_W, mb);
            cr_assert(f >= 0 && b > f,
                      "%s p=%d m=%d stage %d: F%d at %d, "
                      "B%d at %d",
                      k, s->p, s->m, st, mb, f, mb, b);
            cr_assert(s->split_backward ? w > b : w < 0, "%s p=%d m=%d stage %d: W%d at %d", k,
                      s->p, s->m, st, mb, w);
            int ra = find(s, st, DT_PIPE_RECV_ACT, mb);
            int sa = find(s, st, DT_PIPE_SEND_ACT, mb);
            int rg = find(s, st, DT_PIPE_RECV_GRAD, mb);
            int sg = find(s, st, DT_PIPE_SEND_GRAD, mb);
            cr_assert(st > 0 ? ra >= 0 && ra < f : ra < 0, "recv_act%d", mb);
            cr_assert(st < s->p - 1 ? sa > f : sa < 0, "send_act%d", mb);
            cr_assert(st < s->p - 1 ? rg >= 0 && rg < b : rg < 0, "recv_grad%d", mb);
            cr_assert(st > 0 ? sg > b : sg < 0, "send_grad%d", mb);
        }
    }
}

Test(pipeline, every_action_appears_once_in_dependency_order, .timeout = 30)
{
    each_case(check_order);
}

/* Simulated with sends that wait for their receivers: no deadlock, and
 * stage s starts F(mb) only after stage s-1 finished it. */
static void check_no_deadlock(const dt_pipe_schedule *s)
{
    dt_pipe_sim sim;
    dt_status st = dt_pipe_simulate(s, &unit, &sim);
    cr_assert_eq(st, DT_OK, "%s", sim.err);
    for (int g = 1; g < s->p; g++)
        for (int mb = 0; mb < s->m; mb++) {
            int here = find(s, g, DT_PIPE_F, mb);
            int there = find(s, g - 1, DT_PIPE_F, mb);
            cr_assert_geq(sim.start[g][here], sim.end[g - 1][there],
                          "%s p=%d m=%d: stage %d's F%d starts before stage "
                          "%d's ends",
                          dt_pipe_kind_name(s->kind), s->p, s->m, g, mb, g - 1);
        }
    dt_pipe_sim_free(s, &sim);
}

Test(pipeline, no_schedule_deadlocks_even_when_sends_wait_for_receivers, .timeout = 60)
{
    each_case(check_no_deadlock);
}

Test(pipeline, a_list_that_sends_after_receiving_is_found_to_deadlock, .timeout = 10)
{
    char err[256];
    dt_pipe_schedule *s = dt_pipe_schedule_create(DT_PIPE_1F1B, 2, 2, err, sizeof err);
    cr_assert_not_null(s);
    /* stage 1 waits for the gradient of micro-batch 0 from nobody: make
     * stage 0 receive it before it sends the activations of micro-batch 0
     * (F0 send_act0 ... becomes recv_grad0 first) */
    dt_pipe_action *a = s->actions[0];
    int rg = -1;
    for (int i = 0; i < s->n[0]; i++)
        if (a[i].op == DT_PIPE_RECV_GRAD && a[i].mb == 0)
            rg = i;
    dt_pipe_action moved = a[rg];
    memmove(a + 1, a, (size_t)rg * sizeof *a);
    a[0] = moved;
    dt_pipe_sim sim;
    cr_expect_eq(dt_pipe_simulate(s, &unit, &sim), DT_EPROTO);
    cr_expect(strstr(sim.err, "stage 0 waits at recv_grad0") != NULL, "%s", sim.err);
    cr_expect(strstr(sim.err, "stage 1 waits at recv_act0") != NULL, "%s", sim.err);
    dt_pipe_sim_free(s, &sim);
    dt_pipe_schedule_destroy(s);
}

static void check_peaks(const dt_pipe_schedule *s)
{
    int p = s->p, m = s->m;
    for (int st = 0; st < p; st++) {
        int want = s->kind == DT_PIPE_GPIPE ? m : s->kind == DT_PIPE_1F1B ? min_i(p - st, m) : -1;
        if (want > 0) {
            cr_expect_eq(s->act_slots[st], want,
                         "%s p=%d m=%d stage %d: "
                         "peak %d micro-batches, want %d",
                         dt_pipe_kind_name(s->kind), p, m, st, s->act_slots[st], want);
            cr_expect_eq(s->grad_slots[st], 1);
        } else {
            cr_expect_leq(s->act_slots[st], min_i(p, m),
                          "zb p=%d m=%d "
                          "stage %d: peak %d",
                          p, m, st, s->act_slots[st]);
            cr_expect_leq(s->grad_slots[st], s->act_slots[st]);
        }
    }
    if (s->kind == DT_PIPE_ZB) /* 1F1B's peak is stage 0's */
        cr_expect_eq(s->act_slots[0], min_i(p, m));
}

Test(pipeline, live_activations_peak_at_m_for_gpipe_and_p_minus_s_for_1f1b, .timeout = 30)
{
    each_case(check_peaks);
}

/* (makespan - busy) / busy on every stage against the closed forms. */
static void check_bubble(const dt_pipe_schedule *s)
{
    int p = s->p, m = s->m;
    dt_pipe_sim sim;
    cr_assert_eq(dt_pipe_simulate(s, &unit, &sim), DT_OK, "%s", sim.err);
    double onef1b = 3.0 * (m + p - 1);
    if (s->kind != DT_PIPE_ZB || m >= p) {
        double want = s->kind == DT_PIPE_ZB ? 3.0 * m + p - 1 : onef1b;
        double ratio = s->kind == DT_PIPE_ZB ? (p - 1) / (3.0 * m) : (double)(p - 1) / m;
        cr_expect_eq(sim.makespan, want, "%s p=%d m=%d: step %g, want %g",
                     dt_pipe_kind_name(s->kind), p, m, sim.makespan, want);
        for (int st = 0; st < p; st++) {
            double bubble = (sim.makespan - sim.busy[st]) / sim.busy[st];
            cr_expect(fabs(bubble - ratio) < 1e-12,
                      "%s p=%d m=%d stage %d: "
                      "bubble %g, closed form %g",
                      dt_pipe_kind_name(s->kind), p, m, st, bubble, ratio);
        }
    } else {
        cr_expect_leq(sim.makespan, onef1b, "zb p=%d m=%d slower than 1F1B", p, m);
    }
    dt_pipe_sim_free(s, &sim);
}

Test(pipeline, unit_cost_bubble_equals_the_closed_form, .timeout = 60)
{
    each_case(check_bubble);
}

/* Unequal stages (the last one also runs the head and the loss): GPipe and
 * 1F1B then run at the pace of the slowest stage, so the step is one pass
 * of every stage's F + B plus m - 1 periods of the last stage's F + B, and
 * the other stages idle the difference in each period. */
static void check_slow_last_stage(const dt_pipe_schedule *s)
{
    if (s->kind == DT_PIPE_ZB)
        return;
    int p = s->p, m = s->m;
    for (double slow = 1.25; slow <= 2; slow += 0.75) {
        double fbw[3 * 8], pass = 0;
        for (int st = 0; st < p; st++) {
            double k = st == p - 1 ? slow : 1;
            fbw[3 * st] = k, fbw[3 * st + 1] = 2 * k, fbw[3 * st + 2] = 0;
            pass += 3 * k;
        }
        dt_pipe_costs c = {.latency = 0, .stage = fbw};
        dt_pipe_sim sim;
        cr_assert_eq(dt_pipe_simulate(s, &c, &sim), DT_OK, "%s", sim.err);
        double want = pass + (m - 1) * 3 * slow;
        cr_expect(fabs(sim.makespan - want) < 1e-9, "%s p=%d m=%d last stage x%g: step %g, want %g",
                  dt_pipe_kind_name(s->kind), p, m, slow, sim.makespan, want);
        dt_pipe_sim_free(s, &sim);
    }
}

Test(pipeline, a_slower_last_stage_makes_every_other_stage_wait_each_period, .timeout = 60)
{
    each_case(check_slow_last_stage);
}

Test(pipeline, an_unknown_schedule_or_no_micro_batches_is_refused, .timeout = 10)
{
    char err[256];
    cr_expect_null(dt_pipe_schedule_create(DT_PIPE_1F1B, 4, 0, err, sizeof err));
    cr_expect(strstr(err, "m >= 1") != NULL, "%s", err);
    dt_pipe_kind k;
    cr_expect(dt_pipe_kind_parse("zb", &k) && k == DT_PIPE_ZB);
    cr_expect(!dt_pipe_kind_parse("interleaved", &k));
}

/* ---- partition ------------------------------------------------------------ */

static size_t owned(const dt_config *c, int a, int b)
{
    dt_model *m;
    dt_stage_spec sp = {a, b, 1, 1, false};
    cr_assert_eq(dt_model_create_stage(&m, c, dt_backend_cpu(), 1, &sp), DT_OK);
    size_t n = m->num_params;
    dt_model_destroy(m);
    return n;
}

Test(partition, by_parameters_gives_the_end_stages_fewer_blocks, .timeout = 30)
{
    /* V = 512, C = 32: embeddings 16.9k, head 16.4k, a block 12.6k:
     * uniform (2 blocks each) makes the end stages 42k, params [1,3,3,1]
     * makes the largest 37.7k */
    dt_config c = {.V = 512, .T = 16, .L = 8, .H = 4, .C = 32};
    int bounds[5];
    char err[128];
    cr_assert_eq(dt_pipe_partition(bounds, &c, 4, DT_PARTITION_PARAMS, err, sizeof err), DT_OK);
    size_t worst = 0;
    for (int s = 0; s < 4; s++) {
        cr_assert_lt(bounds[s], bounds[s + 1], "stage %d is empty", s);
        size_t n = owned(&c, bounds[s], bounds[s + 1]);
        worst = n > worst ? n : worst;
    }
    cr_expect_eq(bounds[0], 0);
    cr_expect_eq(bounds[4], 8);
    size_t uniform_worst = owned(&c, 0, 2);
    cr_expect_lt(worst, uniform_worst);
    cr_expect_lt(bounds[1] - bounds[0], bounds[2] - bounds[1]);
}

Test(partition, uniform_gives_the_remainder_to_the_first_stages, .timeout = 10)
{
    dt_config c = {.V = 64, .T = 16, .L = 7, .H = 4, .C = 32};
    int bounds[4];
    char err[128];
    cr_assert_eq(dt_pipe_partition(bounds, &c, 3, DT_PARTITION_UNIFORM, err, sizeof err), DT_OK);
    int want[4] = {0, 3, 5, 7};
    cr_expect_arr_eq(bounds, want, sizeof want);
}

Test(partition, more_stages_than_blocks_is_refused_by_name, .timeout = 10)
{
    dt_config c = dt_config_seed(); /* L = 2 */
    int bounds[4];
    char err[160];
    cr_expect_eq(dt_pipe_partition(bounds, &c, 3, DT_PARTITION_PARAMS, err, sizeof err), DT_EINVAL);
    cr_expect(strstr(err, "3 stages for 2 blocks") != NULL, "%s", err);
}

/* ---- the executor without a network (one stage) --------------------------- */

static const dt_config small = {.V = 64, .T = 8, .L = 2, .H = 2, .C = 16};

Test(executor, refuses_a_model_that_is_not_its_stage_or_has_too_few_slots, .timeout = 10)
{
    char err[128];
    dt_pipe_schedule *s = dt_pipe_schedule_create(DT_PIPE_GPIPE, 1, 3, err, sizeof err);
    dt_model *half, *one_slot;
    dt_stage_spec a = {0, 1, 3, 1, false}, b = {0, 2, 1, 1, false};
    cr_assert_eq(dt_model_create_stage(&half, &small, dt_backend_cpu(), 1, &a), DT_OK);
    cr_assert_eq(dt_model_create_stage(&one_slot, &small, dt_backend_cpu(), 1, &b), DT_OK);
    dt_pipe *p;
    cr_expect_eq(dt_pipe_create(&p, NULL, half, s), DT_EINVAL);
    cr_expect(strstr(dt_pipe_error(p), "blocks [0, 1) of 2, which is not "
                                       "stage 0 of 1") != NULL,
              "%s", dt_pipe_error(p));
    dt_pipe_destroy(p);
    cr_expect_eq(dt_pipe_create(&p, NULL, one_slot, s), DT_EINVAL);
    cr_expect(strstr(dt_pipe_error(p), "keeps 3 micro-batches") != NULL, "%s", dt_pipe_error(p));
    dt_pipe_destroy(p);
    dt_model_destroy(half);
    dt_model_destroy(one_slot);
    dt_pipe_schedule_destroy(s);
}

/* One stage, ZB-H1's split backward through the executor: the gradients
 * of --grad-accum 3, bitwise. */
Test(executor, one_stage_with_split_backward_equals_gradient_accumulation, .timeout = 30)
{
    enum { M = 3, N = 2 * 8 };
    int x[M][N], y[M][N];
    dt_rng r;
    dt_rng_seed(&r, 3);
    for (int k = 0; k < M; k++)
        for (int i = 0; i < N; i++) {
            x[k][i] = (int)(dt_rng_next(&r) % 64);
            y[k][i] = (int)(dt_rng_next(&r) % 64);
        }
    dt_model *ref, *st;
    cr_assert_eq(dt_model_create(&ref, &small, dt_backend_cpu(), 2), DT_OK);
    dt_model_init(ref, 9);
    dt_model_zero_grad(ref);
    float want = 0;
    for (int k = 0; k < M; k++) {
        cr_assert_eq(dt_model_forward(ref, x[k], y[k], 2, 8), DT_OK);
        want += ref->mean_loss / (float)M;
        cr_assert_eq(dt_model_backward(ref, 1.0f / M), DT_OK);
    }
    char err[128];
    dt_pipe_schedule *s = dt_pipe_schedule_create(DT_PIPE_ZB, 1, M, err, sizeof err);
    dt_stage_spec sp = {0, 2, s->act_slots[0], s->grad_slots[0], false};
    cr_assert_eq(dt_model_create_stage(&st, &small, dt_backend_cpu(), 2, &sp), DT_OK);
    dt_model_init(st, 9);
    dt_model_zero_grad(st);
    dt_pipe *p;
    cr_assert_eq(dt_pipe_create(&p, NULL, st, s), DT_OK, "%s", dt_pipe_error(p));
    const int *in[M] = {x[0], x[1], x[2]}, *tg[M] = {y[0], y[1], y[2]};
    float got;
    cr_assert_eq(dt_pipe_run(p, in, tg, 2, 8, &got), DT_OK, "%s", dt_pipe_error(p));
    cr_expect(memcmp(&got, &want, sizeof got) == 0, "loss %.9g, want %.9g", got, want);
    float *g = malloc(ref->num_params * sizeof(float));
    float *h = malloc(ref->num_params * sizeof(float));
    dt_model_get_grads(ref, g);
    dt_model_get_grads(st, h);
    cr_expect(memcmp(g, h, ref->num_params * sizeof(float)) == 0,
              "gradients differ from --grad-accum %d", M);
    free(g);
    free(h);
    dt_pipe_destroy(p);
    dt_pipe_schedule_destroy(s);
    dt_model_destroy(st);
    dt_model_destroy(ref);
}
