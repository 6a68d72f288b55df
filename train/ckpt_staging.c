/*
 * ckpt_staging.c — a checkpoint state in device memory, seen through host
 * copies.
 *
 * The checkpoint layer reads and writes host memory (it hashes and writes
 * the bytes itself); dt_ckpt_state_of describes the live model and
 * optimizer by pointers into the backend's memory. On the CPU backends
 * those are host pointers and are used as they are: no copy. On any other
 * backend (cuda; cuda-host, which runs the CUDA kernels on the host and
 * stages anyway, so CI exercises this file) the state is mirrored: a save
 * copies device -> host first, a load fills the host mirror and then copies
 * host -> device. Cost: one extra copy of the state per save or load
 * (params 4Ψ plus the optimizer slice), through the backend's synchronous
 * to_host/from_host — pageable memory, not the collectives' pinned pipeline:
 * checkpoints are rare, and the disk is slower than the copy.
 */
#include <stdlib.h>
#include <string.h>

#include "trainer.h"

bool mg_state_on_device(const mg_run *r)
{
    if (r->tp) /* a tp share is host memory (dt_tp.h) */
        return false;
    const dt_backend *be = r->m->be;
    return be != dt_backend_cpu() && be != dt_backend_cpu_reference();
}

/* The four arrays of a state, by address, and their lengths. */
static void arrays_of(dt_ckpt_state *s, float **p[4], size_t n[4])
{
    p[0] = &s->params;
    p[1] = &s->master;
    p[2] = &s->adam_m;
    p[3] = &s->adam_v;
    n[0] = s->num_params;
    n[1] = n[2] = n[3] = s->opt_n;
}

dt_status mg_state_mirror(mg_run *r, const dt_ckpt_state *dev, dt_ckpt_state *host, bool copy_out)
{
    *host = *dev;
    if (!mg_state_on_device(r))
        return DT_OK;
    float **h[4];
    size_t n[4];
    arrays_of(host, h, n);
    float *d[4] = {dev->params, dev->master, dev->adam_m, dev->adam_v};
    for (int i = 0; i < 4; i++)
        *h[i] = NULL;
    for (int i = 0; i < 4; i++) {
        if (!d[i]) /* no master under DDP */
            continue;
        if (!(*h[i] = malloc(n[i] ? n[i] * sizeof(float) : 1))) {
            mg_state_mirror_free(r, host);
            return DT_ENOMEM;
        }
        if (copy_out && n[i])
            r->m->be->to_host(*h[i], d[i], n[i] * sizeof(float));
    }
    return DT_OK;
}

void mg_state_copy_in(mg_run *r, const dt_ckpt_state *dev, const dt_ckpt_state *host)
{
    if (!mg_state_on_device(r))
        return;
    float *d[4] = {dev->params, dev->master, dev->adam_m, dev->adam_v};
    const float *h[4] = {host->params, host->master, host->adam_m, host->adam_v};
    size_t n[4] = {dev->num_params, dev->opt_n, dev->opt_n, dev->opt_n};
    for (int i = 0; i < 4; i++)
        if (d[i] && h[i] && n[i])
            r->m->be->from_host(d[i], h[i], n[i] * sizeof(float));
}

void mg_state_mirror_free(mg_run *r, dt_ckpt_state *host)
{
    if (!mg_state_on_device(r))
        return;
    free(host->params);
    free(host->master);
    free(host->adam_m);
    free(host->adam_v);
    host->params = host->master = host->adam_m = host->adam_v = NULL;
}
