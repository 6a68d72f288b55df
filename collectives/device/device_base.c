/*
 * device_base.c — a device's record, which every implementation makes and
 * fills: its table, its name, and the last error, kept for dt_device_error.
 *
 * Below both device.c (opening, dispatch) and the implementations
 * (device_fake.c, device_cuda.c), so that neither calls the other back.
 * The error is written under the record's mutex: an implementation may
 * fail on its copy thread while the caller reads the last message.
 * Cost: one allocation per device; a formatted line per failure.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "device_internal.h"

dt_device *comm_device_base_new(const dt_device_ops *ops, const char *name)
{
    dt_device *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->ops = ops;
    snprintf(d->name, sizeof d->name, "%s", name);
    pthread_mutex_init(&d->mu, NULL);
    return d;
}

dt_status comm_device_base_fail(dt_device *d, dt_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&d->mu);
    vsnprintf(d->error, sizeof d->error, fmt, ap);
    pthread_mutex_unlock(&d->mu);
    va_end(ap);
    return st;
}

const char *dt_device_name(const dt_device *d)
{
    return d->name;
}
const char *dt_device_error(const dt_device *d)
{
    return d->error;
}
