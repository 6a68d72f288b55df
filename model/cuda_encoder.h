/*
 * cuda_encoder.h — token + position embedding, forward and backward, as
 * per-thread bodies (see cuda_common.h).
 *
 * Forward: one thread per output element (N*C of them), a gather.
 * Backward: one thread per channel i (C of them) walks the N tokens in
 * order, adding into dwte[token][i] and dwpe[t][i]. Two tokens of a batch
 * may be the same id, so rows would race; columns never do. O(N) serial
 * work per thread, no atomics, the CPU reference's order of additions.
 */
#ifndef DT_CUDA_ENCODER_H
#define DT_CUDA_ENCODER_H

#include "cuda_common.h"

/* out (N, C) element idx = wte[inp[n]][i] + wpe[n % T][i]; idx < N*C */
static inline DT_HD void dtk_encoder_forward_elem(float *out, const int *inp, const float *wte,
                                                  const float *wpe, size_t idx, int T, int C)
{
    size_t n = idx / (size_t)C, i = idx % (size_t)C;
    size_t t = n % (size_t)T;
    out[idx] = wte[(size_t)inp[n] * C + i] + wpe[t * C + i];
}

/* dwte (V, C), dwpe (T, C) column i += dout (N, C) over all N tokens */
static inline DT_HD void dtk_encoder_backward_col(float *dwte, float *dwpe, const float *dout,
                                                  const int *inp, int i, int N, int T, int C)
{
    for (int n = 0; n < N; n++) {
        float d = dout[(size_t)n * C + i];
        dwte[(size_t)inp[n] * C + i] += d;
        dwpe[(size_t)(n % T) * C + i] += d;
    }
}

#endif /* DT_CUDA_ENCODER_H */
