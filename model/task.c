/*
 * task.c — the embedded default dataset: a generated task that a small
 * model visibly learns, scored by a number a person understands.
 *
 * Each example is one line, "PROMPT=ANSWER\n", over ASCII digits, '=' and
 * '\n' (all below 64, so the seed's V=64 holds them):
 *   reverse   "3141=1413\n"
 *   sort      "3141=1134\n"
 * with 1..max_digits uniform random digits. Lines are concatenated into
 * one stream; batches start at a line (data.c), so every answer is seen
 * with its prompt. The prompt's digits are random (irreducible loss,
 * ln 10 nats each); the answer and '\n' are determined — what the model
 * learns.
 *
 * Held-out validation: a prompt belongs to the validation split iff
 * a fixed hash of it is 0 mod 8 — the same rule for every seed — so no
 * validation prompt ever occurs in training, and the score measures that
 * the model learnt the rule, not the examples.
 *
 * Metric: exact-match accuracy. The validation prompt up to '=' is given,
 * the answer is decoded greedily until '\n', and counts only if every
 * character (and the newline) is right. Each example is graded on its
 * own, so the examples can be dealt out to ranks (dt_task_count_exact:
 * rank p of N grades examples p, p + N, ...) and the counts summed: the
 * same accuracy as one rank grading all.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

/* FNV-1a over the prompt digits: fixed, seed-independent split rule. */
static int is_validation(const char *digits, int n)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++)
        h = (h ^ (unsigned char)digits[i]) * 16777619u;
    h ^= h >> 15;
    return (h & 7u) == 0;
}

static int cmp_char(const void *a, const void *b)
{
    return *(const char *)a - *(const char *)b;
}

/* Writes "PROMPT=ANSWER\n" for digits[0..n) into line; returns its length. */
static int format_example(char *line, const char *digits, int n, dt_task_kind kind)
{
    memcpy(line, digits, (size_t)n);
    line[n] = '=';
    char *ans = line + n + 1;
    memcpy(ans, digits, (size_t)n);
    if (kind == DT_TASK_SORT)
        qsort(ans, (size_t)n, 1, cmp_char);
    else
        for (int i = 0; i < n / 2; i++) {
            char c = ans[i];
            ans[i] = ans[n - 1 - i];
            ans[n - 1 - i] = c;
        }
    ans[n] = '\n';
    return 2 * n + 2;
}

dt_status dt_dataset_task(dt_dataset **out, dt_task_kind kind, int max_digits, size_t n_train,
                          size_t n_val, uint64_t seed)
{
    dt_dataset *d = dt_dataset_alloc();
    *out = d;
    if (!d)
        return DT_ENOMEM;
    if (max_digits < 1 || max_digits > 64 || (kind != DT_TASK_REVERSE && kind != DT_TASK_SORT)) {
        snprintf(d->err, sizeof d->err,
                 "dataset: task %d with %d digits: unknown task or digits "
                 "not in [1, 64]",
                 (int)kind, max_digits);
        return DT_EINVAL;
    }
    size_t line_max = 2 * (size_t)max_digits + 2;
    size_t want[2] = {n_train, n_val};
    d->tokens = malloc((n_train + n_val) * line_max * sizeof(uint16_t) + 2);
    d->starts[0] = malloc((n_train + 1) * sizeof(size_t));
    d->starts[1] = malloc((n_val + 1) * sizeof(size_t));
    uint16_t *buf[2] = {d->tokens, malloc((n_val * line_max + 1) * 2)};
    if (!d->tokens || !d->starts[0] || !d->starts[1] || !buf[1]) {
        free(buf[1]);
        return DT_ENOMEM;
    }
    size_t len[2] = {0, 0};
    dt_rng r;
    dt_rng_seed(&r, seed);
    char digits[64], line[130];
    while (d->n_starts[0] < want[0] || d->n_starts[1] < want[1]) {
        int n = 1 + (int)(dt_rng_next(&r) % (uint64_t)max_digits);
        for (int i = 0; i < n; i++)
            digits[i] = (char)('0' + dt_rng_next(&r) % 10);
        int s = is_validation(digits, n);
        if (d->n_starts[s] == want[s])
            continue; /* this split is full: draw again */
        int ll = format_example(line, digits, n, kind);
        d->starts[s][d->n_starts[s]++] = len[s];
        for (int i = 0; i < ll; i++)
            buf[s][len[s]++] = (uint16_t)line[i];
    }
    memcpy(d->tokens + len[0], buf[1], len[1] * sizeof(uint16_t));
    free(buf[1]);
    d->n_train = len[0];
    d->n_val = len[1];
    d->vocab = 64;
    d->is_task = 1;
    return DT_OK;
}

/* One validation example at offset off: is the greedy answer exact? */
static int answer_is_exact(dt_model *m, const uint16_t *ex, int *buf)
{
    int n = 0;
    while (ex[n] != '=')
        buf[n] = ex[n], n++;
    buf[n] = '=';
    int prompt = n + 1, answer = n + 1; /* n digits + '\n' */
    dt_rng unused;
    dt_rng_seed(&unused, 0);
    int got = dt_generate(m, buf, prompt, answer, 0.0f, 0, '\n', &unused);
    if (got != prompt + answer)
        return 0;
    for (int i = 0; i < answer; i++)
        if (buf[prompt + i] != ex[prompt + i])
            return 0;
    return 1;
}

long dt_task_count_exact(dt_model *m, const dt_dataset *d, size_t n, int part, int parts,
                         size_t *graded)
{
    if (graded)
        *graded = 0;
    if (!d->is_task || d->n_starts[DT_VAL] == 0 || parts < 1 || part < 0 || part >= parts)
        return -1;
    const uint16_t *val = d->tokens + d->n_train;
    size_t total = d->n_starts[DT_VAL];
    if (n == 0 || n > total)
        n = total;
    int longest = 0; /* the longest line must fit the context */
    for (size_t i = 0; i < n; i++) {
        const uint16_t *ex = val + d->starts[DT_VAL][i];
        int k = 0;
        while (ex[k] != '\n')
            k++;
        longest = k + 1 > longest ? k + 1 : longest;
    }
    if (longest - 1 > m->cfg.T)
        return -1; /* the last token ('\n') is predicted, never fed */
    int *buf = malloc((size_t)(longest + 1) * sizeof(int));
    if (!buf)
        return -1;
    long right = 0;
    for (size_t i = (size_t)part; i < n; i += (size_t)parts)
        right += answer_is_exact(m, val + d->starts[DT_VAL][i], buf);
    free(buf);
    if (graded)
        *graded = n;
    return right;
}

double dt_task_accuracy(dt_model *m, const dt_dataset *d, size_t n)
{
    size_t graded;
    long right = dt_task_count_exact(m, d, n, 0, 1, &graded);
    return right < 0 ? -1.0 : (double)right / (double)graded;
}
