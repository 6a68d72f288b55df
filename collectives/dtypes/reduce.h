/*
 * reduce.h — element-wise reduction kernels of the collectives layer.
 *
 * INTERNAL header (not installed, not part of dt_comm.h). The algorithms
 * (ring, recursive doubling, tree) call dt_reduce_into once per received
 * segment: `dst` is this rank's partial result, `src` the segment a peer
 * just sent. Over a whole collective every element is reduced p-1 times,
 * so this loop sits on the critical path next to the network; reduce.c
 * keeps it to one vectorised pass over memory (β_reduce ≪ β_net).
 *
 * Contract for every function below:
 *   - `dst` and `src` do not overlap (they are `restrict` in the kernels);
 *   - (t, op) is valid: t < DT_NUM_DTYPES, op < DT_NUM_REDOPS and
 *     dt_redop_supports(op, t). Callers check once, at submit time.
 *   - f16/bf16 accumulate through f32: widen both, apply op in f32, round
 *     back to nearest even, per element. Partial sums are stored in the
 *     16-bit type between steps, as they travel the wire in it: an
 *     algorithm that reduces a chunk in k steps rounds it k times.
 *     The widened kernels below round once instead: an f32 accumulator
 *     collects every contribution, and is narrowed at the end.
 *   - float min/max propagate NaN: if either side is NaN the result is NaN
 *     (unlike fminf/fmaxf, which drop it). A NaN in a gradient must not be
 *     hidden by a reduction. min(-0, +0) keeps dst's zero.
 *   - integer sum/prod wrap modulo 2^bits, for signed types too.
 */
#ifndef DT_REDUCE_H
#define DT_REDUCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dt_comm.h"

/* dst[i] = dst[i] (op) src[i], i < count. DT_AVG reduces as DT_SUM; dt_reduce_finish divides. */
void dt_reduce_into(void *dst, const void *src, size_t count, dt_dtype t, dt_redop op);
/* Plain one-element-at-a-time loop with identical results; the tests' reference. */
void dt_reduce_into_reference(void *dst, const void *src, size_t count, dt_dtype t, dt_redop op);
/* After a DT_AVG reduction of `world_size` contributions: buf[i] /= world_size (integers: C division,
   truncating toward zero; floats: divide in the dtype's accumulation type, f16/bf16 via f32). No-op for other ops. */
void dt_reduce_finish(void *buf, size_t count, dt_dtype t, dt_redop op, int world_size);

/* Widened sums (f16/bf16 with DT_SUM or DT_AVG, dt_reduce_widens): the
 * p contributions of an element are added in f32, in the order the caller
 * feeds them, and rounded to the 16-bit type once (nearest even), after an
 * AVG's division, which is done in f32 too. Result: RNE(fl32(x0 + x1 + ...
 * + x(p-1)) [/ p]), the same bits on every rank that feeds the same order.
 * acc holds count floats. */
bool dt_reduce_widens(dt_dtype t, dt_redop op);
/* acc[i] = widen(src[i]) */
void dt_reduce_widened_start(float *acc, const void *src, size_t count, dt_dtype t);
/* acc[i] += widen(src[i]) */
void dt_reduce_widened_add(float *acc, const void *src, size_t count, dt_dtype t);
/* dst[i] = narrow(acc[i]), or narrow(acc[i] / world_size) for DT_AVG. */
void dt_reduce_widened_finish(void *dst, const float *acc, size_t count, dt_dtype t, dt_redop op,
                              int world_size);

float dt_f16_to_f32(uint16_t h);
uint16_t dt_f32_to_f16(float f);
float dt_bf16_to_f32(uint16_t h);
uint16_t dt_f32_to_bf16(float f);

#endif /* DT_REDUCE_H */
