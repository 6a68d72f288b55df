/*
 * pipe_internal.h — what the pipeline layer's files share and its header
 * does not promise: the three schedule generators. Each writes, for every
 * stage, the order of its compute actions only (F, B, W with mb set);
 * schedule.c inserts the transfers, the STEP marker and the slots.
 */
#ifndef DT_PIPE_INTERNAL_H
#define DT_PIPE_INTERNAL_H

#include "dt_pipe.h"

/* comp[s] has room for 3m actions; n[s] gets the count. 0, or -1 on
 * ENOMEM. */
int dt_sched_gpipe(dt_pipe_action **comp, int *n, int p, int m);
int dt_sched_1f1b(dt_pipe_action **comp, int *n, int p, int m);
int dt_sched_zb(dt_pipe_action **comp, int *n, int p, int m);

/* True for the four transfer ops. */
static inline bool dt_pipe_is_transfer(dt_pipe_op op)
{
    return op >= DT_PIPE_SEND_ACT && op <= DT_PIPE_RECV_GRAD;
}

#endif /* DT_PIPE_INTERNAL_H */
