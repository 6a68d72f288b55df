/*
 * kv_cache.c — incremental decoding: a key/value cache, so that a
 * generated token costs one row of work instead of a forward pass over
 * the whole prefix.
 *
 * In a causal model, position t's keys and values depend only on tokens
 * 0..t. Once computed they never change, so decoding keeps them: for each
 * block l, K[l] and V[l] (T, C) hold the rows of the positions seen so
 * far. The prompt goes through the ordinary batched forward (one GEMM per
 * layer, the same bits as the plain path), its keys and values are copied
 * out of the activations, and every later token runs the model on its
 * one row: layernorm, qkv, attention of its query against the cached
 * keys, MLP, head. Only the new row's k and v are appended.
 *
 * Cost per generated token at position t: ~2P FLOPs for the matmuls (each
 * weight read once, a GEMV) plus 4tC for attention, against ~2P(t+1) +
 * 4t^2 C for the plain path's forward over t+1 tokens. Memory: 2·L·T·C
 * floats for the cache plus one row of scratch per layer kind.
 *
 * The cache holds positions 0..T-1 only: MiniGPT's position embedding is
 * learned and absolute, so once a sequence outgrows the context the plain
 * path slides its window and every position changes; the caller
 * (sample.c) falls back to it then. The element-wise kernels are the
 * backend's own (layernorm, GELU, residual); the matmul of one row
 * (matvec) and the attention of one query are loops here, on host memory,
 * so the cache runs on the CPU backends only (dt_kv_cache_supported). Its
 * logits agree with the plain path's to rounding (a row's dot products
 * sum in another order than the GEMM's), not bitwise; tests check that
 * the generated tokens are the same.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fastmath.h"
#include "model_internal.h"

struct dt_kv_cache {
    dt_model *m;
    int len;      /* positions cached: [0, len) */
    float *k, *v; /* (L, T, C) each */
    /* one row of scratch per activation kind */
    float *x;       /* (C) residual stream */
    float *ln;      /* (C) layernorm output */
    float *stats;   /* (2) layernorm mean, rstd */
    float *qkv;     /* (3C) */
    float *atty;    /* (C) attention output */
    float *proj;    /* (C) a projection back to C */
    float *fch;     /* (4C) */
    float *fch_g;   /* (4C) after GELU */
    float *att;     /* (T) one head's attention weights */
    float *logits;  /* (V) */
    float *scratch; /* one allocation for all the rows above */
};

bool dt_kv_cache_supported(const dt_model *m)
{
    return strncmp(m->be->name, "cpu", 3) == 0 && !m->recompute && !m->bf16 && m->l0 == 0 &&
           m->l1 == m->cfg.L && (!m->params_windowed || m->params_memory);
}

void dt_kv_cache_destroy(dt_kv_cache *kv)
{
    if (!kv)
        return;
    const dt_backend *be = kv->m->be;
    be->free(kv->k);
    be->free(kv->v);
    be->free(kv->scratch);
    free(kv);
}

dt_status dt_kv_cache_create(dt_kv_cache **out, dt_model *m)
{
    *out = NULL;
    if (!dt_kv_cache_supported(m)) {
        snprintf(m->err, sizeof m->err,
                 "minigpt: kv cache: needs the whole model, unwindowed, on a CPU backend, "
                 "without recomputation (backend %s)",
                 m->be->name);
        return DT_EINVAL;
    }
    dt_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv)
        return DT_ENOMEM;
    kv->m = m;
    size_t C = (size_t)m->cfg.C, T = (size_t)m->cfg.T, cache = (size_t)m->cfg.L * T * C;
    size_t rows = C + C + 2 + 3 * C + C + C + 4 * C + 4 * C + T + (size_t)m->cfg.V;
    kv->k = m->be->alloc(cache * sizeof(float));
    kv->v = m->be->alloc(cache * sizeof(float));
    kv->scratch = m->be->alloc(rows * sizeof(float));
    if (!kv->k || !kv->v || !kv->scratch) {
        dt_kv_cache_destroy(kv);
        snprintf(m->err, sizeof m->err, "minigpt: kv cache: out of memory for %zu floats",
                 2 * cache + rows);
        return DT_ENOMEM;
    }
    float *p = kv->scratch;
    kv->x = p, p += C;
    kv->ln = p, p += C;
    kv->stats = p, p += 2;
    kv->qkv = p, p += 3 * C;
    kv->atty = p, p += C;
    kv->proj = p, p += C;
    kv->fch = p, p += 4 * C;
    kv->fch_g = p, p += 4 * C;
    kv->att = p, p += T;
    kv->logits = p;
    *out = kv;
    return DT_OK;
}

int dt_kv_cache_len(const dt_kv_cache *kv)
{
    return kv->len;
}

const float *dt_kv_cache_logits(const dt_kv_cache *kv)
{
    return kv->logits;
}

dt_status dt_kv_cache_prefill(dt_kv_cache *kv, const int *tokens, int n)
{
    dt_model *m = kv->m;
    int C = m->cfg.C, T = m->cfg.T;
    if (n < 1 || n > T) {
        snprintf(m->err, sizeof m->err, "minigpt: kv cache: a prompt of %d tokens, not in [1, %d]",
                 n, T);
        return DT_EINVAL;
    }
    dt_status st = dt_model_forward(m, tokens, NULL, 1, n);
    if (st != DT_OK)
        return st;
    for (int l = 0; l < m->cfg.L; l++) {
        const float *qkv = m->acts.blocks[l].qkv; /* (1, n, 3C) */
        for (int t = 0; t < n; t++) {
            size_t row = ((size_t)l * T + t) * C;
            m->be->copy(kv->k + row, qkv + (size_t)t * 3 * C + C, (size_t)C * sizeof(float));
            m->be->copy(kv->v + row, qkv + (size_t)t * 3 * C + 2 * C, (size_t)C * sizeof(float));
        }
    }
    dt_model_get_logits(m, kv->logits, 0, n - 1);
    kv->len = n;
    return DT_OK;
}

/* out (OC) = w (OC, C) . x (C) + bias (OC, or NULL): a matmul of one row.
 * The GEMM kernel works in tiles of several rows and packs its operands
 * first, which for one row costs more than the arithmetic; this reads
 * each weight once, straight from the layout. Each output keeps eight
 * partial sums over interleaved columns (one vector register; a fixed
 * order, so every vector width gives the same bits), added at the end. */
DT_VECTORIZE
static void matvec(float *out, const float *x, const float *w, const float *bias, int C, int OC)
{
    for (int o = 0; o < OC; o++) {
        const float *row = w + (size_t)o * C;
        float acc[8] = {0};
        int i = 0;
        for (; i + 8 <= C; i += 8)
            for (int j = 0; j < 8; j++)
                acc[j] += x[i + j] * row[i + j];
        float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
                    ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        for (; i < C; i++)
            sum += x[i] * row[i];
        out[o] = bias ? bias[o] + sum : sum;
    }
}

/* Causal attention of one query row (qkv's q) at position t against the
 * cached keys and values 0..t of block l, head by head, into out (C):
 * the kernel's arithmetic (scale, max-shifted exp, normalise) on one row. */
static void attend_one(dt_kv_cache *kv, float *out, const float *qkv, int l, int t)
{
    const dt_config *c = &kv->m->cfg;
    int C = c->C, hs = C / c->H;
    float scale = 1.0f / sqrtf((float)hs);
    const float *K = kv->k + (size_t)l * c->T * C, *V = kv->v + (size_t)l * c->T * C;
    for (int h = 0; h < c->H; h++) {
        const float *q = qkv + h * hs;
        float maxv = -INFINITY;
        for (int j = 0; j <= t; j++) {
            const float *k = K + (size_t)j * C + h * hs;
            float s = 0.0f;
            for (int i = 0; i < hs; i++)
                s += q[i] * k[i];
            kv->att[j] = s * scale;
            maxv = kv->att[j] > maxv ? kv->att[j] : maxv;
        }
        float sum = 0.0f;
        for (int j = 0; j <= t; j++) {
            kv->att[j] = dt_fast_expf(kv->att[j] - maxv);
            sum += kv->att[j];
        }
        float inv = 1.0f / sum, *o = out + h * hs;
        for (int i = 0; i < hs; i++)
            o[i] = 0.0f;
        for (int j = 0; j <= t; j++) {
            const float *v = V + (size_t)j * C + h * hs;
            float a = kv->att[j] * inv;
            for (int i = 0; i < hs; i++)
                o[i] += a * v[i];
        }
    }
}

/* Block l on the one row kv->x at position t, in place. */
static void block_one(dt_kv_cache *kv, int l, int t)
{
    dt_model *m = kv->m;
    const dt_backend *be = m->be;
    int C = m->cfg.C;
    const dt_block_params *w = &m->params.blocks[l];
    size_t row = ((size_t)l * m->cfg.T + t) * C;
    be->layernorm_forward(kv->ln, kv->stats, kv->stats + 1, kv->x, w->ln1w, w->ln1b, 1, C);
    matvec(kv->qkv, kv->ln, w->qkvw, NULL, C, 3 * C);
    memcpy(kv->k + row, kv->qkv + C, (size_t)C * sizeof(float));
    memcpy(kv->v + row, kv->qkv + 2 * C, (size_t)C * sizeof(float));
    attend_one(kv, kv->atty, kv->qkv, l, t);
    matvec(kv->proj, kv->atty, w->attprojw, NULL, C, C);
    be->residual_forward(kv->x, kv->x, kv->proj, (size_t)C);
    be->layernorm_forward(kv->ln, kv->stats, kv->stats + 1, kv->x, w->ln2w, w->ln2b, 1, C);
    matvec(kv->fch, kv->ln, w->fcw, w->fcb, C, 4 * C);
    be->gelu_forward(kv->fch_g, kv->fch, (size_t)4 * C);
    matvec(kv->proj, kv->fch_g, w->fcprojw, w->fcprojb, 4 * C, C);
    be->residual_forward(kv->x, kv->x, kv->proj, (size_t)C);
}

dt_status dt_kv_cache_append(dt_kv_cache *kv, int token)
{
    dt_model *m = kv->m;
    const dt_config *c = &m->cfg;
    int t = kv->len;
    if (t >= c->T || token < 0 || token >= c->V) {
        snprintf(m->err, sizeof m->err,
                 "minigpt: kv cache: token %d at position %d (vocabulary %d, context %d)", token, t,
                 c->V, c->T);
        return DT_EINVAL;
    }
    const float *wte = m->params.wte + (size_t)token * c->C,
                *wpe = m->params.wpe + (size_t)t * c->C;
    for (int i = 0; i < c->C; i++)
        kv->x[i] = wte[i] + wpe[i];
    for (int l = 0; l < c->L; l++)
        block_one(kv, l, t);
    m->be->layernorm_forward(kv->ln, kv->stats, kv->stats + 1, kv->x, m->params.lnfw,
                             m->params.lnfb, 1, c->C);
    matvec(kv->logits, kv->ln, m->params.lm_head, NULL, c->C, c->V);
    kv->len = t + 1;
    return DT_OK;
}
