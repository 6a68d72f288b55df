/*
 * data.c — token streams for training: byte-level text, the seed's random
 * tokens, and the stateless batch sampler every kind shares.
 *
 * A dataset is one array of uint16 token ids, the train split followed by
 * the validation split (a held-out tail: the last val_fraction of a file).
 * Task datasets (task.c) also record where each example starts, so that
 * batches begin at an example boundary; shards (shard.c) fill the same
 * struct from llm.c's files.
 *
 * Batches are stateless: row r of the endless sequence of training rows
 * reads T+1 tokens at an offset drawn from hash(seed, r). The training
 * loop asks for rows step*global_batch + rank*B .. +B-1, so a resumed run
 * needs no sampler state in its checkpoint, and a run on another world
 * size sees the same global batch. Cost: O(B*T) copies per batch.
 *
 * Files are read whole into memory, so only regular files are read (a
 * device, a FIFO or a directory is refused, saying which it is), and a text
 * file only up to DT_TEXT_MAX_BYTES (dt_dataset_fopen).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dt_file_kind.h"
#include "model_internal.h"

dt_dataset *dt_dataset_alloc(void)
{
    return calloc(1, sizeof(dt_dataset));
}

void dt_dataset_close(dt_dataset *d)
{
    if (!d)
        return;
    free(d->tokens);
    free(d->starts[0]);
    free(d->starts[1]);
    free(d);
}

const char *dt_dataset_error(const dt_dataset *d)
{
    return d ? d->err : "dataset: out of memory";
}

size_t dt_dataset_tokens(const dt_dataset *d, dt_split split)
{
    return split == DT_TRAIN ? d->n_train : d->n_val;
}

int dt_dataset_vocab(const dt_dataset *d)
{
    return d->vocab;
}

int dt_dataset_max_token(const dt_dataset *d)
{
    int maxid = 0;
    for (size_t i = 0; i < d->n_train + d->n_val; i++)
        maxid = d->tokens[i] > maxid ? d->tokens[i] : maxid;
    return maxid;
}

static dt_status split_tail(dt_dataset *d, size_t n, double val_fraction)
{
    if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
        snprintf(d->err, sizeof d->err, "dataset: validation fraction %g is not in [0, 1)",
                 val_fraction);
        return DT_EINVAL;
    }
    d->n_val = (size_t)((double)n * val_fraction);
    d->n_train = n - d->n_val;
    return DT_OK;
}

/*
 * A data file is read whole, so only a regular file of known size is read:
 * a device (/dev/zero) would fill memory, a FIFO would block with no word,
 * a directory has no bytes. The open is O_NONBLOCK so that naming a FIFO
 * returns at once (fstat then refuses it), and a file larger than
 * max_bytes is refused before anything is read. Returns the stream, or
 * NULL with d->err saying what is at the path.
 */
FILE *dt_dataset_fopen(dt_dataset *d, const char *path, uint64_t max_bytes, uint64_t *size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat st;
    const char *why = NULL;
    if (fd < 0)
        why = strerror(errno);
    else if (fstat(fd, &st) != 0)
        why = strerror(errno);
    if (why) {
        snprintf(d->err, sizeof d->err, "dataset: cannot open %s: %s", path, why);
    } else if (!S_ISREG(st.st_mode)) {
        snprintf(d->err, sizeof d->err,
                 "dataset: %s is %s, not a regular file: --data reads a text file or "
                 "llm.c token shards, whole, so it must be a file of known size",
                 path, dt_file_kind(st.st_mode));
    } else if ((uint64_t)st.st_size > max_bytes) {
        snprintf(d->err, sizeof d->err,
                 "dataset: %s is %.1f GiB, over the %.1f GiB this loader reads into memory", path,
                 (double)st.st_size / (1 << 30), (double)max_bytes / (1 << 30));
    } else {
        FILE *f = fdopen(fd, "rb");
        if (f) {
            *size = (uint64_t)st.st_size;
            return f;
        }
        snprintf(d->err, sizeof d->err, "dataset: cannot open %s: %s", path, strerror(errno));
    }
    if (fd >= 0)
        close(fd);
    return NULL;
}

dt_status dt_dataset_open_text(dt_dataset **out, const char *path, double val_fraction)
{
    dt_dataset *d = dt_dataset_alloc();
    *out = d;
    if (!d)
        return DT_ENOMEM;
    uint64_t size = 0;
    FILE *f = dt_dataset_fopen(d, path, DT_TEXT_MAX_BYTES, &size);
    if (!f)
        return DT_EINVAL;
    size_t n = (size_t)size; /* what fstat said: a file that grows is read to there */
    unsigned char *bytes = malloc(n ? n : 1);
    d->tokens = malloc((n ? n : 1) * sizeof(uint16_t));
    bool read_ok = bytes && d->tokens && fread(bytes, 1, n, f) == n;
    int e = ferror(f) ? errno : 0;
    fclose(f);
    if (!bytes || !d->tokens) {
        free(bytes);
        return DT_ENOMEM;
    }
    if (!read_ok) {
        free(bytes);
        snprintf(d->err, sizeof d->err, "dataset: reading %s: %s", path,
                 e ? strerror(e) : "it became shorter while being read");
        return DT_ESYS;
    }
    for (size_t i = 0; i < n; i++)
        d->tokens[i] = bytes[i];
    free(bytes);
    d->vocab = 256; /* byte-level: every byte is a token */
    return split_tail(d, n, val_fraction);
}

dt_status dt_dataset_random(dt_dataset **out, int V, size_t n, uint64_t seed)
{
    dt_dataset *d = dt_dataset_alloc();
    *out = d;
    if (!d)
        return DT_ENOMEM;
    if (V < 1 || V > 65536) {
        snprintf(d->err, sizeof d->err, "dataset: random vocabulary %d not in [1, 65536]", V);
        return DT_EINVAL;
    }
    d->tokens = malloc((n ? n : 1) * sizeof(uint16_t));
    if (!d->tokens)
        return DT_ENOMEM;
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        d->tokens[i] = (uint16_t)(dt_rng_next(&r) % (uint64_t)V);
    d->vocab = V;
    return split_tail(d, n, 0.1);
}

/* Offset of row r's window in a split of n tokens (n >= T+1). Task
 * datasets start at one of the examples that leave room for T+1 tokens
 * (starts ascend, so those are a prefix: binary search its length). */
static size_t window_offset(const dt_dataset *d, dt_split split, size_t n, uint64_t seed,
                            uint64_t row, int T)
{
    dt_rng r;
    dt_rng_seed(&r, seed ^ (row * 0xD1B54A32D192ED03ull));
    uint64_t h = dt_rng_next(&r);
    size_t last = n - (size_t)T - 1; /* largest valid offset */
    const size_t *starts = d->starts[split];
    if (starts && d->n_starts[split] > 0) {
        size_t lo = 0, hi = d->n_starts[split]; /* count starts <= last */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (starts[mid] <= last)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo > 0)
            return starts[h % lo];
    }
    return (size_t)(h % (last + 1));
}

dt_status dt_dataset_batch(int *inputs, int *targets, dt_dataset *d, dt_split split, uint64_t seed,
                           uint64_t first_row, int B, int T)
{
    size_t n = dt_dataset_tokens(d, split);
    const uint16_t *base = d->tokens + (split == DT_TRAIN ? 0 : d->n_train);
    if (T < 1 || n < (size_t)T + 1) {
        snprintf(d->err, sizeof d->err,
                 "dataset: the %s split has %zu tokens, fewer than the "
                 "T+1 = %d a row of the batch needs",
                 split == DT_TRAIN ? "train" : "validation", n, T + 1);
        return DT_EINVAL;
    }
    for (int b = 0; b < B; b++) {
        size_t off = window_offset(d, split, n, seed, first_row + (size_t)b, T);
        for (int t = 0; t < T; t++) {
            inputs[b * T + t] = base[off + t];
            targets[b * T + t] = base[off + t + 1];
        }
    }
    return DT_OK;
}
