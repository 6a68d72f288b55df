/*
 * load.c — finding, inspecting, loading and verifying a step directory:
 * by one process (dt_ckpt_load, dt_ckpt_verify: the tool, the tests), or
 * by all ranks of a job together (dt_ckpt_load_collective: resuming).
 *
 * A load is: the manifest (validated in manifest.c), the caller's state
 * against it (config, world, mode), then every shard, each copied by the
 * intersection of its global ranges with what the caller holds —
 * resharding N -> M is this intersection, nothing more. Every rank needs
 * all the parameters, so every rank reads from every shard.
 *
 * Who hashes what. One process verifies every shard: it streams each file
 * through SHA-256. In a job of M ranks that would hash the checkpoint M
 * times over, for nothing: a shard's bytes on disk are the same for every
 * rank. So in the collective load shard r is verified by rank r mod M
 * only (N shards spread evenly over the M ranks, whatever N and M are),
 * and the other ranks only check it: they check its size, header and
 * section table (every structural check, on what they read) and pread
 * just the bytes they hold. Each rank then has a partial verdict — its own
 * checks, plus the hashes of the shards it verified — and one collective
 * (verdict.c) makes them one: a load succeeds on every rank or fails on
 * every rank with the same status, naming the shard file and what was
 * wrong. A rank must not use what it loaded before that agreement, which
 * is why the collective load returns only after it.
 *
 * Order: each rank first reads the shards it verifies (all of each file,
 * which also brings it into the page cache for the ranks that read parts
 * of it from a cold disk), then the rest.
 *
 * Cost, Ψ parameters, M ranks, checkpoint of B bytes (ZeRO-1: B ≈ 16Ψ):
 * each rank hashes B/M and reads B/M + 4Ψ (the parameters) + 12Ψ/M (its
 * master, m, v), and takes part in one 4-byte all-reduce. One process
 * (dt_ckpt_load) hashes and reads all B.
 */
#include <string.h>

#include "ckpt_internal.h"

dt_status dt_ckpt_latest(dt_ckpt *ck, char *buf, size_t len)
{
    ckpt_reset(ck);
    char path[CKPT_PATH_MAX], *text;
    size_t n;
    ckpt_join(path, ck->root, "latest", "");
    dt_status st = ckpt_read_small(ck, path, 256, &text, &n);
    if (st != DT_OK)
        return st;
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r'))
        text[--n] = '\0';
    if (!ckpt_name_is_safe(text) || strncmp(text, "step_", 5) != 0) {
        st = ckpt_fail(ck, DT_EPROTO, DT_CKPT_FAULT_UNSAFE_NAME,
                       "%s: \"%.64s\" is not a step directory's name", path, text);
    } else if ((size_t)snprintf(buf, len, "%s/%s", ck->root, text) >= len) {
        st = ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_FIELD,
                       "latest: the path does not fit the buffer");
    }
    free(text);
    return st;
}

dt_status dt_ckpt_inspect(dt_ckpt *ck, const char *step_dir_path, dt_ckpt_info *info)
{
    ckpt_manifest m;
    ckpt_reset(ck);
    dt_status st = ckpt_manifest_read(ck, step_dir_path, &m);
    if (st != DT_OK)
        return st;
    *info = (dt_ckpt_info){.step = m.step,
                           .world = m.world,
                           .tp = m.tp,
                           .mode = m.mode,
                           .cfg = m.cfg,
                           .num_params = (size_t)m.num_params,
                           .seed = m.seed,
                           .data_row = m.data_row,
                           .rng_state = m.rng_state};
    for (int r = 0; r < m.world; r++)
        info->total_bytes += m.shards[r].bytes;
    ckpt_manifest_free(&m);
    return DT_OK;
}

dt_status dt_ckpt_check(dt_ckpt *ck, const char *step_dir)
{
    ckpt_manifest m;
    ckpt_reset(ck);
    dt_status st = ckpt_manifest_read(ck, step_dir, &m);
    if (st != DT_OK)
        return st;
    for (int r = 0; r < m.world && st == DT_OK; r++)
        st = ckpt_read_shard(ck, step_dir, &m, r, NULL, false);
    ckpt_manifest_free(&m);
    return st;
}

/* The caller's state against the manifest: same model, same world and
 * mode unless resharding is allowed, buffers that fit. */
static dt_status check_target(dt_ckpt *ck, const ckpt_manifest *m, const dt_ckpt_state *s,
                              const char *dir)
{
    int tp = s->tp > 1 ? s->tp : 1;
    if (memcmp(&s->cfg, &m->cfg, sizeof s->cfg) == 0 && tp != m->tp)
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_CONFIG,
                         "%s/manifest.json: saved with --tp %d, loading with --tp %d: the "
                         "shares differ (dtrain-ckpt reshard %s OUTROOT M --tp %d writes it "
                         "for --tp %d on M ranks)",
                         dir, m->tp, tp, dir, tp, tp);
    if (memcmp(&s->cfg, &m->cfg, sizeof s->cfg) != 0 || s->num_params != m->num_params)
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_CONFIG,
                         "%s: saved for V=%d T=%d L=%d H=%d C=%d, loading "
                         "into V=%d T=%d L=%d H=%d C=%d",
                         dir, m->cfg.V, m->cfg.T, m->cfg.L, m->cfg.H, m->cfg.C, s->cfg.V, s->cfg.T,
                         s->cfg.L, s->cfg.H, s->cfg.C);
    if ((s->world != m->world || s->mode != m->mode) && !ck->opts.allow_reshard)
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_WORLD,
                         "%s: saved by %d ranks (%s), loading on %d (%s); "
                         "allow resharding to load it",
                         dir, m->world, m->mode == DT_CKPT_ZERO1 ? "zero1" : "ddp", s->world,
                         s->mode == DT_CKPT_ZERO1 ? "zero1" : "ddp");
    size_t held_n = s->held_n ? s->held_n : s->num_params;
    if (!s->params || s->opt_lo > s->num_params || s->opt_n > s->num_params - s->opt_lo ||
        s->held_lo > s->num_params || held_n > s->num_params - s->held_lo ||
        (s->master && s->opt_n > 0 &&
         (s->opt_lo < s->held_lo || s->opt_lo + s->opt_n > s->held_lo + held_n)))
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_FIELD,
                         "load: no parameter buffer, or a held or optimizer "
                         "range outside the model");
    return DT_OK;
}

/* The shards of m in this rank's order: those it verifies (r mod world =
 * rank) first, then the ones it only checks. */
static dt_status read_shards(dt_ckpt *ck, const char *dir, const ckpt_manifest *m, dt_ckpt_state *s,
                             int rank, int world)
{
    dt_status st = DT_OK;
    for (int pass = 0; pass < 2; pass++) {
        bool verify = pass == 0;
        for (int r = 0; r < m->world && st == DT_OK; r++)
            if ((r % world == rank) == verify)
                st = ckpt_read_shard(ck, dir, m, r, s, verify);
    }
    return st;
}

/* One rank's part of a load by `world` ranks (1: the whole of it). */
static dt_status load_part(dt_ckpt *ck, const char *dir, dt_ckpt_state *s, int rank, int world)
{
    ckpt_manifest m;
    dt_status st = ckpt_manifest_read(ck, dir, &m);
    if (st != DT_OK)
        return st;
    if (s)
        st = check_target(ck, &m, s, dir);
    if (st == DT_OK)
        st = read_shards(ck, dir, &m, s, rank, world);
    if (st == DT_OK && s) {
        /* a DDP checkpoint has no master: fp32 master = the parameters */
        if (s->master && m.mode != DT_CKPT_ZERO1 && s->opt_n > 0 &&
            s->master != s->params + (s->opt_lo - s->held_lo)) /* ZeRO-3: the same array */
            memcpy(s->master, s->params + (s->opt_lo - s->held_lo), s->opt_n * sizeof(float));
        s->step = m.step;
        s->seed = m.seed;
        s->data_row = m.data_row;
        s->rng_state = m.rng_state;
    }
    ckpt_manifest_free(&m);
    return st;
}

dt_status dt_ckpt_load(dt_ckpt *ck, const char *dir, dt_ckpt_state *s)
{
    ckpt_reset(ck);
    return load_part(ck, dir, s, 0, 1);
}

dt_status dt_ckpt_verify(dt_ckpt *ck, const char *dir)
{
    return dt_ckpt_load(ck, dir, NULL);
}

dt_status dt_ckpt_load_collective(dt_ckpt *ck, dt_comm *comm, const char *dir, dt_ckpt_state *s)
{
    if (!comm)
        return dt_ckpt_load(ck, dir, s);
    int rank = dt_comm_rank(comm), world = dt_comm_size(comm);
    ckpt_reset(ck);
    if (s && (s->rank != rank || s->world != world))
        ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_WORLD,
                  "load: the state says "
                  "rank %d of %d, the communicator %d of %d",
                  s->rank, s->world, rank, world);
    else
        load_part(ck, dir, s, rank, world);
    return ckpt_agree(ck, comm, "load");
}
