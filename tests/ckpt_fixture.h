/*
 * ckpt_fixture.h — shared by the checkpoint suites: a scratch root
 * directory per test, a synthetic training state whose every byte is a
 * function of (step, array, index), and manifest surgery through jansson.
 *
 * The synthetic state makes "byte-identical" checkable without training:
 * fill(step) then load must give back exactly fill(step); a rank's view
 * (fixture_rank_view) is what one rank of a job loads into.
 */
#ifndef DT_TEST_CKPT_FIXTURE_H
#define DT_TEST_CKPT_FIXTURE_H

#include <criterion/criterion.h>
#include <ftw.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dt_ckpt.h"

/* V=8 C=5 H=1 L=2 T=5: 805 parameters, which no world size > 1 divides. */
static inline dt_config fixture_config(void)
{
    return (dt_config){.V = 8, .T = 5, .L = 2, .H = 1, .C = 5};
}

static inline int fixture_rm_one(const char *p, const struct stat *sb, int f, struct FTW *w)
{
    (void)sb;
    (void)f;
    (void)w;
    return remove(p);
}

/* Removes a directory tree (the test's scratch root). */
static inline void fixture_rmtree(const char *dir)
{
    nftw(dir, fixture_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static inline void fixture_mkroot(char *buf, size_t len)
{
    snprintf(buf, len, "/tmp/dtrain-ckpt-test-XXXXXX");
    cr_assert_not_null(mkdtemp(buf), "mkdtemp");
}

/* A full state (every optimizer array over all Ψ), values from step. */
typedef struct full_state {
    dt_ckpt_state s;
    float *params, *master, *m, *v;
} full_state;

static inline float fixture_value(long step, int array, size_t i)
{
    uint32_t x = (uint32_t)(step * 2654435761u) ^ (uint32_t)(array * 40503u) ^
                 (uint32_t)(i * 2246822519u);
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    return (float)(int32_t)x / 2147483648.0f;
}

static inline void full_state_init(full_state *f, dt_ckpt_mode mode, long step)
{
    dt_config cfg = fixture_config();
    size_t n = dt_config_num_params(&cfg);
    f->params = malloc(n * sizeof(float));
    f->master = malloc(n * sizeof(float));
    f->m = malloc(n * sizeof(float));
    f->v = malloc(n * sizeof(float));
    cr_assert(f->params && f->master && f->m && f->v);
    float *arr[4] = {f->params, f->master, f->m, f->v};
    for (int a = 0; a < 4; a++)
        for (size_t i = 0; i < n; i++)
            arr[a][i] = fixture_value(step, a, i);
    /* ZeRO-1's master holds the same fp32 values as the parameters */
    memcpy(f->master, f->params, n * sizeof(float));
    f->s = (dt_ckpt_state){.cfg = cfg,
                           .mode = mode,
                           .rank = 0,
                           .world = 1,
                           .step = step,
                           .seed = 0xfeedbeefcafe1234ull,
                           .data_row = (uint64_t)step * 16,
                           .rng_state = 0x8000000000000001ull ^ (uint64_t)step,
                           .num_params = n,
                           .params = f->params,
                           .opt_lo = 0,
                           .opt_n = n,
                           .master = mode == DT_CKPT_ZERO1 ? f->master : NULL,
                           .adam_m = f->m,
                           .adam_v = f->v};
}

static inline void full_state_free(full_state *f)
{
    free(f->params);
    free(f->master);
    free(f->m);
    free(f->v);
}

/* A committed world-rank checkpoint of step 10 (full_state_init's) in a
 * fresh root, its handle and its step directory. */
typedef struct fixture_saved {
    char root[128];
    char step_dir[256];
    dt_ckpt *ck;
    full_state f;
} fixture_saved;

static inline void fixture_saved_open(fixture_saved *x, dt_ckpt_mode mode, const dt_ckpt_options *o,
                                      int world)
{
    fixture_mkroot(x->root, sizeof x->root);
    cr_assert_eq(dt_ckpt_open(&x->ck, x->root, o), DT_OK);
    full_state_init(&x->f, mode, 10);
    cr_assert_eq(dt_ckpt_save_all(x->ck, &x->f.s, world), DT_OK, "%s", dt_ckpt_error(x->ck));
    snprintf(x->step_dir, sizeof x->step_dir, "%s/step_00000010", x->root);
}

static inline void fixture_saved_close(fixture_saved *x)
{
    dt_ckpt_close(x->ck);
    full_state_free(&x->f);
    fixture_rmtree(x->root);
}

/* Rank r's view of `world` ranks: zeroed buffers to load into (under
 * ZeRO-1 the optimizer range is r's partition, at index 0). */
static inline void fixture_rank_view(full_state *dst, dt_ckpt_mode mode, int r, int world)
{
    full_state_init(dst, mode, 0);
    size_t n = dst->s.num_params;
    memset(dst->params, 0, n * sizeof(float));
    memset(dst->m, 0, n * sizeof(float));
    memset(dst->v, 0, n * sizeof(float));
    memset(dst->master, 0, n * sizeof(float));
    dst->s.rank = r;
    dst->s.world = world;
    if (mode == DT_CKPT_ZERO1)
        dt_ckpt_partition(n, world, r, &dst->s.opt_lo, &dst->s.opt_n);
}

/* What a view loaded equals the full state src, byte for byte. */
static inline void fixture_expect_view(const full_state *src, const full_state *got)
{
    const dt_ckpt_state *a = &src->s, *b = &got->s;
    cr_assert_eq(memcmp(a->params, b->params, a->num_params * sizeof(float)), 0,
                 "rank %d of %d: parameters differ", b->rank, b->world);
    size_t lo = b->opt_lo, n = b->opt_n;
    cr_assert_eq(memcmp(a->adam_m + lo, b->adam_m, n * sizeof(float)), 0,
                 "rank %d of %d: m differs", b->rank, b->world);
    cr_assert_eq(memcmp(a->adam_v + lo, b->adam_v, n * sizeof(float)), 0,
                 "rank %d of %d: v differs", b->rank, b->world);
    if (b->master)
        cr_assert_eq(memcmp(src->master + lo, b->master, n * sizeof(float)), 0,
                     "rank %d of %d: master differs", b->rank, b->world);
    cr_assert_eq(b->step, a->step);
    cr_assert_eq(b->seed, a->seed);
    cr_assert_eq(b->data_row, a->data_row);
    cr_assert_eq(b->rng_state, a->rng_state);
}

/* Flips one bit of the byte at offset in path. */
static inline void fixture_flip_byte(const char *path, long offset)
{
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fseek(f, offset, SEEK_SET), 0);
    int c = fgetc(f);
    cr_assert_neq(c, EOF, "%s: no byte at %ld", path, offset);
    cr_assert_eq(fseek(f, offset, SEEK_SET), 0);
    fputc(c ^ 0x10, f);
    cr_assert_eq(fclose(f), 0);
}

/* Rewrites root/step_N/manifest.json through edit(json). */
static inline void fixture_edit_manifest(const char *stepdir, void (*edit)(json_t *root))
{
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", stepdir);
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    cr_assert_not_null(root, "manifest: %s", e.text);
    edit(root);
    cr_assert_eq(json_dump_file(root, path, JSON_INDENT(1)), 0);
    json_decref(root);
}

#endif /* DT_TEST_CKPT_FIXTURE_H */
