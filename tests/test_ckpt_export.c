/*
 * test_ckpt_export.c — dtrain-ckpt export: a checkpoint's parameters as
 * one safetensors file (checkpoint/export.c), from a buffer in memory or
 * streamed from a step directory's shards, in fp32 or rounded to bf16.
 *
 * States are synthetic (ckpt_fixture.h): every value a function of
 * (step, array, index), saved by one process as WORLD shards. The fixture's
 * model (V 8, C 5, H 1, L 2, T 5) has 805 parameters.
 */
#include <jansson.h>

#include "ckpt_fixture.h"

#define WORLD 3
#define NUM_PARAMS 805

/* The whole file at path, its size in *n. */
static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    unsigned char *buf = malloc(*n);
    cr_assert_eq(fread(buf, 1, *n, f), *n);
    fclose(f);
    return buf;
}

/* The header of a safetensors file's bytes, parsed; its length in *hlen. */
static json_t *header_of(const unsigned char *file, uint64_t *hlen)
{
    *hlen = 0;
    for (int i = 7; i >= 0; i--)
        *hlen = *hlen << 8 | file[i];
    json_error_t e;
    json_t *root = json_loadb((const char *)file + 8, *hlen, 0, &e);
    cr_assert_not_null(root, "header: %s", e.text);
    return root;
}

/* x's parameters exported to ROOT/model.safetensors as o says; the
 * file's bytes, their count in *n. */
static unsigned char *export_model(fixture_saved *x, const dt_ckpt_export_options *o, size_t *n)
{
    char p[256];
    snprintf(p, sizeof p, "%s/model.safetensors", x->root);
    cr_assert_eq(dt_ckpt_export_safetensors_as(x->ck, p, &x->f.s.cfg, x->f.params, o), DT_OK, "%s",
                 dt_ckpt_error(x->ck));
    return slurp(p, n);
}

Test(ckpt_export, safetensors_export_has_named_tensors_and_raw_data, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
    size_t n;
    unsigned char *file = export_model(&x, &(dt_ckpt_export_options){0}, &n);
    uint64_t hlen;
    json_t *root = header_of(file, &hlen);
    cr_assert_eq(hlen % 8, 0);
    json_t *wte = json_object_get(root, "wte.weight");
    cr_assert_str_eq(json_string_value(json_object_get(wte, "dtype")), "F32");
    cr_assert_eq(json_integer_value(json_array_get(json_object_get(wte, "shape"), 0)), 8);
    json_t *head = json_object_get(root, "lm_head.weight");
    cr_assert_not_null(head, "no lm_head.weight");
    json_int_t end = json_integer_value(json_array_get(json_object_get(head, "data_offsets"), 1));
    cr_assert_eq(end, NUM_PARAMS * 4);
    cr_assert_eq(n, 8 + hlen + NUM_PARAMS * sizeof(float), "the file is %zu bytes", n);
    cr_assert_eq(memcmp(file + 8 + hlen, x.f.params, NUM_PARAMS * sizeof(float)), 0);
    free(file);
    json_decref(root);
    fixture_saved_close(&x);
}

Test(ckpt_export, safetensors_metadata_carries_the_model_config, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
    size_t n;
    unsigned char *file = export_model(&x, &(dt_ckpt_export_options){0}, &n);
    uint64_t hlen;
    json_t *root = header_of(file, &hlen);
    json_t *meta = json_object_get(root, "__metadata__");
    cr_assert_not_null(meta, "no __metadata__ in %.*s", (int)hlen, (const char *)file + 8);
    const char *want[][2] = {{"V", "8"}, {"C", "5"}, {"H", "1"}, {"L", "2"}, {"T", "5"}};
    for (int i = 0; i < 5; i++) {
        const char *got = json_string_value(json_object_get(meta, want[i][0]));
        cr_expect(got && !strcmp(got, want[i][1]), "%s: %s, expected \"%s\"", want[i][0],
                  got ? got : "(missing, or not a string)", want[i][1]);
    }
    free(file);
    json_decref(root);
    fixture_saved_close(&x);
}

Test(ckpt_export, a_bf16_export_holds_each_value_rounded_to_nearest_even_in_half_the_bytes,
     .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
    size_t n;
    unsigned char *file = export_model(&x, &(dt_ckpt_export_options){.dtype = DT_BF16}, &n);
    uint64_t hlen;
    json_t *root = header_of(file, &hlen);
    const char *name;
    json_t *t;
    json_object_foreach(root, name, t)
    {
        if (strcmp(name, "__metadata__"))
            cr_assert_str_eq(json_string_value(json_object_get(t, "dtype")), "BF16", "%s", name);
    }
    json_t *head = json_object_get(root, "lm_head.weight");
    json_int_t end = json_integer_value(json_array_get(json_object_get(head, "data_offsets"), 1));
    cr_assert_eq(end, NUM_PARAMS * 2, "the data ends at byte %lld", (long long)end);
    cr_assert_eq(n, 8 + hlen + NUM_PARAMS * 2, "the file is %zu bytes", n);
    uint16_t want[NUM_PARAMS];
    dt_f32_to_bf16_n(want, x.f.params, NUM_PARAMS);
    for (int i = 0; i < NUM_PARAMS; i++) {
        uint16_t got = (uint16_t)(file[8 + hlen + 2 * i] | file[8 + hlen + 2 * i + 1] << 8);
        cr_assert_eq(got, want[i], "parameter %d: 0x%04x, the nearest bf16 is 0x%04x", i, got,
                     want[i]);
    }
    free(file);
    json_decref(root);
    fixture_saved_close(&x);
}

Test(ckpt_export, a_step_directory_streamed_gives_the_bytes_of_the_buffer_in_either_dtype,
     .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_ZERO1, NULL, WORLD);
    const dt_dtype dtypes[2] = {DT_F32, DT_BF16};
    for (int d = 0; d < 2; d++) {
        dt_ckpt_export_options o = {.names = DT_CKPT_NAMES_SEED, .dtype = dtypes[d]};
        char mem[256], dir[256];
        snprintf(mem, sizeof mem, "%s/mem.safetensors", x.root);
        snprintf(dir, sizeof dir, "%s/dir.safetensors", x.root);
        cr_assert_eq(dt_ckpt_export_safetensors_as(x.ck, mem, &x.f.s.cfg, x.f.params, &o), DT_OK,
                     "%s", dt_ckpt_error(x.ck));
        cr_assert_eq(dt_ckpt_export_dir(x.ck, x.step_dir, dir, &o), DT_OK, "%s",
                     dt_ckpt_error(x.ck));
        size_t nm, nd;
        unsigned char *a = slurp(mem, &nm), *b = slurp(dir, &nd);
        cr_assert(nm == nd && memcmp(a, b, nm) == 0, "%s: the streamed export differs",
                  dt_dtype_name(dtypes[d]));
        free(a);
        free(b);
    }
    fixture_saved_close(&x);
}

Test(ckpt_export, a_dtype_other_than_f32_or_bf16_is_refused_by_name, .timeout = 30)
{
    fixture_saved x;
    fixture_saved_open(&x, DT_CKPT_DDP, NULL, WORLD);
    char p[256];
    snprintf(p, sizeof p, "%s/model.safetensors", x.root);
    dt_ckpt_export_options o = {.dtype = DT_F16};
    cr_assert_eq(dt_ckpt_export_safetensors_as(x.ck, p, &x.f.s.cfg, x.f.params, &o), DT_EINVAL);
    cr_assert(strstr(dt_ckpt_error(x.ck), "f32 or bf16, not f16"), "%s", dt_ckpt_error(x.ck));
    cr_assert_neq(access(p, F_OK), 0, "a refused export wrote %s", p);
    fixture_saved_close(&x);
}
