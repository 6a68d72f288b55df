/*
 * test_pipeline_dp.c — pipelines composed with data parallelism: a world
 * of D x P ranks (threads of this process over loopback TCP), split with
 * dt_comm_split into a pipeline group per replica and a data-parallel
 * group per stage, is the same computation as D ranks of plain DDP (or
 * ZeRO-1) accumulating gradients over the same micro-batches.
 *
 * D = P = 2, every schedule, m in {1, p, 2p + 1}, DDP, ZeRO-1 and ZeRO-2
 * (against ZeRO-1's reference; ZeRO's pieces go to their owners during
 * the stage's last backward, armed as DDP's buckets are), K = 2 AdamW
 * steps. Replica r's micro-batch j is the reference's rank r
 * micro-step j. The comparison is BITWISE, parameters and losses: each
 * stage adds its micro-batches' gradients in the order one rank does
 * (test_pipeline_train.c), the mean over two replicas is one addition and
 * one scaling whatever the bucket or shard boundaries, and AdamW is
 * elementwise. Every rank of a stage must hold bitwise identical
 * parameters, DDP must have sent every bucket, and ZeRO must have launched
 * every piece by the end of the stage's last backward (the executor
 * installs their hooks there).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dt_optim.h"
#include "dt_pipe.h"
#include "rank_threads.h"

enum { K = 2, B = 2, T = 16, D = 2, P = 2, MAX_M = 5 };
static const dt_config cfg = {.V = 64, .T = 16, .L = 4, .H = 4, .C = 32};
static const uint64_t SEED = 5;
static const float LR = 1e-2f;
static const size_t BUCKET_BYTES = 8192; /* several buckets per stage */

typedef enum mode { DDP, ZERO1, ZERO2 } mode;
static const char *const mode_names[] = {"ddp", "zero1", "zero2"};

typedef struct scenario {
    dt_pipe_kind kind;
    mode opt;
    int m;
    int x[K][D * MAX_M][B * T], y[K][D * MAX_M][B * T];
    float *ref_params; /* [num_params] DDP rank 0 after K steps */
    float ref_loss[K];
    float *got_params[D]; /* each replica's stages write their slices */
    float got_loss[K];    /* replica 0's last stage, after the average */
} scenario;

static void make_data(scenario *s)
{
    dt_rng r;
    dt_rng_seed(&r, 91);
    for (int k = 0; k < K; k++)
        for (int j = 0; j < D * MAX_M; j++)
            for (int i = 0; i < B * T; i++) {
                s->x[k][j][i] = (int)(dt_rng_next(&r) % (uint64_t)cfg.V);
                s->y[k][j][i] = (int)(dt_rng_next(&r) % (uint64_t)cfg.V);
            }
}

/* DDP's or ZeRO-1's sync and AdamW step; false (rank failed) on error. */
static bool sync_and_step(rank_ctx *rc, dt_model *m, dt_ddp *ddp, dt_zero1 *z, int k)
{
    dt_adamw_hparams h = dt_adamw_defaults(LR);
    if (z)
        return dt_zero1_step(z, &h, k + 1, NULL) == DT_OK ||
               rank_fail(rc, "zero1 step: %s", dt_zero1_error(z));
    dt_comm_stats cs;
    if (dt_ddp_wait(ddp, &cs) != DT_OK)
        return rank_fail(rc, "ddp wait: %s", dt_ddp_error(ddp));
    if (cs.ops != dt_ddp_num_buckets(ddp) && dt_comm_size(rc->comm) > 1)
        rank_fail(rc, "only %d of %d buckets went out", cs.ops, dt_ddp_num_buckets(ddp));
    return dt_model_update(m, &h, k + 1) == DT_OK || rank_fail(rc, "update: %s", dt_model_error(m));
}

static dt_status make_optimizer(dt_model *m, dt_comm *c, mode opt, dt_ddp **ddp, dt_zero1 **z)
{
    if (opt == ZERO2)
        return dt_zero2_create(z, m, c, BUCKET_BYTES);
    return opt == ZERO1 ? dt_zero1_create_bucketed(z, m, c, BUCKET_BYTES)
                        : dt_ddp_create(ddp, m, c, BUCKET_BYTES);
}

/* The reference: rank r of D runs --grad-accum m on micro-batches r·m+j. */
static void reference_rank(rank_ctx *rc)
{
    scenario *s = rc->arg;
    dt_model *m;
    dt_ddp *ddp = NULL;
    dt_zero1 *z = NULL;
    if (dt_model_create(&m, &cfg, dt_backend_cpu(), B) != DT_OK) {
        rank_fail(rc, "model: %s", dt_model_error(m));
        return;
    }
    dt_model_init(m, SEED);
    if (make_optimizer(m, rc->comm, s->opt == DDP ? DDP : ZERO1, &ddp, &z) != DT_OK)
        rank_fail(rc, "optimizer");
    for (int k = 0; k < K && !rc->failed; k++) {
        float loss = 0;
        dt_model_zero_grad(m);
        for (int j = 0; j < s->m; j++) {
            int mb = rc->rank * s->m + j;
            dt_model_forward(m, s->x[k][mb], s->y[k][mb], B, T);
            loss += m->mean_loss / (float)s->m;
            float dloss = 1.0f / (float)s->m;
            if (ddp)
                dt_ddp_backward(ddp, dloss, j == s->m - 1);
            else
                dt_model_backward(m, dloss);
        }
        if (!sync_and_step(rc, m, ddp, z, k))
            break;
        dt_allreduce(rc->comm, &loss, 1, DT_F32, DT_AVG);
        s->ref_loss[k] = loss;
    }
    if (rc->rank == 0)
        dt_model_get_params(m, s->ref_params);
    dt_ddp_destroy(ddp);
    dt_zero1_destroy(z);
    dt_model_destroy(m);
}

typedef struct stage_rank {
    int stage, replica;
    dt_comm *pipe, *dp;
    dt_pipe_schedule *sched;
    dt_model *m;
    dt_pipe *pp;
    dt_ddp *ddp;
    dt_zero1 *z;
} stage_rank;

/* Groups, schedule, stage model, executor and optimizer of one rank. */
static bool open_stage_rank(rank_ctx *rc, scenario *s, stage_rank *sr)
{
    char err[256];
    int bounds[P + 1];
    sr->stage = rc->rank / D;
    sr->replica = rc->rank % D;
    if (dt_comm_split(rc->comm, sr->replica, sr->stage, &sr->pipe) != DT_OK ||
        dt_comm_split(rc->comm, sr->stage, sr->replica, &sr->dp) != DT_OK)
        return rank_fail(rc, "split: %s", dt_comm_error(rc->comm));
    if (!(sr->sched = dt_pipe_schedule_create(s->kind, P, s->m, err, sizeof err)) ||
        dt_pipe_partition(bounds, &cfg, P, DT_PARTITION_PARAMS, err, sizeof err) != DT_OK)
        return rank_fail(rc, "%s", err);
    int st = sr->stage;
    dt_stage_spec sp = {bounds[st], bounds[st + 1], sr->sched->act_slots[st],
                        sr->sched->grad_slots[st], false};
    if (dt_model_create_stage(&sr->m, &cfg, dt_backend_cpu(), B, &sp) != DT_OK)
        return rank_fail(rc, "stage: %s", dt_model_error(sr->m));
    dt_model_init(sr->m, SEED);
    if (dt_pipe_create(&sr->pp, sr->pipe, sr->m, sr->sched) != DT_OK)
        return rank_fail(rc, "%s", dt_pipe_error(sr->pp));
    if (make_optimizer(sr->m, sr->dp, s->opt, &sr->ddp, &sr->z) != DT_OK)
        return rank_fail(rc, "optimizer");
    return true;
}

static void close_stage_rank(stage_rank *sr)
{
    dt_ddp_destroy(sr->ddp);
    dt_zero1_destroy(sr->z);
    dt_pipe_destroy(sr->pp);
    dt_model_destroy(sr->m);
    dt_pipe_schedule_destroy(sr->sched);
    dt_comm_destroy(sr->pipe);
    dt_comm_destroy(sr->dp);
}

/* Every ZeRO piece of the step was launched by the end of the stage's
 * last action that writes weight gradients (its last B, or W). */
static bool pieces_left_during_last_backward(rank_ctx *rc, const stage_rank *sr)
{
    const double *t0, *t1;
    double end = 0, submit, done;
    dt_pipe_last_timeline(sr->pp, &t0, &t1);
    for (int i = 0; i < sr->sched->n[sr->stage]; i++) {
        dt_pipe_op op = sr->sched->actions[sr->stage][i].op;
        if (op == (sr->sched->split_backward ? DT_PIPE_W : DT_PIPE_B))
            end = t1[i];
    }
    for (int i = 0; i < dt_zero1_num_buckets(sr->z); i++)
        if (!dt_zero1_piece_times(sr->z, i, &submit, &done) || submit > end)
            return rank_fail(rc, "piece %d launched %.3f ms after the last backward", i,
                             1e3 * (submit - end));
    return true;
}

/* One pipelined step: the stage's micro-batches, DDP's buckets (ZeRO's
 * pieces) armed for its last backward, the sync, AdamW; the last stages
 * average the loss. */
static bool pipelined_step(rank_ctx *rc, scenario *s, stage_rank *sr, int k)
{
    const int *in[MAX_M], *tg[MAX_M];
    for (int j = 0; j < s->m; j++) {
        int mb = sr->replica * s->m + j;
        in[j] = s->x[k][mb], tg[j] = s->y[k][mb];
    }
    int last = sr->stage == P - 1;
    float loss = 0;
    dt_model_zero_grad(sr->m);
    if (sr->ddp) {
        dt_grad_ready_fn fn;
        void *user;
        if (dt_ddp_arm(sr->ddp, &fn, &user) != DT_OK)
            return rank_fail(rc, "arm: %s", dt_ddp_error(sr->ddp));
        dt_pipe_set_grad_hook(sr->pp, fn, user);
    }
    if (sr->z) {
        dt_grad_ready_fn fn;
        void *user;
        if (dt_zero1_arm(sr->z, &fn, &user) != DT_OK)
            return rank_fail(rc, "arm: %s", dt_zero1_error(sr->z));
        dt_pipe_set_grad_hook(sr->pp, fn, user);
    }
    if (dt_pipe_run(sr->pp, sr->stage == 0 ? in : NULL, last ? tg : NULL, B, T, &loss) != DT_OK)
        return rank_fail(rc, "%s", dt_pipe_error(sr->pp));
    if (!sync_and_step(rc, sr->m, sr->ddp, sr->z, k) ||
        (sr->z && !pieces_left_during_last_backward(rc, sr)))
        return false;
    if (last && dt_allreduce(sr->dp, &loss, 1, DT_F32, DT_AVG) != DT_OK)
        return rank_fail(rc, "loss: %s", dt_comm_error(sr->dp));
    if (last && sr->replica == 0)
        s->got_loss[k] = loss;
    return true;
}

static void pipelined_rank(rank_ctx *rc)
{
    scenario *s = rc->arg;
    stage_rank sr = {0};
    if (open_stage_rank(rc, s, &sr))
        for (int k = 0; k < K && pipelined_step(rc, s, &sr, k); k++)
            ;
    if (sr.m)
        dt_model_get_params(sr.m, s->got_params[sr.replica] + sr.m->param_lo);
    close_stage_rank(&sr);
}

static void expect_bitwise(const scenario *s)
{
    const char *k = dt_pipe_kind_name(s->kind);
    const char *opt = mode_names[s->opt];
    size_t n = dt_config_num_params(&cfg), differ = 0, apart = 0;
    double maxrel = 0;
    for (size_t i = 0; i < n; i++) {
        float g = s->got_params[0][i], r = s->ref_params[i];
        double rel = fabs((double)g - r) / (fabs((double)r) + 1e-30);
        maxrel = rel > maxrel ? rel : maxrel;
        differ += memcmp(&g, &r, sizeof g) != 0;
        apart += memcmp(&s->got_params[0][i], &s->got_params[1][i], sizeof g) != 0;
    }
    cr_expect_eq(differ, 0,
                 "%s %s m=%d: %zu of %zu parameters differ from "
                 "%d ranks with --grad-accum %d (max relative %.3g)",
                 k, opt, s->m, differ, n, D, s->m, maxrel);
    cr_expect_eq(apart, 0,
                 "%s %s m=%d: the replicas of a stage differ in "
                 "%zu parameters",
                 k, opt, s->m, apart);
    for (int j = 0; j < K; j++)
        cr_expect(memcmp(&s->got_loss[j], &s->ref_loss[j], sizeof(float)) == 0,
                  "%s %s m=%d step %d: loss %.9g, DDP %.9g", k, opt, s->m, j, s->got_loss[j],
                  s->ref_loss[j]);
}

static void run_job(int world, rank_fn fn, scenario *s, const char *what)
{
    rank_job job;
    rank_threads_run(&job, world, fn, s);
    for (int r = 0; r < world; r++)
        cr_assert(!job.ranks[r].failed, "%s %s %s m=%d: rank %d: %s", what,
                  dt_pipe_kind_name(s->kind), mode_names[s->opt], s->m, r, job.ranks[r].msg);
}

static void dp_pp_equals_ddp(dt_pipe_kind kind, mode opt)
{
    int ms[3] = {1, P, 2 * P + 1};
    size_t n = dt_config_num_params(&cfg);
    for (int i = 0; i < 3; i++) {
        scenario *s = calloc(1, sizeof *s);
        *s = (scenario){.kind = kind, .opt = opt, .m = ms[i]};
        make_data(s);
        s->ref_params = calloc(n, sizeof(float));
        for (int r = 0; r < D; r++)
            s->got_params[r] = calloc(n, sizeof(float));
        run_job(D, reference_rank, s, "reference");
        run_job(D * P, pipelined_rank, s, "dp x pp");
        expect_bitwise(s);
        free(s->ref_params);
        for (int r = 0; r < D; r++)
            free(s->got_params[r]);
        free(s);
    }
}

#define DP_PP(name, kind, mode, opt)                                                             \
    Test(pipeline_dp, name##_2x2_with_##opt##_equals_2_ranks_grad_accum_bitwise, .timeout = 240) \
    {                                                                                            \
        dp_pp_equals_ddp(kind, mode);                                                            \
    }

DP_PP(gpipe, DT_PIPE_GPIPE, DDP, ddp)
DP_PP(one_f_one_b, DT_PIPE_1F1B, DDP, ddp)
DP_PP(zero_bubble, DT_PIPE_ZB, DDP, ddp)
DP_PP(gpipe, DT_PIPE_GPIPE, ZERO1, zero1)
DP_PP(one_f_one_b, DT_PIPE_1F1B, ZERO1, zero1)
DP_PP(zero_bubble, DT_PIPE_ZB, ZERO1, zero1)
DP_PP(gpipe, DT_PIPE_GPIPE, ZERO2, zero2_as_zero1)
DP_PP(one_f_one_b, DT_PIPE_1F1B, ZERO2, zero2_as_zero1)
DP_PP(zero_bubble, DT_PIPE_ZB, ZERO2, zero2_as_zero1)
