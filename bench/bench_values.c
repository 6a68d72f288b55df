/*
 * bench_values.c — deterministic inputs and their expected reductions, for
 * dtrain-bench --check. See bench_values.h for the idea.
 *
 * The half-precision conversions are written out here (round to nearest
 * even, as the reduction kernels round) rather than borrowed from the
 * collectives layer: a checker that shares code with what it checks would
 * share its bugs.
 */
#include "bench_values.h"

#include <math.h>
#include <string.h>

/* ---- half precision ----------------------------------------------------------- */

static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a >= 0x7f800000u)
        return sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0); /* inf, nan */
    if (a >= 0x477ff000u)
        return sign | 0x7c00u; /* rounds past 65504: inf */
    if (a < 0x38800000u) {     /* below 2^-14: subnormal or zero */
        float v;
        memcpy(&v, &a, sizeof v);
        return sign | (uint16_t)lrintf(v * 16777216.0f); /* units of 2^-24 */
    }
    uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);        /* to nearest, ties to even */
    return sign | (uint16_t)((rounded - 0x38000000u) >> 13); /* rebias 127 -> 15 */
}

static float f16_to_f32(uint16_t h)
{
    int exp = (h >> 10) & 0x1f;
    int mant = h & 0x3ff;
    float v;
    if (exp == 0)
        v = ldexpf((float)mant, -24);
    else if (exp == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexpf((float)(mant | 0x400), exp - 25);
    return (h & 0x8000u) ? -v : v;
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* nan */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* ---- inputs --------------------------------------------------------------------- */

int64_t bench_reduce_input(dt_redop op, int r, size_t i)
{
    switch (op) {
    case DT_PROD: return 1 + (int64_t)((i + (size_t)r) % 2);
    case DT_MIN:
    case DT_MAX: return (int64_t)((i * 7 + (size_t)r * 13) % 17);
    case DT_BAND:
    case DT_BOR:
    case DT_BXOR: return (int64_t)((i * 37 + (size_t)r * 91) & 0x7f);
    default: return (int64_t)((i * 7 + (size_t)r * 13) % 8); /* sum, avg */
    }
}

int64_t bench_plain_input(int r, size_t i)
{
    return (int64_t)((i * 7 + (size_t)r * 31) % 101);
}

static bool is_float(dt_dtype t)
{
    return t == DT_F32 || t == DT_F64 || t == DT_F16 || t == DT_BF16;
}

void bench_store(dt_dtype t, void *buf, size_t i, int64_t v)
{
    switch (t) {
    case DT_F32: ((float *)buf)[i] = (float)v; break;
    case DT_F64: ((double *)buf)[i] = (double)v; break;
    case DT_F16: ((uint16_t *)buf)[i] = f32_to_f16((float)v); break;
    case DT_BF16: ((uint16_t *)buf)[i] = f32_to_bf16((float)v); break;
    case DT_I8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case DT_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)buf)[i] = v; break;
    default: break;
    }
}

/* ---- reading back ----------------------------------------------------------------- */

static double load_float(dt_dtype t, const void *buf, size_t i)
{
    switch (t) {
    case DT_F32: return ((const float *)buf)[i];
    case DT_F64: return ((const double *)buf)[i];
    case DT_F16: return f16_to_f32(((const uint16_t *)buf)[i]);
    default: return bf16_to_f32(((const uint16_t *)buf)[i]);
    }
}

static int64_t load_int(dt_dtype t, const void *buf, size_t i)
{
    switch (t) {
    case DT_I8: return ((const int8_t *)buf)[i];
    case DT_U8: return ((const uint8_t *)buf)[i];
    case DT_I32: return ((const int32_t *)buf)[i];
    default: return ((const int64_t *)buf)[i];
    }
}

/* v cut to the width of integer type t, the way a store into it wraps. */
static int64_t wrap_int(dt_dtype t, uint64_t v)
{
    switch (t) {
    case DT_I8: return (int8_t)v;
    case DT_U8: return (uint8_t)v;
    case DT_I32: return (int32_t)v;
    default: return (int64_t)v;
    }
}

/* v rounded to floating type t, as storing it there would. */
static double round_to(dt_dtype t, double v)
{
    switch (t) {
    case DT_F32: return (float)v;
    case DT_F16: return f16_to_f32(f32_to_f16((float)v));
    case DT_BF16: return bf16_to_f32(f32_to_bf16((float)v));
    default: return v;
    }
}

static int64_t expected_int(dt_dtype t, dt_redop op, int p, size_t g)
{
    int64_t acc = bench_reduce_input(op, 0, g);
    for (int r = 1; r < p; r++) {
        int64_t v = bench_reduce_input(op, r, g);
        switch (op) {
        case DT_PROD: acc = wrap_int(t, (uint64_t)acc * (uint64_t)v); break;
        case DT_MIN: acc = v < acc ? v : acc; break;
        case DT_MAX: acc = v > acc ? v : acc; break;
        case DT_BAND: acc &= v; break;
        case DT_BOR: acc |= v; break;
        case DT_BXOR: acc ^= v; break;
        default: acc = wrap_int(t, (uint64_t)acc + (uint64_t)v); break; /* sum, avg */
        }
    }
    return op == DT_AVG ? acc / p : acc;
}

static double expected_float(dt_dtype t, dt_redop op, int p, size_t g)
{
    double acc = (double)bench_reduce_input(op, 0, g);
    for (int r = 1; r < p; r++) {
        double v = (double)bench_reduce_input(op, r, g);
        switch (op) {
        case DT_PROD: acc *= v; break;
        case DT_MIN: acc = v < acc ? v : acc; break;
        case DT_MAX: acc = v > acc ? v : acc; break;
        default: acc += v; break; /* sum, avg */
        }
    }
    acc = round_to(t, acc);
    return op == DT_AVG ? round_to(t, acc / p) : acc;
}

/* A few units in the last place of each type: room for an average's
 * rounding, none for a wrong sum (the inputs are integers). */
static double tolerance(dt_dtype t)
{
    switch (t) {
    case DT_F32: return 1e-6;
    case DT_F64: return 1e-12;
    case DT_F16: return 2e-3;
    default: return 1.6e-2;
    }
}

bool bench_reduced_ok(dt_dtype t, dt_redop op, int p, const void *buf, size_t i,
                      size_t global_index)
{
    if (!is_float(t))
        return load_int(t, buf, i) == expected_int(t, op, p, global_index);
    double want = expected_float(t, op, p, global_index), got = load_float(t, buf, i);
    if (isinf(want))
        return got == want;
    return fabs(got - want) <= tolerance(t) * fmax(1.0, fabs(want));
}

bool bench_plain_ok(dt_dtype t, const void *buf, size_t i, int64_t v)
{
    if (!is_float(t))
        return load_int(t, buf, i) == wrap_int(t, (uint64_t)v);
    return load_float(t, buf, i) == (double)v;
}
