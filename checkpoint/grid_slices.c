/*
 * grid_slices.c — who saves what in a checkpoint of a 3-D run (minigpt
 * --dp D --tp T --pp P): the tp layout's shares, each cut by the pipeline
 * into its stages' ranges, each range cut over the replicas.
 *
 * The flat buffer is a tp checkpoint's (tp_share.c: the T shares end to
 * end without their vocabulary padding, "tp": T in the manifest). A share keeps the model's tensor order,
 * so stage s (blocks [l0, l1), with the embeddings when l0 = 0 and ln_f
 * and the head when l1 = L) holds one contiguous range of it, exactly as
 * a plain pipeline stage holds one of the model's buffer; its D replicas
 * each save a piece of that range (dt_ckpt_partition), so every one of
 * the D·T·P ranks writes about 1/(D·T·P) of the checkpoint and nothing is
 * gathered. Slices run through the buffer share by share, stage by stage,
 * replica by replica; world ranks run replica-major inside a stage and tp
 * rank fastest (Megatron's grid), so slice_order maps one onto the other.
 * With T = 1 this is dt_ckpt_pipeline_slices' layout, with P = 1
 * dt_ckpt_tp_slices', and any layout of the same T loads any other (the
 * loader intersects ranges): the grid is not in the manifest.
 *
 * Cost: one pass over the model's tensor table.
 */
#include <stdlib.h>

#include "ckpt_internal.h"

/* Stage [l0, l1)'s range [*lo, *hi) of one share of tp (1: the model's
 * buffer); tab: tp's layout table (NULL for 1). */
static void stage_range(const dt_config *cfg, const dt_tp_tensor *tab, int n, int l0, int l1,
                        size_t *lo, size_t *hi)
{
    if (!tab) {
        dt_config_stage_range(cfg, l0, l1, lo, hi);
        return;
    }
    /* wte, wpe, then 10 tensors a block, then ln_f (2) and the head */
    int first = l0 == 0 ? 0 : 2 + 10 * l0;
    int last = l1 == cfg->L ? n - 1 : 2 + 10 * l1 - 1;
    *lo = tab[first].local.offset;
    *hi = tab[last].local.offset + tab[last].local.numel;
}

dt_status dt_ckpt_grid_slices(size_t *slices, int *order, const dt_config *cfg, int T, int P, int D,
                              const int *blocks)
{
    T = T > 1 ? T : 1;
    size_t flat = dt_ckpt_flat_params(cfg, T), share = T > 1 ? dt_tp_num_params(cfg, T) : flat;
    if (flat == 0)
        return DT_EINVAL;
    int n = dt_tp_layout_num_tensors(cfg);
    dt_tp_tensor *tab = NULL;
    if (T > 1) {
        tab = malloc((size_t)n * sizeof *tab);
        if (!tab || dt_tp_layout_build(tab, cfg, T) != n) {
            free(tab);
            return DT_ENOMEM;
        }
    }
    for (int t = 0; t < T; t++)
        for (int s = 0; s < P; s++) {
            size_t lo, hi;
            stage_range(cfg, tab, n, blocks[s], blocks[s + 1], &lo, &hi);
            for (int rep = 0; rep < D; rep++) {
                size_t plo, pn;
                int k = (t * P + s) * D + rep;
                dt_ckpt_partition(hi - lo, D, rep, &plo, &pn);
                if (T > 1) /* the padding left out (tp_share.c) */
                    dt_ckpt_tp_range(cfg, T, t, lo + plo, pn, &slices[k], &plo, &pn);
                else
                    slices[k] = (size_t)t * share + lo + plo;
                order[s * D * T + rep * T + t] = k;
            }
        }
    slices[T * P * D] = flat;
    free(tab);
    return DT_OK;
}
