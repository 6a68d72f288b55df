/*
 * collective_data.h — test data for collectives: values every dtype holds
 * exactly, the inputs each rank contributes, and a byte-exact comparison
 * that says which element differs.
 *
 * Reductions: sums of at most 8 values in [-4, 4] (unsigned: [0, 8]);
 * products of values in {1, -1, 2} (unsigned {1, 3, 2}) with at most two
 * factors other than 1 among 8 ranks; min/max of integers in [-6, 6];
 * single-bit patterns for band/bor, small integers for bxor. Every partial
 * result of every order fits f16 and bf16 (integers up to 256) exactly, so
 * any algorithm's order gives the serial reference's bytes.
 *
 * Data movement: fill_block(from, to) values are below 101 and differ for
 * different `from` at every element, so a block from the wrong rank is
 * caught; and no pattern is periodic in the element index (element_hash),
 * so neither is a block or chunk in the wrong place.
 */
#ifndef DT_TEST_COLLECTIVE_DATA_H
#define DT_TEST_COLLECTIVE_DATA_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dt_comm.h"
#include "rank_threads.h"
#include "reduce.h"

static inline void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1); /* non-NULL even for count 0 */
    if (!p)
        abort();
    return p;
}

/* ---- values ---------------------------------------------------------------- */

static inline void put_value(void *buf, size_t i, dt_dtype t, double v)
{
    switch (t) {
    case DT_F32: ((float *)buf)[i] = (float)v; break;
    case DT_F64: ((double *)buf)[i] = v; break;
    case DT_F16: ((uint16_t *)buf)[i] = dt_f32_to_f16((float)v); break;
    case DT_BF16: ((uint16_t *)buf)[i] = dt_f32_to_bf16((float)v); break;
    case DT_I8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case DT_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: abort();
    }
}

static inline double get_value(const void *buf, size_t i, dt_dtype t)
{
    switch (t) {
    case DT_F32: return ((const float *)buf)[i];
    case DT_F64: return ((const double *)buf)[i];
    case DT_F16: return dt_f16_to_f32(((const uint16_t *)buf)[i]);
    case DT_BF16: return dt_bf16_to_f32(((const uint16_t *)buf)[i]);
    case DT_I8: return ((const int8_t *)buf)[i];
    case DT_U8: return ((const uint8_t *)buf)[i];
    case DT_I32: return ((const int32_t *)buf)[i];
    case DT_I64: return (double)((const int64_t *)buf)[i];
    default: abort();
    }
}

/* A well-mixed number for element i (splitmix64's finaliser): patterns built
 * on it have no period, so a chunk or block that lands shifted, by any
 * amount, disagrees with the reference almost everywhere. */
static inline uint64_t element_hash(size_t i)
{
    uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15u;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
    return x ^ (x >> 31);
}

/* What `rank` contributes at element i to a reduction with `op`. Along the
 * ranks the pattern steps through residues, so 8 ranks hit each residue at
 * most twice (the bound on prod's factors). */
static inline int reduction_value(dt_dtype t, dt_redop op, int rank, size_t i)
{
    const bool is_unsigned = t == DT_U8;
    const uint64_t h = element_hash(i), r = (uint64_t)rank;
    switch (op) {
    case DT_PROD: {
        static const int signed_factors[5] = {1, -1, 2, 1, 1};
        static const int unsigned_factors[5] = {1, 3, 2, 1, 1};
        size_t k = (size_t)((h + r) % 5);
        return is_unsigned ? unsigned_factors[k] : signed_factors[k];
    }
    case DT_MIN:
    case DT_MAX: return (int)((h + r * 11) % 13) - (is_unsigned ? 0 : 6);
    case DT_BAND: return 0x7f & ~(1 << ((h + r) % 7));
    case DT_BOR: return 1 << ((h + 2 * r) % 7);
    case DT_BXOR: return (int)((h + r * 29) % 97);
    default: /* sum, avg */ return (int)((h + r * 3) % 9) - (is_unsigned ? 0 : 4);
    }
}

/* buf[i] = v[i] in dtype t; the switch outside the loops keeps it fast. */
static inline void store_ints(void *buf, const int *v, size_t n, dt_dtype t)
{
#define STORE_LOOP(type, expr)         \
    do {                               \
        for (size_t i = 0; i < n; i++) \
            ((type *)buf)[i] = (expr); \
    } while (0);                       \
    break
    switch (t) {
    case DT_F32: STORE_LOOP(float, (float)v[i]);
    case DT_F64: STORE_LOOP(double, v[i]);
    case DT_F16: STORE_LOOP(uint16_t, dt_f32_to_f16((float)v[i]));
    case DT_BF16: STORE_LOOP(uint16_t, dt_f32_to_bf16((float)v[i]));
    case DT_I8: STORE_LOOP(int8_t, (int8_t)v[i]);
    case DT_U8: STORE_LOOP(uint8_t, (uint8_t)v[i]);
    case DT_I32: STORE_LOOP(int32_t, v[i]);
    case DT_I64: STORE_LOOP(int64_t, v[i]);
    default: abort();
    }
#undef STORE_LOOP
}

static inline void fill_reduction_input(void *buf, size_t n, dt_dtype t, dt_redop op, int rank)
{
    int *v = xmalloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = reduction_value(t, op, rank, i);
    store_ints(buf, v, n, t);
    free(v);
}

/* Element i of the block that rank `from` holds for rank `to` (0 where
 * there is no destination): below 101, distinct for distinct `from` (37
 * is invertible mod 101). */
static inline void fill_block(void *buf, size_t n, dt_dtype t, int from, int to)
{
    int *v = xmalloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = (int)(((uint64_t)from * 37 + (uint64_t)to * 13 + element_hash(i)) % 101);
    store_ints(buf, v, n, t);
    free(v);
}

/* Records a mismatch (first differing element) under `label`. */
static inline void expect_equal(rank_ctx *rc, const char *label, const void *got, const void *want,
                                size_t n, dt_dtype t)
{
    size_t es = dt_dtype_size(t);
    if (n == 0 || memcmp(got, want, n * es) == 0)
        return;
    size_t i = 0;
    while (memcmp((const char *)got + i * es, (const char *)want + i * es, es) == 0)
        i++;
    rank_fail(rc, "%s: element %zu of %zu is %g, expected %g", label, i, n, get_value(got, i, t),
              get_value(want, i, t));
}

#endif /* DT_TEST_COLLECTIVE_DATA_H */
