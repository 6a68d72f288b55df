/*
 * device.c — what every dt_device shares: opening by name, and the
 * dispatch of each call to the implementation's table (device_internal.h).
 * The implementations (device_fake.c, device_cuda.c) sit below it and never
 * call back: they make their record and report errors through
 * device_base.c.
 *
 * The CUDA device is in the CUDA module (dt_cuda_module.h): the first
 * "cuda" open loads it with dlopen, and the device keeps the handle until
 * it is closed; a run that never asks for CUDA never maps a CUDA library.
 *
 * The dispatch functions add nothing but a check that the device exists, so
 * a call costs one indirect jump on top of the implementation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device_internal.h"
#include "dt_clock.h"
#include "dt_cuda_module.h"

bool dt_device_cuda_built(void)
{
    return DT_CUDA_MODULE_BUILT;
}

/* "cuda" -> 0, "cuda:3" -> 3; -1 if name is not a CUDA device name. */
static int cuda_ordinal(const char *name)
{
    if (strcmp(name, "cuda") == 0)
        return 0;
    if (strncmp(name, "cuda:", 5) != 0)
        return -1;
    char *end;
    long n = strtol(name + 5, &end, 10);
    return (*end || end == name + 5 || n < 0 || n > 1024) ? -1 : (int)n;
}

/* Loads the CUDA module and opens `ordinal` through it; the device then
 * holds the module's handle. */
static dt_status open_cuda(dt_device **out, const char *name, int ordinal, char *err, size_t errlen)
{
    void *module;
    const void *table;
    char why[400];
    dt_status st = dt_cuda_module_open(&module, &table, DT_CUDA_MODULE_DEVICE, why, sizeof why);
    if (st != DT_OK) {
        snprintf(err, errlen, "device \"%s\": %s", name, why);
        return st;
    }
    st = ((const comm_device_cuda_entry *)table)->open(out, ordinal);
    if (!*out) {
        dlclose(module);
        snprintf(err, errlen, "out of memory");
        return st;
    }
    (*out)->module = module;
    if (st != DT_OK)
        snprintf(err, errlen, "%s", dt_device_error(*out));
    return st;
}

dt_status dt_device_open(dt_device **out, const char *name, char *err, size_t errlen)
{
    *out = NULL;
    if (name && strcmp(name, "fake") == 0) {
        dt_fake_device_options o = {0};
        dt_status st = dt_device_open_fake(out, &o);
        if (st != DT_OK)
            snprintf(err, errlen, "fake device: %s",
                     *out ? dt_device_error(*out) : "out of memory");
        return st;
    }
    int ordinal = name ? cuda_ordinal(name) : -1;
    if (ordinal < 0) {
        snprintf(err, errlen, "unknown device \"%s\" (expected fake, cuda or cuda:N)",
                 name ? name : "(null)");
        return DT_EINVAL;
    }
    return open_cuda(out, name, ordinal, err, errlen);
}

void dt_device_close(dt_device *d)
{
    if (!d)
        return;
    void *module = d->module;
    if (d->ops && d->ops->close)
        d->ops->close(d);
    pthread_mutex_destroy(&d->mu);
    free(d);
    if (module) /* last: the table closed above lives in it */
        dlclose(module);
}

dt_status dt_device_pinned_alloc(dt_device *d, void **p, size_t bytes)
{
    *p = NULL;
    return d->ops->pinned_alloc(d, p, bytes);
}

void dt_device_pinned_free(dt_device *d, void *p)
{
    if (p)
        d->ops->pinned_free(d, p);
}

dt_status dt_device_alloc(dt_device *d, void **p, size_t bytes)
{
    *p = NULL;
    return d->ops->alloc(d, p, bytes);
}

void dt_device_free(dt_device *d, void *p)
{
    if (p)
        d->ops->free(d, p);
}

bool dt_device_owns(dt_device *d, const void *p)
{
    return p && d->ops->owns(d, p);
}

dt_status dt_device_stream_create(dt_device *d, dt_device_stream **s)
{
    *s = NULL;
    return d->ops->stream_create(d, s);
}

void dt_device_stream_destroy(dt_device *d, dt_device_stream *s)
{
    if (s)
        d->ops->stream_destroy(d, s);
}

dt_status dt_device_copy_d2h(dt_device *d, void *host, const void *dev, size_t bytes,
                             dt_device_stream *s)
{
    return bytes ? d->ops->copy_d2h(d, host, dev, bytes, s) : DT_OK;
}

dt_status dt_device_copy_h2d(dt_device *d, void *dev, const void *host, size_t bytes,
                             dt_device_stream *s)
{
    return bytes ? d->ops->copy_h2d(d, dev, host, bytes, s) : DT_OK;
}

dt_status dt_device_event_create(dt_device *d, dt_device_event **e)
{
    *e = NULL;
    return d->ops->event_create(d, e);
}

void dt_device_event_destroy(dt_device *d, dt_device_event *e)
{
    if (e)
        d->ops->event_destroy(d, e);
}

dt_status dt_device_event_record(dt_device *d, dt_device_event *e, dt_device_stream *s)
{
    return d->ops->event_record(d, e, s);
}

dt_status dt_device_event_query(dt_device *d, dt_device_event *e, bool *done)
{
    return d->ops->event_query(d, e, done);
}

dt_status dt_device_event_wait(dt_device *d, dt_device_event *e, double deadline)
{
    long nap_ns = 10000;
    for (int spins = 0;; spins++) {
        bool done = false;
        dt_status st = d->ops->event_query(d, e, &done);
        if (st != DT_OK || done)
            return st;
        double now = dt_now();
        if (now >= deadline)
            return comm_device_base_fail(d, DT_ETIMEDOUT,
                                         "%s: an event did not complete by "
                                         "the deadline",
                                         dt_device_name(d));
        if (spins < 64)
            continue;
        double left_ns = (deadline - now) * 1e9;
        struct timespec ts = {0, left_ns < (double)nap_ns ? (long)left_ns + 1 : nap_ns};
        nanosleep(&ts, NULL);
        if (nap_ns < 500000)
            nap_ns *= 2;
    }
}

dt_status dt_device_event_synchronize(dt_device *d, dt_device_event *e)
{
    return d->ops->event_synchronize(d, e);
}

size_t dt_device_fake_live_allocations(const dt_device *d)
{
    return d->ops->live_allocations ? d->ops->live_allocations(d) : 0;
}
