/*
 * test_pipeline_train.c — pipelined training on real ranks (threads of
 * this process, each with its own communicator over loopback TCP) is the
 * same computation as one process accumulating gradients.
 *
 * For p = 2, 3, 4 stages, each schedule, and m in {1, p-1, p, 2p+1}
 * micro-batches: K = 2 AdamW steps of the pipeline against K steps of one
 * full model running the same micro-batches with `--grad-accum m`
 * semantics (backward with dloss = 1/m each, one update). Every stage's
 * parameters must equal the reference's slice BITWISE, and every step's
 * loss too: the stage split changes no kernel's operands and the
 * schedules add micro-batch gradients in the same order (0 .. m-1), so
 * there is no rounding difference to tolerate. (Bitwise implies the
 * 1e-6 relative / 1e-5 loss bounds of the specification.)
 *
 * The same with every stage recomputing its blocks' activations
 * (--recompute): still bitwise.
 *
 * When each receive is posted: as soon as its slot is free, ahead of the
 * compute that precedes it in the list.
 *
 * Then the failure cases: a stage whose micro-batches have another shape
 * than its neighbour's gets a DT_EPROTO naming both sides, and its
 * neighbour fails too instead of waiting.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dt_pipe.h"
#include "rank_threads.h"

enum { K = 2, B = 2, T = 16, MAX_M = 9 };
static const dt_config cfg = {.V = 64, .T = 16, .L = 4, .H = 4, .C = 32};
static const uint64_t SEED = 5;
static const float LR = 1e-2f;

typedef struct scenario {
    dt_pipe_kind kind;
    int m;
    bool recompute; /* the stages keep only their blocks' outputs */
    int x[K][MAX_M][B * T], y[K][MAX_M][B * T];
    float *ref_params; /* [num_params] after K steps */
    float ref_loss[K];
    float *got_params; /* each stage writes its slice */
    float got_loss[K];
    int shape_B[RANK_THREADS_MAX]; /* micro-batch rows each rank uses */
    /* the last step's timeline: each stage's receive posts and F starts */
    double recv_post[RANK_THREADS_MAX][MAX_M], f_start[RANK_THREADS_MAX][MAX_M];
} scenario;

static void make_data(scenario *s)
{
    dt_rng r;
    dt_rng_seed(&r, 77);
    for (int k = 0; k < K; k++)
        for (int j = 0; j < MAX_M; j++)
            for (int i = 0; i < B * T; i++) {
                s->x[k][j][i] = (int)(dt_rng_next(&r) % (uint64_t)cfg.V);
                s->y[k][j][i] = (int)(dt_rng_next(&r) % (uint64_t)cfg.V);
            }
}

/* One process, --grad-accum m: the reference. */
static void reference(scenario *s)
{
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &cfg, dt_backend_cpu(), B), DT_OK);
    dt_model_init(m, SEED);
    dt_adamw_hparams h = dt_adamw_defaults(LR);
    for (int k = 0; k < K; k++) {
        float loss = 0;
        dt_model_zero_grad(m);
        for (int j = 0; j < s->m; j++) {
            cr_assert_eq(dt_model_forward(m, s->x[k][j], s->y[k][j], B, T), DT_OK);
            loss += m->mean_loss / (float)s->m;
            cr_assert_eq(dt_model_backward(m, 1.0f / (float)s->m), DT_OK);
        }
        s->ref_loss[k] = loss;
        cr_assert_eq(dt_model_update(m, &h, k + 1), DT_OK);
    }
    s->ref_params = malloc(m->num_params * sizeof(float));
    s->got_params = calloc(m->num_params, sizeof(float));
    dt_model_get_params(m, s->ref_params);
    dt_model_destroy(m);
}

/* When the last run posted each receive and began each F on stage st. */
static void keep_timeline(scenario *s, const dt_pipe_schedule *sched, int st, const dt_pipe *pp)
{
    const double *t0, *t1;
    dt_pipe_last_timeline(pp, &t0, &t1);
    for (int i = 0; i < sched->n[st]; i++) {
        const dt_pipe_action *a = &sched->actions[st][i];
        if (a->op == DT_PIPE_RECV_ACT || a->op == DT_PIPE_RECV_GRAD)
            s->recv_post[st][a->mb] = t0[i];
        else if (a->op == DT_PIPE_F)
            s->f_start[st][a->mb] = t0[i];
    }
}

/* One stage's K steps; fails the rank with the pipeline's message. */
static void train_stage(rank_ctx *rc, scenario *s, const dt_pipe_schedule *sched, dt_model *m,
                        dt_pipe *pp)
{
    int st = rc->rank, p = rc->world;
    const int *in[MAX_M], *tg[MAX_M];
    dt_adamw_hparams h = dt_adamw_defaults(LR);
    for (int k = 0; k < K; k++) {
        for (int j = 0; j < s->m; j++)
            in[j] = s->x[k][j], tg[j] = s->y[k][j];
        float loss;
        dt_model_zero_grad(m);
        int rows = s->shape_B[st] ? s->shape_B[st] : B;
        dt_status rs = dt_pipe_run(pp, st == 0 ? in : NULL, st == p - 1 ? tg : NULL, rows, T,
                                   &loss);
        if (rs != DT_OK) {
            rank_fail(rc, "%s", dt_pipe_error(pp));
            return;
        }
        if (st == p - 1)
            s->got_loss[k] = loss;
        dt_model_update(m, &h, k + 1);
    }
    keep_timeline(s, sched, st, pp);
    dt_model_get_params(m, s->got_params + m->param_lo);
}

static void run_rank(rank_ctx *rc)
{
    scenario *s = rc->arg;
    char err[256];
    int bounds[RANK_THREADS_MAX + 1];
    dt_pipe_schedule *sched = dt_pipe_schedule_create(s->kind, rc->world, s->m, err, sizeof err);
    if (!sched ||
        dt_pipe_partition(bounds, &cfg, rc->world, DT_PARTITION_PARAMS, err, sizeof err) != DT_OK) {
        rank_fail(rc, "%s", err);
        dt_pipe_schedule_destroy(sched);
        return;
    }
    int st = rc->rank;
    dt_stage_spec sp = {bounds[st], bounds[st + 1], sched->act_slots[st], sched->grad_slots[st],
                        s->recompute};
    dt_model *m;
    dt_pipe *pp = NULL;
    if (dt_model_create_stage(&m, &cfg, dt_backend_cpu(), B, &sp) != DT_OK)
        rank_fail(rc, "%s", dt_model_error(m));
    else if (dt_model_init(m, SEED), dt_pipe_create(&pp, rc->comm, m, sched) != DT_OK)
        rank_fail(rc, "%s", dt_pipe_error(pp));
    else
        train_stage(rc, s, sched, m, pp);
    dt_pipe_destroy(pp);
    dt_model_destroy(m);
    dt_pipe_schedule_destroy(sched);
}

static void expect_bitwise(const scenario *s, int p)
{
    const char *k = dt_pipe_kind_name(s->kind);
    size_t n = dt_config_num_params(&cfg), worst = 0;
    double maxrel = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)s->got_params[i] - s->ref_params[i]);
        double r = d / (fabs((double)s->ref_params[i]) + 1e-30);
        if (memcmp(&s->got_params[i], &s->ref_params[i], sizeof(float)))
            worst++;
        maxrel = r > maxrel ? r : maxrel;
    }
    cr_expect_eq(worst, 0,
                 "%s p=%d m=%d: %zu of %zu parameters differ from "
                 "--grad-accum (max relative %.3g)",
                 k, p, s->m, worst, n, maxrel);
    for (int j = 0; j < K; j++)
        cr_expect(memcmp(&s->got_loss[j], &s->ref_loss[j], sizeof(float)) == 0,
                  "%s p=%d m=%d step %d: loss %.9g, --grad-accum "
                  "%.9g",
                  k, p, s->m, j, s->got_loss[j], s->ref_loss[j]);
}

static void pipeline_equals_grad_accum(dt_pipe_kind kind, int p, bool recompute)
{
    int ms[4] = {1, p - 1, p, 2 * p + 1};
    for (int i = 0; i < 4; i++) {
        if (i == 1 && p - 1 == 1)
            continue; /* the same case as m = 1 */
        scenario *s = calloc(1, sizeof *s);
        s->kind = kind;
        s->m = ms[i];
        s->recompute = recompute;
        make_data(s);
        reference(s);
        rank_job job;
        int failed = rank_threads_run(&job, p, run_rank, s);
        for (int r = 0; r < p; r++)
            cr_assert(!job.ranks[r].failed, "%s p=%d m=%d: rank %d: %s", dt_pipe_kind_name(kind), p,
                      s->m, r, job.ranks[r].msg);
        cr_assert_eq(failed, 0);
        expect_bitwise(s, p);
        free(s->ref_params);
        free(s->got_params);
        free(s);
    }
}

#define EQUALS_GRAD_ACCUM(name, kind, p)                                                   \
    Test(pipeline_train, name##_on_##p##_stages_equals_grad_accum_bitwise, .timeout = 120) \
    {                                                                                      \
        pipeline_equals_grad_accum(kind, p, false);                                        \
    }

EQUALS_GRAD_ACCUM(gpipe, DT_PIPE_GPIPE, 2)
EQUALS_GRAD_ACCUM(gpipe, DT_PIPE_GPIPE, 3)
EQUALS_GRAD_ACCUM(gpipe, DT_PIPE_GPIPE, 4)
EQUALS_GRAD_ACCUM(one_f_one_b, DT_PIPE_1F1B, 2)
EQUALS_GRAD_ACCUM(one_f_one_b, DT_PIPE_1F1B, 3)
EQUALS_GRAD_ACCUM(one_f_one_b, DT_PIPE_1F1B, 4)
EQUALS_GRAD_ACCUM(zero_bubble, DT_PIPE_ZB, 2)
EQUALS_GRAD_ACCUM(zero_bubble, DT_PIPE_ZB, 3)
EQUALS_GRAD_ACCUM(zero_bubble, DT_PIPE_ZB, 4)

/* --recompute: each stage's micro-batches in flight share one workspace,
 * every block is rebuilt there before its backward (ZB-H1's W rebuilds
 * its inner gradients too), and the result is still the same bits. */
#define RECOMPUTE_EQUALS_GRAD_ACCUM(name, kind, p)                                        \
    Test(pipeline_train, name##_with_recompute_on_##p##_stages_equals_grad_accum_bitwise, \
         .timeout = 120)                                                                  \
    {                                                                                     \
        pipeline_equals_grad_accum(kind, p, true);                                        \
    }

RECOMPUTE_EQUALS_GRAD_ACCUM(gpipe, DT_PIPE_GPIPE, 2)
RECOMPUTE_EQUALS_GRAD_ACCUM(one_f_one_b, DT_PIPE_1F1B, 3)
RECOMPUTE_EQUALS_GRAD_ACCUM(zero_bubble, DT_PIPE_ZB, 2)
RECOMPUTE_EQUALS_GRAD_ACCUM(zero_bubble, DT_PIPE_ZB, 3)

Test(pipeline_train, mismatched_activation_shapes_are_a_protocol_error_naming_both_sides,
     .timeout = 60)
{
    scenario *s = calloc(1, sizeof *s);
    s->kind = DT_PIPE_1F1B;
    s->m = 2;
    s->shape_B[1] = 1; /* stage 1 expects (1, T, C), stage 0 sends (2, T, C) */
    make_data(s);
    s->got_params = calloc(dt_config_num_params(&cfg), sizeof(float));
    rank_job job;
    rank_threads_run(&job, 2, run_rank, s);
    const char *m1 = job.ranks[1].msg;
    cr_assert(job.ranks[1].failed, "stage 1 accepted the wrong shape");
    cr_expect(strstr(m1, "DT_EPROTO") != NULL, "%s", m1);
    cr_expect(strstr(m1, "rank 0") != NULL && strstr(m1, "4096 B") &&
                  strstr(m1, "expected recv #0 with tag 1879048192 (512 x f32; 2048 B)"),
              "the message names both sides and sizes: %s", m1);
    cr_expect(strstr(m1, "activations of micro-batch 0") != NULL, "%s", m1);
    cr_expect(job.ranks[0].failed, "stage 0 did not notice: %s", job.ranks[0].msg);
    free(s->got_params);
    free(s);
}

/* Runs kind on p = 2 stages with m micro-batches, its timeline kept. */
static scenario *timed_run(dt_pipe_kind kind, int m)
{
    scenario *s = calloc(1, sizeof *s);
    s->kind = kind;
    s->m = m;
    make_data(s);
    s->got_params = calloc(dt_config_num_params(&cfg), sizeof(float));
    rank_job job;
    rank_threads_run(&job, 2, run_rank, s);
    for (int r = 0; r < 2; r++)
        cr_assert(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    free(s->got_params);
    return s;
}

Test(pipeline_train, a_receive_is_posted_as_soon_as_its_slot_is_free, .timeout = 60)
{
    /* GPipe's last stage holds every micro-batch: all its receives go out
     * before its first forward. */
    scenario *s = timed_run(DT_PIPE_GPIPE, 4);
    for (int mb = 0; mb < 4; mb++)
        cr_expect(s->recv_post[1][mb] <= s->f_start[1][0],
                  "gpipe stage 1: recv_act%d posted %.6f s after F0", mb,
                  s->recv_post[1][mb] - s->f_start[1][0]);
    free(s);
    /* 1F1B's stage 0 has one gradient set, free after B(mb - 1): the
     * receive of mb's gradient goes out before F(mb + 1), which its list
     * puts first. */
    s = timed_run(DT_PIPE_1F1B, 4);
    for (int mb = 1; mb + 1 < 4; mb++)
        cr_expect(s->recv_post[0][mb] <= s->f_start[0][mb + 1],
                  "1f1b stage 0: recv_grad%d posted %.6f s after F%d", mb,
                  s->recv_post[0][mb] - s->f_start[0][mb + 1], mb + 1);
    free(s);
}
