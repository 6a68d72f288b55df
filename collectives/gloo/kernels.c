/*
 * kernels.c — gloo's reductions, element by element, as torch 1.13 runs them.
 *
 * gloo/math.h: sum and product are c[i] = a[i] op b[i]; max is
 * std::max(a, b) = (a < b) ? b : a and min is std::min(a, b) =
 * (b < a) ? b : a, so a NaN in `a` wins and one in `b` loses; half
 * (gloo::float16) converts both operands to float, operates, and rounds
 * back to nearest-even. Integers wrap (computed unsigned here, so C's
 * signed overflow never happens). The algorithms call these with `a` the
 * local value and `b` the one received: the order is part of the result.
 * This file is compiled with -ffp-contract=off: no multiply-add fusion,
 * no reassociation, so the bits are gloo's.
 *
 * dtrain's own kernels (reduce.c) differ on purpose: they vectorise f16
 * through wider blocks and define min/max on NaN their own way.
 *
 * Cost: one pass over count elements.
 */
#include <string.h>

#include "gloo.h"
#include "half.h"

bool comm_gloo_reduces(dt_dtype t, dt_redop op)
{
    bool integer = t == DT_I8 || t == DT_U8 || t == DT_I32 || t == DT_I64;
    if (t == DT_BF16 || t >= DT_NUM_DTYPES)
        return false; /* torch 1.13's gloo has no bfloat16 */
    if (op == DT_SUM || op == DT_PROD || op == DT_MIN || op == DT_MAX)
        return true;
    return integer && (op == DT_BAND || op == DT_BOR || op == DT_BXOR);
}

#define FLOAT_LOOP(T, op)                            \
    do {                                             \
        T *o = out;                                  \
        const T *x = a, *y = b;                      \
        for (size_t i = 0; i < n; i++) {             \
            T u = x[i], v = y[i];                    \
            o[i] = op == DT_SUM    ? u + v           \
                   : op == DT_PROD ? u * v           \
                   : op == DT_MAX  ? (u < v ? v : u) \
                                   : (v < u ? v : u); \
        }                                            \
    } while (0)

/* Integers of type T, computed in the unsigned type U of the same width. */
#define INT_LOOP(T, U, op)                                   \
    do {                                                     \
        T *o = out;                                          \
        const T *x = a, *y = b;                              \
        for (size_t i = 0; i < n; i++) {                     \
            T u = x[i], v = y[i];                            \
            switch (op) {                                    \
            case DT_SUM: o[i] = (T)(U)((U)u + (U)v); break;  \
            case DT_PROD: o[i] = (T)(U)((U)u * (U)v); break; \
            case DT_MAX: o[i] = u < v ? v : u; break;        \
            case DT_MIN: o[i] = v < u ? v : u; break;        \
            case DT_BAND: o[i] = (T)(u & v); break;          \
            case DT_BOR: o[i] = (T)(u | v); break;           \
            default: o[i] = (T)(u ^ v); break;               \
            }                                                \
        }                                                    \
    } while (0)

static void reduce_f16(uint16_t *o, const uint16_t *x, const uint16_t *y, size_t n, dt_redop op)
{
    for (size_t i = 0; i < n; i++) {
        float u = half_f16_to_f32(x[i]), v = half_f16_to_f32(y[i]);
        if (op == DT_MAX)
            o[i] = u < v ? y[i] : x[i]; /* std::max on float16 keeps the operand's bits */
        else if (op == DT_MIN)
            o[i] = v < u ? y[i] : x[i];
        else
            o[i] = half_f32_to_f16(op == DT_SUM ? u + v : u * v);
    }
}

void comm_gloo_reduce(void *out, const void *a, const void *b, size_t n, dt_dtype t, dt_redop op)
{
    switch (t) {
    case DT_F32: FLOAT_LOOP(float, op); break;
    case DT_F64: FLOAT_LOOP(double, op); break;
    case DT_F16: reduce_f16(out, a, b, n, op); break;
    case DT_I8: INT_LOOP(int8_t, uint8_t, op); break;
    case DT_U8: INT_LOOP(uint8_t, uint8_t, op); break;
    case DT_I32: INT_LOOP(int32_t, uint32_t, op); break;
    case DT_I64: INT_LOOP(int64_t, uint64_t, op); break;
    default: break;
    }
}
