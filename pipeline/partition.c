/*
 * partition.c — which blocks each pipeline stage owns.
 *
 * A stage owns a contiguous range of blocks; the first also owns the
 * embeddings (wte, wpe), the last ln_f and the head. Two rules:
 *
 *   params   (the default, DeepSpeed's "parameters" method) minimise the
 *            largest stage's parameter count, exactly, by dynamic
 *            programming over where each stage ends: best[k][j] = the
 *            smallest possible largest stage when k stages hold blocks
 *            [0, j). O(p L^2), nothing for L <= 1024.
 *   uniform  L / p blocks each, the remainder one each to the first
 *            stages (Megatron's default when L divides evenly).
 *
 * With a large vocabulary the embeddings and the head outweigh blocks, so
 * "params" gives the end stages fewer blocks. Every stage must own at
 * least one block: a stage with only embeddings or only the head would
 * split the residual stream in a place the stage model does not have.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipe_internal.h"

bool dt_pipe_partition_parse(const char *name, dt_pipe_partition_kind *out)
{
    if (strcmp(name, "params") == 0)
        *out = DT_PARTITION_PARAMS;
    else if (strcmp(name, "uniform") == 0)
        *out = DT_PARTITION_UNIFORM;
    else
        return false;
    return true;
}

/* Parameters of a stage owning blocks [a, b), counted by the model's own
 * layout (one block = the difference one more layer makes). */
static size_t stage_params(const dt_config *c, int a, int b)
{
    size_t C = (size_t)c->C, V = (size_t)c->V, T = (size_t)c->T;
    dt_config one = *c, two = *c;
    one.L = 1;
    two.L = 2;
    size_t block = dt_config_num_params(&two) - dt_config_num_params(&one);
    size_t n = (size_t)(b - a) * block;
    if (a == 0)
        n += V * C + T * C;
    if (b == c->L)
        n += 2 * C + V * C;
    return n;
}

static int by_params(int *bounds, const dt_config *c, int p)
{
    int L = c->L;
    size_t *best = malloc((size_t)(p + 1) * (L + 1) * sizeof(size_t));
    int *cut = malloc((size_t)(p + 1) * (L + 1) * sizeof(int));
    if (!best || !cut) {
        free(best), free(cut);
        return -1;
    }
#define AT(k, j) ((size_t)(k) * (L + 1) + (j))
    for (int j = 1; j <= L; j++)
        best[AT(1, j)] = stage_params(c, 0, j), cut[AT(1, j)] = 0;
    for (int k = 2; k <= p; k++)
        for (int j = k; j <= L; j++) {
            best[AT(k, j)] = (size_t)-1;
            for (int i = k - 1; i < j; i++) { /* stage k-1 owns [i, j) */
                size_t a = best[AT(k - 1, i)], b = stage_params(c, i, j);
                size_t worst = a > b ? a : b;
                if (worst < best[AT(k, j)])
                    best[AT(k, j)] = worst, cut[AT(k, j)] = i;
            }
        }
    bounds[p] = L;
    for (int k = p; k >= 1; k--)
        bounds[k - 1] = cut[AT(k, bounds[k])];
#undef AT
    free(best);
    free(cut);
    return 0;
}

dt_status dt_pipe_partition(int *bounds, const dt_config *cfg, int p, dt_pipe_partition_kind kind,
                            char *err, size_t errlen)
{
    if (p < 1 || p > cfg->L) {
        snprintf(err, errlen,
                 "pipeline: %d stages for %d blocks: every "
                 "stage must own at least one block (use --pp <= %d or "
                 "more layers)",
                 p, cfg->L, cfg->L);
        return DT_EINVAL;
    }
    if (kind == DT_PARTITION_PARAMS) {
        if (by_params(bounds, cfg, p) != 0) {
            snprintf(err, errlen, "pipeline: partition: out of memory");
            return DT_ENOMEM;
        }
        return DT_OK;
    }
    int base = cfg->L / p, extra = cfg->L % p;
    bounds[0] = 0;
    for (int s = 0; s < p; s++)
        bounds[s + 1] = bounds[s] + base + (s < extra);
    return DT_OK;
}
