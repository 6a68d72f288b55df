/*
 * schedule_gpipe.c — GPipe (Huang et al. 2019): every forward, then every
 * backward.
 *
 * p = 4 stages, m = 8 micro-batches, F = 1 and B = 2 time units (digits
 * are micro-batches; each B spans two columns):
 *
 *   s0 01234567.........0011223344556677
 *   s1 .01234567......0011223344556677..
 *   s2 ..01234567...0011223344556677....
 *   s3 ...012345670011223344556677......
 *
 * Step time (m + p - 1)(F + B); each stage idles (p - 1)(F + B) of it, a
 * bubble/work ratio of (p - 1)/m. Every stage holds all m micro-batches'
 * activations at the turn from F to B: memory grows with m, which is why
 * 1F1B exists. Backward runs micro-batches in order 0 .. m-1, the order a
 * one-process `--grad-accum m` run adds their gradients in, so the sums
 * are the same, bit for bit.
 */
#include "pipe_internal.h"

int dt_sched_gpipe(dt_pipe_action **comp, int *n, int p, int m)
{
    for (int s = 0; s < p; s++) {
        int k = 0;
        for (int i = 0; i < m; i++)
            comp[s][k++] = (dt_pipe_action){DT_PIPE_F, i, -1, -1};
        for (int i = 0; i < m; i++)
            comp[s][k++] = (dt_pipe_action){DT_PIPE_B, i, -1, -1};
        n[s] = k;
    }
    return 0;
}
