/*
 * bench_values.h — the numbers dtrain-bench puts into collectives and the
 * numbers it expects back, for every dtype and reduction.
 *
 * Inputs are small integers chosen per (rank, index) so that every dtype
 * holds them exactly (i8 and f16 included) and every reduction of them over
 * a few ranks stays exact too: sums of 0..7, products of 1s and 2s, bitwise
 * ops of 7-bit patterns. The expected value is then a closed-form fold over
 * the ranks' inputs, computed here on the CPU without the network, in the
 * dtype's own arithmetic (integers wrap as the reduction kernels do; the
 * average divides and truncates like C). Only averages of floating types
 * can round, so floats compare within a tolerance of a few units in the last
 * place of their type.
 */
#ifndef DT_BENCH_VALUES_H
#define DT_BENCH_VALUES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dt_comm.h"

/* What rank r contributes at global index i to a reduction `op`. */
int64_t bench_reduce_input(dt_redop op, int r, size_t i);
/* What rank r holds at index i in a data-movement collective. */
int64_t bench_plain_input(int r, size_t i);

/* buf[i] = v, converted to dtype t (v is small enough to be exact). */
void bench_store(dt_dtype t, void *buf, size_t i, int64_t v);

/* Whether buf[i] (dtype t) equals the reduction `op` over p ranks of
 * bench_reduce_input(op, r, global_index). */
bool bench_reduced_ok(dt_dtype t, dt_redop op, int p, const void *buf, size_t i,
                      size_t global_index);
/* Whether buf[i] (dtype t) equals v exactly. */
bool bench_plain_ok(dt_dtype t, const void *buf, size_t i, int64_t v);

#endif /* DT_BENCH_VALUES_H */
