/*
 * stage_hooks.h — internal: what a pipelined algorithm tells the staging of
 * device buffers, which sits above the algorithms (staging/staging.c has
 * the picture and the costs).
 *
 * A staged op runs a host algorithm on pinned host copies of device
 * buffers. The pipelined algorithms (ring all-reduce, reduce-scatter,
 * all-gather, chain broadcast, linear gather and scatter, all-to-all) say
 * two things as they go, so that the copies hide behind the wire:
 *
 *   stage_need(o, p, n)    about to read input bytes [p, p+n): wait until
 *                          their device-to-host copy has completed
 *   stage_ready(o, p, n)   output bytes [p, p+n) are final: start their
 *                          host-to-device copy now
 *
 * The staging hands its two functions down in o->stage_hooks with o->stage;
 * the algorithms never call the staging room by name. With no device
 * buffers (o->stage == NULL) each hook is one predictable branch.
 */
#ifndef DT_STAGE_HOOKS_H
#define DT_STAGE_HOOKS_H

#include "transport.h"

typedef struct stage_hooks {
    dt_status (*need)(dt_opctx *o, const void *p, size_t n);
    void (*ready)(dt_opctx *o, const void *p, size_t n);
} stage_hooks;

static inline dt_status stage_need(dt_opctx *o, const void *p, size_t n)
{
    return o->stage ? o->stage_hooks->need(o, p, n) : DT_OK;
}

static inline void stage_ready(dt_opctx *o, const void *p, size_t n)
{
    if (o->stage)
        o->stage_hooks->ready(o, p, n);
}

#endif /* DT_STAGE_HOOKS_H */
