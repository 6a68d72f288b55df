/*
 * test_model_stage.c — a MiniGPT split into pipeline stages is the same
 * model: each stage holds exactly its slice of the full model's flat
 * parameters (bitwise, from the same seed), and running the stages one
 * after another in one process — activations handed forward, their
 * gradients handed back — gives the full model's loss and gradients
 * bitwise (every kernel sees the same operands in the same order), whether
 * backward runs whole or split into its input and weight halves, and
 * with several micro-batches in flight in separate activation slots, and
 * with recomputation (one workspace shared by the slots).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "dt_model.h"

enum { B = 2, MAXS = 4 };
static const dt_config cfg = {.V = 64, .T = 16, .L = 4, .H = 4, .C = 32};
/* three stages: embeddings + block 0 | blocks 1, 2 | block 3 + head */
static const int bounds[] = {0, 1, 3, 4};
enum { NSTAGE = 3 };

static void tokens(int *x, int n, uint64_t seed)
{
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (int i = 0; i < n; i++)
        x[i] = (int)(dt_rng_next(&r) % (uint64_t)cfg.V);
}

static dt_model *full_model(void)
{
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &cfg, dt_backend_cpu(), B), DT_OK);
    dt_model_init(m, 42);
    return m;
}

static void make_stages(dt_model **st, int slots, int grad_slots, bool recompute)
{
    for (int s = 0; s < NSTAGE; s++) {
        dt_stage_spec sp = {bounds[s], bounds[s + 1], slots, grad_slots, recompute};
        dt_status rc = dt_model_create_stage(&st[s], &cfg, dt_backend_cpu(), B, &sp);
        cr_assert_eq(rc, DT_OK, "%s", dt_model_error(st[s]));
        dt_model_init(st[s], 42);
    }
}

static void destroy_all(dt_model *full, dt_model **st)
{
    dt_model_destroy(full);
    for (int s = 0; s < NSTAGE; s++)
        dt_model_destroy(st[s]);
}

Test(model_stage, stages_tile_the_flat_layout_and_hold_its_slices_bitwise, .timeout = 30)
{
    dt_model *full = full_model(), *st[NSTAGE];
    make_stages(st, 1, 1, false);
    float *all = malloc(full->num_params * sizeof(float));
    dt_model_get_params(full, all);
    size_t next = 0;
    for (int s = 0; s < NSTAGE; s++) {
        dt_model *m = st[s];
        cr_assert_eq(m->param_lo, next, "stage %d starts at %zu", s, m->param_lo);
        cr_assert_eq(m->num_params, m->param_hi - m->param_lo);
        float *p = malloc(m->num_params * sizeof(float));
        dt_model_get_params(m, p);
        cr_expect(memcmp(p, all + m->param_lo, m->num_params * sizeof(float)) == 0,
                  "stage %d's parameters differ from [%zu, %zu) of "
                  "the full model's",
                  s, m->param_lo, m->param_hi);
        /* its tensor table is the full table's entries, offsets local */
        for (int i = 0; i < m->num_tensors; i++) {
            const dt_tensor_info *t = &m->tensors[i];
            const dt_tensor_info *f = dt_model_find_tensor(full, t->name);
            cr_assert_not_null(f, "%s", t->name);
            cr_expect_eq(t->offset + m->param_lo, f->offset, "%s", t->name);
        }
        next = m->param_hi;
        free(p);
    }
    cr_expect_eq(next, full->num_params);
    cr_expect_null(st[1]->params.wte, "a middle stage holds no embeddings");
    cr_expect_null(st[1]->params.lm_head, "a middle stage holds no head");
    cr_expect_null(st[1]->params.blocks[0].qkvw, "block 0 is stage 0's");
    free(all);
    destroy_all(full, st);
}

/* Forward of micro-batch mb through the stages (slot mb), copying each
 * stage's output into the next one's input as the network would. */
static void chain_forward(dt_model **st, const int *x, const int *y, int mb)
{
    for (int s = 0; s < NSTAGE; s++) {
        cr_assert_eq(dt_model_select(st[s], mb, 0), DT_OK);
        if (s > 0) {
            float *in = dt_model_input(st[s], B, cfg.T);
            memcpy(in, dt_model_output(st[s - 1]), (size_t)B * cfg.T * cfg.C * sizeof(float));
        }
        dt_status rc = dt_model_forward(st[s], s == 0 ? x : NULL, y, B, cfg.T);
        cr_assert_eq(rc, DT_OK, "%s", dt_model_error(st[s]));
    }
}

static void chain_backward(dt_model **st, int mb, float dloss, dt_backward_part part)
{
    for (int s = NSTAGE - 1; s >= 0; s--) {
        cr_assert_eq(dt_model_select(st[s], mb, mb), DT_OK);
        if (s < NSTAGE - 1 && part != DT_BACKWARD_WEIGHT)
            memcpy(dt_model_output_grad(st[s]), dt_model_input_grad(st[s + 1]),
                   (size_t)B * cfg.T * cfg.C * sizeof(float));
        dt_status rc = dt_model_backward_part(st[s], dloss, part);
        cr_assert_eq(rc, DT_OK, "%s", dt_model_error(st[s]));
    }
}

/* The stages' gradients, concatenated, against the full model's. */
static void expect_same_grads(dt_model *full, dt_model **st)
{
    float *g = malloc(full->num_params * sizeof(float));
    float *h = malloc(full->num_params * sizeof(float));
    dt_model_get_grads(full, g);
    for (int s = 0; s < NSTAGE; s++)
        dt_model_get_grads(st[s], h + st[s]->param_lo);
    for (int i = 0; i < full->num_tensors; i++) {
        const dt_tensor_info *t = &full->tensors[i];
        cr_expect(memcmp(g + t->offset, h + t->offset, t->numel * sizeof(float)) == 0,
                  "gradient of %s differs from the full model's", t->name);
    }
    free(g);
    free(h);
}

/* Two micro-batches with 1/2 loss scaling: the full model runs them one
 * after another (--grad-accum 2); the stages run both forwards first
 * (two slots in flight), then both backwards, whole or split. */
static void stages_match_full_model(int split, bool recompute)
{
    enum { M = 2, N = B * 16 };
    int x[M][N], y[M][N];
    dt_model *full = full_model(), *st[NSTAGE];
    make_stages(st, M, M, recompute);
    float full_loss[M];
    dt_model_zero_grad(full);
    for (int k = 0; k < M; k++) {
        tokens(x[k], N, 10 + k);
        tokens(y[k], N, 20 + k);
        cr_assert_eq(dt_model_forward(full, x[k], y[k], B, cfg.T), DT_OK);
        full_loss[k] = full->mean_loss;
        cr_assert_eq(dt_model_backward(full, 1.0f / M), DT_OK);
    }
    for (int s = 0; s < NSTAGE; s++)
        dt_model_zero_grad(st[s]);
    for (int k = 0; k < M; k++)
        chain_forward(st, x[k], y[k], k);
    for (int k = 0; k < M; k++) {
        dt_model_select(st[NSTAGE - 1], k, k);
        cr_expect_eq(st[NSTAGE - 1]->mean_loss, full_loss[k],
                     "micro-batch %d: loss %.9g, full model %.9g", k, st[NSTAGE - 1]->mean_loss,
                     full_loss[k]);
        if (!split)
            chain_backward(st, k, 1.0f / M, DT_BACKWARD_ALL);
        else
            chain_backward(st, k, 1.0f / M, DT_BACKWARD_INPUT);
    }
    for (int k = 0; split && k < M; k++)
        chain_backward(st, k, 1.0f / M, DT_BACKWARD_WEIGHT);
    expect_same_grads(full, st);
    destroy_all(full, st);
}

Test(model_stage, config_stage_range_is_the_stage_models_slice, .timeout = 10)
{
    dt_model *st[NSTAGE];
    make_stages(st, 1, 1, false);
    for (int s = 0; s < NSTAGE; s++) {
        size_t lo, hi;
        dt_config_stage_range(&cfg, bounds[s], bounds[s + 1], &lo, &hi);
        cr_expect(lo == st[s]->param_lo && hi == st[s]->param_hi,
                  "blocks [%d, %d): [%zu, %zu), the stage holds [%zu, %zu)", bounds[s],
                  bounds[s + 1], lo, hi, st[s]->param_lo, st[s]->param_hi);
    }
    destroy_all(NULL, st);
}

Test(model_stage, stages_in_sequence_give_the_full_models_loss_and_grads, .timeout = 60)
{
    stages_match_full_model(0, false);
}

Test(model_stage, split_backward_gives_the_same_bits_as_whole_backward, .timeout = 60)
{
    stages_match_full_model(1, false);
}

/* Recomputing stages: two micro-batches in flight share each stage's one
 * workspace, so every block is rebuilt before its backward; the weight
 * half rebuilds its inner gradients too. */
Test(model_stage, recomputing_stages_give_the_full_models_grads_whole_and_split, .timeout = 60)
{
    stages_match_full_model(0, true);
    stages_match_full_model(1, true);
}

/* Per set, a recomputing stage keeps of each block only its output; one
 * workspace of a block's other activations, and one of the gradients
 * backward writes of them (ln1, qkv, atty, residual2, ln2: 7C; fch,
 * fch_gelu: 8C per token), serves all its sets. Each set holds only the
 * top-level tensors its kind touches: an activation set its input, ln_f's
 * output and statistics, the logits, probabilities and losses (the last
 * two the head's only); a gradient set its input's, ln_f output's and the
 * logits' gradients, and the attention scratch backward needs. */
Test(model_stage, recomputing_stages_share_one_workspace_between_their_sets, .timeout = 10)
{
    enum { SETS = 3, GSETS = 2 };
    dt_model *re[NSTAGE];
    make_stages(re, SETS, GSETS, true);
    size_t N = (size_t)B * cfg.T, C = (size_t)cfg.C, V = (size_t)cfg.V;
    size_t att = (size_t)B * cfg.H * cfg.T * cfg.T;
    for (int s = 0; s < NSTAGE; s++) {
        size_t L = (size_t)(bounds[s + 1] - bounds[s]), head = s == NSTAGE - 1;
        size_t acts = (1 + L) * N * C + head * (N * C + 3 * N + 2 * N * V);
        size_t grads = (1 + L) * N * C + head * (N * C + N * V) + att;
        size_t ws = N * (17 * C + 4) + att;
        cr_expect_eq(re[s]->num_acts, acts, "stage %d", s);
        cr_expect_eq(re[s]->num_grad_acts, grads, "stage %d", s);
        cr_expect_eq(re[s]->num_ws, ws, "stage %d", s);
        cr_expect_eq(re[s]->num_grad_ws, 15 * N * C, "stage %d", s);
        cr_expect_eq(dt_model_activation_bytes(re[s]),
                     (SETS * acts + GSETS * grads + ws + 15 * N * C) * sizeof(float), "stage %d",
                     s);
        cr_expect_eq(re[s]->acts.blocks[bounds[s]].qkv, re[s]->ws_memory + N * C + 2 * N,
                     "stage %d: qkv is not in the workspace", s);
    }
    destroy_all(NULL, re);
}

Test(model_stage, an_empty_block_range_is_refused_by_name, .timeout = 10)
{
    dt_model *m;
    dt_stage_spec sp = {2, 2, 1, 1, false};
    cr_assert_eq(dt_model_create_stage(&m, &cfg, dt_backend_cpu(), B, &sp), DT_EINVAL);
    cr_expect(strstr(dt_model_error(m), "[2, 2)") != NULL, "%s", dt_model_error(m));
    dt_model_destroy(m);
    dt_stage_spec beyond = {3, 5, 1, 1, false};
    cr_assert_eq(dt_model_create_stage(&m, &cfg, dt_backend_cpu(), B, &beyond), DT_EINVAL);
    dt_model_destroy(m);
}

Test(model_stage, a_middle_stage_refuses_token_ids, .timeout = 10)
{
    dt_model *m;
    dt_stage_spec sp = {1, 3, 1, 1, false};
    cr_assert_eq(dt_model_create_stage(&m, &cfg, dt_backend_cpu(), B, &sp), DT_OK);
    int x[B * 16] = {0};
    cr_expect_eq(dt_model_forward(m, x, NULL, B, cfg.T), DT_EINVAL);
    cr_expect(strstr(dt_model_error(m), "activations") != NULL, "%s", dt_model_error(m));
    dt_model_destroy(m);
}

/* Memory is the point of stages: their activation sets add up to the full
 * model's, plus one input (B, T, C) and one attention scratch
 * (B, NH, T, T) for each stage after the first; the head's only on the
 * last. */
Test(model_stage, stage_activations_add_up_to_the_full_models, .timeout = 10)
{
    dt_model *full = full_model(), *st[NSTAGE];
    make_stages(st, 1, 1, false);
    size_t extra = (size_t)B * cfg.T * cfg.C + (size_t)B * cfg.H * cfg.T * cfg.T;
    size_t sum = 0;
    for (int s = 0; s < NSTAGE; s++)
        sum += st[s]->num_acts;
    cr_expect_eq(sum, full->num_acts + (NSTAGE - 1) * extra);
    cr_expect_null(st[1]->acts.logits);
    cr_expect_not_null(st[2]->acts.logits);
    destroy_all(full, st);
}
