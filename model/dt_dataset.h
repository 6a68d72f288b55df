/*
 * dt_dataset.h — the model layer's data: token streams with a train and a
 * validation split, read by row as batches, and the embedded task whose
 * answers the model can be graded on. dt_model.h includes it.
 *
 * Sources: byte-level text, llm.c token shards (one file or a glob), the
 * seed's uniform random tokens, and a generated task (digit reversal or
 * sorting). A batch is a pure function of (seed, row): no cursor, no
 * state, so a resumed run or another world size reads the same rows. A
 * data set is held whole in memory from when it is opened (read or
 * generated), one array of uint16 tokens: two bytes a token. A batch costs
 * B·(T+1) token copies.
 */
#ifndef DT_DATASET_H
#define DT_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_model dt_model; /* dt_model.h: what dt_task_accuracy grades */

typedef enum dt_split { DT_TRAIN = 0, DT_VAL = 1 } dt_split;

/* A token stream with a train and a validation part. */
typedef struct dt_dataset dt_dataset;

/*
 * Byte-level tokens (V = 256) of any file; the last val_fraction of the
 * bytes is the validation split. Always sets *out (NULL only on ENOMEM);
 * on failure read dt_dataset_error(*out), then dt_dataset_close.
 */
dt_status dt_dataset_open_text(dt_dataset **out, const char *path, double val_fraction);
/* llm.c token shards: a header of 256 int32 (magic 20240520, version 1,
 * token count) then uint16 tokens; the file size must match. val_path may
 * be NULL (then the last 10% of train is validation). The vocabulary is
 * GPT-2's, DT_GPT2_VOCAB (or 1 + the largest id, if that is larger). */
#define DT_GPT2_VOCAB 50257
dt_status dt_dataset_open_shards(dt_dataset **out, const char *train_path, const char *val_path);
/* Every shard a glob pattern matches ("data/train_*.bin"), in sorted order,
 * as one stream; the last 10% of it is validation. A pattern matching
 * nothing is DT_EINVAL naming it. */
dt_status dt_dataset_open_shard_glob(dt_dataset **out, const char *pattern);
/* Whether the file starts with an llm.c shard's magic (20240520). */
bool dt_dataset_is_shard_file(const char *path);
/* The seed's data: n uniform random tokens in [0, V), seeded. */
dt_status dt_dataset_random(dt_dataset **out, int V, size_t n, uint64_t seed);

/* The embedded default: a generated task the model can visibly learn. */
typedef enum dt_task_kind {
    DT_TASK_REVERSE = 0, /* "3141=1413\n": reverse a string of digits */
    DT_TASK_SORT,        /* "3141=1134\n": sort the digits */
} dt_task_kind;
/* n_train + n_val examples of 1..max_digits digits, deterministic in seed;
 * validation examples never appear in training. Tokens are ASCII (< 64). */
dt_status dt_dataset_task(dt_dataset **out, dt_task_kind kind, int max_digits, size_t n_train,
                          size_t n_val, uint64_t seed);

void dt_dataset_close(dt_dataset *d);
const char *dt_dataset_error(const dt_dataset *d);
size_t dt_dataset_tokens(const dt_dataset *d, dt_split split);
int dt_dataset_vocab(const dt_dataset *d);     /* the ids it may hold: 256 for
                                             bytes, 50257 for shards, ... */
int dt_dataset_max_token(const dt_dataset *d); /* the largest id present */

/*
 * Batch rows first_row .. first_row+B-1 of a deterministic sequence of
 * windows: row r reads T+1 tokens at an offset chosen by hashing
 * (seed, r), at an example start for task datasets. Stateless, so a
 * resumed run or another world size sees the same rows (row = global
 * index, e.g. step * global_batch + rank * B + b).
 * inputs, targets (B, T) host. Returns DT_EINVAL if the split is shorter
 * than T+1 tokens.
 */
dt_status dt_dataset_batch(int *inputs, int *targets, dt_dataset *d, dt_split split, uint64_t seed,
                           uint64_t first_row, int B, int T);

/*
 * Exact-match accuracy on the task's validation examples (the first n, or
 * all if n is 0): the prompt up to '=' is given, the answer is decoded
 * greedily until '\n', and it counts only if every character is right.
 * Graded by teacher forcing, the same test in one forward: greedy
 * decoding reproduces the answer exactly iff at every answer position,
 * fed the right characters before it, the argmax is the right one. Each
 * forward grades a batch of examples, as many as max_B·T tokens hold.
 * Returns a fraction in [0, 1], or -1 if d is not a task dataset or the
 * model's context cannot hold an example.
 */
double dt_task_accuracy(dt_model *m, const dt_dataset *d, size_t n);
/*
 * One share of that evaluation, for splitting it over parts ranks: the
 * first n examples (all if n is 0 or more than there are) are cut into
 * batches of consecutive examples, the same cut for every share and for
 * one rank alone, and the batches with index j % parts == part are graded
 * and the exact ones counted. The shares' counts sum to the whole's
 * count, bit for bit the same forwards; *graded (may be NULL) is set to
 * the number of examples of all shares together. lockstep: every share
 * runs the same number of forwards, the longest share's, a share with
 * fewer running forwards of one token that grade nothing (a sharded
 * model's forwards are collectives: ZeRO-3). Returns the count, or -1
 * where dt_task_accuracy returns -1 (the same on every share).
 */
long dt_task_count_exact(dt_model *m, const dt_dataset *d, size_t n, int part, int parts,
                         bool lockstep, size_t *graded);
/*
 * How a grading forward runs where the model is one pipeline stage: fn
 * runs the forward of inputs (B, T) on m, streaming it through the other
 * stages, and sets *logits when m then holds the batch's logits (the last
 * stage). Every stage grades the same batches; only the last counts.
 * A tensor-parallel share runs its own forward in fn instead (m only
 * sizes the batches) and answers the greedy tokens through argmax.
 */
typedef struct dt_forward_fn {
    dt_status (*fn)(void *user, dt_model *m, const int *inputs, const int *targets, int B, int T,
                    bool *logits);
    void *user;
    /* NULL: grading reads m's logits. Otherwise the greedy token at
     * (b, t) of the last forward, which fn computed where m holds no
     * logits (a tensor-parallel share: dt_tp_argmax). */
    int (*argmax)(void *user, int b, int t);
} dt_forward_fn;
/* dt_task_count_exact with each forward run by fwd (NULL: the model's
 * own); a share whose forwards hold no logits counts 0. */
long dt_task_count_exact_with(dt_model *m, const dt_dataset *d, size_t n, int part, int parts,
                              bool lockstep, const dt_forward_fn *fwd, size_t *graded);
/* The host scratch that evaluation allocates (bytes): one batch's token
 * ids and line lengths, one row of logits. 0 where it returns -1 without
 * grading. */
size_t dt_task_scratch_bytes(dt_model *m, const dt_dataset *d, size_t n);
/* dt_task_count_exact_with in the caller's scratch (dt_task_scratch_bytes
 * of it, aligned as malloc aligns): a caller whose shares run in lockstep
 * allocates it first, so that a rank without the memory fails before any
 * share starts. -1 also for a NULL scratch. */
long dt_task_count_exact_in(void *scratch, dt_model *m, const dt_dataset *d, size_t n, int part,
                            int parts, bool lockstep, const dt_forward_fn *fwd, size_t *graded);

#ifdef __cplusplus
}
#endif
#endif /* DT_DATASET_H */
