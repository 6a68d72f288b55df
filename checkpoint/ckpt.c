/*
 * ckpt.c — the checkpoint handle, the collective save with its commit
 * protocol, and load/verify/inspect.
 *
 * Save, on every rank (comm NULL = world 1):
 *   1. rank 0 makes root/step_N/ and removes a stale manifest there (a
 *      crashed earlier attempt at the same step must not vouch for the new
 *      shards); broadcast of its verdict = "directory ready" barrier.
 *   2. each rank writes its shard (shard_file.c): tmp, SHA-256, fsync,
 *      rename. A rank that fails keeps going through the collectives with
 *      ok = 0, so nobody hangs and nothing is committed.
 *   3. gather of (ok, sha256) to rank 0 = "all shards written" (each
 *      shard's size is recomputed from the layout, ckpt_describe_shard).
 *   4. rank 0 writes the manifest, then `latest`, each atomically
 *      (fsutil.c), then rotates (--keep).
 *   5. broadcast of rank 0's verdict = "manifest committed": every rank
 *      returns the same status, and no rank starts the next step (or the
 *      next save) before the commit.
 * Cost: one broadcast, one gather of 72 B per rank, one broadcast; disk
 * work in parallel on all ranks.
 *
 * Load: manifest (validated in manifest.c), then the caller's state against
 * it (config, world, mode), then every shard (each rank needs all the
 * parameters), each copied by the intersection of its global ranges with
 * what the caller holds — resharding is this intersection, nothing more.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"

#define RECORD_BYTES 72 /* ok u8 @0, sha256 hex @8 */

dt_status ckpt_fail(dt_ckpt *ck, dt_status st, dt_ckpt_fault fault,
                    const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ck->err, sizeof ck->err, fmt, ap);
    va_end(ap);
    ck->fault = fault;
    ck->status = st;
    return st;
}

const char *dt_ckpt_fault_name(dt_ckpt_fault f)
{
    static const char *const names[] = {
        "DT_CKPT_FAULT_NONE", "DT_CKPT_FAULT_IO", "DT_CKPT_FAULT_NO_CHECKPOINT",
        "DT_CKPT_FAULT_BAD_JSON", "DT_CKPT_FAULT_SCHEMA", "DT_CKPT_FAULT_FIELD",
        "DT_CKPT_FAULT_WORLD", "DT_CKPT_FAULT_CONFIG",
        "DT_CKPT_FAULT_RANK_RANGE", "DT_CKPT_FAULT_RANK_DUP",
        "DT_CKPT_FAULT_RANK_MISSING", "DT_CKPT_FAULT_UNSAFE_NAME",
        "DT_CKPT_FAULT_MISSING_FILE", "DT_CKPT_FAULT_SIZE",
        "DT_CKPT_FAULT_HASH", "DT_CKPT_FAULT_ABSURD", "DT_CKPT_FAULT_HEADER",
        "DT_CKPT_FAULT_COVERAGE"};
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "?";
}

void dt_ckpt_partition(size_t n, int world, int r, size_t *lo, size_t *count)
{
    size_t s = (n + (size_t)world - 1) / (size_t)world;
    *lo = (size_t)r * s;
    if (*lo > n)
        *lo = n;
    *count = n - *lo < s ? n - *lo : s;
}

dt_status dt_ckpt_open(dt_ckpt **out, const char *root,
                       const dt_ckpt_options *opts)
{
    dt_ckpt *ck = calloc(1, sizeof *ck);
    *out = ck;
    if (!ck)
        return DT_ENOMEM;
    if (opts)
        ck->opts = *opts;
    if (!root || !*root || strlen(root) >= CKPT_PATH_MAX - 128)
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_FIELD,
                         "checkpoint root: empty or too long a path");
    snprintf(ck->root, sizeof ck->root, "%s", root);
    return DT_OK;
}

void dt_ckpt_close(dt_ckpt *ck) { free(ck); }
const char *dt_ckpt_error(const dt_ckpt *ck) { return ck->err; }
dt_ckpt_fault dt_ckpt_last_fault(const dt_ckpt *ck) { return ck->fault; }
const char *dt_ckpt_root(const dt_ckpt *ck) { return ck->root; }

/* Each public call reports only its own failure. */
static void reset(dt_ckpt *ck)
{
    ck->fault = DT_CKPT_FAULT_NONE;
    ck->status = DT_OK;
    ck->err[0] = '\0';
}

/* ---- save ---------------------------------------------------------------- */

/*
 * Saving a step again (a run resumed from an older checkpoint) must first
 * unmake the old commit of that step: its manifest would vouch for shards
 * being replaced. If `latest` names that step, it is moved first to the
 * newest other committed step, or removed when there is none, so that
 * `latest` never names a directory without a manifest, even for an instant.
 */
static dt_status prepare_dir(dt_ckpt *ck, const char *dir, const char *name,
                             long step)
{
    if ((mkdir(ck->root, 0755) != 0 && errno != EEXIST) ||
        (mkdir(dir, 0755) != 0 && errno != EEXIST))
        return ckpt_fail(ck, DT_ESYS, DT_CKPT_FAULT_IO, "creating %s: %s",
                         dir, strerror(errno));
    char man[CKPT_PATH_MAX], latest[CKPT_PATH_MAX], other[64];
    ckpt_join(man, dir, "manifest.json", "");
    if (access(man, F_OK) != 0)
        return DT_OK;
    ckpt_join(latest, ck->root, "latest", "");
    char *text = NULL;
    size_t len;
    if (ckpt_read_small(ck, latest, 256, &text, &len) == DT_OK &&
        strncmp(text, name, strlen(name)) == 0 &&
        (text[strlen(name)] == '\n' || text[strlen(name)] == '\0')) {
        dt_status st = DT_OK;
        if (ckpt_newest_committed(ck, step, other)) {
            char line[80];
            snprintf(line, sizeof line, "%s\n", other);
            st = ckpt_write_atomic(ck, ck->root, "latest", line, strlen(line));
        } else if (remove(latest) == 0) {
            ckpt_fsync_dir(ck->root);
        }
        if (st != DT_OK) {
            free(text);
            return st;
        }
    }
    free(text);
    ck->fault = DT_CKPT_FAULT_NONE;
    ck->status = DT_OK;
    ck->err[0] = '\0';
    if (remove(man) == 0)
        ckpt_fsync_dir(dir);
    return DT_OK;
}

/* Rank 0's part: manifest, latest, rotation. */
static dt_status commit(dt_ckpt *ck, const char *dir, const char *name,
                        const dt_ckpt_state *s, int world, ckpt_shard *recs)
{
    ckpt_manifest m = {.schema = DT_CKPT_SCHEMA_VERSION, .step = s->step,
                       .world = world, .mode = s->mode, .cfg = s->cfg,
                       .num_params = s->num_params, .seed = s->seed,
                       .data_row = s->data_row, .rng_state = s->rng_state,
                       .shards = recs};
    dt_status st = ckpt_manifest_write(ck, dir, &m);
    if (st != DT_OK)
        return st;
    char text[80];
    snprintf(text, sizeof text, "%s\n", name);
    st = ckpt_write_atomic(ck, ck->root, "latest", text, strlen(text));
    if (st == DT_OK)
        ckpt_rotate(ck, ck->opts.keep, name);
    return st;
}

static dt_status check_state(dt_ckpt *ck, const dt_ckpt_state *s)
{
    char err[128];
    if (dt_config_check(&s->cfg, err, sizeof err) != DT_OK ||
        dt_config_num_params(&s->cfg) != s->num_params || !s->params ||
        s->step < 0 || s->opt_lo > s->num_params ||
        s->opt_n > s->num_params - s->opt_lo)
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_CONFIG,
                         "state: config, parameter count, step or optimizer "
                         "range inconsistent");
    return DT_OK;
}

/* name (64) = step_N, dir (CKPT_PATH_MAX) = root/step_N */
static void step_dir(const dt_ckpt *ck, long step, char *name, char *dir)
{
    ckpt_step_name(name, 64, step);
    ckpt_join(dir, ck->root, name, "");
}

/*
 * Steps 3-5 of the protocol: gather (ok, sha256) to rank 0, which knows
 * every other field of each record from the partition, commits if all are
 * ok, and broadcasts its verdict. ok is this rank's outcome so far.
 */
static dt_status gather_and_commit(dt_ckpt *ck, dt_comm *comm,
                                   const dt_ckpt_state *s, const char *dir,
                                   const char *name, const ckpt_shard *mine,
                                   bool ok)
{
    int rank = comm ? dt_comm_rank(comm) : 0;
    int world = comm ? dt_comm_size(comm) : 1;
    unsigned char rec[RECORD_BYTES] = {0};
    rec[0] = ok;
    memcpy(rec + 8, mine->sha256, 64);
    unsigned char *all = rank == 0 ? calloc((size_t)world, RECORD_BYTES) : NULL;
    ckpt_shard *recs = rank == 0 ? calloc((size_t)world, sizeof *recs) : NULL;
    int32_t verdict = rank != 0 || (all && recs);
    dt_status st = DT_OK;
    if (comm)
        st = dt_gather(comm, rec, all ? all : rec, RECORD_BYTES, DT_U8, 0);
    else if (all)
        memcpy(all, rec, RECORD_BYTES);
    if (st != DT_OK) {
        free(all);
        free(recs);
        return ckpt_fail(ck, st, DT_CKPT_FAULT_IO, "save of %s: gathering "
                         "the shards' hashes: %s", dir, dt_comm_error(comm));
    }
    int bad_rank = -1;
    if (rank == 0 && verdict) {
        for (int r = 0; r < world; r++) {
            const unsigned char *q = all + (size_t)r * RECORD_BYTES;
            if (!q[0] && bad_rank < 0)
                bad_rank = r;
            ckpt_describe_shard(s, r, world, &recs[r]);
            memcpy(recs[r].sha256, q + 8, 64);
            recs[r].sha256[64] = '\0';
        }
        verdict = bad_rank < 0 && ok;
        if (verdict)
            verdict = commit(ck, dir, name, s, world, recs) == DT_OK;
        else if (ok)
            ckpt_fail(ck, DT_EPROTO, DT_CKPT_FAULT_IO, "save of %s: rank %d "
                      "could not write its shard; nothing committed", dir,
                      bad_rank);
    }
    free(all);
    free(recs);
    if (comm && (st = dt_broadcast(comm, &verdict, 1, DT_I32, 0)) != DT_OK)
        return ckpt_fail(ck, st, DT_CKPT_FAULT_IO, "save of %s: the commit "
                         "broadcast: %s", dir, dt_comm_error(comm));
    if (verdict)
        return DT_OK;
    if (ok && rank != 0)
        ckpt_fail(ck, DT_EPROTO, DT_CKPT_FAULT_IO, "save of %s: not "
                  "committed (rank 0 or another rank failed; see its log)",
                  dir);
    return ck->status != DT_OK ? ck->status : DT_EPROTO;
}

dt_status dt_ckpt_save(dt_ckpt *ck, dt_comm *comm, const dt_ckpt_state *s)
{
    int rank = comm ? dt_comm_rank(comm) : 0;
    int world = comm ? dt_comm_size(comm) : 1;
    reset(ck);
    char name[64], dir[CKPT_PATH_MAX];
    step_dir(ck, s->step, name, dir);
    bool ok = check_state(ck, s) == DT_OK;
    if (ok && (s->rank != rank || s->world != world))
        ok = ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_WORLD, "save: the state "
                       "says rank %d of %d, the communicator %d of %d",
                       s->rank, s->world, rank, world) == DT_OK;
    int32_t ready = 1;
    if (rank == 0)
        ready = ok && prepare_dir(ck, dir, name, s->step) == DT_OK;
    dt_status st = DT_OK;
    if (comm && (st = dt_broadcast(comm, &ready, 1, DT_I32, 0)) != DT_OK)
        return ckpt_fail(ck, st, DT_CKPT_FAULT_IO, "save of %s: broadcast: "
                         "%s", dir, dt_comm_error(comm));
    if (!ready && ok)
        ok = ckpt_fail(ck, DT_EPROTO, DT_CKPT_FAULT_IO, "save of %s: rank 0 "
                       "could not prepare the directory", dir) == DT_OK;
    ckpt_shard mine = {0};
    if (ok)
        ok = ckpt_write_shard(ck, dir, s, rank, world, &mine) == DT_OK;
    return gather_and_commit(ck, comm, s, dir, name, &mine, ok);
}

dt_status dt_ckpt_save_all(dt_ckpt *ck, const dt_ckpt_state *full, int world)
{
    reset(ck);
    dt_status st = check_state(ck, full);
    if (st != DT_OK)
        return st;
    if (world < 1 || world > DT_CKPT_MAX_WORLD || full->opt_lo != 0 ||
        full->opt_n != full->num_params)
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_WORLD, "save_all: needs "
                         "1..%d ranks and optimizer arrays over all %zu "
                         "parameters", DT_CKPT_MAX_WORLD, full->num_params);
    char name[64], dir[CKPT_PATH_MAX];
    step_dir(ck, full->step, name, dir);
    if ((st = prepare_dir(ck, dir, name, full->step)) != DT_OK)
        return st;
    ckpt_shard *recs = calloc((size_t)world, sizeof *recs);
    if (!recs)
        return ckpt_fail(ck, DT_ENOMEM, DT_CKPT_FAULT_IO, "out of memory");
    for (int r = 0; r < world && st == DT_OK; r++)
        st = ckpt_write_shard(ck, dir, full, r, world, &recs[r]);
    if (st == DT_OK)
        st = commit(ck, dir, name, full, world, recs);
    free(recs);
    return st;
}

/* ---- load ---------------------------------------------------------------- */

dt_status dt_ckpt_latest(dt_ckpt *ck, char *buf, size_t len)
{
    reset(ck);
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
                       "%s: \"%.64s\" is not a step directory's name", path,
                       text);
    } else if ((size_t)snprintf(buf, len, "%s/%s", ck->root, text) >= len) {
        st = ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_FIELD,
                       "latest: the path does not fit the buffer");
    }
    free(text);
    return st;
}

dt_status dt_ckpt_inspect(dt_ckpt *ck, const char *step_dir_path,
                          dt_ckpt_info *info)
{
    ckpt_manifest m;
    reset(ck);
    dt_status st = ckpt_manifest_read(ck, step_dir_path, &m);
    if (st != DT_OK)
        return st;
    *info = (dt_ckpt_info){.step = m.step, .world = m.world, .mode = m.mode,
                           .cfg = m.cfg, .num_params = (size_t)m.num_params,
                           .seed = m.seed, .data_row = m.data_row,
                           .rng_state = m.rng_state};
    for (int r = 0; r < m.world; r++)
        info->total_bytes += m.shards[r].bytes;
    ckpt_manifest_free(&m);
    return DT_OK;
}

/* The caller's state against the manifest: same model, same world and
 * mode unless resharding is allowed, buffers that fit. */
static dt_status check_target(dt_ckpt *ck, const ckpt_manifest *m,
                              const dt_ckpt_state *s, const char *dir)
{
    if (memcmp(&s->cfg, &m->cfg, sizeof s->cfg) != 0 ||
        s->num_params != m->num_params)
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_CONFIG,
                         "%s: saved for V=%d T=%d L=%d H=%d C=%d, loading "
                         "into V=%d T=%d L=%d H=%d C=%d", dir, m->cfg.V,
                         m->cfg.T, m->cfg.L, m->cfg.H, m->cfg.C, s->cfg.V,
                         s->cfg.T, s->cfg.L, s->cfg.H, s->cfg.C);
    if ((s->world != m->world || s->mode != m->mode) && !ck->opts.allow_reshard)
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_WORLD,
                         "%s: saved by %d ranks (%s), loading on %d (%s); "
                         "allow resharding to load it", dir, m->world,
                         m->mode == DT_CKPT_ZERO1 ? "zero1" : "ddp", s->world,
                         s->mode == DT_CKPT_ZERO1 ? "zero1" : "ddp");
    if (!s->params || s->opt_lo > s->num_params ||
        s->opt_n > s->num_params - s->opt_lo)
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_FIELD,
                         "load: no parameter buffer, or an optimizer range "
                         "outside the model");
    return DT_OK;
}

dt_status dt_ckpt_load(dt_ckpt *ck, const char *dir, dt_ckpt_state *s)
{
    ckpt_manifest m;
    reset(ck);
    dt_status st = ckpt_manifest_read(ck, dir, &m);
    if (st != DT_OK)
        return st;
    if (s)
        st = check_target(ck, &m, s, dir);
    for (int r = 0; r < m.world && st == DT_OK; r++)
        st = ckpt_read_shard(ck, dir, &m, r, s);
    if (st == DT_OK && s) {
        /* a DDP checkpoint has no master: fp32 master = the parameters */
        if (s->master && m.mode != DT_CKPT_ZERO1 && s->opt_n > 0)
            memcpy(s->master, s->params + s->opt_lo, s->opt_n * sizeof(float));
        s->step = m.step;
        s->seed = m.seed;
        s->data_row = m.data_row;
        s->rng_state = m.rng_state;
    }
    ckpt_manifest_free(&m);
    return st;
}

dt_status dt_ckpt_verify(dt_ckpt *ck, const char *dir)
{
    return dt_ckpt_load(ck, dir, NULL);
}
