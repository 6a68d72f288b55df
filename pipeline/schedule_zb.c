/*
 * schedule_zb.c — ZB-H1, the zero-bubble schedule of Qi et al. 2023 at
 * 1F1B's memory.
 *
 * Backward is split in two (model/backward.c): B, the input gradient,
 * which the previous stage waits for, and W, the weight gradient, which
 * nobody waits for until the optimizer step. Sending B's result at once
 * shortens the critical path; the W's then fill the holes 1F1B leaves
 * idle. p = 4, m = 8, F = B = W = 1 time unit (as drawn by
 * dt_pipe_sim_draw):
 *
 *   s0 0123...00411522633744556677    s0 FFFF...BWFBWFBWFBWFBWBWBWBW
 *   s1 .012..031042153264375465767    s1 .FFF..BFBWFBWFBWFBWFBWBWBWW
 *   s2 ..01.0213204315426537647567    s2 ..FF.BFBFBWFBWFBWFBWFBWBWWW
 *   s3 ...001122330441552663774567    s3 ...FBFBFBFBWFBWFBWFBWFBWWWW
 *
 * (left: micro-batches; right: the kind of each action.)
 * Every stage idles p - 1 units in all, so the step is m(F + B + W) +
 * (p - 1)(F + B - W): with B = W = F a bubble/work ratio of (p - 1)/(3m),
 * a third of 1F1B's (27 units here against 1F1B's 33). Live
 * micro-batches (forward done, W not yet) never exceed min(p, m) on any
 * stage — 1F1B's peak, stage 0's; stage s defers up to s + 1 W's, so it
 * keeps that many activation-gradient sets.
 *
 * How the lists are made: by playing the pipeline in unit time steps
 * (F = B = W = 1, transfers free) with a greedy rule per stage and step:
 *
 *   1. F of the next micro-batch, if its input is there, fewer than
 *      p - s micro-batches are between their F and their B (1F1B's
 *      warm-up depth), and fewer than p between their F and their W;
 *   2. else B of the next micro-batch, if its output gradient is there;
 *   3. else W of the oldest micro-batch whose B is done;
 *   4. else idle.
 *
 * The order each stage ran its actions in is its list. For m >= p this
 * rule meets the closed form above exactly (tests/test_pipeline.c checks
 * p = 1..8); for m < p it is no slower than 1F1B. F, B and W each run in
 * micro-batch order, so weight gradients are summed in the same order as
 * a one-process `--grad-accum m` run.
 */
#include <stdlib.h>

#include "pipe_internal.h"

typedef struct zb_state {
    int p, m;
    int *nf, *nb, *nw; /* [p] F, B, W done so far on each stage */
    int *f_at, *b_at;  /* [p * m] step that ran F / B of (s, mb); -1 */
} zb_state;

/* The action stage s takes at step t, by the rule above; -1 for idle. */
static int zb_choose(const zb_state *z, int s, int t, int *mb)
{
    int p = z->p, m = z->m;
    int f = z->nf[s], b = z->nb[s], w = z->nw[s];
    if (f < m) {
        int ready = s == 0 || (z->f_at[(s - 1) * m + f] >= 0 && z->f_at[(s - 1) * m + f] < t);
        if (ready && f - b < p - s && f - w < p) {
            *mb = f;
            return DT_PIPE_F;
        }
    }
    if (b < f) {
        int ready = s == p - 1 || (z->b_at[(s + 1) * m + b] >= 0 && z->b_at[(s + 1) * m + b] < t);
        if (ready && z->f_at[s * m + b] < t) {
            *mb = b;
            return DT_PIPE_B;
        }
    }
    if (w < b) {
        *mb = w;
        return DT_PIPE_W;
    }
    return -1;
}

/* Plays the steps until every W is done; -1 if that takes longer than a
 * pipeline running one action at a time would (a bug in the rule). */
static int zb_play(zb_state *z, dt_pipe_action **comp, int *n, int *op, int *mb)
{
    int p = z->p, m = z->m;
    for (int t = 0, left = p; left > 0; t++) {
        if (t > 3 * m * p + p)
            return -1;
        for (int s = 0; s < p; s++) /* decide on the state before step t */
            op[s] = zb_choose(z, s, t, &mb[s]);
        left = 0;
        for (int s = 0; s < p; s++) {
            if (op[s] >= 0)
                comp[s][n[s]++] = (dt_pipe_action){op[s], mb[s], -1, -1};
            if (op[s] == DT_PIPE_F)
                z->f_at[s * m + z->nf[s]++] = t;
            else if (op[s] == DT_PIPE_B)
                z->b_at[s * m + z->nb[s]++] = t;
            else if (op[s] == DT_PIPE_W)
                z->nw[s]++;
            left += z->nw[s] < m;
        }
    }
    return 0;
}

int dt_sched_zb(dt_pipe_action **comp, int *n, int p, int m)
{
    zb_state z = {p,
                  m,
                  calloc((size_t)p, sizeof(int)),
                  calloc((size_t)p, sizeof(int)),
                  calloc((size_t)p, sizeof(int)),
                  malloc((size_t)p * m * sizeof(int)),
                  malloc((size_t)p * m * sizeof(int))};
    int *op = malloc((size_t)p * sizeof(int));
    int *mb = malloc((size_t)p * sizeof(int));
    int rc = -1;
    if (z.nf && z.nb && z.nw && z.f_at && z.b_at && op && mb) {
        for (int i = 0; i < p * m; i++)
            z.f_at[i] = z.b_at[i] = -1;
        for (int s = 0; s < p; s++)
            n[s] = 0;
        rc = zb_play(&z, comp, n, op, mb);
    }
    free(z.nf);
    free(z.nb);
    free(z.nw);
    free(z.f_at);
    free(z.b_at);
    free(op);
    free(mb);
    return rc;
}
