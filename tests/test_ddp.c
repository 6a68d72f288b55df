/*
 * test_ddp.c — data parallelism is the same arithmetic as one process.
 *
 * The specification: N ranks, each running B sequences and k micro-steps,
 * must train exactly like one process accumulating gradients over the same
 * N·k·B sequences (dloss = 1/(N·k) per micro-batch), up to the rounding of
 * a different summation order: losses and final parameters within 1e-6
 * (relative). That holds for DDP at every bucket size (one tensor per
 * bucket up to one bucket for everything), with gradient accumulation
 * (no_sync on all micro-steps but the last), and for ZeRO-1, including a
 * parameter count that no world size divides (805 = 5·7·23), at every
 * bucket size (a piece of gradient per tensor, cut again at shard
 * boundaries, up to one bucket) and both overlapped and plain. After every
 * step all ranks must hold bitwise identical parameters (hashes compared
 * across ranks; overlapped ZeRO-1: after the next forward, which is when
 * its prefetched parameters are complete). ZeRO-2 and ZeRO-3 (sharded
 * gradients; sharded parameters, gathered unit by unit) are ZeRO-1 to the
 * bit, with and without recomputation and accumulation.
 *
 * Ranks run as threads over loopback TCP (rank_threads.h); the serial
 * reference runs on the test's thread first. Rank 0 initialises its model
 * from the seed, the others from another seed, so only the initial
 * broadcast can make them agree.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dt_optim.h"
#include "rank_threads.h"
#include "numeric_compare.h"

#define MAX_STEPS 8
#define TOL 1e-6
/* Parameters after the steps against the serial run: N ranks sum the
 * gradients in another order than one process does, and AdamW divides
 * each by its own small root mean square, so rounding grows in the
 * parameters more than in the losses: measured up to 1.07e-6 in a clang
 * build (whose FMA contraction in the attention tiles' softmax differs
 * from GCC's), 2e-6 allowed. */
#define PARAM_TOL 2e-6

/* ZeRO-1 overlapped: dt_zero1_forward / _backward / _step_async (reduces
 * from backward's hook, the gather prefetched stage by stage by the next
 * forward); ZeRO-1 plain: dt_model_forward / _backward and the blocking
 * dt_zero1_step, which reduces everything itself. ZeRO-2: ZeRO-1
 * overlapped, with the gradients sharded too (the model holds none).
 * ZeRO-3: ZeRO-2 with the parameters sharded too (held whole only for the
 * replica check and the final read). */
typedef enum mode { MODE_DDP, MODE_ZERO1, MODE_ZERO1_PLAIN, MODE_ZERO2, MODE_ZERO3 } mode;

typedef struct scenario {
    dt_config cfg;
    int B, k, steps; /* per rank: B sequences, k micro-steps */
    size_t bucket_bytes;
    mode how;
    bool recompute; /* the ranks' models recompute activations */
    float lr;
    uint64_t seed;
    /* results, one slot per rank */
    float losses[RANK_THREADS_MAX][MAX_STEPS];
    float *params[RANK_THREADS_MAX];
} scenario;

/* V=8 C=5 H=1 L=2 T=5: 805 parameters, odd and prime to 3. */
static dt_config odd_config(void)
{
    return (dt_config){.V = 8, .T = 5, .L = 2, .H = 1, .C = 5};
}

static scenario make_scenario(mode how, int k, size_t bucket_bytes)
{
    return (scenario){.cfg = odd_config(),
                      .B = 2,
                      .k = k,
                      .steps = 4,
                      .bucket_bytes = bucket_bytes,
                      .how = how,
                      .lr = 1e-2f,
                      .seed = 42};
}


static dt_dataset *open_data(const scenario *s)
{
    dt_dataset *d;
    cr_assert_eq(dt_dataset_random(&d, s->cfg.V, 4096, s->seed), DT_OK);
    return d;
}

/* Global micro-batch g of step t covers rows [t·G + g·B, +B), G = N·k·B;
 * rank r's micro-step j is g = r·k + j. */
static uint64_t first_row(const scenario *s, int world, int step, int g)
{
    return (uint64_t)step * (uint64_t)(world * s->k * s->B) + (uint64_t)g * (uint64_t)s->B;
}

/* One process, N·k micro-batches per step: the reference. */
static void serial_reference(const scenario *s, int world, float *losses, float *params)
{
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &s->cfg, dt_backend_cpu(), s->B), DT_OK);
    dt_model_init(m, s->seed);
    dt_dataset *d = open_data(s);
    int T = s->cfg.T, G = world * s->k;
    int *x = malloc(sizeof(int) * (size_t)(s->B * T));
    int *y = malloc(sizeof(int) * (size_t)(s->B * T));
    dt_adamw_hparams h = dt_adamw_defaults(s->lr);
    for (int t = 0; t < s->steps; t++) {
        dt_model_zero_grad(m);
        double sum = 0;
        for (int g = 0; g < G; g++) {
            cr_assert_eq(dt_dataset_batch(x, y, d, DT_TRAIN, s->seed, first_row(s, world, t, g),
                                          s->B, T),
                         DT_OK);
            cr_assert_eq(dt_model_forward(m, x, y, s->B, T), DT_OK);
            cr_assert_eq(dt_model_backward(m, 1.0f / (float)G), DT_OK);
            sum += m->mean_loss;
        }
        losses[t] = (float)(sum / G);
        cr_assert_eq(dt_model_update(m, &h, t + 1), DT_OK);
    }
    dt_model_get_params(m, params);
    free(x);
    free(y);
    dt_dataset_close(d);
    dt_model_destroy(m);
}

/* The gradient-sync and optimizer half of a step, DDP or ZeRO-1. */
static dt_status rank_step(rank_ctx *rc, scenario *s, dt_model *m, dt_ddp *ddp, dt_zero1 *z,
                           int step)
{
    dt_adamw_hparams h = dt_adamw_defaults(s->lr);
    dt_status st;
    if (ddp) {
        st = dt_ddp_wait(ddp, NULL);
        if (st != DT_OK)
            return rank_fail(rc, "%s", dt_ddp_error(ddp)), st;
        st = dt_model_update(m, &h, step + 1);
        return st;
    }
    st = s->how != MODE_ZERO1_PLAIN ? dt_zero1_step_async(z, &h, step + 1, NULL)
                                    : dt_zero1_step(z, &h, step + 1, NULL);
    if (st != DT_OK)
        rank_fail(rc, "%s", dt_zero1_error(z));
    return st;
}

/* Forward and backward of micro-step j of step t. */
static dt_status micro_step(scenario *s, dt_model *m, dt_ddp *ddp, dt_zero1 *z, const int *x,
                            const int *y, int j)
{
    bool last = j == s->k - 1;
    float dloss = 1.0f / (float)s->k;
    if (s->how == MODE_ZERO1 || s->how >= MODE_ZERO2) {
        dt_status st = dt_zero1_forward(z, x, y, s->B, s->cfg.T);
        return st != DT_OK ? st : dt_zero1_backward(z, dloss, last);
    }
    dt_status st = dt_model_forward(m, x, y, s->B, s->cfg.T);
    if (st == DT_OK && ddp)
        return dt_ddp_backward(ddp, dloss, last);
    return st != DT_OK ? st : dt_model_backward(m, dloss);
}

/* Every rank's parameters bitwise equal (the replica check). */
static dt_status expect_same_replicas(rank_ctx *rc, dt_comm *comm, const dt_model *m, dt_zero1 *z,
                                      int t)
{
    bool same = false;
    dt_status st = z ? dt_zero1_hold_params(z, true) : DT_OK; /* ZeRO-3: gathered whole */
    if (st == DT_OK)
        st = dt_check_replicas(comm, m, &same, NULL);
    if (st == DT_OK && !same)
        rank_fail(rc, "step %d: replicas differ", t);
    return st;
}

/* Trains s on `comm` (the job's world or a group of it) as rank
 * dt_comm_rank(comm) of dt_comm_size(comm). */
static void train_on(rank_ctx *rc, scenario *s, dt_comm *comm)
{
    int rank = dt_comm_rank(comm), world = dt_comm_size(comm);
    dt_model *m;
    dt_status made = s->recompute ? dt_model_create_recompute(&m, &s->cfg, dt_backend_cpu(), s->B)
                                  : dt_model_create(&m, &s->cfg, dt_backend_cpu(), s->B);
    if (made != DT_OK) {
        rank_fail(rc, "model: %s", m ? dt_model_error(m) : "ENOMEM");
        dt_model_destroy(m);
        return;
    }
    dt_model_init(m, rank == 0 ? s->seed : s->seed + 1000 + rank);
    dt_ddp *ddp = NULL;
    dt_zero1 *z = NULL;
    dt_status st = s->how == MODE_DDP     ? dt_ddp_create(&ddp, m, comm, s->bucket_bytes)
                   : s->how == MODE_ZERO2 ? dt_zero2_create(&z, m, comm, s->bucket_bytes)
                   : s->how == MODE_ZERO3 ? dt_zero3_create(&z, m, comm, s->bucket_bytes)
                                          : dt_zero1_create_bucketed(&z, m, comm, s->bucket_bytes);
    if (st != DT_OK)
        rank_fail(rc, "create: %s", ddp ? dt_ddp_error(ddp) : z ? dt_zero1_error(z) : "ENOMEM");
    dt_dataset *d = NULL;
    dt_dataset_random(&d, s->cfg.V, 4096, s->seed);
    int T = s->cfg.T, n = s->B * T;
    int *x = malloc(sizeof(int) * (size_t)n), *y = malloc(sizeof(int) * (size_t)n);
    bool prefetch = s->how == MODE_ZERO1 || s->how >= MODE_ZERO2;
    for (int t = 0; st == DT_OK && t < s->steps; t++) {
        dt_model_zero_grad(m);
        float loss = 0;
        for (int j = 0; st == DT_OK && j < s->k; j++) {
            dt_dataset_batch(x, y, d, DT_TRAIN, s->seed, first_row(s, world, t, rank * s->k + j),
                             s->B, T);
            st = micro_step(s, m, ddp, z, x, y, j);
            loss += m->mean_loss / (float)s->k;
            if (st == DT_OK && prefetch && t > 0 && j == 0)
                st = expect_same_replicas(rc, comm, m, z, t - 1);
        }
        if (st == DT_OK)
            st = rank_step(rc, s, m, ddp, z, t);
        if (st == DT_OK)
            st = dt_allreduce(comm, &loss, 1, DT_F32, DT_AVG);
        s->losses[rank][t] = loss;
        if (st == DT_OK && !prefetch)
            st = expect_same_replicas(rc, comm, m, z, t);
    }
    if (st == DT_OK && prefetch) /* leaves ZeRO-3's parameters held, to be read */
        st = expect_same_replicas(rc, comm, m, z, s->steps - 1);
    if (st != DT_OK)
        rank_fail(rc, "training: %s: %s", dt_status_name(st),
                  z     ? dt_zero1_error(z)
                  : ddp ? dt_ddp_error(ddp)
                        : "");
    s->params[rank] = malloc(m->num_params * sizeof(float));
    dt_model_get_params(m, s->params[rank]);
    free(x);
    free(y);
    dt_dataset_close(d);
    dt_ddp_destroy(ddp);
    dt_zero1_destroy(z);
    dt_model_destroy(m);
}

static void run_rank(rank_ctx *rc)
{
    train_on(rc, rc->arg, rc->comm);
}

/* Compares the results of s's `world` ranks with the reference. */
static void expect_serial_results(scenario *s, int world)
{
    size_t P = dt_config_num_params(&s->cfg);
    float ref_losses[MAX_STEPS];
    float *ref = malloc(P * sizeof(float));
    serial_reference(s, world, ref_losses, ref);
    for (int r = 0; r < world; r++) {
        for (int t = 0; t < s->steps; t++) {
            double e = fabs((double)s->losses[r][t] - ref_losses[t]) / fabs((double)ref_losses[t]);
            cr_expect(e <= TOL,
                      "N=%d bucket=%zu rank %d step %d: loss %.9g "
                      "vs %.9g (rel %.3g)",
                      world, s->bucket_bytes, r, t, s->losses[r][t], ref_losses[t], e);
        }
        double e = rel_l2(s->params[r], ref, P);
        cr_expect(e <= PARAM_TOL, "N=%d bucket=%zu rank %d: parameters off by %.3g", world,
                  s->bucket_bytes, r, e);
        free(s->params[r]);
        s->params[r] = NULL;
    }
    free(ref);
}

/* Runs s on `world` ranks and compares every rank with the reference. */
static void expect_equals_serial(scenario *s, int world)
{
    rank_job job;
    int failed = rank_threads_run(&job, world, run_rank, s);
    for (int r = 0; r < world; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
    expect_serial_results(s, world);
}

/* tiny: one tensor per bucket; 1 KB: a few tensors each; 0: one bucket */
static const size_t bucket_sizes[] = {16, 1024, 0};

static void ddp_equals_serial_on(int world)
{
    for (size_t i = 0; i < sizeof bucket_sizes / sizeof bucket_sizes[0]; i++) {
        scenario s = make_scenario(MODE_DDP, 1, bucket_sizes[i]);
        expect_equals_serial(&s, world);
    }
}

Test(ddp, one_rank_equals_serial_at_every_bucket_size, .timeout = 60)
{
    ddp_equals_serial_on(1);
}

Test(ddp, two_ranks_equal_serial_at_every_bucket_size, .timeout = 60)
{
    ddp_equals_serial_on(2);
}

Test(ddp, three_ranks_equal_serial_at_every_bucket_size, .timeout = 60)
{
    ddp_equals_serial_on(3);
}

Test(ddp, four_ranks_equal_serial_at_every_bucket_size, .timeout = 60)
{
    ddp_equals_serial_on(4);
}

Test(ddp, gradient_accumulation_syncs_only_the_last_micro_step, .timeout = 60)
{
    scenario s = make_scenario(MODE_DDP, 3, 64);
    expect_equals_serial(&s, 2);
}

Test(ddp, seed_model_on_four_ranks_equals_serial, .timeout = 60)
{
    scenario s = make_scenario(MODE_DDP, 1, 4096);
    s.cfg = dt_config_seed();
    s.steps = 3;
    expect_equals_serial(&s, 4);
}

static void zero1_equals_serial_on(int world, mode how)
{
    for (size_t i = 0; i < sizeof bucket_sizes / sizeof bucket_sizes[0]; i++) {
        scenario s = make_scenario(how, 1, bucket_sizes[i]);
        expect_equals_serial(&s, world);
    }
}

Test(zero1, overlapped_equals_serial_on_one_to_four_ranks_at_every_bucket_size, .timeout = 120)
{
    cr_assert_eq(dt_config_num_params(&(dt_config){.V = 8, .T = 5, .L = 2, .H = 1, .C = 5}), 805);
    for (int world = 1; world <= 4; world++)
        zero1_equals_serial_on(world, MODE_ZERO1);
}

Test(zero1, plain_backward_and_blocking_step_equal_serial_on_one_to_four_ranks, .timeout = 120)
{
    for (int world = 1; world <= 4; world++)
        zero1_equals_serial_on(world, MODE_ZERO1_PLAIN);
}

Test(zero1, equals_serial_with_gradient_accumulation, .timeout = 60)
{
    scenario s = make_scenario(MODE_ZERO1, 2, 64);
    expect_equals_serial(&s, 3);
    scenario plain = make_scenario(MODE_ZERO1_PLAIN, 2, 0);
    expect_equals_serial(&plain, 3);
}

/* Rank's check for the test below: one bucket for everything (bucket
 * size 0 = 25 MB) is one gradient piece per shard. */
static void expect_one_piece_per_shard(rank_ctx *rc)
{
    dt_config c = odd_config();
    dt_model *m = NULL;
    dt_zero1 *z = NULL;
    if (dt_model_create(&m, &c, dt_backend_cpu(), 1) != DT_OK ||
        dt_zero1_create_bucketed(&z, m, rc->comm, 0) != DT_OK)
        rank_fail(rc, "create failed");
    else if (dt_zero1_num_buckets(z) != dt_comm_size(rc->comm))
        rank_fail(rc, "%d pieces on %d ranks", dt_zero1_num_buckets(z), dt_comm_size(rc->comm));
    dt_zero1_destroy(z);
    dt_model_destroy(m);
}

/* Buckets are cut at every shard boundary they cross, so a piece is
 * always reduced to the one rank that owns it; one tensor per bucket on
 * one rank is one piece per tensor. */
Test(zero1, a_bucket_is_cut_at_shard_boundaries, .timeout = 30)
{
    rank_job job;
    cr_assert_eq(rank_threads_run(&job, 3, expect_one_piece_per_shard, NULL), 0, "%s",
                 job.ranks[0].msg);
    dt_config c = odd_config();
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &c, dt_backend_cpu(), 1), DT_OK);
    dt_zero1 *z;
    cr_assert_eq(dt_zero1_create_bucketed(&z, m, NULL, 4), DT_OK);
    cr_expect_eq(dt_zero1_num_buckets(z), m->num_tensors);
    dt_zero1_destroy(z);
    dt_model_destroy(m);
}

/* ZeRO-1 against DDP directly, both on 3 ranks. */
Test(zero1, equals_ddp_with_adamw, .timeout = 60)
{
    scenario a = make_scenario(MODE_DDP, 1, 256);
    scenario b = make_scenario(MODE_ZERO1, 1, 0);
    rank_job job;
    cr_assert_eq(rank_threads_run(&job, 3, run_rank, &a), 0, "%s", job.ranks[0].msg);
    cr_assert_eq(rank_threads_run(&job, 3, run_rank, &b), 0, "%s", job.ranks[0].msg);
    size_t P = dt_config_num_params(&a.cfg);
    for (int r = 0; r < 3; r++) {
        for (int t = 0; t < a.steps; t++)
            cr_expect(fabsf(a.losses[r][t] - b.losses[r][t]) <= TOL * fabsf(a.losses[r][t]),
                      "rank %d step %d: %.9g vs %.9g", r, t, a.losses[r][t], b.losses[r][t]);
        cr_expect(rel_l2(b.params[r], a.params[r], P) <= TOL, "rank %d", r);
        free(a.params[r]);
        free(b.params[r]);
    }
}

/* ---- ZeRO-2: sharded gradients ---------------------------------------------- */

Test(zero2, equals_serial_on_one_to_four_ranks_at_every_bucket_size, .timeout = 120)
{
    for (int world = 1; world <= 4; world++)
        zero1_equals_serial_on(world, MODE_ZERO2);
}

Test(zero2, equals_serial_with_gradient_accumulation, .timeout = 60)
{
    scenario s = make_scenario(MODE_ZERO2, 3, 64);
    expect_equals_serial(&s, 2);
}

/* Every element reduced to the same owner by the same tree, the same AdamW
 * on the same shard: ZeRO-2 moves the gradients elsewhere, not the
 * arithmetic, so it is ZeRO-1 to the bit
 * (and both are DDP to 1e-6, the order of a ring's sums against a tree's). */
/* Scenarios a and b on 1-4 ranks: every rank's losses and final
 * parameters equal to the bit. */
static void expect_bitwise_on_one_to_four_ranks(scenario a0, scenario b0)
{
    for (int world = 1; world <= 4; world++) {
        scenario a = a0, b = b0;
        rank_job job;
        cr_assert_eq(rank_threads_run(&job, world, run_rank, &a), 0, "%s", job.ranks[0].msg);
        cr_assert_eq(rank_threads_run(&job, world, run_rank, &b), 0, "%s", job.ranks[0].msg);
        size_t P = dt_config_num_params(&a.cfg);
        for (int r = 0; r < world; r++) {
            cr_expect_eq(memcmp(a.losses[r], b.losses[r], sizeof a.losses[r]), 0,
                         "modes %d, %d N=%d rank %d: losses differ", a.how, b.how, world, r);
            cr_expect_eq(memcmp(a.params[r], b.params[r], P * sizeof(float)), 0,
                         "modes %d, %d N=%d rank %d: parameters differ", a.how, b.how, world, r);
            free(a.params[r]);
            free(b.params[r]);
        }
    }
}

Test(zero2, is_bitwise_zero1_on_one_to_four_ranks, .timeout = 120)
{
    expect_bitwise_on_one_to_four_ranks(make_scenario(MODE_ZERO1, 1, 256),
                                        make_scenario(MODE_ZERO2, 1, 256));
}

/* One rank has nothing to sum with: ZeRO-2's buckets, shard and AdamW on
 * the whole range are one process's backward and update, to the bit. */
Test(zero2, one_rank_is_bitwise_one_process, .timeout = 60)
{
    scenario s = make_scenario(MODE_ZERO2, 1, 64);
    rank_job job;
    cr_assert_eq(rank_threads_run(&job, 1, run_rank, &s), 0, "%s", job.ranks[0].msg);
    size_t P = dt_config_num_params(&s.cfg);
    float ref_losses[MAX_STEPS], *ref = malloc(P * sizeof(float));
    serial_reference(&s, 1, ref_losses, ref);
    cr_expect_eq(memcmp(s.params[0], ref, P * sizeof(float)), 0, "parameters differ");
    free(s.params[0]);
    free(ref);
}

/* Recomputation changes what is kept, not what is computed: DDP and
 * ZeRO-2 with it are themselves without it, to the bit, on 1-4 ranks. */
Test(recompute, ddp_and_zero2_are_bitwise_themselves_without_it, .timeout = 120)
{
    mode modes[] = {MODE_DDP, MODE_ZERO2};
    for (int k = 0; k < 2; k++)
        for (int world = 1; world <= 4; world++) {
            scenario a = make_scenario(modes[k], 1, 256);
            scenario b = make_scenario(modes[k], 1, 256);
            b.recompute = true;
            rank_job job;
            cr_assert_eq(rank_threads_run(&job, world, run_rank, &a), 0, "%s", job.ranks[0].msg);
            cr_assert_eq(rank_threads_run(&job, world, run_rank, &b), 0, "%s", job.ranks[0].msg);
            size_t P = dt_config_num_params(&a.cfg);
            for (int r = 0; r < world; r++) {
                cr_expect_eq(memcmp(a.params[r], b.params[r], P * sizeof(float)), 0,
                             "mode %d N=%d rank %d: parameters differ", k, world, r);
                free(a.params[r]);
                free(b.params[r]);
            }
        }
}

/* Against DDP to 1e-6: a ring's sums in another order than a tree's. */
static void expect_near_ddp_on_four_ranks(mode how)
{
    scenario a = make_scenario(MODE_DDP, 1, 256);
    scenario b = make_scenario(how, 1, 128);
    rank_job job;
    cr_assert_eq(rank_threads_run(&job, 4, run_rank, &a), 0, "%s", job.ranks[0].msg);
    cr_assert_eq(rank_threads_run(&job, 4, run_rank, &b), 0, "%s", job.ranks[0].msg);
    size_t P = dt_config_num_params(&a.cfg);
    for (int r = 0; r < 4; r++) {
        cr_expect(rel_l2(b.params[r], a.params[r], P) <= TOL, "mode %d rank %d", how, r);
        free(a.params[r]);
        free(b.params[r]);
    }
}

Test(zero2, equals_ddp_with_adamw, .timeout = 60)
{
    expect_near_ddp_on_four_ranks(MODE_ZERO2);
}

/* ---- ZeRO-3: sharded parameters ---------------------------------------------- */

/* Gathering a unit copies bits: ZeRO-3 computes on the same parameters as
 * ZeRO-1 and reduces the same gradients the same way, at every bucket
 * size. */
Test(zero3, is_bitwise_zero1_on_one_to_four_ranks_at_every_bucket_size, .timeout = 180)
{
    for (size_t i = 0; i < sizeof bucket_sizes / sizeof bucket_sizes[0]; i++)
        expect_bitwise_on_one_to_four_ranks(make_scenario(MODE_ZERO1, 1, bucket_sizes[i]),
                                            make_scenario(MODE_ZERO3, 1, bucket_sizes[i]));
}

/* Backward gathers each block again before recomputing it. */
Test(zero3, with_recompute_is_bitwise_zero1_without_it, .timeout = 120)
{
    scenario b = make_scenario(MODE_ZERO3, 1, 256);
    b.recompute = true;
    expect_bitwise_on_one_to_four_ranks(make_scenario(MODE_ZERO1, 1, 256), b);
}

/* The no-sync micro-steps gather for their backward too. */
Test(zero3, with_gradient_accumulation_is_bitwise_zero2, .timeout = 120)
{
    expect_bitwise_on_one_to_four_ranks(make_scenario(MODE_ZERO2, 3, 64),
                                        make_scenario(MODE_ZERO3, 3, 64));
}

Test(zero3, equals_ddp_with_adamw, .timeout = 60)
{
    expect_near_ddp_on_four_ranks(MODE_ZERO3);
}

/* ---- over a group of the world ----------------------------------------------- */

/* Four ranks split the way a dp × pp = 2 × 2 grid splits them into its
 * data-parallel groups (world ranks {0,2} and {1,3}); each group trains its
 * own scenario, as if it were a job of two. */
static void train_in_my_group(rank_ctx *rc)
{
    scenario *both = rc->arg;
    dt_comm *dp = NULL;
    if (dt_comm_split(rc->comm, rc->rank % 2, rc->rank, &dp) != DT_OK) {
        rank_fail(rc, "split: %s", dt_comm_error(rc->comm));
        return;
    }
    train_on(rc, &both[rc->rank % 2], dp);
    dt_comm_destroy(dp);
}

Test(ddp, each_group_of_a_split_world_trains_like_a_job_of_its_size, .timeout = 60)
{
    scenario both[2] = {make_scenario(MODE_DDP, 1, 1024), make_scenario(MODE_ZERO1, 2, 0)};
    both[1].seed = 7;
    rank_job job;
    int failed = rank_threads_run(&job, 4, train_in_my_group, both);
    for (int r = 0; r < 4; r++)
        cr_expect(!job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
    expect_serial_results(&both[0], 2); /* DDP on world ranks 0 and 2 */
    expect_serial_results(&both[1], 2); /* ZeRO-1 on world ranks 1 and 3 */
}
