/*
 * test_dtype_reduce.c — specification of the reduction kernels (reduce.h)
 * and of the 16-bit float conversions they use. (The collectives'
 * vocabulary, names, sizes and parsing: test_dtype_names.c.)
 *
 * How the kernels are pinned down:
 *   - the 16-bit float conversions are checked exhaustively where the
 *     domain is small (all 65536 inputs of a widening; every rounding
 *     midpoint of a narrowing) against independent oracles written here
 *     (ldexp for values, a nearest-even search for rounding), plus the
 *     named corner cases: ties, inf, NaN, subnormals, overflow;
 *   - the fast dt_reduce_into must equal dt_reduce_into_reference for
 *     every dtype × supported op on random data, at odd lengths and odd
 *     alignments, without touching memory past `count`;
 *   - the reference itself is checked on hand-computed cases (wrap-around,
 *     NaN propagation, signedness, ties in f16 accumulation, averages).
 *
 * Random data comes from a seeded xorshift generator held in a local
 * struct, so every run sees the same numbers and tests share no state.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dt_comm.h"
#include "reduce.h"

/* ---- helpers -------------------------------------------------------------- */

typedef struct rng {
    uint64_t state;
} rng;

static uint64_t rng_next(rng *r)
{
    r->state ^= r->state << 13;
    r->state ^= r->state >> 7;
    r->state ^= r->state << 17;
    return r->state;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static bool f16_is_nan(uint16_t h)
{
    return (h & 0x7fffu) > 0x7c00u;
}
static bool bf16_is_nan(uint16_t h)
{
    return (h & 0x7fffu) > 0x7f80u;
}

/* Independent value of an f16: (-1)^s · 2^(e-15) · 1.m, or 2^-14 · 0.m. */
static double f16_value_oracle(uint16_t h)
{
    int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return sign ? -v : v;
}

/* Independent nearest-even narrowing of a finite, non-NaN f32 to a 16-bit
 * format, given its (already verified) widening. Binary-search the largest
 * non-negative encoding not above |x|, then pick the nearer neighbour, the
 * even one on a tie. `max_finite` (odd in both formats) rounds on to inf
 * from its midpoint up. */
static uint16_t nearest_even_oracle(float x, float (*widen)(uint16_t), uint16_t max_finite,
                                    uint16_t inf)
{
    double a = fabs((double)x);
    uint16_t sign = signbit(x) ? 0x8000u : 0;
    uint16_t lo = 0, hi = max_finite;
    if (a >= widen(max_finite)) {
        double top = widen(max_finite), below = widen(max_finite - 1);
        return sign | (a >= top + (top - below) / 2 ? inf : max_finite);
    }
    while (hi - lo > 1) { /* invariant: widen(lo) <= a < widen(hi) */
        uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (widen(mid) <= a)
            lo = mid;
        else
            hi = mid;
    }
    double down = a - widen(lo), up = widen(hi) - a;
    uint16_t pick = down < up ? lo : up < down ? hi : (lo % 2 == 0 ? lo : hi);
    return sign | pick;
}

/* Equal bits, or both NaN: which NaN payload survives NaN (op) NaN depends
 * on operand order, which the compiler may swap in a commutative op. */
static bool same_element(dt_dtype t, const void *a, const void *b)
{
    switch (t) {
    case DT_F32: {
        float x, y;
        memcpy(&x, a, 4), memcpy(&y, b, 4);
        return memcmp(a, b, 4) == 0 || (isnan(x) && isnan(y));
    }
    case DT_F64: {
        double x, y;
        memcpy(&x, a, 8), memcpy(&y, b, 8);
        return memcmp(a, b, 8) == 0 || (isnan(x) && isnan(y));
    }
    case DT_F16:
    case DT_BF16: {
        uint16_t x, y;
        memcpy(&x, a, 2), memcpy(&y, b, 2);
        bool (*is_nan)(uint16_t) = t == DT_F16 ? f16_is_nan : bf16_is_nan;
        return x == y || (is_nan(x) && is_nan(y));
    }
    default: return memcmp(a, b, dt_dtype_size(t)) == 0;
    }
}

/* Mostly ordinary values in [-4, 4) with 1 in 16 special ones, so sums and
 * products stay interesting and every kernel meets NaN, inf, ±0 and
 * subnormals somewhere. Integers get raw random bits. */
static void fill_random(void *buf, size_t count, dt_dtype t, rng *r)
{
    static const float specials[] = {NAN,   -NAN,   INFINITY, -INFINITY, 0.0f,
                                     -0.0f, 1e-40f, -3e-8f,   65504.0f,  1e30f};
    size_t nspecial = sizeof specials / sizeof specials[0];
    for (size_t i = 0; i < count; i++) {
        uint64_t bits = rng_next(r);
        float f = (float)((int64_t)(bits >> 40) - (1 << 23)) / (1 << 21);
        if ((bits & 15) == 0)
            f = specials[(bits >> 4) % nspecial];
        switch (t) {
        case DT_F32: ((float *)buf)[i] = f; break;
        case DT_F64: ((double *)buf)[i] = (double)f * (1.0 + 0x1p-40); break;
        case DT_F16: ((uint16_t *)buf)[i] = dt_f32_to_f16(f); break;
        case DT_BF16: ((uint16_t *)buf)[i] = dt_f32_to_bf16(f); break;
        default: memcpy((char *)buf + i * dt_dtype_size(t), &bits, dt_dtype_size(t));
        }
    }
}

/* Runs fast and reference on the same random inputs for every supported op
 * and several lengths, starting `skew` elements into the allocation so that
 * vector loops meet unaligned heads; checks a guard past `count` too. */
static void check_fast_matches_reference(dt_dtype t)
{
    static const size_t lengths[] = {0, 1, 7, 1000, 4099};
    const size_t guard = 16, size = dt_dtype_size(t);
    rng r = {0x9e3779b97f4a7c15ull + (uint64_t)t};
    for (int op = 0; op < DT_NUM_REDOPS; op++) {
        if (!dt_redop_supports((dt_redop)op, t))
            continue;
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
            size_t n = lengths[li], skew = li % 3, total = skew + n + guard;
            char *src = malloc(total * size), *fast = malloc(total * size);
            char *ref = malloc(total * size);
            cr_assert(src && fast && ref);
            fill_random(src, total, t, &r);
            fill_random(fast, total, t, &r);
            memcpy(ref, fast, total * size);
            dt_reduce_into(fast + skew * size, src + skew * size, n, t, op);
            dt_reduce_into_reference(ref + skew * size, src + skew * size, n, t, op);
            for (size_t i = 0; i < total; i++)
                cr_assert(same_element(t, fast + i * size, ref + i * size),
                          "%s %s, count %zu: element %zu differs (fast vs "
                          "reference)%s",
                          dt_dtype_name(t), dt_redop_name(op), n, i,
                          i < skew || i >= skew + n ? ", outside the range" : "");
            free(src), free(fast), free(ref);
        }
    }
}

/* Both kernels on one small case: dst (op)= src, compared with `want`. */
static void check_both(dt_dtype t, dt_redop op, const void *dst, const void *src, const void *want,
                       size_t n)
{
    size_t bytes = n * dt_dtype_size(t);
    char fast[64], ref[64];
    cr_assert(bytes <= sizeof fast);
    memcpy(fast, dst, bytes), memcpy(ref, dst, bytes);
    dt_reduce_into(fast, src, n, t, op);
    dt_reduce_into_reference(ref, src, n, t, op);
    for (size_t i = 0; i < n; i++) {
        size_t at = i * dt_dtype_size(t);
        cr_assert(same_element(t, fast + at, (const char *)want + at),
                  "fast %s %s: element %zu wrong", dt_dtype_name(t), dt_redop_name(op), i);
        cr_assert(same_element(t, ref + at, (const char *)want + at),
                  "reference %s %s: element %zu wrong", dt_dtype_name(t), dt_redop_name(op), i);
    }
}

/* ---- f16 ------------------------------------------------------------------ */

Test(f16, named_values_widen_exactly, .timeout = 10)
{
    cr_assert_eq(dt_f16_to_f32(0x3c00), 1.0f);
    cr_assert_eq(dt_f16_to_f32(0xc000), -2.0f);
    cr_assert_eq(dt_f16_to_f32(0x3555), 0.333251953125f);
    cr_assert_eq(dt_f16_to_f32(0x7bff), 65504.0f);
    cr_assert_eq(dt_f16_to_f32(0x0400), 0x1p-14f);        /* smallest normal */
    cr_assert_eq(dt_f16_to_f32(0x03ff), 1023 * 0x1p-24f); /* largest subnormal */
    cr_assert_eq(dt_f16_to_f32(0x0001), 0x1p-24f);        /* smallest subnormal */
    cr_assert_eq(dt_f16_to_f32(0x8001), -0x1p-24f);
    cr_assert_eq(f32_bits(dt_f16_to_f32(0x8000)), 0x80000000u); /* -0 */
    cr_assert_eq(dt_f16_to_f32(0x7c00), INFINITY);
    cr_assert_eq(dt_f16_to_f32(0xfc00), -INFINITY);
    cr_assert(isnan(dt_f16_to_f32(0x7e00)));
    cr_assert(isnan(dt_f16_to_f32(0x7c01))); /* signalling NaN: not inf */
}

Test(f16, every_encoding_widens_to_its_value, .timeout = 10)
{
    for (uint32_t h = 0; h <= 0xffff; h++) {
        double want = f16_value_oracle((uint16_t)h);
        float got = dt_f16_to_f32((uint16_t)h);
        if (isnan(want))
            cr_assert(isnan(got), "0x%04x should widen to NaN", h);
        else
            cr_assert(got == want && !signbit(got) == !signbit(want),
                      "0x%04x widened to %a, want %a", h, got, want);
    }
}

Test(f16, every_value_round_trips_and_nan_stays_nan, .timeout = 10)
{
    for (uint32_t h = 0; h <= 0xffff; h++) {
        uint16_t back = dt_f32_to_f16(dt_f16_to_f32((uint16_t)h));
        if (f16_is_nan((uint16_t)h))
            cr_assert(f16_is_nan(back) && (back & 0x8000) == (h & 0x8000),
                      "NaN 0x%04x came back as 0x%04x", h, back);
        else
            cr_assert_eq(back, h, "0x%04x came back as 0x%04x", h, back);
    }
}

Test(f16, every_midpoint_rounds_to_the_even_neighbour, .timeout = 10)
{
    for (uint32_t k = 0; k < 0x7bff; k++) { /* between k and k+1 */
        float lo = dt_f16_to_f32((uint16_t)k), hi = dt_f16_to_f32((uint16_t)(k + 1));
        float mid = (lo + hi) / 2; /* exact: 12 significant bits */
        uint16_t even = (uint16_t)(k % 2 == 0 ? k : k + 1);
        cr_assert_eq(dt_f32_to_f16(mid), even, "midpoint after 0x%04x", k);
        cr_assert_eq(dt_f32_to_f16(-mid), even | 0x8000u);
        cr_assert_eq(dt_f32_to_f16(nextafterf(mid, 0)), k, "below mid 0x%04x", k);
        cr_assert_eq(dt_f32_to_f16(nextafterf(mid, INFINITY)), k + 1, "above midpoint after 0x%04x",
                     k);
    }
}

Test(f16, named_roundings_ties_subnormals_and_overflow, .timeout = 10)
{
    cr_assert_eq(dt_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);     /* tie, to even */
    cr_assert_eq(dt_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie, to even */
    cr_assert_eq(dt_f32_to_f16(0x1p-25f), 0x0000);            /* tie between 0 and 2^-24 */
    cr_assert_eq(dt_f32_to_f16(3 * 0x1p-25f), 0x0002);
    cr_assert_eq(dt_f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400); /* up into normals */
    cr_assert_eq(dt_f32_to_f16(1e-10f), 0x0000);
    cr_assert_eq(dt_f32_to_f16(-1e-10f), 0x8000);
    cr_assert_eq(dt_f32_to_f16(FLT_TRUE_MIN), 0x0000);
    cr_assert_eq(dt_f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(dt_f32_to_f16(65519.996f), 0x7bff);
    cr_assert_eq(dt_f32_to_f16(65520.0f), 0x7c00); /* tie goes to even: inf */
    cr_assert_eq(dt_f32_to_f16(1e10f), 0x7c00);
    cr_assert_eq(dt_f32_to_f16(-FLT_MAX), 0xfc00);
    cr_assert_eq(dt_f32_to_f16(INFINITY), 0x7c00);
    cr_assert_eq(dt_f32_to_f16(-INFINITY), 0xfc00);
}

Test(f16, nan_narrows_to_a_quiet_nan_of_the_same_sign, .timeout = 10)
{
    uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0xffc00000u, 0xff800001u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = dt_f32_to_f16(f32_from_bits(nans[i]));
        cr_assert(f16_is_nan(h) && (h & 0x0200u), "0x%08x -> 0x%04x", nans[i], h);
        cr_assert_eq(h >> 15, nans[i] >> 31);
    }
}

Test(f16, random_f32_narrow_like_the_nearest_even_oracle, .timeout = 30)
{
    rng r = {12345};
    for (int i = 0; i < 200000; i++) {
        uint64_t bits = rng_next(&r);
        uint32_t exponent = 97 + (uint32_t)(bits >> 32) % 50; /* 2^-30 .. 2^19 */
        uint32_t x = (uint32_t)(bits & 0x807fffffu) | exponent << 23;
        float f = f32_from_bits(x);
        uint16_t want = nearest_even_oracle(f, dt_f16_to_f32, 0x7bff, 0x7c00);
        cr_assert_eq(dt_f32_to_f16(f), want, "%a -> 0x%04x, want 0x%04x", f, dt_f32_to_f16(f),
                     want);
    }
}

/* ---- bf16 ----------------------------------------------------------------- */

Test(bf16, named_values_widen_exactly, .timeout = 10)
{
    cr_assert_eq(dt_bf16_to_f32(0x3f80), 1.0f);
    cr_assert_eq(dt_bf16_to_f32(0xc000), -2.0f);
    cr_assert_eq(dt_bf16_to_f32(0x7f7f), 0x1.fep127f);
    cr_assert_eq(dt_bf16_to_f32(0x0001), 0x1p-133f); /* smallest subnormal */
    cr_assert_eq(dt_bf16_to_f32(0x7f80), INFINITY);
    cr_assert_eq(dt_bf16_to_f32(0xff80), -INFINITY);
    cr_assert(isnan(dt_bf16_to_f32(0x7fc0)));
    cr_assert(isnan(dt_bf16_to_f32(0x7f81)));
}

Test(bf16, every_value_round_trips_and_nan_stays_nan, .timeout = 10)
{
    for (uint32_t h = 0; h <= 0xffff; h++) {
        uint16_t back = dt_f32_to_bf16(dt_bf16_to_f32((uint16_t)h));
        if (bf16_is_nan((uint16_t)h))
            cr_assert(bf16_is_nan(back) && (back & 0x8000) == (h & 0x8000));
        else
            cr_assert_eq(back, h, "0x%04x came back as 0x%04x", h, back);
    }
}

Test(bf16, every_midpoint_rounds_to_the_even_neighbour, .timeout = 10)
{
    for (uint32_t k = 0; k < 0x7f7f; k++) {
        uint32_t mid = k << 16 | 0x8000u;
        uint16_t even = (uint16_t)(k % 2 == 0 ? k : k + 1);
        cr_assert_eq(dt_f32_to_bf16(f32_from_bits(mid)), even, "after 0x%04x", k);
        cr_assert_eq(dt_f32_to_bf16(f32_from_bits(mid | 0x80000000u)), even | 0x8000u);
        cr_assert_eq(dt_f32_to_bf16(f32_from_bits(mid - 1)), k);
        cr_assert_eq(dt_f32_to_bf16(f32_from_bits(mid + 1)), k + 1);
    }
}

Test(bf16, named_roundings_ties_subnormals_overflow_and_nan, .timeout = 10)
{
    cr_assert_eq(dt_f32_to_bf16(f32_from_bits(0x3f808000u)), 0x3f80); /* tie */
    cr_assert_eq(dt_f32_to_bf16(f32_from_bits(0x3f818000u)), 0x3f82); /* tie */
    cr_assert_eq(dt_f32_to_bf16(f32_from_bits(0x00008000u)), 0x0000);
    cr_assert_eq(dt_f32_to_bf16(f32_from_bits(0x00018000u)), 0x0002);
    cr_assert_eq(dt_f32_to_bf16(FLT_TRUE_MIN), 0x0000);
    cr_assert_eq(dt_f32_to_bf16(f32_from_bits(0x007fffffu)), 0x0080); /* to normal */
    cr_assert_eq(dt_f32_to_bf16(f32_from_bits(0x7f7f7fffu)), 0x7f7f);
    cr_assert_eq(dt_f32_to_bf16(FLT_MAX), 0x7f80); /* rounds up to inf */
    cr_assert_eq(dt_f32_to_bf16(-FLT_MAX), 0xff80);
    cr_assert_eq(dt_f32_to_bf16(INFINITY), 0x7f80);
    uint16_t nan = dt_f32_to_bf16(f32_from_bits(0x7f800001u)); /* payload low */
    cr_assert(bf16_is_nan(nan), "signalling NaN became 0x%04x", nan);
    cr_assert(bf16_is_nan(dt_f32_to_bf16(f32_from_bits(0xffffffffu))));
    cr_assert_eq(dt_f32_to_bf16(f32_from_bits(0xffffffffu)) >> 15, 1);
}

Test(bf16, random_f32_narrow_like_the_nearest_even_oracle, .timeout = 30)
{
    rng r = {777};
    for (int i = 0; i < 200000; i++) {
        float f = f32_from_bits((uint32_t)rng_next(&r));
        if (isnan(f))
            continue;
        uint16_t want = nearest_even_oracle(f, dt_bf16_to_f32, 0x7f7f, 0x7f80);
        cr_assert_eq(dt_f32_to_bf16(f), want, "%a -> 0x%04x, want 0x%04x", f, dt_f32_to_bf16(f),
                     want);
    }
}

/* ---- reductions: fast equals reference ------------------------------------ */

Test(fast_vs_reference, f32, .timeout = 30)
{
    check_fast_matches_reference(DT_F32);
}
Test(fast_vs_reference, f64, .timeout = 30)
{
    check_fast_matches_reference(DT_F64);
}
Test(fast_vs_reference, f16, .timeout = 30)
{
    check_fast_matches_reference(DT_F16);
}
Test(fast_vs_reference, bf16, .timeout = 30)
{
    check_fast_matches_reference(DT_BF16);
}
Test(fast_vs_reference, i8, .timeout = 30)
{
    check_fast_matches_reference(DT_I8);
}
Test(fast_vs_reference, u8, .timeout = 30)
{
    check_fast_matches_reference(DT_U8);
}
Test(fast_vs_reference, i32, .timeout = 30)
{
    check_fast_matches_reference(DT_I32);
}
Test(fast_vs_reference, i64, .timeout = 30)
{
    check_fast_matches_reference(DT_I64);
}

/* ---- reductions: hand-computed cases -------------------------------------- */

Test(reduce, integer_sum_and_prod_wrap_around, .timeout = 10)
{
    int8_t i8d[] = {127, -128, 16}, i8s[] = {1, -1, 16}, i8w[] = {-128, 127, 32};
    check_both(DT_I8, DT_SUM, i8d, i8s, i8w, 3);
    int8_t i8p[] = {127, -128, 0}; /* -128·-1 = 128 and 16·16 = 256 wrap */
    check_both(DT_I8, DT_PROD, i8d, i8s, i8p, 3);
    uint8_t u8d[] = {255, 200}, u8s[] = {1, 100}, u8w[] = {0, 44};
    check_both(DT_U8, DT_SUM, u8d, u8s, u8w, 2);
    int32_t i32d[] = {INT32_MAX, 65536}, i32s[] = {1, 65536};
    int32_t i32sum[] = {INT32_MIN, 131072}, i32prod[] = {INT32_MAX, 0};
    check_both(DT_I32, DT_SUM, i32d, i32s, i32sum, 2);
    check_both(DT_I32, DT_PROD, i32d, i32s, i32prod, 2);
    int64_t i64d[] = {INT64_MAX, INT64_MIN}, i64s[] = {1, -1};
    int64_t i64w[] = {INT64_MIN, INT64_MAX};
    check_both(DT_I64, DT_SUM, i64d, i64s, i64w, 2);
}

Test(reduce, integer_min_max_respect_signedness, .timeout = 10)
{
    int8_t i8d[] = {-1, 5}, i8s[] = {1, -128}, i8min[] = {-1, -128}, i8max[] = {1, 5};
    check_both(DT_I8, DT_MIN, i8d, i8s, i8min, 2);
    check_both(DT_I8, DT_MAX, i8d, i8s, i8max, 2);
    uint8_t u8d[] = {255, 5}, u8s[] = {1, 128}, u8min[] = {1, 5}, u8max[] = {255, 128};
    check_both(DT_U8, DT_MIN, u8d, u8s, u8min, 2);
    check_both(DT_U8, DT_MAX, u8d, u8s, u8max, 2);
    int64_t i64d[] = {-1, INT64_MAX}, i64s[] = {0, INT64_MIN};
    int64_t i64min[] = {-1, INT64_MIN}, i64max[] = {0, INT64_MAX};
    check_both(DT_I64, DT_MIN, i64d, i64s, i64min, 2);
    check_both(DT_I64, DT_MAX, i64d, i64s, i64max, 2);
}

Test(reduce, bitwise_ops_combine_bits, .timeout = 10)
{
    int32_t d[] = {0x0ff0, -1}, s[] = {0x00ff, 0x1234};
    int32_t band[] = {0x00f0, 0x1234}, bor[] = {0x0fff, -1}, bxor[] = {0x0f0f, ~0x1234};
    check_both(DT_I32, DT_BAND, d, s, band, 2);
    check_both(DT_I32, DT_BOR, d, s, bor, 2);
    check_both(DT_I32, DT_BXOR, d, s, bxor, 2);
    uint8_t ud[] = {0xf0}, us[] = {0x3c}, ux[] = {0xcc};
    check_both(DT_U8, DT_BXOR, ud, us, ux, 1);
}

Test(reduce, float_min_max_propagate_nan_from_either_side, .timeout = 10)
{
    float d[] = {NAN, 1.0f, 2.0f, -0.0f}, s[] = {1.0f, NAN, -3.0f, 5.0f};
    float min[] = {NAN, NAN, -3.0f, -0.0f}, max[] = {NAN, NAN, 2.0f, 5.0f};
    check_both(DT_F32, DT_MIN, d, s, min, 4);
    check_both(DT_F32, DT_MAX, d, s, max, 4);
    double dd[] = {1.0, NAN}, ds[] = {NAN, 1.0}, dw[] = {NAN, NAN};
    check_both(DT_F64, DT_MIN, dd, ds, dw, 2);
    check_both(DT_F64, DT_MAX, dd, ds, dw, 2);
    uint16_t hd[] = {0x7e00, 0x3c00}, hs[] = {0x3c00, 0xfe00}, hw[] = {0x7e00, 0x7e00};
    check_both(DT_F16, DT_MIN, hd, hs, hw, 2);
    uint16_t bd[] = {0x3f80, 0x7fc0}, bs[] = {0x7fc0, 0x3f80}, bw[] = {0x7fc0, 0x7fc0};
    check_both(DT_BF16, DT_MAX, bd, bs, bw, 2);
}

Test(reduce, f16_sum_rounds_once_per_step_to_even, .timeout = 10)
{
    /* ulp(2048) = 2: 2048+1 ties to 2048, 2048+3 = 2051 ties to 2052. */
    uint16_t d[] = {dt_f32_to_f16(2048), dt_f32_to_f16(2048), dt_f32_to_f16(65504)};
    uint16_t s[] = {dt_f32_to_f16(1), dt_f32_to_f16(3), dt_f32_to_f16(32)};
    uint16_t w[] = {dt_f32_to_f16(2048), dt_f32_to_f16(2052), 0x7c00};
    check_both(DT_F16, DT_SUM, d, s, w, 3);
    /* bf16 keeps 8 bits: 256 + 1 ties to 256, 256 + 3 = 259 ties to 260. */
    uint16_t bd[] = {dt_f32_to_bf16(256), dt_f32_to_bf16(256)};
    uint16_t bs[] = {dt_f32_to_bf16(1), dt_f32_to_bf16(3)};
    uint16_t bw[] = {dt_f32_to_bf16(256), dt_f32_to_bf16(260)};
    check_both(DT_BF16, DT_SUM, bd, bs, bw, 2);
}

Test(reduce, avg_sums_like_sum, .timeout = 10)
{
    float d[] = {1.5f, -2.0f}, s[] = {2.5f, 8.0f}, w[] = {4.0f, 6.0f};
    check_both(DT_F32, DT_AVG, d, s, w, 2);
    int8_t id[] = {100}, is[] = {100}, iw[] = {-56}; /* wraps, like sum */
    check_both(DT_I8, DT_AVG, id, is, iw, 1);
}

/* ---- average -------------------------------------------------------------- */

Test(finish, float_avg_divides_by_world_size, .timeout = 10)
{
    float f[] = {10.0f, -3.0f, 1.0f};
    dt_reduce_finish(f, 3, DT_F32, DT_AVG, 4);
    cr_assert(f[0] == 2.5f && f[1] == -0.75f && f[2] == 0.25f);
    double d[] = {1.0};
    dt_reduce_finish(d, 1, DT_F64, DT_AVG, 3);
    cr_assert_eq(d[0], 1.0 / 3.0);
    uint16_t h[] = {dt_f32_to_f16(3.0f), dt_f32_to_f16(1.0f)};
    dt_reduce_finish(h, 2, DT_F16, DT_AVG, 2);
    cr_assert(h[0] == dt_f32_to_f16(1.5f) && h[1] == dt_f32_to_f16(0.5f));
    uint16_t b[] = {dt_f32_to_bf16(1.0f)};
    dt_reduce_finish(b, 1, DT_BF16, DT_AVG, 3); /* via f32, one rounding */
    cr_assert_eq(b[0], dt_f32_to_bf16(1.0f / 3.0f));
}

Test(finish, integer_avg_truncates_toward_zero, .timeout = 10)
{
    int32_t i32[] = {7, -7, 8, -1};
    dt_reduce_finish(i32, 4, DT_I32, DT_AVG, 2);
    cr_assert(i32[0] == 3 && i32[1] == -3 && i32[2] == 4 && i32[3] == 0);
    int8_t i8[] = {-128, 127};
    dt_reduce_finish(i8, 2, DT_I8, DT_AVG, 3);
    cr_assert(i8[0] == -42 && i8[1] == 42);
    uint8_t u8[] = {255};
    dt_reduce_finish(u8, 1, DT_U8, DT_AVG, 4);
    cr_assert_eq(u8[0], 63);
    int64_t i64[] = {INT64_MIN, -5};
    dt_reduce_finish(i64, 2, DT_I64, DT_AVG, 2);
    cr_assert(i64[0] == INT64_MIN / 2 && i64[1] == -2);
}

Test(finish, other_ops_and_a_world_of_one_leave_the_buffer_alone, .timeout = 10)
{
    float f[] = {10.0f};
    for (int op = 0; op < DT_NUM_REDOPS; op++)
        if (op != DT_AVG)
            dt_reduce_finish(f, 1, DT_F32, (dt_redop)op, 4);
    cr_assert_eq(f[0], 10.0f);
    dt_reduce_finish(f, 1, DT_F32, DT_AVG, 1);
    cr_assert_eq(f[0], 10.0f);
    int32_t i[] = {-9};
    dt_reduce_finish(i, 1, DT_I32, DT_AVG, 1);
    cr_assert_eq(i[0], -9);
}

/* ---- widened sums --------------------------------------------------------- */

Test(widened, only_16_bit_float_sums_and_averages_widen, .timeout = 10)
{
    cr_assert(dt_reduce_widens(DT_BF16, DT_SUM) && dt_reduce_widens(DT_BF16, DT_AVG));
    cr_assert(dt_reduce_widens(DT_F16, DT_SUM) && dt_reduce_widens(DT_F16, DT_AVG));
    cr_assert(!dt_reduce_widens(DT_BF16, DT_MAX) && !dt_reduce_widens(DT_BF16, DT_PROD));
    cr_assert(!dt_reduce_widens(DT_F32, DT_SUM) && !dt_reduce_widens(DT_I32, DT_SUM));
}

Test(widened, bf16_sum_rounds_once_at_the_end, .timeout = 10)
{
    /* 256 + 1 + 1 + 1: per step each +1 ties back to 256; once, 259 ties to 260. */
    uint16_t x[4][2] = {{dt_f32_to_bf16(256), dt_f32_to_bf16(1)},
                        {dt_f32_to_bf16(1), dt_f32_to_bf16(1)},
                        {dt_f32_to_bf16(1), dt_f32_to_bf16(1)},
                        {dt_f32_to_bf16(1), dt_f32_to_bf16(256)}};
    float acc[2];
    uint16_t got[2];
    dt_reduce_widened_start(acc, x[0], 2, DT_BF16);
    for (int q = 1; q < 4; q++)
        dt_reduce_widened_add(acc, x[q], 2, DT_BF16);
    dt_reduce_widened_finish(got, acc, 2, DT_BF16, DT_SUM, 4);
    cr_assert_eq(got[0], dt_f32_to_bf16(260), "got %g", (double)dt_bf16_to_f32(got[0]));
    cr_assert_eq(got[1], dt_f32_to_bf16(260), "got %g", (double)dt_bf16_to_f32(got[1]));
}

Test(widened, an_average_divides_the_f32_sum_then_rounds, .timeout = 10)
{
    /* The f32 sum divided by p, then one rounding: 769 / 3 = 256.33 is
     * 256 in bf16; 772 / 3 = 257.33 is 257.25 in f16. */
    uint16_t b[3] = {dt_f32_to_bf16(255), dt_f32_to_bf16(256), dt_f32_to_bf16(258)};
    uint16_t h[3] = {dt_f32_to_f16(257), dt_f32_to_f16(257), dt_f32_to_f16(258)};
    float acc[1];
    uint16_t got;
    dt_reduce_widened_start(acc, &b[0], 1, DT_BF16);
    dt_reduce_widened_add(acc, &b[1], 1, DT_BF16);
    dt_reduce_widened_add(acc, &b[2], 1, DT_BF16);
    dt_reduce_widened_finish(&got, acc, 1, DT_BF16, DT_AVG, 3);
    cr_assert_eq(got, dt_f32_to_bf16((255.0f + 256.0f + 258.0f) / 3.0f));
    dt_reduce_widened_start(acc, &h[0], 1, DT_F16);
    dt_reduce_widened_add(acc, &h[1], 1, DT_F16);
    dt_reduce_widened_add(acc, &h[2], 1, DT_F16);
    dt_reduce_widened_finish(&got, acc, 1, DT_F16, DT_AVG, 3);
    cr_assert_eq(got, dt_f32_to_f16(772.0f / 3.0f), "got %g", (double)dt_f16_to_f32(got));
}

Test(widened, random_bf16_sums_are_the_f32_sum_rounded_once, .timeout = 30)
{
    enum { N = 4099, P = 5 };
    static uint16_t x[P][N], got[N];
    static float acc[N];
    rng r = {0x5eed};
    for (int q = 0; q < P; q++)
        for (size_t i = 0; i < N; i++)
            x[q][i] = dt_f32_to_bf16((float)((int64_t)(rng_next(&r) % 20001) - 10000) / 37.0f);
    dt_reduce_widened_start(acc, x[0], N, DT_BF16);
    for (int q = 1; q < P; q++)
        dt_reduce_widened_add(acc, x[q], N, DT_BF16);
    dt_reduce_widened_finish(got, acc, N, DT_BF16, DT_SUM, P);
    for (size_t i = 0; i < N; i++) {
        float s = dt_bf16_to_f32(x[0][i]);
        for (int q = 1; q < P; q++)
            s += dt_bf16_to_f32(x[q][i]);
        cr_assert_eq(got[i], dt_f32_to_bf16(s), "element %zu", i);
    }
}
