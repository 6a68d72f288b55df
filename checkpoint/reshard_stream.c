/*
 * reshard_stream.c — resharding a step directory one output shard at a
 * time, so that the tool never holds the whole state.
 *
 * dt_ckpt_save_all writes M shards from a full state in memory: the
 * parameters and every optimizer array over [0, Ψ), 16Ψ bytes for a
 * ZeRO-1 checkpoint (2.6 GB at GPT-2 small's 162M). Resharding needs no
 * more than one output shard at a time: output rank r's file holds the
 * slice [lo, lo + n) of every array (the new layout's), and that slice is
 * the intersection of the input shards' global ranges with [lo, lo + n),
 * which the shard reader copies out of each (held and optimizer ranges
 * set to the slice; load.c's resharding, one slice at a time).
 *
 * So: every input shard is verified first (dt_ckpt_verify: its SHA-256,
 * through a 1 MiB scratch), then for r = 0 .. M-1 the slice is read from
 * the shards that meet it (checking reads: sizes, headers, section
 * tables, no second hash) into buffers sized for the largest slice, and
 * written as rank r's shard (ckpt_save_each); the manifest is committed
 * as dt_ckpt_save_all commits it. The bytes are the same as the in-memory
 * reshard's. Memory: 16 bytes per parameter of the largest output slice,
 * 16Ψ/M for an even partition, instead of 16Ψ (M = 1, consolidating,
 * still holds the whole state: the output shard is the whole model).
 * Input read: each input shard once to verify, then the ranges each
 * output slice needs.
 *
 * Not for --tp (in or out): a tp checkpoint's shares are laid out per
 * share, and converting them needs the whole model (tp_share.c).
 */
#include <stdlib.h>

#include "ckpt_internal.h"

typedef struct slice_source {
    dt_ckpt *ck;            /* the output's handle: failures are reported there */
    const char *dir;        /* the input step directory */
    const ckpt_manifest *m; /* its manifest */
    float *buf[4];          /* params, master, m, v: the largest slice each */
} slice_source;

/* Output rank r's slice of every array, read from the input shards. */
static dt_status fill_slice(void *user, const dt_ckpt_state *full, int r, int world,
                            dt_ckpt_state *slice)
{
    slice_source *src = user;
    size_t lo, n;
    ckpt_slice_of(full, r, world, &lo, &n);
    slice->held_lo = slice->opt_lo = lo;
    slice->held_n = slice->opt_n = n;
    slice->params = src->buf[0];
    slice->master = full->mode == DT_CKPT_ZERO1 ? src->buf[1] : NULL;
    slice->adam_m = src->buf[2];
    slice->adam_v = src->buf[3];
    dt_status st = DT_OK;
    for (int q = 0; n > 0 && q < src->m->world && st == DT_OK; q++)
        st = ckpt_read_shard(src->ck, src->dir, src->m, q, slice, false);
    return st;
}

/* The largest slice of the layout (at least 1, for a buffer). */
static size_t largest_slice(const dt_ckpt_state *full, int world)
{
    size_t most = 1;
    for (int r = 0; r < world; r++) {
        size_t lo, n;
        ckpt_slice_of(full, r, world, &lo, &n);
        most = n > most ? n : most;
    }
    return most;
}

dt_status dt_ckpt_reshard_streamed(dt_ckpt *out, dt_ckpt *in, const char *step_dir, int world,
                                   const size_t *slices, const int *slice_order)
{
    dt_status st = dt_ckpt_verify(in, step_dir);
    if (st != DT_OK)
        return ckpt_fail(out, st, dt_ckpt_last_fault(in), "%s", dt_ckpt_error(in));
    ckpt_manifest m;
    if ((st = ckpt_manifest_read(in, step_dir, &m)) != DT_OK)
        return ckpt_fail(out, st, dt_ckpt_last_fault(in), "%s", dt_ckpt_error(in));
    slice_source src = {.ck = out, .dir = step_dir, .m = &m};
    dt_ckpt_state full = {.cfg = m.cfg,
                          .mode = m.mode,
                          .world = 1, /* as a full state loaded by one process */
                          .step = m.step,
                          .seed = m.seed,
                          .data_row = m.data_row,
                          .rng_state = m.rng_state,
                          .num_params = (size_t)m.num_params,
                          .opt_n = (size_t)m.num_params,
                          .slices = slices,
                          .slice_order = slice_order};
    size_t cap = world >= 1 && world <= DT_CKPT_MAX_WORLD ? largest_slice(&full, world) : 1;
    for (int k = 0; k < 4; k++)
        src.buf[k] = malloc(cap * sizeof(float));
    full.params = src.buf[0]; /* only checked for presence: the slices fill it */
    if (m.tp > 1)
        st = ckpt_fail(out, DT_EINVAL, DT_CKPT_FAULT_CONFIG,
                       "reshard: %s holds --tp %d shares, which slices of the flat buffer do "
                       "not convert: load it whole",
                       step_dir, m.tp);
    else if (!src.buf[0] || !src.buf[1] || !src.buf[2] || !src.buf[3])
        st = ckpt_fail(out, DT_ENOMEM, DT_CKPT_FAULT_IO,
                       "reshard: out of memory for a slice of %zu parameters", cap);
    else
        st = ckpt_save_each(out, &full, world, fill_slice, &src);
    for (int k = 0; k < 4; k++)
        free(src.buf[k]);
    ckpt_manifest_free(&m);
    return st;
}
