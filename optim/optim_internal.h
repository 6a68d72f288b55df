/*
 * optim_internal.h — helpers shared by the optimizer layer's files, not
 * part of its public interface: the one formula for the share of
 * communication hidden.
 */
#ifndef DT_OPTIM_INTERNAL_H
#define DT_OPTIM_INTERNAL_H

#include "dt_clock.h" /* dt_now, for the communication timings */

/* 1 - exposed/comm clipped to [0, 1]: the share of the time collectives
 * ran that the training thread did not spend waiting for them. */
static inline double dt_optim_hidden_share(double comm_ms, double exposed_ms)
{
    if (comm_ms <= 0)
        return exposed_ms > 0 ? 0.0 : 1.0;
    double h = 1.0 - exposed_ms / comm_ms;
    return h < 0 ? 0.0 : h > 1 ? 1.0 : h;
}

#endif /* DT_OPTIM_INTERNAL_H */
