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
 * different `from` at every element, so a block from the wrong rank, or in
 * the wrong place, is caught.
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

static inline void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1); /* non-NULL even for count 0 */
    if (!p)
        abort();
    return p;
}

/* ---- values ---------------------------------------------------------------- */

static inline void put_value(void *buf, size_t i, dt_dtype t, double v) {
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

static inline double get_value(const void *buf, size_t i, dt_dtype t) {
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

/* What `rank` contributes at element i to a reduction with `op`. */
static inline int reduction_value(dt_dtype t, dt_redop op, int rank, size_t i) {
    const bool is_unsigned = t == DT_U8;
    const size_t r = (size_t)rank;
    switch (op) {
    case DT_PROD: { /* residue 2 or 1 of 5: at most two ranks of eight */
        static const int signed_factors[5] = {1, -1, 2, 1, 1};
        static const int unsigned_factors[5] = {1, 3, 2, 1, 1};
        size_t k = (i * 3 + r) % 5;
        return is_unsigned ? unsigned_factors[k] : signed_factors[k];
    }
    case DT_MIN: case DT_MAX:
        return (int)((i * 5 + r * 11) % 13) - (is_unsigned ? 0 : 6);
    case DT_BAND: return 0x7f & ~(1 << ((i + r) % 7));
    case DT_BOR: return 1 << ((i + 2 * r) % 7);
    case DT_BXOR: return (int)((i * 13 + r * 29 + 5) % 97);
    default: /* sum, avg */
        return (int)((i * 7 + r * 3) % 9) - (is_unsigned ? 0 : 4);
    }
}

static inline void fill_reduction_input(void *buf, size_t n, dt_dtype t, dt_redop op,
                                 int rank) {
    for (size_t i = 0; i < n; i++)
        put_value(buf, i, t, reduction_value(t, op, rank, i));
}

/* Element i of the block that rank `from` holds for rank `to` (0 where
 * there is no destination): below 101, distinct for distinct `from`. */
static inline void fill_block(void *buf, size_t n, dt_dtype t, int from, int to) {
    for (size_t i = 0; i < n; i++)
        put_value(buf, i, t, (double)(((size_t)from * 37 + (size_t)to * 13 +
                                       i * 11 + 1) % 101));
}

/* Records a mismatch (first differing element) under `label`. */
static inline void expect_equal(rank_ctx *rc, const char *label, const void *got,
                         const void *want, size_t n, dt_dtype t) {
    size_t es = dt_dtype_size(t);
    if (n == 0 || memcmp(got, want, n * es) == 0)
        return;
    size_t i = 0;
    while (memcmp((const char *)got + i * es, (const char *)want + i * es, es) == 0)
        i++;
    rank_fail(rc, "%s: element %zu of %zu is %g, expected %g", label, i, n,
              get_value(got, i, t), get_value(want, i, t));
}

#endif /* DT_TEST_COLLECTIVE_DATA_H */
