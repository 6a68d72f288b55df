/*
 * schedule_1f1b.c — 1F1B (PipeDream-Flush, Narayanan et al. 2021): a
 * warm-up of forwards, then one forward and one backward in turn, then
 * a cool-down of backwards.
 *
 * p = 4 stages, m = 8 micro-batches, F = 1 and B = 2 time units (digits
 * are micro-batches; each B spans two columns):
 *
 *   s0 0123......00411522633744.55.66.77
 *   s1 .012....00311422533644755.66.77..
 *   s2 ..01..00211322433544655766.77....
 *   s3 ...000111222333444555666777......
 *
 * Stage s runs w = min(p - s - 1, m) warm-up forwards, then m - w pairs
 * (forward of micro-batch w + i, backward of i), then the last w
 * backwards. The step takes as long as GPipe's, (m + p - 1)(F + B), with
 * the same bubble (p - 1)/m of the work, but a micro-batch's activations
 * are freed by its backward soon after its forward: stage s never holds
 * more than min(p - s, m) of them, instead of m. Backwards run in
 * micro-batch order, like a one-process `--grad-accum m` run.
 */
#include "pipe_internal.h"

int dt_sched_1f1b(dt_pipe_action **comp, int *n, int p, int m)
{
    for (int s = 0; s < p; s++) {
        int w = p - s - 1 < m ? p - s - 1 : m, k = 0;
        for (int i = 0; i < w; i++)
            comp[s][k++] = (dt_pipe_action){DT_PIPE_F, i, -1, -1};
        for (int i = 0; i < m - w; i++) {
            comp[s][k++] = (dt_pipe_action){DT_PIPE_F, w + i, -1, -1};
            comp[s][k++] = (dt_pipe_action){DT_PIPE_B, i, -1, -1};
        }
        for (int i = m - w; i < m; i++)
            comp[s][k++] = (dt_pipe_action){DT_PIPE_B, i, -1, -1};
        n[s] = k;
    }
    return 0;
}
