/*
 * fastmath.h — exp and the normal CDF as branch-free float code that the
 * compiler can vectorise (glibc's expf/erff are scalar calls: in the GELU
 * and softmax loops they cost more than the matmuls at MiniGPT's sizes).
 *
 * dt_fast_expf: Cephes' expf. x = n*ln2 + r with |r| <= ln2/2, e^r by a
 * degree-6 polynomial, 2^n built in the exponent bits. Error ~2 ulp on
 * [-80, 88]; above 88 it saturates at e^88, below -80 (1.8e-35) it is 0.
 * That floor matters for speed, not accuracy: it keeps denormals (which
 * cost ~100 cycles an operation on x86) out of the GELU and softmax tails,
 * where a result near 1e-38 would be scaled down into them.
 *
 * dt_fast_normal_cdf: Phi(x) = erfc(-x/sqrt 2)/2 with Numerical Recipes'
 * Chebyshev fit of erfc (relative error < 1.2e-7 over the whole line,
 * also in the tail), evaluated on |x| and reflected: Phi = 1 - q for
 * x >= 0, q for x < 0, so the negative tail keeps its relative accuracy
 * (no 1 + erf cancellation) down to Phi ~ 1e-35, below which it is 0.
 *
 * Both are pure functions of their argument: same input, same bits, on
 * any machine and at any vector width (no reductions, no FMA contraction
 * under -std=c11).
 */
#ifndef DT_FASTMATH_H
#define DT_FASTMATH_H

#include <stdint.h>
#include <string.h>

static inline float dt_fast_expf(float x_in)
{
    float x = x_in < -80.0f ? -80.0f : x_in;
    x = x > 88.0f ? 88.0f : x;
    /* n = round(x / ln2), by the 1.5 * 2^23 trick (|x/ln2| < 2^22) */
    float fn = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - fn * 0.693359375f + fn * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)fn + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x_in < -80.0f ? 0.0f : p * scale;
}

/* Phi(x), the standard normal CDF: the "x * Phi(x)" of erf-GELU. */
static inline float dt_fast_normal_cdf(float x)
{
    float z = (x < 0.0f ? -x : x) * 0.70710678118654752f; /* |x| / sqrt 2 */
    z = z > 10.0f ? 10.0f : z; /* erfc(10)/2 ~ 1e-45: 0 in float (see exp) */
    float t = 1.0f / (1.0f + 0.5f * z);
    float p = 0.17087277f;
    p = p * t - 0.82215223f;
    p = p * t + 1.48851587f;
    p = p * t - 1.13520398f;
    p = p * t + 0.27886807f;
    p = p * t - 0.18628806f;
    p = p * t + 0.09678418f;
    p = p * t + 0.37409196f;
    p = p * t + 1.00002368f;
    p = p * t - 1.26551223f;
    float q = 0.5f * t * dt_fast_expf(p - z * z); /* erfc(z) / 2 */
    return x >= 0.0f ? 1.0f - q : q;
}

#endif /* DT_FASTMATH_H */
