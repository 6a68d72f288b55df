/*
 * device_internal.h — internal: the table behind a dt_device.
 *
 * device_base.c makes the record every device shares (the table, the
 * name, the last error); device.c opens a device by name and dispatches
 * each call through `ops`; each implementation (device_fake.c,
 * device_cuda.c) fills a dt_device_ops and keeps its own state in `impl`.
 * An implementation reports a failure with comm_device_base_fail, which
 * keeps the message for dt_device_error, and returns the status.
 *
 * The CUDA implementation lives in the CUDA module (dt_cuda_module.h), not
 * in libdtrain: device.c loads it on the first "cuda" open and finds its
 * opener in the table below; the device keeps the module's handle.
 */
#ifndef DT_DEVICE_INTERNAL_H
#define DT_DEVICE_INTERNAL_H

#include <pthread.h>

#include "dt_device.h"

typedef struct dt_device_ops {
    dt_status (*pinned_alloc)(dt_device *d, void **p, size_t bytes);
    void (*pinned_free)(dt_device *d, void *p);
    dt_status (*alloc)(dt_device *d, void **p, size_t bytes);
    void (*free)(dt_device *d, void *p);
    bool (*owns)(dt_device *d, const void *p);
    dt_status (*stream_create)(dt_device *d, dt_device_stream **s);
    void (*stream_destroy)(dt_device *d, dt_device_stream *s);
    dt_status (*copy_d2h)(dt_device *d, void *host, const void *dev, size_t bytes,
                          dt_device_stream *s);
    dt_status (*copy_h2d)(dt_device *d, void *dev, const void *host, size_t bytes,
                          dt_device_stream *s);
    dt_status (*event_create)(dt_device *d, dt_device_event **e);
    void (*event_destroy)(dt_device *d, dt_device_event *e);
    dt_status (*event_record)(dt_device *d, dt_device_event *e, dt_device_stream *s);
    dt_status (*event_query)(dt_device *d, dt_device_event *e, bool *done);
    dt_status (*event_synchronize)(dt_device *d, dt_device_event *e);
    size_t (*live_allocations)(const dt_device *d);
    void (*close)(dt_device *d); /* frees impl */
} dt_device_ops;

struct dt_device {
    const dt_device_ops *ops;
    void *impl;
    char name[128];
    pthread_mutex_t mu; /* guards error */
    char error[512];
    void *module; /* the CUDA module's handle (dlopen), dropped on close; or NULL */
};

/* device_base.c: a device with empty error and the given ops; NULL on
 * ENOMEM. */
dt_device *comm_device_base_new(const dt_device_ops *ops, const char *name);
/* Keep the message for dt_device_error; returns st. */
dt_status comm_device_base_fail(dt_device *d, dt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* What the CUDA module exports for the device (device_cuda.c), under the
 * name DT_CUDA_MODULE_DEVICE: opens ordinal `ordinal`; *out as
 * dt_device_open. `abi` first, as dt_cuda_module_open expects. */
typedef struct comm_device_cuda_entry {
    unsigned abi; /* DT_CUDA_MODULE_ABI */
    dt_status (*open)(dt_device **out, int ordinal);
} comm_device_cuda_entry;
#define DT_CUDA_MODULE_DEVICE "dt_cuda_module_device"

#endif /* DT_DEVICE_INTERNAL_H */
