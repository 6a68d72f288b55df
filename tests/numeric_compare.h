/*
 * numeric_compare.h — how the model and optimizer tests compare float
 * vectors: the relative L2 error ||a - b||_2 / ||b||_2 (the absolute L2
 * error when b is all zeros), accumulated in double.
 */
#ifndef DT_TEST_NUMERIC_COMPARE_H
#define DT_TEST_NUMERIC_COMPARE_H

#include <math.h>
#include <stddef.h>

static inline double rel_l2(const float *a, const float *b, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

#endif /* DT_TEST_NUMERIC_COMPARE_H */
