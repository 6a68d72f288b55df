/*
 * golden_fixture.h — the PyTorch golden fixture (tests/data/minigpt_golden.bin,
 * written by tests/make_golden.py) as the model suites read it: named
 * records of f32 or i32, a model holding its weights, and its forward.
 * Shared by test_model.c (the CPU backends) and test_cuda_kernels.c (the
 * CUDA backend's kernels). Assertions are Criterion's.
 *
 * File format: "DTGOLD1\n", then records: u32 name length, name, u8 dtype
 * (0 f32, 1 i32), u32 count, count 4-byte values.
 */
#ifndef DT_TEST_GOLDEN_FIXTURE_H
#define DT_TEST_GOLDEN_FIXTURE_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_model.h"

#ifndef DT_TEST_DATA_DIR
#define DT_TEST_DATA_DIR "tests/data"
#endif

/* ---- fixture reader ------------------------------------------------------- */

typedef struct record {
    char name[64];
    int dtype; /* 0 f32, 1 i32 */
    uint32_t count;
    void *data;
} record;

typedef struct fixture {
    record rec[64];
    int n;
} fixture;

static inline void fixture_load(fixture *fx, const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open fixture %s", path);
    char magic[8];
    cr_assert_eq(fread(magic, 1, 8, f), 8);
    cr_assert(memcmp(magic, "DTGOLD1\n", 8) == 0, "bad fixture magic");
    fx->n = 0;
    uint32_t len;
    while (fread(&len, 4, 1, f) == 1) {
        record *r = &fx->rec[fx->n++];
        cr_assert(fx->n <= 64 && len < sizeof r->name, "fixture too big");
        cr_assert_eq(fread(r->name, 1, len, f), len);
        r->name[len] = '\0';
        uint8_t dt;
        cr_assert_eq(fread(&dt, 1, 1, f), 1);
        cr_assert_eq(fread(&r->count, 4, 1, f), 1);
        r->dtype = dt;
        r->data = malloc((size_t)r->count * 4 + 1);
        cr_assert_eq(fread(r->data, 4, r->count, f), r->count, "fixture record %s truncated",
                     r->name);
    }
    fclose(f);
}

static inline void fixture_free(fixture *fx)
{
    for (int i = 0; i < fx->n; i++)
        free(fx->rec[i].data);
}

static inline const record *fixture_get(const fixture *fx, const char *name)
{
    for (int i = 0; i < fx->n; i++)
        if (strcmp(fx->rec[i].name, name) == 0)
            return &fx->rec[i];
    cr_assert_fail("fixture has no record %s", name);
    return NULL;
}

/* Loads the fixture and a C model holding its weights. */
static inline dt_model *golden_model(fixture *fx, const dt_backend *be)
{
    fixture_load(fx, DT_TEST_DATA_DIR "/minigpt_golden.bin");
    const int *cfg = fixture_get(fx, "config")->data;
    dt_config c = {.V = cfg[0], .T = cfg[1], .L = cfg[2], .H = cfg[3], .C = cfg[4]};
    dt_model *m;
    cr_assert_eq(dt_model_create(&m, &c, be, cfg[5]), DT_OK, "%s", dt_model_error(m));
    float *host = calloc(m->num_params, sizeof(float));
    for (int i = 0; i < m->num_tensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        char key[80];
        snprintf(key, sizeof key, "param:%s", t->name);
        const record *r = fixture_get(fx, key);
        cr_assert_eq(r->count, t->numel, "%s: %u values, layout says %zu", t->name, r->count,
                     t->numel);
        memcpy(host + t->offset, r->data, t->numel * sizeof(float));
    }
    dt_model_set_params(m, host);
    free(host);
    return m;
}

static inline void golden_forward(dt_model *m, const fixture *fx)
{
    const int *cfg = fixture_get(fx, "config")->data;
    cr_assert_eq(dt_model_forward(m, fixture_get(fx, "inputs")->data,
                                  fixture_get(fx, "targets")->data, cfg[5], cfg[1]),
                 DT_OK, "%s", dt_model_error(m));
}


#endif /* DT_TEST_GOLDEN_FIXTURE_H */
