/*
 * reduce.c — the reduction kernels: dst[i] = dst[i] (op) src[i].
 *
 * Two implementations of one specification (reduce.h), llm.c style:
 *
 *   dt_reduce_into_reference  one element at a time through a switch on the
 *                             op; obviously correct, slow; the tests' oracle.
 *   dt_reduce_into            one tight loop per (dtype, op), reached through
 *                             a table; no branches inside, `restrict`
 *                             pointers, so the compiler emits SIMD.
 *
 * Beside them, the widened sums of f16/bf16 (dt_reduce_widened_*): an f32
 * accumulator that takes every contribution and is rounded once at the
 * end, for the algorithms that see every contribution unreduced.
 *
 * Both must agree bit for bit (up to which NaN payload survives a NaN op
 * NaN: the compiler may swap the operands of a commutative float op). That
 * holds because they evaluate the same expression per element in the same
 * precision: f16/bf16 widen to f32, apply the op, round back (half.h, shared
 * code); integers wrap; float min/max use the same NaN-propagating select.
 *
 * Integers: signed and unsigned two's complement sum, prod and bitwise ops
 * are the same bits, so those kernels run on the unsigned type of the width
 * (wrap-around is defined there; signed overflow would be UB). Only min/max
 * need to know the sign.
 *
 * Vectorisation: GCC's -O2 uses the "very cheap" vectoriser cost model,
 * which gives up on loops whose trip count is unknown; the kernels ask for
 * -O3's model with an optimize attribute (GCC only; clang vectorises these
 * at -O2 anyway). The attribute is on the kernels alone, not the file, so
 * the reference stays a plain scalar loop. On x86-64 Linux each kernel
 * also gets an AVX2 clone, picked at load time by the CPU (target_clones);
 * both clones compile the same expression, so results do not depend on
 * which runs. Not vectorised by SSE2 (it lacks the instructions): 64-bit
 * integer prod and min/max; they stay scalar and still run near memory
 * speed.
 *
 * Cost: one read of src, one read and one write of dst: memory-bound for
 * f32/f64/integers; f16/bf16 are compute-bound on the conversions (about
 * 15 integer ops per element). Measured on one core of an AVX2 machine,
 * 16 MiB of dst: f32 sum ~20 GB/s, bf16 ~7 GB/s, f16 ~1.8 GB/s.
 */
#include <assert.h>
#include <stdint.h>

#include "dt_comm.h"
#include "half.h"
#include "reduce.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
/* Baseline x86-64 is SSE2; an AVX2 clone (chosen once, at load time, by
 * the CPU it runs on) doubles the vector width and adds variable shifts
 * and unsigned packs, which the f16/bf16 conversions use heavily. Not
 * under ThreadSanitizer: clone resolvers run before its runtime is up and
 * crash the program at load. */
#define VECTORISE __attribute__((optimize("O3"), target_clones("default", "avx2")))
#elif defined(__GNUC__) && !defined(__clang__)
#define VECTORISE __attribute__((optimize("O3")))
#else
#define VECTORISE
#endif

typedef void (*reduce_kernel)(void *restrict dst, const void *restrict src, size_t count);

/* NaN-propagating min/max (reduce.h): b wins if it is smaller (larger) or
 * NaN; a NaN in `a` survives because every comparison with it is false. */
#define FLOAT_MIN(a, b) ((b) < (a) || (b) != (b) ? (b) : (a))
#define FLOAT_MAX(a, b) ((b) > (a) || (b) != (b) ? (b) : (a))
#define INT_MIN_OF(a, b) ((b) < (a) ? (b) : (a))
#define INT_MAX_OF(a, b) ((b) > (a) ? (b) : (a))

/* One kernel: dst[i] = EXPR(a = dst[i], b = src[i]) over elements of T. */
#define DEFINE_KERNEL(name, T, EXPR)                                                         \
    VECTORISE static void name(void *restrict dst_, const void *restrict src_, size_t count) \
    {                                                                                        \
        T *restrict dst = dst_;                                                              \
        const T *restrict src = src_;                                                        \
        for (size_t i = 0; i < count; i++) {                                                 \
            T a = dst[i], b = src[i];                                                        \
            dst[i] = (T)(EXPR);                                                              \
        }                                                                                    \
    }

/* f32 and f64: the arithmetic ops and NaN-propagating min/max. */
#define DEFINE_FLOAT_KERNELS(tag, T)             \
    DEFINE_KERNEL(tag##_sum, T, a + b)           \
    DEFINE_KERNEL(tag##_prod, T, a *b)           \
    DEFINE_KERNEL(tag##_min, T, FLOAT_MIN(a, b)) \
    DEFINE_KERNEL(tag##_max, T, FLOAT_MAX(a, b))

DEFINE_FLOAT_KERNELS(f32, float)
DEFINE_FLOAT_KERNELS(f64, double)

/* f16/bf16: widen both, op in f32, round back; min/max need no rounding
 * (the result is one of the inputs) but go the same way for uniformity. */
#define DEFINE_HALF_KERNELS(tag, TO_F32, FROM_F32)                                \
    DEFINE_KERNEL(tag##_sum, uint16_t, FROM_F32(TO_F32(a) + TO_F32(b)))           \
    DEFINE_KERNEL(tag##_prod, uint16_t, FROM_F32(TO_F32(a) * TO_F32(b)))          \
    DEFINE_KERNEL(tag##_min, uint16_t, FROM_F32(FLOAT_MIN(TO_F32(a), TO_F32(b)))) \
    DEFINE_KERNEL(tag##_max, uint16_t, FROM_F32(FLOAT_MAX(TO_F32(a), TO_F32(b))))

DEFINE_HALF_KERNELS(f16, half_f16_to_f32, half_f32_to_f16)
DEFINE_HALF_KERNELS(bf16, half_bf16_to_f32, half_f32_to_bf16)

/* Width-only integer ops, on the unsigned type of that width. The product
 * of two uint8_t promotes to int but cannot overflow it (255² < 2^31). */
#define DEFINE_BITS_KERNELS(tag, U)    \
    DEFINE_KERNEL(tag##_sum, U, a + b) \
    DEFINE_KERNEL(tag##_prod, U, a *b) \
    DEFINE_KERNEL(tag##_band, U, a &b) \
    DEFINE_KERNEL(tag##_bor, U, a | b) \
    DEFINE_KERNEL(tag##_bxor, U, a ^ b)

DEFINE_BITS_KERNELS(b8, uint8_t)
DEFINE_BITS_KERNELS(b32, uint32_t)
DEFINE_BITS_KERNELS(b64, uint64_t)

/* Sign-aware integer ops. */
#define DEFINE_ORDER_KERNELS(tag, T)              \
    DEFINE_KERNEL(tag##_min, T, INT_MIN_OF(a, b)) \
    DEFINE_KERNEL(tag##_max, T, INT_MAX_OF(a, b))

DEFINE_ORDER_KERNELS(i8, int8_t)
DEFINE_ORDER_KERNELS(u8, uint8_t)
DEFINE_ORDER_KERNELS(i32, int32_t)
DEFINE_ORDER_KERNELS(i64, int64_t)

/* [dtype][op] -> kernel; NULL where dt_redop_supports says false. AVG
 * sums here; dt_reduce_finish divides once at the end. */
#define FLOAT_ROW(tag)                                                                            \
    {                                                                                             \
        [DT_SUM] = tag##_sum, [DT_PROD] = tag##_prod, [DT_MIN] = tag##_min, [DT_MAX] = tag##_max, \
        [DT_AVG] = tag##_sum                                                                      \
    }
#define INT_ROW(bits, tag)                                                    \
    {                                                                         \
        [DT_SUM] = bits##_sum, [DT_PROD] = bits##_prod, [DT_MIN] = tag##_min, \
        [DT_MAX] = tag##_max, [DT_AVG] = bits##_sum, [DT_BAND] = bits##_band, \
        [DT_BOR] = bits##_bor, [DT_BXOR] = bits##_bxor                        \
    }

static const reduce_kernel kernels[DT_NUM_DTYPES][DT_NUM_REDOPS] = {
    [DT_F32] = FLOAT_ROW(f32),    [DT_F64] = FLOAT_ROW(f64),    [DT_F16] = FLOAT_ROW(f16),
    [DT_BF16] = FLOAT_ROW(bf16),  [DT_I8] = INT_ROW(b8, i8),    [DT_U8] = INT_ROW(b8, u8),
    [DT_I32] = INT_ROW(b32, i32), [DT_I64] = INT_ROW(b64, i64),
};

void dt_reduce_into(void *dst, const void *src, size_t count, dt_dtype t, dt_redop op)
{
    assert((unsigned)t < DT_NUM_DTYPES && (unsigned)op < DT_NUM_REDOPS);
    reduce_kernel k = kernels[t][op];
    assert(k && "unsupported (dtype, op): check dt_redop_supports first");
    if (k)
        k(dst, src, count);
}

/* ---- widened sums: f32 accumulator, one rounding ---------------------------- */

/* Why. A ring reduces each chunk in p-1 hops and each hop's partial sum
 * travels in the 16-bit type, so a bf16 sum is rounded p-1 times: with
 * bf16's 8 significant bits, 1 + 2^-9 + 2^-9 + 2^-9 rounds back to 1 at
 * every hop (each 2^-9 is a tie, and 1 is even), where the sum rounded
 * once is 1 + 2^-7. An algorithm whose owner receives every contribution
 * unreduced (rank_order.c) can add them all in f32 and round once; these
 * are its kernels. The pieces stay 16-bit on the wire: the bytes moved
 * are the 16-bit type's. */

bool dt_reduce_widens(dt_dtype t, dt_redop op)
{
    return (t == DT_F16 || t == DT_BF16) && (op == DT_SUM || op == DT_AVG);
}

#define DEFINE_WIDEN_KERNELS(tag, TO_F32)                                                    \
    VECTORISE static void tag##_widen(float *restrict acc, const uint16_t *restrict src,     \
                                      size_t count)                                          \
    {                                                                                        \
        for (size_t i = 0; i < count; i++)                                                   \
            acc[i] = TO_F32(src[i]);                                                         \
    }                                                                                        \
    VECTORISE static void tag##_widen_add(float *restrict acc, const uint16_t *restrict src, \
                                          size_t count)                                      \
    {                                                                                        \
        for (size_t i = 0; i < count; i++)                                                   \
            acc[i] += TO_F32(src[i]);                                                        \
    }

#define DEFINE_NARROW_KERNEL(tag, FROM_F32)                                               \
    VECTORISE static void tag##_narrow(uint16_t *restrict dst, const float *restrict acc, \
                                       size_t count, float divisor)                       \
    {                                                                                     \
        for (size_t i = 0; i < count; i++)                                                \
            dst[i] = FROM_F32(acc[i] / divisor);                                          \
    }

DEFINE_WIDEN_KERNELS(f16, half_f16_to_f32)
DEFINE_WIDEN_KERNELS(bf16, half_bf16_to_f32)
DEFINE_NARROW_KERNEL(f16, half_f32_to_f16)
DEFINE_NARROW_KERNEL(bf16, half_f32_to_bf16)

void dt_reduce_widened_start(float *acc, const void *src, size_t count, dt_dtype t)
{
    assert(t == DT_F16 || t == DT_BF16);
    (t == DT_F16 ? f16_widen : bf16_widen)(acc, src, count);
}

void dt_reduce_widened_add(float *acc, const void *src, size_t count, dt_dtype t)
{
    assert(t == DT_F16 || t == DT_BF16);
    (t == DT_F16 ? f16_widen_add : bf16_widen_add)(acc, src, count);
}

/* A sum divides by 1, which is exact: one loop serves both ops. */
void dt_reduce_widened_finish(void *dst, const float *acc, size_t count, dt_dtype t, dt_redop op,
                              int world_size)
{
    assert(dt_reduce_widens(t, op));
    float divisor = op == DT_AVG && world_size > 1 ? (float)world_size : 1.0f;
    (t == DT_F16 ? f16_narrow : bf16_narrow)(dst, acc, count, divisor);
}

/* The same kernels, exported as array conversions (dt_comm.h). */
void dt_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n)
{
    bf16_narrow(dst, src, n, 1.0f);
}

void dt_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
    bf16_widen(dst, src, n);
}

/* ---- reference ------------------------------------------------------------ */

/* One f32 (or f64) element; f16/bf16 come here after widening. */
static float reference_f32(float a, float b, dt_redop op)
{
    switch (op) {
    case DT_SUM:
    case DT_AVG: return a + b;
    case DT_PROD: return a * b;
    case DT_MIN: return FLOAT_MIN(a, b);
    case DT_MAX: return FLOAT_MAX(a, b);
    default: assert(!"bitwise op on a float"); return a;
    }
}

static double reference_f64(double a, double b, dt_redop op)
{
    switch (op) {
    case DT_SUM:
    case DT_AVG: return a + b;
    case DT_PROD: return a * b;
    case DT_MIN: return FLOAT_MIN(a, b);
    case DT_MAX: return FLOAT_MAX(a, b);
    default: assert(!"bitwise op on a float"); return a;
    }
}

/* One integer element of any width, widened to 64 bits (sign- or
 * zero-extended by the caller). Arithmetic in uint64_t, then the caller
 * narrows: wrap-around modulo 2^64 narrowed is wrap-around modulo 2^width. */
static int64_t reference_int(int64_t a, int64_t b, dt_redop op)
{
    uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
    switch (op) {
    case DT_SUM:
    case DT_AVG: return (int64_t)(ua + ub);
    case DT_PROD: return (int64_t)(ua * ub);
    case DT_MIN: return b < a ? b : a;
    case DT_MAX: return b > a ? b : a;
    case DT_BAND: return (int64_t)(ua & ub);
    case DT_BOR: return (int64_t)(ua | ub);
    case DT_BXOR: return (int64_t)(ua ^ ub);
    default: assert(!"unknown op"); return a;
    }
}

#define REFERENCE_LOOP(T, EXPR)            \
    do {                                   \
        T *d = dst;                        \
        const T *s = src;                  \
        for (size_t i = 0; i < count; i++) \
            d[i] = (T)(EXPR(d[i], s[i]));  \
    } while (0)

#define REF_F32(a, b) reference_f32(a, b, op)
#define REF_F64(a, b) reference_f64(a, b, op)
#define REF_F16(a, b) dt_f32_to_f16(reference_f32(dt_f16_to_f32(a), dt_f16_to_f32(b), op))
#define REF_BF16(a, b) dt_f32_to_bf16(reference_f32(dt_bf16_to_f32(a), dt_bf16_to_f32(b), op))
#define REF_INT(a, b) reference_int(a, b, op)

void dt_reduce_into_reference(void *dst, const void *src, size_t count, dt_dtype t, dt_redop op)
{
    assert(dt_redop_supports(op, t));
    switch (t) {
    case DT_F32: REFERENCE_LOOP(float, REF_F32); break;
    case DT_F64: REFERENCE_LOOP(double, REF_F64); break;
    case DT_F16: REFERENCE_LOOP(uint16_t, REF_F16); break;
    case DT_BF16: REFERENCE_LOOP(uint16_t, REF_BF16); break;
    case DT_I8: REFERENCE_LOOP(int8_t, REF_INT); break;
    case DT_U8: REFERENCE_LOOP(uint8_t, REF_INT); break;
    case DT_I32: REFERENCE_LOOP(int32_t, REF_INT); break;
    case DT_I64: REFERENCE_LOOP(int64_t, REF_INT); break;
    default: assert(!"unknown dtype"); break;
    }
}

/* ---- average -------------------------------------------------------------- */

#define DIVIDE_LOOP(T, EXPR)               \
    do {                                   \
        T *b = buf;                        \
        for (size_t i = 0; i < count; i++) \
            b[i] = (T)(EXPR);              \
    } while (0)

/* Division, not multiplication by 1/p: a sum of p equal values then comes
 * back exactly, and integer averages truncate toward zero as C does. A
 * world_size below 1 cannot have produced a sum; it leaves buf alone. */
void dt_reduce_finish(void *buf, size_t count, dt_dtype t, dt_redop op, int world_size)
{
    if (op != DT_AVG || world_size < 1)
        return;
    const int p = world_size;
    switch (t) {
    case DT_F32: DIVIDE_LOOP(float, b[i] / (float)p); break;
    case DT_F64: DIVIDE_LOOP(double, b[i] / (double)p); break;
    case DT_F16: DIVIDE_LOOP(uint16_t, dt_f32_to_f16(dt_f16_to_f32(b[i]) / (float)p)); break;
    case DT_BF16: DIVIDE_LOOP(uint16_t, dt_f32_to_bf16(dt_bf16_to_f32(b[i]) / (float)p)); break;
    case DT_I8: DIVIDE_LOOP(int8_t, b[i] / p); break;
    case DT_U8: DIVIDE_LOOP(uint8_t, b[i] / p); break;
    case DT_I32: DIVIDE_LOOP(int32_t, b[i] / p); break;
    case DT_I64: DIVIDE_LOOP(int64_t, b[i] / (int64_t)p); break;
    default: assert(!"unknown dtype"); break;
    }
}
