/*
 * ckpt_runs.h — what the end-to-end checkpoint tests of tp and 3-D runs
 * share: running a built program with its log kept, dtrain-ckpt with
 * arguments, and comparing checkpoint files and whole step directories
 * byte for byte. The including test defines DT_CKPT_BIN.
 */
#ifndef DT_TESTS_CKPT_RUNS_H
#define DT_TESTS_CKPT_RUNS_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_program.h"

/* Runs argv (NULL-terminated) with its log under root; returns its output
 * (the caller frees) and asserts the exit code. */
static char *run(const char *root, const char *name, const char *const *argv, int want)
{
    char log[512];
    snprintf(log, sizeof log, "%s/%s.log", root, name);
    char *out = NULL;
    int rc = run_program(argv, log, &out);
    cr_assert_eq(rc, want, "%s exited %d, not %d:\n%s", name, rc, want, out);
    return out;
}

/* dtrain-ckpt ARGS (at most 14), which must succeed. */
static void ckpt_tool(const char *root, const char *name, const char *const *args)
{
    const char *argv[16] = {DT_CKPT_BIN};
    int k = 1;
    for (; *args && k < 15; args++)
        argv[k++] = *args;
    argv[k] = NULL;
    free(run(root, name, argv, 0));
}

static void read_file(const char *path, char **buf, long *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    rewind(f);
    *buf = malloc((size_t)*len + 1);
    cr_assert_eq(fread(*buf, 1, (size_t)*len, f), (size_t)*len);
    (*buf)[*len] = '\0';
    fclose(f);
}

static void expect_same_file(const char *x, const char *y)
{
    char *a, *b;
    long na, nb;
    read_file(x, &a, &na);
    read_file(y, &b, &nb);
    cr_expect(na == nb && memcmp(a, b, (size_t)na) == 0, "%s and %s differ", x, y);
    free(a);
    free(b);
}

/* Every shard and the manifest of two step directories, byte for byte. */
static void expect_same_step(const char *x, const char *y, int world)
{
    char p[300], q[300];
    for (int r = 0; r < world; r++) {
        snprintf(p, sizeof p, "%s/rank%05d.bin", x, r);
        snprintf(q, sizeof q, "%s/rank%05d.bin", y, r);
        expect_same_file(p, q);
    }
    snprintf(p, sizeof p, "%s/manifest.json", x);
    snprintf(q, sizeof q, "%s/manifest.json", y);
    expect_same_file(p, q);
}

#endif /* DT_TESTS_CKPT_RUNS_H */
