/*
 * bf16_kernels.c — the conversions bf16 compute puts around the fp32
 * kernels (the portable path; precision.c tells the story): an fp32 array
 * rounded to bf16 in place (round to nearest, ties to even, as
 * collectives/dtypes/half.h rounds), a matmul's weight (or wte) rounded
 * into the model's one-matrix workspace, a gain, bias or wpe into one of
 * the two halves of the small parameter workspace (a LayerNorm reads its
 * scale and shift at once), and a block's stored activations packed
 * from the fp32 workspace into its bf16 store and widened back.
 *
 * Cost: memory-bound passes, one per rounded tensor, shared across the
 * rank's team like the element-wise layers (kernels_rows.c); widening is
 * exact (a shift), so pack then unpack returns the rounded values bitwise.
 */
#include <string.h>

#include "model_internal.h"

/* ---- round to nearest even ------------------------------------------------ */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The bf16 nearest to f, ties to even (half.h's rule: NaN stays a quiet
 * NaN instead of carrying into inf). */
static uint16_t round_bf16(float f)
{
    uint32_t x = f32_bits(f);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = (x >> 16) | 0x0040u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

static float widen_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

DT_VECTORIZE
static void round_range(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = widen_bf16(round_bf16(src[i]));
}

DT_VECTORIZE
static void narrow_range(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = round_bf16(src[i]);
}

DT_VECTORIZE
static void widen_range(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = widen_bf16(src[i]);
}

void dt_bf16_round(float *dst, const float *src, size_t n)
{
#pragma omp parallel num_threads(dt_threads_current()) if (n >= DT_PAR_ELEMS)
    {
        size_t lo, hi;
        dt_team_share(n, 16, &lo, &hi);
        round_range(dst + lo, src + lo, hi - lo);
    }
}

void dt_model_round_acts(const dt_model *m, float *x, size_t n)
{
    if (m->bf16)
        dt_bf16_round(x, x, n);
}

const float *dt_model_matmul_weight(const dt_model *m, const float *w, size_t n)
{
    if (!m->bf16)
        return w;
    dt_bf16_round(m->weight_ws, w, n);
    return m->weight_ws;
}

size_t dt_model_param_ws_half(const dt_config *c)
{
    return (size_t)(c->T > 4 ? c->T : 4) * (size_t)c->C;
}

const float *dt_model_bf16_param(const dt_model *m, const float *p, size_t n, int half)
{
    if (!m->bf16 || !p)
        return p;
    float *dst = m->param_ws + (size_t)half * dt_model_param_ws_half(&m->cfg);
    dt_bf16_round(dst, p, n);
    return dst;
}

/* ---- the bf16 store of a block's activations ------------------------------ */

#define NUM_STORED 7

/* The fields of block l (in the workspace) that backward reads, and their
 * element counts for (B, T); returns the block's store size. */
static size_t stored_fields(float *f[NUM_STORED], size_t n[NUM_STORED], dt_model *m, int l,
                            size_t B, size_t T)
{
    size_t N = B * T, C = (size_t)m->cfg.C, att = B * (size_t)m->cfg.H * T * T;
    size_t k[NUM_STORED] = {N * C, 3 * N * C, N * C, att, N * C, 4 * N * C, 4 * N * C};
    size_t total = 0;
    if (f) {
        dt_block_acts *x = &m->acts.blocks[l];
        float *p[NUM_STORED] = {x->ln1, x->qkv, x->atty, x->att, x->ln2, x->fch, x->fch_gelu};
        memcpy(f, p, sizeof p);
    }
    for (int i = 0; i < NUM_STORED; i++)
        total += k[i];
    if (n)
        memcpy(n, k, sizeof k);
    return total;
}

/* Elements of one activation slot's store: the stage's blocks at (max_B,
 * T). A pipeline stage keeps act_slots of them, one per micro-batch in
 * flight (slot k's at k times this), so a forward into one slot never
 * overwrites what another slot's backward will widen. */
size_t dt_bf16_store_size(const dt_model *m)
{
    return (size_t)(m->l1 - m->l0) *
           stored_fields(NULL, NULL, (dt_model *)m, m->l0, (size_t)m->max_B, (size_t)m->cfg.T);
}

/* Packs or unpacks block l of the selected slot for shape (B, T): its
 * blocks lie at a stride of their (B, T) size from the slot's start, which
 * fits the slot's (max_B, T) share (minigpt.c's rule for shorter rows). */
static void move_block(dt_model *m, int l, int B, int T, bool pack)
{
    float *f[NUM_STORED];
    size_t n[NUM_STORED];
    size_t per = stored_fields(f, n, m, l, (size_t)B, (size_t)T);
    uint16_t *s = m->bf16_memory + (size_t)m->slot * m->num_bf16 + (size_t)(l - m->l0) * per;
    for (int i = 0; i < NUM_STORED; i++) {
        if (pack)
            narrow_range(s, f[i], n[i]);
        else
            widen_range(f[i], s, n[i]);
        s += n[i];
    }
}

void dt_model_bf16_pack(dt_model *m, int l, int B, int T)
{
    if (m->bf16 && !m->recompute) /* recomputation keeps no store */
        move_block(m, l, B, T, true);
}

void dt_model_bf16_unpack(dt_model *m, int l)
{
    move_block(m, l, m->last_B, m->last_T, false);
    m->ws_slot = m->slot;
    m->ws_block = l;
}

/* ---- for layers outside the model ------------------------------------------ */

/* The rounding the model's own layers use (dt_bf16_round), for a layer
 * that computes MiniGPT on its own memory (tensor/: a tp share rounds its
 * parameters and activations with it, so both give the same bits). */
void dt_bf16_round_floats(float *dst, const float *src, size_t n)
{
    dt_bf16_round(dst, src, n);
}
