/*
 * manifest.c — manifest.json, the commit marker of a step directory.
 *
 *   {"format": "dtrain-checkpoint", "schema_version": 1, "step": 10,
 *    "world_size": 4, "mode": "zero1", "num_params": 29824,
 *    "config": {"V": 64, "T": 16, "L": 2, "H": 4, "C": 32},
 *    "seed": 1337, "data_row": 640, "rng_state": 1337,
 *    "shards": [{"rank": 0, "file": "rank00000.bin", "bytes": 119496,
 *                "sha256": "…", "ranges": {"params": [0, 7456],
 *                "master": [0, 7456], "m": [0, 7456], "v": [0, 7456]}}, …]}
 *
 * Ranges are [global offset, length] in elements of the model's flat
 * layout. seed and rng_state are 64-bit patterns stored as JSON integers
 * (two's complement: values >= 2^63 read as negative elsewhere).
 *
 * Reading validates before anything is trusted, in an order that makes
 * each corruption report its own cause: JSON syntax, format and schema
 * version, then each field's presence and type, then sanity bounds (a
 * hostile manifest must not make us allocate or seek absurdly), then
 * ranks (in range, unique, complete), file names, the byte count implied
 * by the ranges, and finally that each array's ranges tile [0, Ψ).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"

#define MAX_PARAMS ((uint64_t)1 << 40)

dt_status ckpt_manifest_write(dt_ckpt *ck, const char *dir, const ckpt_manifest *m)
{
    json_t *shards = json_array();
    for (int r = 0; r < m->world; r++) {
        const ckpt_shard *s = &m->shards[r];
        json_t *ranges = json_object();
        for (int k = 0; k < KIND_COUNT; k++)
            if (s->ranges[k].present)
                json_object_set_new(ranges, ckpt_kind_names[k],
                                    json_pack("[II]", (json_int_t)s->ranges[k].offset,
                                              (json_int_t)s->ranges[k].count));
        json_array_append_new(shards, json_pack("{s:i, s:s, s:I, s:s, s:o}", "rank", s->rank,
                                                "file", s->file, "bytes", (json_int_t)s->bytes,
                                                "sha256", s->sha256, "ranges", ranges));
    }
    json_t *root = json_pack("{s:s, s:i, s:I, s:i, s:s, s:I, s:{s:i, s:i, s:i, s:i, s:i}, s:I, "
                             "s:I, s:I}",
                             "format", "dtrain-checkpoint", "schema_version",
                             DT_CKPT_SCHEMA_VERSION, "step", (json_int_t)m->step, "world_size",
                             m->world, "mode", m->mode == DT_CKPT_ZERO1 ? "zero1" : "ddp",
                             "num_params", (json_int_t)m->num_params, "config", "V", m->cfg.V, "T",
                             m->cfg.T, "L", m->cfg.L, "H", m->cfg.H, "C", m->cfg.C, "seed",
                             (json_int_t)m->seed, "data_row", (json_int_t)m->data_row, "rng_state",
                             (json_int_t)m->rng_state);
    /* "tp" only for a tp run's buffer: a plain manifest stays as it was */
    if (root && m->tp > 1)
        json_object_set_new(root, "tp", json_integer(m->tp));
    if (root)
        json_object_set_new(root, "shards", shards);
    else
        json_decref(shards);
    char *text = root ? json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text)
        return ckpt_fail(ck, DT_ENOMEM, DT_CKPT_FAULT_IO,
                         "manifest: out of memory building the JSON");
    size_t len = strlen(text);
    if (len > MANIFEST_MAX_BYTES) {
        free(text); /* never commit what no reader would accept */
        return ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_ABSURD,
                         "manifest of "
                         "%d shards: %zu bytes, over the %zu a reader accepts",
                         m->world, len, MANIFEST_MAX_BYTES);
    }
    dt_status st = ckpt_write_atomic(ck, dir, "manifest.json", text, len);
    free(text);
    return st;
}

void ckpt_manifest_free(ckpt_manifest *m)
{
    free(m->shards);
    m->shards = NULL;
}

/* ---- reading ------------------------------------------------------------- */

typedef struct parse {
    dt_ckpt *ck;
    const char *path;
} parse;

static dt_status field_fail(parse *p, const char *field, const char *want)
{
    return ckpt_fail(p->ck, DT_EPROTO, DT_CKPT_FAULT_FIELD, "%s: field %s is missing or not %s",
                     p->path, field, want);
}

/* An integer field in [lo, hi]; ABSURD outside, FIELD if absent. */
static dt_status get_int(parse *p, json_t *obj, const char *key, json_int_t lo, json_int_t hi,
                         json_int_t *out)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v))
        return field_fail(p, key, "an integer");
    *out = json_integer_value(v);
    if (*out < lo || *out > hi)
        return ckpt_fail(p->ck, DT_EPROTO, DT_CKPT_FAULT_ABSURD,
                         "%s: %s = %lld is outside [%lld, %lld]", p->path, key, (long long)*out,
                         (long long)lo, (long long)hi);
    return DT_OK;
}

#define TRY(x)               \
    do {                     \
        dt_status st_ = (x); \
        if (st_ != DT_OK)    \
            return st_;      \
    } while (0)

/* The keys each object of the manifest may have: a key outside them is
 * refused by name, so nothing a reader does not check can ride along
 * (nor make the file any bigger than its shards need). */
static const char *const top_keys[] = {"format",   "schema_version", "step",   "world_size",
                                       "mode",     "num_params",     "config", "seed",
                                       "data_row", "rng_state",      "tp",     "shards",
                                       NULL};
static const char *const config_keys[] = {"V", "T", "L", "H", "C", NULL};
static const char *const shard_keys[] = {"rank", "file", "bytes", "sha256", "ranges", NULL};
static const char *const range_keys[] = {"params", "master", "m", "v", NULL};

static dt_status only_known_keys(parse *p, json_t *obj, const char *where, const char *const *known)
{
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v)
    {
        size_t i = 0;
        while (known[i] && strcmp(known[i], key) != 0)
            i++;
        if (!known[i])
            return ckpt_fail(p->ck, DT_EPROTO, DT_CKPT_FAULT_FIELD,
                             "%s: unknown key \"%.64s\" in %s (schema %d "
                             "has no such field)",
                             p->path, key, where, DT_CKPT_SCHEMA_VERSION);
    }
    return DT_OK;
}

static dt_status parse_header(parse *p, json_t *root, ckpt_manifest *m)
{
    json_t *fmt = json_object_get(root, "format");
    json_t *sv = json_object_get(root, "schema_version");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "dtrain-checkpoint"))
        return ckpt_fail(p->ck, DT_EPROTO, DT_CKPT_FAULT_SCHEMA,
                         "%s: format is not \"dtrain-checkpoint\"", p->path);
    if (!json_is_integer(sv) || json_integer_value(sv) != DT_CKPT_SCHEMA_VERSION)
        return ckpt_fail(p->ck, DT_EPROTO, DT_CKPT_FAULT_SCHEMA,
                         "%s: schema_version %lld is not one this build reads "
                         "(%d)",
                         p->path, json_is_integer(sv) ? (long long)json_integer_value(sv) : -1LL,
                         DT_CKPT_SCHEMA_VERSION);
    m->schema = DT_CKPT_SCHEMA_VERSION;
    TRY(only_known_keys(p, root, "the manifest", top_keys));
    json_int_t v;
    TRY(get_int(p, root, "step", 0, (json_int_t)1 << 50, &v));
    m->step = (long)v;
    TRY(get_int(p, root, "world_size", 1, DT_CKPT_MAX_WORLD, &v));
    m->world = (int)v;
    json_t *mode = json_object_get(root, "mode");
    if (!json_is_string(mode) ||
        (strcmp(json_string_value(mode), "ddp") && strcmp(json_string_value(mode), "zero1")))
        return field_fail(p, "mode", "\"ddp\" or \"zero1\"");
    m->mode = strcmp(json_string_value(mode), "zero1") == 0 ? DT_CKPT_ZERO1 : DT_CKPT_DDP;
    json_t *cfg = json_object_get(root, "config");
    if (!json_is_object(cfg))
        return field_fail(p, "config", "an object");
    TRY(only_known_keys(p, cfg, "config", config_keys));
    int *dims[5] = {&m->cfg.V, &m->cfg.T, &m->cfg.L, &m->cfg.H, &m->cfg.C};
    const char *names[5] = {"V", "T", "L", "H", "C"};
    for (int i = 0; i < 5; i++) {
        TRY(get_int(p, cfg, names[i], 1, 1 << 24, &v));
        *dims[i] = (int)v;
    }
    TRY(get_int(p, root, "num_params", 1, (json_int_t)MAX_PARAMS, &v));
    m->num_params = (uint64_t)v;
    m->tp = 1;
    if (json_object_get(root, "tp")) {
        TRY(get_int(p, root, "tp", 2, DT_CKPT_MAX_WORLD, &v));
        m->tp = (int)v;
    }
    char err[128];
    if (dt_config_check(&m->cfg, err, sizeof err) != DT_OK ||
        dt_ckpt_flat_params(&m->cfg, m->tp) != m->num_params)
        return ckpt_fail(p->ck, DT_EPROTO, DT_CKPT_FAULT_CONFIG,
                         "%s: num_params %llu does not match the config "
                         "(V=%d T=%d L=%d H=%d C=%d, tp %d)",
                         p->path, (unsigned long long)m->num_params, m->cfg.V, m->cfg.T, m->cfg.L,
                         m->cfg.H, m->cfg.C, m->tp);
    json_int_t lim = (json_int_t)((~0ULL) >> 1);
    TRY(get_int(p, root, "seed", -lim - 1, lim, &v));
    m->seed = (uint64_t)v;
    TRY(get_int(p, root, "data_row", 0, lim, &v));
    m->data_row = (uint64_t)v;
    TRY(get_int(p, root, "rng_state", -lim - 1, lim, &v));
    m->rng_state = (uint64_t)v;
    return DT_OK;
}

static bool is_hex64(const char *s)
{
    if (strlen(s) != 64)
        return false;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
            return false;
    return true;
}

/* One entry of "shards" into its slot m->shards[rank]. */
static dt_status parse_shard(parse *p, json_t *e, size_t i, ckpt_manifest *m, bool *seen)
{
    if (!json_is_object(e))
        return field_fail(p, "shards[i]", "an object");
    TRY(only_known_keys(p, e, "a shard", shard_keys));
    json_int_t rank, bytes;
    TRY(get_int(p, e, "rank", -((json_int_t)1 << 40), (json_int_t)1 << 40, &rank));
    if (rank < 0 || rank >= m->world)
        return ckpt_fail(p->ck, DT_EPROTO, DT_CKPT_FAULT_RANK_RANGE,
                         "%s: shards[%zu] has rank %lld, outside [0, %d)", p->path, i,
                         (long long)rank, m->world);
    if (seen[rank])
        return ckpt_fail(p->ck, DT_EPROTO, DT_CKPT_FAULT_RANK_DUP,
                         "%s: shards[%zu] claims rank %lld, which another "
                         "shard already has",
                         p->path, i, (long long)rank);
    seen[rank] = true;
    ckpt_shard *s = &m->shards[rank];
    s->rank = (int)rank;
    json_t *file = json_object_get(e, "file"), *sha = json_object_get(e, "sha256");
    if (!json_is_string(file))
        return field_fail(p, "shards[i].file", "a string");
    if (!ckpt_name_is_safe(json_string_value(file)))
        return ckpt_fail(p->ck, DT_EPROTO, DT_CKPT_FAULT_UNSAFE_NAME,
                         "%s: rank %lld's file name \"%.80s\" is not a plain "
                         "name inside the directory",
                         p->path, (long long)rank, json_string_value(file));
    snprintf(s->file, sizeof s->file, "%s", json_string_value(file));
    if (!json_is_string(sha) || !is_hex64(json_string_value(sha)))
        return field_fail(p, "shards[i].sha256", "64 lowercase hex digits");
    snprintf(s->sha256, sizeof s->sha256, "%s", json_string_value(sha));
    TRY(get_int(p, e, "bytes", 0, (json_int_t)MAX_PARAMS * 16, &bytes));
    s->bytes = (uint64_t)bytes;
    json_t *ranges = json_object_get(e, "ranges");
    if (!json_is_object(ranges))
        return field_fail(p, "shards[i].ranges", "an object");
    TRY(only_known_keys(p, ranges, "a shard's ranges", range_keys));
    uint64_t expect = SHARD_HEADER_BYTES;
    for (int k = 0; k < KIND_COUNT; k++) {
        json_t *r = json_object_get(ranges, ckpt_kind_names[k]);
        bool want = k != KIND_MASTER || m->mode == DT_CKPT_ZERO1;
        if (!want && !r)
            continue;
        if (!json_is_array(r) || json_array_size(r) != 2 ||
            !json_is_integer(json_array_get(r, 0)) || !json_is_integer(json_array_get(r, 1)) ||
            !want)
            return field_fail(p, ckpt_kind_names[k],
                              want ? "[offset, length]" : "absent under ddp");
        json_int_t off = json_integer_value(json_array_get(r, 0));
        json_int_t len = json_integer_value(json_array_get(r, 1));
        if (off < 0 || len < 0 || (uint64_t)off > m->num_params ||
            (uint64_t)len > m->num_params - (uint64_t)off)
            return ckpt_fail(p->ck, DT_EPROTO, DT_CKPT_FAULT_ABSURD,
                             "%s: rank %lld's %s range [%lld, +%lld) is "
                             "outside the %llu parameters",
                             p->path, (long long)rank, ckpt_kind_names[k], (long long)off,
                             (long long)len, (unsigned long long)m->num_params);
        s->ranges[k] = (ckpt_range){true, (uint64_t)off, (uint64_t)len};
        expect += SECTION_BYTES + (uint64_t)len * sizeof(float);
    }
    if (expect != s->bytes)
        return ckpt_fail(p->ck, DT_EPROTO, DT_CKPT_FAULT_ABSURD,
                         "%s: rank %lld: bytes = %llu, its ranges make %llu", p->path,
                         (long long)rank, (unsigned long long)s->bytes, (unsigned long long)expect);
    return DT_OK;
}

static int cmp_u64_pair(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : 0;
}

/* Each array's ranges, sorted, must tile [0, Ψ) with no gap or overlap. */
static dt_status check_coverage(parse *p, const ckpt_manifest *m)
{
    uint64_t *pairs = malloc((size_t)m->world * 2 * sizeof *pairs);
    if (!pairs)
        return ckpt_fail(p->ck, DT_ENOMEM, DT_CKPT_FAULT_IO, "out of memory");
    dt_status st = DT_OK;
    for (int k = 0; k < KIND_COUNT && st == DT_OK; k++) {
        if (k == KIND_MASTER && m->mode != DT_CKPT_ZERO1)
            continue;
        for (int r = 0; r < m->world; r++) {
            pairs[2 * r] = m->shards[r].ranges[k].offset;
            pairs[2 * r + 1] = m->shards[r].ranges[k].count;
        }
        qsort(pairs, (size_t)m->world, 2 * sizeof *pairs, cmp_u64_pair);
        uint64_t at = 0;
        for (int r = 0; r < m->world && st == DT_OK; r++) {
            if (pairs[2 * r + 1] == 0)
                continue;
            if (pairs[2 * r] != at)
                st = ckpt_fail(p->ck, DT_EPROTO, DT_CKPT_FAULT_COVERAGE,
                               "%s: the %s ranges leave a gap or overlap at "
                               "element %llu",
                               p->path, ckpt_kind_names[k], (unsigned long long)at);
            at += pairs[2 * r + 1];
        }
        if (st == DT_OK && at != m->num_params)
            st = ckpt_fail(p->ck, DT_EPROTO, DT_CKPT_FAULT_COVERAGE,
                           "%s: the %s ranges cover %llu of %llu elements", p->path,
                           ckpt_kind_names[k], (unsigned long long)at,
                           (unsigned long long)m->num_params);
    }
    free(pairs);
    return st;
}

static dt_status parse_shards(parse *p, json_t *root, ckpt_manifest *m)
{
    json_t *arr = json_object_get(root, "shards");
    if (!json_is_array(arr))
        return field_fail(p, "shards", "an array");
    m->shards = calloc((size_t)m->world, sizeof *m->shards);
    bool *seen = calloc((size_t)m->world, sizeof *seen);
    dt_status st = m->shards && seen
                       ? DT_OK
                       : ckpt_fail(p->ck, DT_ENOMEM, DT_CKPT_FAULT_IO, "out of memory");
    for (size_t i = 0; st == DT_OK && i < json_array_size(arr); i++)
        st = parse_shard(p, json_array_get(arr, i), i, m, seen);
    for (int r = 0; st == DT_OK && r < m->world; r++)
        if (!seen[r])
            st = ckpt_fail(p->ck, DT_EPROTO, DT_CKPT_FAULT_RANK_MISSING,
                           "%s: no shard for rank %d of %d", p->path, r, m->world);
    free(seen);
    return st == DT_OK ? check_coverage(p, m) : st;
}

/* A step directory's name must be the one its manifest's step makes: a
 * step_00000010 whose manifest says 20 is not step 20, nor step 10. */
static dt_status check_step_name(parse *p, const char *dir, long step)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/')
        b--;
    char want[64];
    ckpt_step_name(want, sizeof want, step);
    if (n - b != strlen(want) || memcmp(dir + b, want, n - b) != 0)
        return ckpt_fail(p->ck, DT_EPROTO, DT_CKPT_FAULT_FIELD,
                         "%s: step %ld belongs in a directory named %s, not "
                         "\"%.*s\"",
                         p->path, step, want, (int)(n - b), dir + b);
    return DT_OK;
}

dt_status ckpt_manifest_read(dt_ckpt *ck, const char *dir, ckpt_manifest *m)
{
    memset(m, 0, sizeof *m);
    char path[CKPT_PATH_MAX];
    ckpt_join(path, dir, "manifest.json", "");
    char *text;
    size_t len;
    dt_status st = ckpt_check_dir(ck, dir);
    if (st != DT_OK)
        return st;
    st = ckpt_read_small(ck, path, MANIFEST_MAX_BYTES, &text, &len);
    if (st != DT_OK) {
        if (ck->fault == DT_CKPT_FAULT_NO_CHECKPOINT)
            ckpt_fail(ck, DT_EINVAL, DT_CKPT_FAULT_NO_CHECKPOINT,
                      "%s: no manifest.json: not a committed checkpoint", dir);
        return st;
    }
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    parse p = {ck, path};
    if (!root)
        return ckpt_fail(ck, DT_EPROTO, DT_CKPT_FAULT_BAD_JSON,
                         "%s: not valid JSON: line %d column %d: %s", path, jerr.line, jerr.column,
                         jerr.text);
    if (!json_is_object(root))
        st = ckpt_fail(ck, DT_EPROTO, DT_CKPT_FAULT_BAD_JSON,
                       "%s: the top level is not a JSON object", path);
    if (st == DT_OK)
        st = parse_header(&p, root, m);
    if (st == DT_OK)
        st = check_step_name(&p, dir, m->step);
    if (st == DT_OK)
        st = parse_shards(&p, root, m);
    json_decref(root);
    if (st != DT_OK)
        ckpt_manifest_free(m);
    return st;
}
