/*
 * tp_share.c — the checkpoint of a tensor-parallel run: its shares end to
 * end, and the conversion between tp layouts.
 *
 * A tp rank holds a share of the model (model/tp_layout.c): its slices of
 * the split tensors plus every replicated one, in the model's tensor
 * order. The shares are not ranges of the model's flat buffer (a
 * row-parallel weight is a column stripe), so a tp checkpoint does not
 * store the model's buffer: it stores the T shares one after the other,
 *
 *   flat buffer = share 0 | share 1 | ... | share T-1     (T x S elements)
 *
 * (share t without its vocabulary padding, dt_tp_share_kept: the kept
 * shares of a V that tp does not divide differ in length by a few rows,
 * and the buffer holds the unpadded model's V rows of wte and lm_head)
 * and each rank holds one contiguous range of that, exactly like a
 * pipeline stage holds its range: the shard format, the manifest's ranges
 * and the loader's intersections need nothing new, only "tp": T in the
 * manifest to say what the buffer is. The replicated tensors are stored
 * T times (896 of the default model's 29,824 parameters, once per extra
 * share); the price of a layout the loader already knows.
 *
 * Within share t, the D replicas of a --tp T --dp D run each save a piece
 * (dt_ckpt_partition of S over D), as ZeRO-1 would cut it, so the writes
 * are spread over all T·D ranks. Their world ranks are replica·T + t, so
 * consecutive ranks save pieces of different shares: slice_order says
 * which slice each rank saves.
 *
 * Converting T -> T' (dtrain-ckpt reshard --tp, export) goes through the
 * model's layout: join the shares (dt_tp_layout_unslice, share 0's copy of
 * the replicated tensors last, so it wins), then cut T' shares
 * (dt_tp_layout_slice), each through a scratch share that puts the
 * padding back (zeros). Every array the same way: parameters, master, m,
 * v are laid out alike. Cost: one pass over each array per direction,
 * host memory for both layouts and one share.
 */
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"

size_t dt_ckpt_flat_params(const dt_config *cfg, int tp)
{
    if (tp <= 1)
        return dt_config_num_params(cfg);
    if (dt_tp_config_check(cfg, tp, NULL, 0) != DT_OK)
        return 0;
    size_t pad = (size_t)tp * (size_t)dt_tp_vocab_rows(cfg, tp) - (size_t)cfg->V;
    return (size_t)tp * dt_tp_num_params(cfg, tp) - 2 * pad * (size_t)cfg->C;
}

/* Where share t's kept part starts in the flat buffer. */
static size_t kept_offset(const dt_config *cfg, int T, int t)
{
    size_t off = 0, lo, n;
    for (int q = 0; q < t; q++) {
        dt_tp_share_kept(cfg, T, q, &lo, &n);
        off += n;
    }
    return off;
}

void dt_ckpt_tp_range(const dt_config *cfg, int T, int t, size_t lo, size_t n, size_t *flat_lo,
                      size_t *skip, size_t *kept)
{
    size_t klo, kn;
    dt_tp_share_kept(cfg, T, t, &klo, &kn);
    size_t khi = klo + kn, a = lo < klo ? klo : lo > khi ? khi : lo;
    size_t b = lo + n < klo ? klo : lo + n > khi ? khi : lo + n;
    *flat_lo = kept_offset(cfg, T, t) + (a - klo);
    *skip = a >= lo ? a - lo : 0;
    *kept = b - a;
}

void dt_ckpt_tp_slices(size_t *slices, int *order, const dt_config *cfg, int T, int D)
{
    size_t share = dt_tp_num_params(cfg, T);
    for (int t = 0; t < T; t++)
        for (int rep = 0; rep < D; rep++) {
            size_t lo, n, skip, kept;
            dt_ckpt_partition(share, D, rep, &lo, &n); /* ZeRO-1's piece of the share */
            dt_ckpt_tp_range(cfg, T, t, lo, n, &slices[t * D + rep], &skip, &kept);
            order[rep * T + t] = t * D + rep;
        }
    slices[T * D] = dt_ckpt_flat_params(cfg, T);
}

void dt_ckpt_tp_free(dt_ckpt_state *s)
{
    free(s->params);
    free(s->master);
    free(s->adam_m);
    free(s->adam_v);
    s->params = s->master = s->adam_m = s->adam_v = NULL;
}

/* One array from the layout of tp `from` into that of `to` (each 1 or a
 * tp size); full: Ψ elements of scratch, share: a share of the larger tp. */
static void convert_array(float *dst, const float *src, float *full, float *share,
                          const dt_config *cfg, const dt_tp_tensor *tf, const dt_tp_tensor *tt,
                          int n, int from, int to)
{
    const float *whole = src;
    size_t lo, kn;
    if (from > 1) {
        for (int q = from - 1; q >= 0; q--) { /* share 0's replicated tensors last */
            dt_tp_share_kept(cfg, from, q, &lo, &kn);
            memcpy(share + lo, src + kept_offset(cfg, from, q), kn * sizeof(float));
            dt_tp_layout_unslice(full, share, tf, n, from, q); /* reads no padding */
        }
        whole = full;
    }
    if (to <= 1) {
        memcpy(dst, whole, dt_config_num_params(cfg) * sizeof(float));
        return;
    }
    for (int q = 0; q < to; q++) {
        dt_tp_layout_slice(share, whole, tt, n, to, q);
        dt_tp_share_kept(cfg, to, q, &lo, &kn);
        memcpy(dst + kept_offset(cfg, to, q), share + lo, kn * sizeof(float));
    }
}

/* The layout table of tp (NULL for 1); *ok false if it could not be made. */
static dt_tp_tensor *table_of(const dt_config *cfg, int tp, bool *ok)
{
    if (tp <= 1)
        return NULL;
    int n = dt_tp_layout_num_tensors(cfg);
    dt_tp_tensor *t = malloc((size_t)n * sizeof *t);
    if (!t || dt_tp_layout_build(t, cfg, tp) != n) {
        free(t);
        *ok = false;
        return NULL;
    }
    return t;
}

dt_status dt_ckpt_tp_convert(dt_ckpt_state *out, const dt_ckpt_state *in, int tp)
{
    int from = in->tp > 1 ? in->tp : 1, to = tp > 1 ? tp : 1;
    size_t sf = dt_ckpt_flat_params(&in->cfg, from), st = dt_ckpt_flat_params(&in->cfg, to);
    *out = *in;
    out->params = out->master = out->adam_m = out->adam_v = NULL;
    if (sf == 0 || st == 0 || sf != in->num_params || in->held_n != 0 || in->opt_lo != 0 ||
        in->opt_n != in->num_params)
        return DT_EINVAL;
    out->tp = to;
    out->num_params = out->opt_n = st;
    out->slices = NULL;
    out->slice_order = NULL;
    bool ok = true;
    int n = dt_tp_layout_num_tensors(&in->cfg);
    dt_tp_tensor *tf = table_of(&in->cfg, from, &ok), *tt = table_of(&in->cfg, to, &ok);
    float *full = malloc(dt_config_num_params(&in->cfg) * sizeof(float));
    float *share = malloc(dt_tp_num_params(&in->cfg, from > to ? from : to) * sizeof(float));
    const float *src[4] = {in->params, in->master, in->adam_m, in->adam_v};
    float **dst[4] = {&out->params, &out->master, &out->adam_m, &out->adam_v};
    for (int k = 0; k < 4 && ok && full && share; k++) {
        if (!src[k])
            continue;
        if (!(*dst[k] = malloc(st * sizeof(float))))
            ok = false;
        else
            convert_array(*dst[k], src[k], full, share, &in->cfg, tf, tt, n, from, to);
    }
    ok = ok && full && share;
    free(full);
    free(share);
    free(tf);
    free(tt);
    if (!ok)
        dt_ckpt_tp_free(out);
    return ok ? DT_OK : DT_ENOMEM;
}
