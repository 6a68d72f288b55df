/*
 * dt_clock.h — the one clock dtrain measures time and deadlines with:
 * seconds on CLOCK_MONOTONIC, which no settimeofday or NTP step moves.
 *
 * Deadlines (op timeouts, rendezvous waits) are dt_now() + seconds, and
 * timings are differences of two dt_now() readings. Header-only (base/),
 * so any layer and any program may use it without linking a library.
 * Cost: one clock_gettime, a vDSO call of some 20 ns on Linux.
 */
#ifndef DT_CLOCK_H
#define DT_CLOCK_H

#include <time.h>

static inline double dt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif /* DT_CLOCK_H */
