/*
 * layout.c — MiniGPT's configuration and its flat parameter layout.
 *
 * The idea (llm.c's): a model is one contiguous float buffer plus a table
 * saying which range is which tensor. The table is built once, from the
 * config alone, by walking the tensors in forward order; the pointer
 * structs (dt_params) are then "base + offset" for the parameter buffer
 * and for the gradient buffer alike, so both always share one layout.
 *
 * Invariants: tensors are contiguous, in offset order, without gaps, and
 * their sizes add up to dt_config_num_params. Names are PyTorch's
 * state_dict names of the reference module (model/minigpt_torch.py), so a
 * fixture or an exported checkpoint maps tensor to tensor by name.
 *
 * Initialisation follows PyTorch's default distributions (not its random
 * stream): embeddings N(0, 1), Linear U(+-1/sqrt(fan_in)) for weight and
 * bias, LayerNorm (1, 0). It draws from a splitmix64 stream in layout
 * order, so a seed fixes every value on every machine.
 *
 * A pipeline stage owns blocks [l0, l1) (plus the embeddings on the first
 * stage, ln_f and the head on the last): one contiguous [lo, hi) slice of
 * the flat layout. dt_layout_build_stage gives its table, offsets local to
 * its own buffer; dt_layout_init_stage gives its slice of the full
 * model's initial values, bitwise, without building the full model, and
 * dt_model_init_range any range of them (a ZeRO-3 shard): splitmix64 is
 * a counter, so the stream jumps to a tensor's first draw in one step
 * (dt_rng_skip) and only the range's own values are computed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_model.h"
#include "model_internal.h"

dt_config dt_config_seed(void)
{
    dt_config c = {.V = 64, .T = 16, .L = 2, .H = 4, .C = 32};
    return c;
}

dt_status dt_config_check(const dt_config *c, char *err, size_t errlen)
{
    const char *what = NULL;
    if (c->V < 2 || c->V > 65536)
        what = "vocabulary V must be in [2, 65536]";
    else if (c->T < 1 || c->T > 65536)
        what = "context T must be in [1, 65536]";
    else if (c->L < 1 || c->L > 1024)
        what = "layers L must be in [1, 1024]";
    else if (c->C < 1 || c->C > 65536)
        what = "width C must be in [1, 65536]";
    else if (c->H < 1 || c->C % c->H != 0)
        what = "heads H must be >= 1 and divide C";
    if (what == NULL)
        return DT_OK;
    if (err && errlen)
        snprintf(err, errlen, "config V=%d T=%d L=%d H=%d C=%d: %s", c->V, c->T, c->L, c->H, c->C,
                 what);
    return DT_EINVAL;
}

/* Elements of one block: ln1 (2C), qkv (3CC), proj (CC), ln2 (2C),
 * fc (4CC + 4C), fcproj (4CC + C). */
static size_t block_params(size_t C)
{
    return 2 * C + 3 * C * C + C * C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
}

size_t dt_config_num_params(const dt_config *c)
{
    size_t V = (size_t)c->V, T = (size_t)c->T, C = (size_t)c->C;
    return V * C + T * C + (size_t)c->L * block_params(C) + 2 * C + V * C;
}

dt_status dt_config_tensors(const dt_config *cfg, dt_tensor_info **tab, int *n)
{
    char err[160];
    *tab = NULL;
    *n = 0;
    if (dt_config_check(cfg, err, sizeof err) != DT_OK)
        return DT_EINVAL;
    int count = dt_layout_num_tensors(cfg);
    if (!(*tab = calloc((size_t)count, sizeof **tab)))
        return DT_ENOMEM;
    dt_layout_build(*tab, NULL, NULL, cfg);
    *n = count;
    return DT_OK;
}

void dt_config_stage_range(const dt_config *c, int l0, int l1, size_t *lo, size_t *hi)
{
    size_t emb = ((size_t)c->V + (size_t)c->T) * (size_t)c->C;
    size_t block = block_params((size_t)c->C);
    *lo = l0 == 0 ? 0 : emb + (size_t)l0 * block;
    *hi = l1 == c->L ? dt_config_num_params(c) : emb + (size_t)l1 * block;
}

double dt_config_flops_per_step(const dt_config *c, int B, int T)
{
    double C = c->C, V = c->V, L = c->L, tokens = (double)B * T;
    double weights = L * 12.0 * C * C + V * C; /* matmul weights only */
    /* q.k^T and att.v: 2*T*C multiply-adds per token per layer each way,
     * forward 4TC flops, backward twice that. */
    double attention = L * tokens * 4.0 * T * C * 3.0;
    return 6.0 * weights * tokens + attention;
}

/* Appends one tensor to the table; returns its offset. */
static size_t add_tensor(dt_tensor_info *tab, int *n, size_t *offset, const char *name, int rows,
                         int cols)
{
    dt_tensor_info *t = &tab[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = *offset;
    t->ndim = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols > 0 ? cols : 0;
    t->numel = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    *offset += t->numel;
    return t->offset;
}

int dt_layout_num_tensors(const dt_config *c)
{
    return 2 + 10 * c->L + 3;
}

/*
 * Fills tab (dt_layout_num_tensors entries) and, if base is not NULL,
 * the pointer struct p with base + offset for every tensor. p->blocks must
 * have room for L entries.
 */
void dt_layout_build(dt_tensor_info *tab, dt_params *p, float *base, const dt_config *c)
{
    int n = 0, C = c->C;
    size_t off = 0;
    char name[48];
    size_t o_wte = add_tensor(tab, &n, &off, "wte.weight", c->V, C);
    size_t o_wpe = add_tensor(tab, &n, &off, "wpe.weight", c->T, C);
    if (base) {
        p->wte = base + o_wte;
        p->wpe = base + o_wpe;
    }
    for (int l = 0; l < c->L; l++) {
        size_t o[10];
        static const char *const names[10] = {"ln1.weight",       "ln1.bias",    "attn.qkv.weight",
                                              "attn.proj.weight", "ln2.weight",  "ln2.bias",
                                              "mlp.fc.weight",    "mlp.fc.bias", "mlp.proj.weight",
                                              "mlp.proj.bias"};
        const int rows[10] = {C, C, 3 * C, C, C, C, 4 * C, 4 * C, C, C};
        const int cols[10] = {0, 0, C, C, 0, 0, C, 0, 4 * C, 0};
        for (int k = 0; k < 10; k++) {
            snprintf(name, sizeof name, "blocks.%d.%s", l, names[k]);
            o[k] = add_tensor(tab, &n, &off, name, rows[k], cols[k]);
        }
        if (base) {
            dt_block_params *b = &p->blocks[l];
            b->ln1w = base + o[0];
            b->ln1b = base + o[1];
            b->qkvw = base + o[2];
            b->attprojw = base + o[3];
            b->ln2w = base + o[4];
            b->ln2b = base + o[5];
            b->fcw = base + o[6];
            b->fcb = base + o[7];
            b->fcprojw = base + o[8];
            b->fcprojb = base + o[9];
        }
    }
    size_t o_lnfw = add_tensor(tab, &n, &off, "ln_f.weight", C, 0);
    size_t o_lnfb = add_tensor(tab, &n, &off, "ln_f.bias", C, 0);
    size_t o_head = add_tensor(tab, &n, &off, "lm_head.weight", c->V, C);
    if (base) {
        p->lnfw = base + o_lnfw;
        p->lnfb = base + o_lnfb;
        p->lm_head = base + o_head;
    }
}

/* ---- a stage's slice ------------------------------------------------------ */

/* Index range [i0, i1) of the full table that a stage owning blocks
 * [l0, l1) holds: the embeddings if it is the first, ln_f and the head if
 * it is the last. Forward order makes the range contiguous. */
static void stage_tensor_range(const dt_config *c, int l0, int l1, int *i0, int *i1)
{
    *i0 = l0 == 0 ? 0 : 2 + 10 * l0;
    *i1 = l1 == c->L ? dt_layout_num_tensors(c) : 2 + 10 * l1;
}

/* The pointer field of dt_params that tensor i of the full table fills. */
static float **param_field(dt_params *p, const dt_config *c, int i)
{
    if (i == 0)
        return &p->wte;
    if (i == 1)
        return &p->wpe;
    if (i < 2 + 10 * c->L) {
        dt_block_params *b = &p->blocks[(i - 2) / 10];
        float **f[10] = {&b->ln1w, &b->ln1b, &b->qkvw, &b->attprojw, &b->ln2w,
                         &b->ln2b, &b->fcw,  &b->fcb,  &b->fcprojw,  &b->fcprojb};
        return f[(i - 2) % 10];
    }
    float **tail[3] = {&p->lnfw, &p->lnfb, &p->lm_head};
    return tail[i - 2 - 10 * c->L];
}

/*
 * The stage's table: the tensors it owns, offsets made local to its own
 * flat buffer (the full model's offset minus *lo). With base, points the
 * owned fields of p at base + local offset; the others stay as they were
 * (NULL in a fresh model). Returns the tensor count; *lo, *hi are the
 * stage's [lo, hi) in the full model's flat layout.
 */
int dt_layout_build_stage(dt_tensor_info *tab, dt_params *p, float *base, const dt_config *c,
                          int l0, int l1, size_t *lo, size_t *hi)
{
    int n = dt_layout_num_tensors(c), i0, i1;
    dt_tensor_info *full = calloc((size_t)n, sizeof *full);
    if (!full)
        return -1;
    dt_layout_build(full, NULL, NULL, c);
    stage_tensor_range(c, l0, l1, &i0, &i1);
    *lo = full[i0].offset;
    *hi = full[i1 - 1].offset + full[i1 - 1].numel;
    for (int i = i0; i < i1; i++) {
        tab[i - i0] = full[i];
        tab[i - i0].offset -= *lo;
        if (base)
            *param_field(p, c, i) = base + tab[i - i0].offset;
    }
    free(full);
    return i1 - i0;
}

/*
 * A gradient window (ZeRO-2): points the field of every tensor of tab (the
 * table of a stage whose first block is l0, local offsets) lying wholly in [lo, lo + count) at base + (offset - lo), and every
 * other field at NULL, which the kernels read as "no gradient wanted".
 */
void dt_layout_map_window(dt_params *p, const dt_tensor_info *tab, int n, const dt_config *c,
                          int l0, float *base, size_t lo, size_t count)
{
    int i0, i1;
    stage_tensor_range(c, l0, c->L, &i0, &i1);
    for (int i = 0; i < n; i++) {
        size_t at = tab[i].offset;
        bool inside = base && at >= lo && at + tab[i].numel <= lo + count;
        *param_field(p, c, i0 + i) = inside ? base + (at - lo) : NULL;
    }
}

/* ---- deterministic initialisation ---------------------------------------- */

/* The fill functions take x == NULL to mean "draw as if filling, store
 * nothing": how a stage skips the stream over tensors it does not own. */
static double rng_uniform_open(dt_rng *r) /* (0, 1) */
{
    return ((double)(dt_rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static void fill_normal(float *x, size_t n, float std, dt_rng *r)
{
    for (size_t i = 0; i < n; i += 2) { /* Box-Muller, two at a time */
        double u1 = rng_uniform_open(r), u2 = rng_uniform_open(r);
        if (!x)
            continue;
        double rad = sqrt(-2.0 * log(u1));
        x[i] = (float)(std * rad * cos(2.0 * M_PI * u2));
        if (i + 1 < n)
            x[i + 1] = (float)(std * rad * sin(2.0 * M_PI * u2));
    }
}

static void fill_uniform(float *x, size_t n, float bound, dt_rng *r)
{
    for (size_t i = 0; i < n; i++) {
        double u = rng_uniform_open(r);
        if (x)
            x[i] = (float)((2.0 * u - 1.0) * bound);
    }
}

enum init_rule { INIT_NORMAL, INIT_CONST, INIT_UNIFORM };

/* How tensor i of tab starts, and its std, value or bound: the role of
 * each tensor is read from its name, so the rule lives in one place. */
static enum init_rule tensor_rule(const dt_tensor_info *tab, int i, float *scale)
{
    const dt_tensor_info *t = &tab[i];
    const char *s = t->name;
    if (strstr(s, "wte") == s || strstr(s, "wpe") == s) {
        *scale = 1.0f;
        return INIT_NORMAL;
    }
    if (strstr(s, "ln")) { /* ln1, ln2, ln_f: no draws */
        *scale = strstr(s, ".weight") ? 1.0f : 0.0f;
        return INIT_CONST;
    }
    /* Linear: weight (out, in); bias has the weight's fan_in */
    int fan_in = t->ndim == 2 ? t->shape[1] : tab[i - 1].shape[1];
    *scale = 1.0f / sqrtf((float)fan_in);
    return INIT_UNIFORM;
}

/* Tensor i of tab into x (or, x NULL, only its draws). */
static void init_tensor(float *x, const dt_tensor_info *tab, int i, dt_rng *r)
{
    float scale;
    size_t n = tab[i].numel;
    switch (tensor_rule(tab, i, &scale)) {
    case INIT_NORMAL: fill_normal(x, n, scale, r); break;
    case INIT_CONST:
        for (size_t k = 0; x && k < n; k++)
            x[k] = scale;
        break;
    case INIT_UNIFORM: fill_uniform(x, n, scale, r); break;
    }
}

/* Fills host (num_params) by walking the tensor table in layout order. */
void dt_layout_init(float *host, const dt_tensor_info *tab, int n, uint64_t seed)
{
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (int i = 0; i < n; i++)
        init_tensor(host + tab[i].offset, tab, i, &r);
}

/*
 * A stage's slice of what dt_layout_init gives the full model, bitwise:
 * the stream is drawn through every tensor before the stage (storing
 * nothing), then into host (the stage's hi - lo floats). The skipped draws
 * cost one splitmix64 step each, no Box-Muller. Returns -1 on ENOMEM.
 */
int dt_layout_init_stage(float *host, const dt_config *c, int l0, int l1, uint64_t seed)
{
    int n = dt_layout_num_tensors(c), i0, i1;
    dt_tensor_info *full = calloc((size_t)n, sizeof *full);
    if (!full)
        return -1;
    dt_layout_build(full, NULL, NULL, c);
    stage_tensor_range(c, l0, l1, &i0, &i1);
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (int i = 0; i < i1; i++)
        init_tensor(i < i0 ? NULL : host + full[i].offset - full[i0].offset, full, i, &r);
    free(full);
    return 0;
}

/* ---- any range, drawn directly ------------------------------------------- */

/* Draws tensor i makes in dt_layout_init: Box-Muller two per pair of
 * elements (an odd tensor's last pair too), Linear one per element,
 * LayerNorm none. */
static uint64_t tensor_draws(const dt_tensor_info *tab, int i)
{
    float scale;
    enum init_rule rule = tensor_rule(tab, i, &scale);
    size_t n = tab[i].numel;
    return rule == INIT_NORMAL ? (uint64_t)(n + 1) / 2 * 2 : rule == INIT_UNIFORM ? n : 0;
}

/* Elements [from, from + n) of tensor i into x, r at the tensor's first
 * draw. The stream skips to the first draw the range needs; a range that
 * starts on the second element of a Box-Muller pair computes the pair
 * and keeps its second value, so every value is the one the full fill
 * computes, by the same arithmetic. */
static void init_tensor_part(float *x, const dt_tensor_info *tab, int i, size_t from, size_t n,
                             dt_rng *r)
{
    float scale;
    switch (tensor_rule(tab, i, &scale)) {
    case INIT_CONST:
        for (size_t k = 0; k < n; k++)
            x[k] = scale;
        return;
    case INIT_UNIFORM:
        dt_rng_skip(r, from);
        fill_uniform(x, n, scale, r);
        return;
    case INIT_NORMAL:
        dt_rng_skip(r, from & ~(size_t)1);
        if (from & 1) {
            float pair[2];
            fill_normal(pair, 2, scale, r);
            *x++ = pair[1];
            n--;
        }
        fill_normal(x, n, scale, r);
        return;
    }
}

dt_status dt_model_init_range(float *host, const dt_config *c, size_t lo, size_t n, uint64_t seed)
{
    if (lo > dt_config_num_params(c) || n > dt_config_num_params(c) - lo)
        return DT_EINVAL;
    int nt = dt_layout_num_tensors(c);
    dt_tensor_info *tab = calloc((size_t)nt, sizeof *tab);
    if (!tab)
        return DT_ENOMEM;
    dt_layout_build(tab, NULL, NULL, c);
    uint64_t drawn = 0; /* by the tensors before tensor i */
    for (int i = 0; i < nt; i++) {
        size_t a = tab[i].offset > lo ? tab[i].offset : lo;
        size_t end = tab[i].offset + tab[i].numel, b = end < lo + n ? end : lo + n;
        if (a < b) {
            dt_rng r;
            dt_rng_seed(&r, seed);
            dt_rng_skip(&r, drawn);
            init_tensor_part(host + (a - lo), tab, i, a - tab[i].offset, b - a, &r);
        }
        drawn += tensor_draws(tab, i);
    }
    free(tab);
    return DT_OK;
}
