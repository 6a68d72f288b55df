/*
 * half.h — the two 16-bit float formats, converted to and from f32.
 *
 * INTERNAL header. dtype.c exports these as dt_f16_to_f32 & co. (reduce.h);
 * reduce.c includes this file directly so that its per-element loops see
 * the bodies, inline them, and vectorise. One definition, two users: the
 * reference and the fast kernels round identically because they run the
 * same code.
 *
 *   f16  (IEEE binary16): 1 sign, 5 exponent (bias 15), 10 mantissa bits.
 *   bf16 (bfloat16):      1 sign, 8 exponent (bias 127), 7 mantissa bits —
 *                         the top half of an f32.
 *
 * Narrowing rounds to nearest, ties to even; overflow becomes ±inf; a NaN
 * stays a NaN (quiet, keeping the top payload bits); subnormals are exact
 * in both directions. Widening is always exact.
 *
 * The idea: each conversion is branch-free (every case is computed, then
 * one is selected with and/or masks), so a loop of them is straight-line
 * code the compiler can turn into SIMD. Masks rather than `?:` because GCC
 * turns a `?:` back into a branch, moves the float add into it, and then
 * refuses to vectorise a float op that "may trap" on only one path. Two cases borrow the FPU's own rounding instead of
 * shifting by a variable amount (which SSE2 cannot do per lane): adding
 * 0.5f puts a tiny value in a binade whose ulp is 2^-24, exactly the f16
 * subnormal step, so the FPU's round-to-nearest-even does the work.
 * Invariant this relies on: the default rounding mode (nearest-even);
 * flush-to-zero modes do not matter because every f32 that takes part is
 * either normal or rounds to zero in f16 anyway.
 *
 * Cost: a dozen integer/float operations per element, no branches, no
 * tables.
 */
#ifndef DT_HALF_H
#define DT_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t half_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float half_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* All ones if cond, else zero: the lane mask of a SIMD compare. */
static inline uint32_t half_mask(int cond)
{
    return 0u - (uint32_t)cond;
}

/* 0.5f: its binade [0.5, 1) has ulp 2^-24, the f16 subnormal step. */
#define HALF_MAGIC_BITS 0x3f000000u
/* Rebias an exponent from f16 (15) to f32 (127): 112 << 23. */
#define HALF_REBIAS (112u << 23)

/* Exact. Normals and inf/NaN shift into place and rebias; a subnormal
 * m·2^-24 is read as the float 0.5 + m·2^-24 and 0.5 is subtracted (exact,
 * both are multiples of 2^-24 below 1). NaN payloads keep their bits. */
static inline float half_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t magnitude = (uint32_t)(h & 0x7fffu);
    uint32_t shifted = magnitude << 13;
    uint32_t normal = shifted + HALF_REBIAS;
    uint32_t inf_nan = shifted + 2 * HALF_REBIAS; /* exponent 31 -> 255 */
    uint32_t subnormal = half_f32_bits(half_f32_from_bits(HALF_MAGIC_BITS + magnitude) - 0.5f);
    uint32_t is_inf_nan = half_mask(magnitude >= 0x7c00u);
    uint32_t is_subnormal = half_mask(magnitude < 0x0400u);
    uint32_t bits = (inf_nan & is_inf_nan) | (subnormal & is_subnormal) |
                    (normal & ~(is_inf_nan | is_subnormal));
    return half_f32_from_bits(sign | bits);
}

/* Round to nearest even. Let a = |f|'s bits.
 *   a > inf bits        NaN: quiet bit set, top 9 payload bits kept.
 *   a < 2^-14 (0x38800000)  f16 subnormal or zero: the FPU rounds a + 0.5f.
 *   otherwise           rebias, then add 0xfff + lsb and drop 13 bits (the
 *                       classic integer RNE); a carry out of the mantissa
 *                       bumps the exponent, which is the right answer, and
 *                       anything past 65504's rounding range clamps to inf. */
static inline uint16_t half_f32_to_f16(float f)
{
    uint32_t x = half_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7fffffffu;
    uint32_t nan = 0x7e00u | ((a >> 13) & 0x03ffu);
    uint32_t subnormal = half_f32_bits(half_f32_from_bits(a) + 0.5f) - HALF_MAGIC_BITS;
    uint32_t rebiased = a - HALF_REBIAS; /* wraps for tiny a: not selected */
    uint32_t normal = (rebiased + 0x0fffu + ((rebiased >> 13) & 1u)) >> 13;
    normal = normal > 0x7c00u ? 0x7c00u : normal;
    uint32_t is_nan = half_mask(a > 0x7f800000u);
    uint32_t is_subnormal = half_mask(a < 0x38800000u);
    uint32_t bits = (nan & is_nan) | (subnormal & is_subnormal) |
                    (normal & ~(is_nan | is_subnormal));
    return (uint16_t)(sign | bits);
}

/* Exact: bf16 is the top half of an f32. */
static inline float half_bf16_to_f32(uint16_t h)
{
    return half_f32_from_bits((uint32_t)h << 16);
}

/* Round to nearest even by integer arithmetic on the f32 bits; overflow
 * carries into the exponent and lands on inf by itself. NaN is handled
 * apart so that rounding cannot carry a payload into inf. */
static inline uint16_t half_f32_to_bf16(float f)
{
    uint32_t x = half_f32_bits(f);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = (x >> 16) | 0x0040u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

#endif /* DT_HALF_H */
