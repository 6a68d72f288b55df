/*
 * overlap_clock.c — the timing of launched collectives that ZeRO-1's
 * pieces and ZeRO-2's gradient pieces share: how long the link was busy
 * and how much of that the caller waited for (exposed).
 *
 * Busy time runs from a piece's submit (or the previous piece's
 * completion, whichever is later) to its completion, so overlapping
 * pieces are not counted twice. Cost: two dt_now() calls per wait.
 */
#include "optim_internal.h"

dt_status optim_overlap_clock_wait(optim_overlap_clock *c, dt_work **work, bool *done,
                                   double t_submit, double *t_done)
{
    double t0 = dt_now();
    dt_status st = dt_work_wait(*work);
    double t1 = dt_now();
    *work = NULL;
    if (!*done) {
        *done = true;
        *t_done = t1;
        c->exposed_s += t1 - t0;
    }
    double start = t_submit > c->prev_done ? t_submit : c->prev_done;
    if (*t_done > start)
        c->busy_s += *t_done - start;
    c->prev_done = *t_done > c->prev_done ? *t_done : c->prev_done;
    c->ops++;
    return st;
}
