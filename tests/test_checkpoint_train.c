/*
 * test_checkpoint_train.c — checkpoints of real training, ranks as threads.
 *
 * The specification: a run that saves at step k, stops, and resumes from
 * `latest` (in a new job, from a model initialised differently, so only the
 * load can make it right) trains bitwise like the run that never stopped —
 * DDP and ZeRO-1. Every rank's state read back right after the collective
 * save is byte-equal to what it holds in memory (the curriculum's RESUME
 * VERIFIED check). A checkpoint saved on 4 ranks continues on 2, and one
 * saved on 2 continues on 4, with the global batch (ranks x B) kept at 8,
 * losses within 1e-5 relative of the run that was never resharded. ZeRO-2
 * saves ZeRO-1's state (its gradients live only within a step): it resumes
 * bitwise from its own checkpoint and from ZeRO-1's, and a ZeRO-2
 * checkpoint continues as DDP on another world size and back. ZeRO-3
 * too, holding its whole model (one all-gather) to save and load it.
 * Every load
 * here is the trainer's: collective, each shard hashed by one rank.
 */
#include <math.h>

#include "ckpt_fixture.h"
#include "dt_ckpt_train.h"
#include "rank_threads.h"

#define STEPS 6
#define GLOBAL_BATCH 8

/* The optimizer of a phase; ZeRO-2's checkpoint mode is ZeRO-1's. */
typedef enum optimizer { OPT_DDP, OPT_ZERO1, OPT_ZERO2, OPT_ZERO3 } optimizer;

typedef struct run {
    optimizer opt;
    int B;           /* per rank: GLOBAL_BATCH / world */
    int start, stop; /* steps [start, stop) */
    bool load;       /* resume from latest first */
    bool save;       /* save at stop */
    const char *root;
    float losses[STEPS]; /* rank 0's view of the global mean loss */
    float params[RANK_THREADS_MAX][1024];
} run;

static bool fail_ck(rank_ctx *rc, dt_ckpt *ck, const char *what)
{
    return rank_fail(rc, "%s: %s (%s)", what, dt_ckpt_error(ck),
                     dt_ckpt_fault_name(dt_ckpt_last_fault(ck)));
}

/* Reloads the step just saved into scratch buffers and compares every
 * array with the live state: the RESUME VERIFIED check. */
static bool verify_snapshot(rank_ctx *rc, dt_ckpt *ck, const dt_ckpt_state *live)
{
    char dir[4200];
    if (dt_ckpt_latest(ck, dir, sizeof dir) != DT_OK)
        return fail_ck(rc, ck, "latest");
    dt_ckpt_state s = *live;
    size_t n = live->num_params, k = live->opt_n ? live->opt_n : 1;
    s.params = calloc(n, sizeof(float));
    s.adam_m = calloc(k, sizeof(float));
    s.adam_v = calloc(k, sizeof(float));
    s.master = live->master ? calloc(k, sizeof(float)) : NULL;
    s.step = -1;
    bool ok = dt_ckpt_load_collective(ck, rc->comm, dir, &s) == DT_OK;
    if (!ok)
        fail_ck(rc, ck, "reload");
    else if (memcmp(s.params, live->params, n * sizeof(float)) ||
             memcmp(s.adam_m, live->adam_m, live->opt_n * sizeof(float)) ||
             memcmp(s.adam_v, live->adam_v, live->opt_n * sizeof(float)) ||
             (live->master && memcmp(s.master, live->master, live->opt_n * sizeof(float))) ||
             s.step != live->step || s.data_row != live->data_row)
        ok = rank_fail(rc, "rank %d: the reloaded state differs from memory", rc->rank);
    free(s.params);
    free(s.adam_m);
    free(s.adam_v);
    free(s.master);
    return ok;
}

static bool train_steps(rank_ctx *rc, run *R, dt_model *m, dt_dataset *d, dt_ddp *ddp, dt_zero1 *z)
{
    dt_config cfg = fixture_config();
    int T = cfg.T, B = R->B;
    int x[64], y[64];
    dt_adamw_hparams h = dt_adamw_defaults(1e-2f);
    for (int t = R->start; t < R->stop; t++) {
        uint64_t row = (uint64_t)t * GLOBAL_BATCH + (uint64_t)(rc->rank * B);
        dt_model_zero_grad(m);
        if (dt_dataset_batch(x, y, d, DT_TRAIN, 42, row, B, T) != DT_OK ||
            (R->opt == OPT_ZERO3 ? dt_zero1_forward(z, x, y, B, T)
                                 : dt_model_forward(m, x, y, B, T)) != DT_OK)
            return rank_fail(rc, "forward at step %d", t);
        float loss = m->mean_loss;
        dt_status st = ddp                   ? dt_ddp_backward(ddp, 1.0f, true)
                       : R->opt >= OPT_ZERO2 ? dt_zero1_backward(z, 1.0f, true)
                                             : dt_model_backward(m, 1.0f);
        if (st == DT_OK && ddp && (st = dt_ddp_wait(ddp, NULL)) == DT_OK)
            st = dt_model_update(m, &h, t + 1);
        else if (st == DT_OK && z)
            st = dt_zero1_step(z, &h, t + 1, NULL);
        if (st == DT_OK)
            st = dt_allreduce(rc->comm, &loss, 1, DT_F32, DT_AVG);
        if (st != DT_OK)
            return rank_fail(rc, "step %d: %s", t, dt_status_name(st));
        if (rc->rank == 0)
            R->losses[t] = loss;
    }
    return true;
}

static bool checkpoint_io(rank_ctx *rc, run *R, dt_model *m, dt_zero1 *z, bool loading)
{
    dt_ckpt_options o = {.allow_reshard = true, .keep = 2};
    dt_ckpt *ck = NULL;
    dt_ckpt_state s;
    char dir[4200];
    bool ok = (!z || dt_zero1_hold_params(z, true) == DT_OK) && /* ZeRO-3: whole */
              dt_ckpt_open(&ck, R->root, &o) == DT_OK &&
              dt_ckpt_state_of(&s, m, z, rc->rank, rc->world) == DT_OK;
    if (ok && loading) {
        ok = dt_ckpt_latest(ck, dir, sizeof dir) == DT_OK &&
             dt_ckpt_load_collective(ck, rc->comm, dir, &s) == DT_OK;
        if (!ok)
            fail_ck(rc, ck, "load");
        else if (s.step != R->start || s.data_row != (uint64_t)R->start * GLOBAL_BATCH)
            ok = rank_fail(rc, "resumed at step %ld row %llu", s.step,
                           (unsigned long long)s.data_row);
    } else if (ok) {
        s.step = R->stop;
        s.seed = 42;
        s.data_row = (uint64_t)R->stop * GLOBAL_BATCH;
        ok = dt_ckpt_save(ck, rc->comm, &s) == DT_OK;
        if (!ok)
            fail_ck(rc, ck, "save");
        else
            ok = verify_snapshot(rc, ck, &s);
    }
    dt_ckpt_close(ck);
    return ok;
}

static void run_rank(rank_ctx *rc)
{
    run *R = rc->arg;
    dt_config cfg = fixture_config();
    dt_model *m;
    dt_dataset *d;
    dt_ddp *ddp = NULL;
    dt_zero1 *z = NULL;
    if (dt_model_create(&m, &cfg, dt_backend_cpu(), R->B) != DT_OK ||
        dt_dataset_random(&d, cfg.V, 4096, 42) != DT_OK) {
        rank_fail(rc, "setup");
        return;
    }
    dt_model_init(m, R->load ? 999 : 42); /* a resumed run must not rely on init */
    dt_status st = R->opt == OPT_ZERO1   ? dt_zero1_create(&z, m, rc->comm)
                   : R->opt == OPT_ZERO2 ? dt_zero2_create(&z, m, rc->comm, 256)
                   : R->opt == OPT_ZERO3 ? dt_zero3_create(&z, m, rc->comm, 256)
                                         : dt_ddp_create(&ddp, m, rc->comm, 512);
    bool ok = st == DT_OK || rank_fail(rc, "optimizer: %s", dt_status_name(st));
    if (ok && R->load)
        ok = checkpoint_io(rc, R, m, z, true);
    if (ok)
        ok = train_steps(rc, R, m, d, ddp, z);
    if (ok && R->save)
        ok = checkpoint_io(rc, R, m, z, false);
    if (ok && z)
        ok = dt_zero1_hold_params(z, true) == DT_OK;
    if (ok)
        memcpy(R->params[rc->rank], m->params_memory, m->num_params * sizeof(float));
    dt_ddp_destroy(ddp);
    dt_zero1_destroy(z);
    dt_dataset_close(d);
    dt_model_destroy(m);
}

static void run_job(run *R, int world)
{
    rank_job job;
    R->B = GLOBAL_BATCH / world;
    int failed = rank_threads_run(&job, world, run_rank, R);
    for (int r = 0; r < world; r++)
        cr_assert_not(job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}

/* Straight run of STEPS with opt1; then [0, 3) + save with opt1, resume
 * with opt2 on world2 for [3, 6). */
static void resume_across(optimizer opt1, int world1, optimizer opt2, int world2, bool bitwise)
{
    char root[128];
    fixture_mkroot(root, sizeof root);
    run *straight = calloc(1, sizeof *straight), *split = calloc(1, sizeof *split);
    *straight = (run){.opt = opt1, .start = 0, .stop = STEPS, .root = root};
    run_job(straight, world1);
    *split = (run){.opt = opt1, .start = 0, .stop = 3, .save = true, .root = root};
    run_job(split, world1);
    split->opt = opt2;
    split->start = 3;
    split->stop = STEPS;
    split->save = false;
    split->load = true;
    run_job(split, world2);
    size_t n = dt_config_num_params(&(dt_config){.V = 8, .T = 5, .L = 2, .H = 1, .C = 5});
    for (int t = 0; t < STEPS; t++) {
        float a = straight->losses[t], b = split->losses[t];
        if (bitwise)
            cr_assert_eq(memcmp(&a, &b, sizeof a), 0, "step %d: loss %.9g vs %.9g", t, a, b);
        else
            cr_assert_leq(fabsf(a - b), 1e-5f * fabsf(a), "step %d: loss %.9g vs %.9g", t, a, b);
    }
    if (bitwise)
        cr_assert_eq(memcmp(straight->params[0], split->params[0], n * sizeof(float)), 0,
                     "final parameters differ");
    free(straight);
    free(split);
    fixture_rmtree(root);
}

static void resume_case(dt_ckpt_mode mode, int world1, int world2, bool bitwise)
{
    optimizer opt = mode == DT_CKPT_ZERO1 ? OPT_ZERO1 : OPT_DDP;
    resume_across(opt, world1, opt, world2, bitwise);
}

Test(checkpoint_train, zero1_resume_continues_bitwise, .timeout = 120)
{
    resume_case(DT_CKPT_ZERO1, 2, 2, true);
}

Test(checkpoint_train, ddp_resume_continues_bitwise, .timeout = 120)
{
    resume_case(DT_CKPT_DDP, 2, 2, true);
}

Test(checkpoint_train, zero1_reshard_4_to_2_continues_within_1e5_relative, .timeout = 180)
{
    resume_case(DT_CKPT_ZERO1, 4, 2, false);
}

Test(checkpoint_train, ddp_reshard_2_to_4_continues_within_1e5_relative, .timeout = 180)
{
    resume_case(DT_CKPT_DDP, 2, 4, false);
}

Test(checkpoint_train, zero1_reshard_2_to_4_continues_within_1e5_relative, .timeout = 180)
{
    resume_case(DT_CKPT_ZERO1, 2, 4, false);
}

Test(checkpoint_train, zero2_resume_continues_bitwise, .timeout = 120)
{
    resume_across(OPT_ZERO2, 2, OPT_ZERO2, 2, true);
}

Test(checkpoint_train, zero2_resumes_a_zero1_checkpoint_bitwise, .timeout = 120)
{
    resume_across(OPT_ZERO1, 3, OPT_ZERO2, 3, true);
}

Test(checkpoint_train, zero2_on_4_continues_as_ddp_on_2_within_1e5_relative, .timeout = 180)
{
    resume_across(OPT_ZERO2, 4, OPT_DDP, 2, false);
}

Test(checkpoint_train, ddp_on_2_continues_as_zero2_on_4_within_1e5_relative, .timeout = 180)
{
    resume_across(OPT_DDP, 2, OPT_ZERO2, 4, false);
}

Test(checkpoint_train, zero3_resume_continues_bitwise, .timeout = 120)
{
    resume_across(OPT_ZERO3, 2, OPT_ZERO3, 2, true);
}

Test(checkpoint_train, zero3_resumes_a_zero1_checkpoint_bitwise, .timeout = 120)
{
    resume_across(OPT_ZERO1, 3, OPT_ZERO3, 3, true);
}

Test(checkpoint_train, zero1_resumes_a_zero3_checkpoint_bitwise, .timeout = 120)
{
    resume_across(OPT_ZERO3, 3, OPT_ZERO1, 3, true);
}

Test(checkpoint_train, zero3_on_4_continues_as_ddp_on_2_within_1e5_relative, .timeout = 180)
{
    resume_across(OPT_ZERO3, 4, OPT_DDP, 2, false);
}

Test(checkpoint_train, ddp_on_2_continues_as_zero3_on_4_within_1e5_relative, .timeout = 180)
{
    resume_across(OPT_DDP, 2, OPT_ZERO3, 4, false);
}
