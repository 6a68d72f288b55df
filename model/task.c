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
 * character (and the newline) is right. Greedy decoding stays on the
 * right answer iff each answer position, fed the right characters before
 * it, has the right argmax; so the grading feeds each whole line (less
 * its '\n') and reads the argmax at every answer position: teacher
 * forcing, one forward for what decoding does in one per character. The
 * lines are short (a 5-digit task's are 12 tokens), so one forward takes
 * a batch of them, as many as the training batch's max_B·T tokens hold
 * (rows of the batch's longest line, shorter ones padded after their end,
 * which the causal mask keeps out of every graded position): activation
 * memory never exceeds training's. Each batch is graded on its own, so
 * the batches can be dealt out to ranks (dt_task_count_exact: rank p of
 * N grades batches p, p + N, ...) and the counts summed: the same cut
 * and the same forwards as one rank grading all, so the same count. A
 * ZeRO-3 model gathers every unit in each forward, so there every rank
 * runs as many forwards as the longest share (lockstep), idle ones of
 * one token where its share has run out.
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

/* Tokens of the example line at ex, through its '\n'. */
static int line_length(const uint16_t *ex)
{
    int k = 0;
    while (ex[k] != '\n')
        k++;
    return k + 1;
}

/* Where a grading pass stands: the examples, the batches they are cut
 * into, and one batch's host buffers. */
typedef struct grading {
    dt_model *m;
    const uint16_t *val;      /* the validation tokens */
    const size_t *starts;     /* [n] each example's offset in val */
    size_t n;                 /* examples graded */
    int rows;                 /* examples per forward */
    int *in;                  /* (rows, longest - 1) */
    int *len;                 /* (rows) each row's line length */
    float *logits;            /* (V) */
    const dt_forward_fn *fwd; /* NULL: the model's own forward */
} grading;

/* One forward of in (B, T); *logits when m holds the batch's logits. */
static dt_status grading_forward(grading *g, int B, int T, bool *logits)
{
    *logits = true;
    if (g->fwd)
        return g->fwd->fn(g->fwd->user, g->m, g->in, NULL, B, T, logits);
    return dt_model_forward(g->m, g->in, NULL, B, T);
}

/* The greedy token at (b, t) of the last forward: the hook's where it
 * answers (a tensor-parallel share), else the argmax of m's logits. */
static int greedy_token(grading *g, int b, int t, dt_rng *unused)
{
    if (g->fwd && g->fwd->argmax)
        return g->fwd->argmax(g->fwd->user, b, t);
    dt_model_get_logits(g->m, g->logits, b, t);
    return dt_sample_logits(g->logits, g->m->cfg.V, 0.0f, 0, unused);
}

/* Rows 0..B of g->in (a batch of B examples from first, each fed without
 * its final '\n', padded with token 0 to the batch's longest, T) and one
 * forward over them; then each row's answer, position by position: the
 * greedy token (dt_sample_logits' argmax) must be the expected one. */
static long grade_batch(grading *g, size_t first, int B)
{
    int T = 0, *len = g->len;
    for (int b = 0; b < B; b++) {
        len[b] = line_length(g->val + g->starts[first + (size_t)b]);
        T = len[b] - 1 > T ? len[b] - 1 : T;
    }
    for (int b = 0; b < B; b++) {
        const uint16_t *ex = g->val + g->starts[first + (size_t)b];
        for (int t = 0; t < T; t++)
            g->in[b * T + t] = t < len[b] - 1 ? ex[t] : 0;
    }
    bool logits;
    if (grading_forward(g, B, T, &logits) != DT_OK || !logits)
        return 0;
    long right = 0;
    dt_rng unused;
    dt_rng_seed(&unused, 0);
    for (int b = 0; b < B; b++) {
        const uint16_t *ex = g->val + g->starts[first + (size_t)b];
        int eq = 0;
        while (ex[eq] != '=')
            eq++;
        bool exact = true; /* the logits at t predict the token at t + 1 */
        for (int t = eq; exact && t < len[b] - 1; t++)
            exact = greedy_token(g, b, t, &unused) == ex[t + 1];
        right += exact;
    }
    return right;
}

/* A forward that grades nothing (one token), for a lockstep share with
 * fewer batches than the longest share: its parameter hooks still run. */
static void idle_forward(grading *g)
{
    bool logits;
    g->in[0] = 0;
    grading_forward(g, 1, 1, &logits);
}

/* Batches j = part, part + parts, ... of ceil(n / rows); with lockstep,
 * idle forwards up to the longest share's count. */
static long grade_share(grading *g, int part, int parts, bool lockstep)
{
    size_t batches = (g->n + (size_t)g->rows - 1) / (size_t)g->rows;
    size_t rounds = (batches + (size_t)parts - 1) / (size_t)parts;
    long right = 0;
    for (size_t k = 0; k < rounds; k++) {
        size_t j = k * (size_t)parts + (size_t)part;
        if (j >= batches) {
            if (lockstep)
                idle_forward(g);
            continue;
        }
        size_t first = j * (size_t)g->rows, left = g->n - first;
        right += grade_batch(g, first, left < (size_t)g->rows ? (int)left : g->rows);
    }
    return right;
}

/* The cut of a grading pass over the first n examples (g->n, g->rows and
 * the longest line); false where dt_task_count_exact returns -1 without
 * grading: not a task, no example, a line the context cannot hold. */
static bool plan_grading(grading *g, int *longest, dt_model *m, const dt_dataset *d, size_t n)
{
    if (!d->is_task || d->n_starts[DT_VAL] == 0)
        return false;
    size_t total = d->n_starts[DT_VAL];
    *g = (grading){.m = m,
                   .val = d->tokens + d->n_train,
                   .starts = d->starts[DT_VAL],
                   .n = n == 0 || n > total ? total : n};
    *longest = 0;
    for (size_t i = 0; i < g->n; i++) {
        int k = line_length(g->val + g->starts[i]);
        *longest = k > *longest ? k : *longest;
    }
    if (*longest - 1 > m->cfg.T)
        return false; /* the last token ('\n') is predicted, never fed */
    /* as many examples per forward as the allocation's tokens hold */
    size_t rows = (size_t)m->max_B * (size_t)m->cfg.T / (size_t)(*longest - 1);
    g->rows = rows > g->n ? (int)g->n : (int)rows;
    return true;
}

/* The scratch's parts, in order: in (rows, longest - 1) ints, len (rows)
 * ints, logits (V) floats. */
static size_t scratch_ints(const grading *g, int longest)
{
    return (size_t)g->rows * (size_t)(longest - 1) + (size_t)g->rows;
}

size_t dt_task_scratch_bytes(dt_model *m, const dt_dataset *d, size_t n)
{
    grading g;
    int longest;
    if (!plan_grading(&g, &longest, m, d, n))
        return 0;
    return scratch_ints(&g, longest) * sizeof(int) + (size_t)m->cfg.V * sizeof(float);
}

long dt_task_count_exact_in(void *scratch, dt_model *m, const dt_dataset *d, size_t n, int part,
                            int parts, bool lockstep, const dt_forward_fn *fwd, size_t *graded)
{
    grading g;
    int longest;
    if (graded)
        *graded = 0;
    if (!scratch || parts < 1 || part < 0 || part >= parts || !plan_grading(&g, &longest, m, d, n))
        return -1;
    g.fwd = fwd;
    g.in = scratch;
    g.len = g.in + (size_t)g.rows * (size_t)(longest - 1);
    g.logits = (float *)(g.in + scratch_ints(&g, longest));
    long right = grade_share(&g, part, parts, lockstep);
    if (graded)
        *graded = g.n;
    return right;
}

long dt_task_count_exact(dt_model *m, const dt_dataset *d, size_t n, int part, int parts,
                         bool lockstep, size_t *graded)
{
    return dt_task_count_exact_with(m, d, n, part, parts, lockstep, NULL, graded);
}

long dt_task_count_exact_with(dt_model *m, const dt_dataset *d, size_t n, int part, int parts,
                              bool lockstep, const dt_forward_fn *fwd, size_t *graded)
{
    size_t bytes = dt_task_scratch_bytes(m, d, n);
    void *scratch = bytes ? malloc(bytes) : NULL;
    long right = dt_task_count_exact_in(scratch, m, d, n, part, parts, lockstep, fwd, graded);
    free(scratch);
    return right;
}

double dt_task_accuracy(dt_model *m, const dt_dataset *d, size_t n)
{
    size_t graded;
    long right = dt_task_count_exact(m, d, n, 0, 1, false, &graded);
    return right < 0 ? -1.0 : (double)right / (double)graded;
}
