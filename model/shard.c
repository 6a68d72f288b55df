/*
 * shard.c — reader for llm.c's token shards (the .bin files its data
 * scripts write: fineweb, tinyshakespeare, ...).
 *
 * Format: a header of 256 little-endian int32 — [0] magic 20240520,
 * [1] version 1, [2] number of tokens — then that many uint16 tokens.
 * Everything is checked before a token is used: magic, version, and that
 * the file is exactly 1024 + 2*count bytes (a truncated download is the
 * usual failure, and would otherwise train on a short file silently).
 * Each error names the file, the field, what it found and what it
 * expected. Cost: one read of the file.
 *
 * Several shards are taken as llm.c takes them, by a glob pattern
 * (`train_*.bin`), in sorted order, concatenated. The vocabulary of shard
 * data is GPT-2's 50,257 (the tokenizer llm.c's scripts use), not the
 * largest id seen: a model sized from one shard's ids would not fit the
 * next shard's.
 */
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_BYTES (256 * sizeof(int32_t))
#define SHARD_MAX_BYTES (SHARD_HEADER_BYTES + 2 * (uint64_t)INT32_MAX) /* the count is an int32 */

/* Only a regular file is looked into (dt_dataset_fopen): a FIFO is not
 * opened for a wait, nor a device read. */
bool dt_dataset_is_shard_file(const char *path)
{
    int32_t magic = 0;
    dt_dataset probe = {0};
    uint64_t size;
    FILE *f = dt_dataset_fopen(&probe, path, SHARD_MAX_BYTES, &size);
    bool yes = f && fread(&magic, sizeof magic, 1, f) == 1 && magic == SHARD_MAGIC;
    if (f)
        fclose(f);
    return yes;
}

/* Reads one shard into a malloc'ed array; *n its token count. */
static dt_status read_shard(dt_dataset *d, const char *path, uint16_t **out, size_t *n)
{
    *out = NULL;
    uint64_t file_size = 0;
    FILE *f = dt_dataset_fopen(d, path, SHARD_MAX_BYTES, &file_size);
    if (!f)
        return DT_EINVAL;
    int32_t header[256];
    size_t got = fread(header, 1, sizeof header, f);
    dt_status s = DT_EINVAL;
    long size = (long)file_size;
    if (got < sizeof header) {
        snprintf(d->err, sizeof d->err,
                 "shard %s: %zu bytes, shorter than the %zu-byte header "
                 "(truncated, or not an llm.c shard)",
                 path, got, SHARD_HEADER_BYTES);
    } else if (header[0] != SHARD_MAGIC) {
        snprintf(d->err, sizeof d->err,
                 "shard %s: magic %d, expected %d (not an llm.c token shard)", path, header[0],
                 SHARD_MAGIC);
    } else if (header[1] != SHARD_VERSION) {
        snprintf(d->err, sizeof d->err,
                 "shard %s: version %d, this reader knows version %d "
                 "(uint16 tokens)",
                 path, header[1], SHARD_VERSION);
    } else if (header[2] < 0 || size != (long)(SHARD_HEADER_BYTES + 2 * (size_t)header[2])) {
        snprintf(d->err, sizeof d->err,
                 "shard %s: header says %d tokens (%zu bytes), the file has "
                 "%ld bytes (truncated?)",
                 path, header[2], SHARD_HEADER_BYTES + 2 * (size_t)header[2], size);
    } else {
        *n = (size_t)header[2];
        *out = malloc(*n ? *n * sizeof(uint16_t) : 1);
        s = *out ? DT_OK : DT_ENOMEM;
        if (s == DT_OK && (fseek(f, (long)SHARD_HEADER_BYTES, SEEK_SET) != 0 ||
                           fread(*out, sizeof(uint16_t), *n, f) != *n)) {
            snprintf(d->err, sizeof d->err, "shard %s: read error", path);
            free(*out);
            *out = NULL;
            s = DT_ESYS;
        }
    }
    fclose(f);
    return s;
}

dt_status dt_dataset_open_shards(dt_dataset **out, const char *train_path, const char *val_path)
{
    dt_dataset *d = dt_dataset_alloc();
    *out = d;
    if (!d)
        return DT_ENOMEM;
    uint16_t *train = NULL, *val = NULL;
    size_t n_train = 0, n_val = 0;
    dt_status s = read_shard(d, train_path, &train, &n_train);
    if (s == DT_OK && val_path)
        s = read_shard(d, val_path, &val, &n_val);
    if (s != DT_OK) {
        free(train);
        return s;
    }
    if (!val_path) { /* no validation shard: hold out the last 10% */
        n_val = n_train / 10;
        n_train -= n_val;
    }
    d->tokens = malloc((n_train + n_val + 1) * sizeof(uint16_t));
    if (!d->tokens) {
        free(train);
        free(val);
        return DT_ENOMEM;
    }
    memcpy(d->tokens, train, (n_train + (val ? 0 : n_val)) * sizeof(uint16_t));
    if (val)
        memcpy(d->tokens + n_train, val, n_val * sizeof(uint16_t));
    free(train);
    free(val);
    d->n_train = n_train;
    d->n_val = n_val;
    int maxid = dt_dataset_max_token(d);
    d->vocab = maxid < DT_GPT2_VOCAB ? DT_GPT2_VOCAB : maxid + 1;
    return DT_OK;
}

/* Appends one shard's tokens to *all (grown); on failure d->err says why. */
static dt_status append_shard(dt_dataset *d, const char *path, uint16_t **all, size_t *n)
{
    uint16_t *tok;
    size_t k;
    dt_status s = read_shard(d, path, &tok, &k);
    if (s != DT_OK)
        return s;
    uint16_t *grown = realloc(*all, (*n + k + 1) * sizeof(uint16_t));
    if (!grown) {
        free(tok);
        return DT_ENOMEM;
    }
    memcpy(grown + *n, tok, k * sizeof(uint16_t));
    free(tok);
    *all = grown;
    *n += k;
    return DT_OK;
}

dt_status dt_dataset_open_shard_glob(dt_dataset **out, const char *pattern)
{
    dt_dataset *d = dt_dataset_alloc();
    *out = d;
    if (!d)
        return DT_ENOMEM;
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc != 0) {
        snprintf(d->err, sizeof d->err, "shards %s: %s", pattern,
                 rc == GLOB_NOMATCH ? "no file matches" : "cannot list them");
        if (rc != GLOB_NOMATCH)
            globfree(&g);
        return rc == GLOB_NOMATCH ? DT_EINVAL : DT_ESYS;
    }
    uint16_t *all = NULL;
    size_t n = 0;
    dt_status s = DT_OK;
    for (size_t i = 0; i < g.gl_pathc && s == DT_OK; i++) /* glob sorts */
        s = append_shard(d, g.gl_pathv[i], &all, &n);
    globfree(&g);
    if (s != DT_OK) {
        free(all);
        return s;
    }
    d->tokens = all ? all : calloc(1, sizeof(uint16_t));
    d->n_val = n / 10; /* the last 10% of the last shards is validation */
    d->n_train = n - d->n_val;
    int maxid = dt_dataset_max_token(d);
    d->vocab = maxid < DT_GPT2_VOCAB ? DT_GPT2_VOCAB : maxid + 1;
    return d->tokens ? DT_OK : DT_ENOMEM;
}
