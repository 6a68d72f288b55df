/*
 * bench_device.h — dtrain-bench's device buffers: a bench_case's buffers
 * mirrored in device memory, so the same op can be timed on host buffers
 * and, in the same run, on device buffers staged through pinned memory.
 */
#ifndef DT_BENCH_DEVICE_H
#define DT_BENCH_DEVICE_H

#include "bench_case.h"
#include "dt_device.h"

typedef struct bench_device_case {
    dt_device *dev;
    dt_op op;          /* bc's op, on the device buffers */
    void *send, *recv; /* device memory, or NULL */
    size_t send_bytes, recv_bytes;
    dt_device_stream *stream;
    dt_device_event *event;
} bench_device_case;

/* Device buffers as large as bc's, holding bc's current contents. On
 * failure the message is dt_device_error(dev). */
dt_status bench_device_case_init(bench_device_case *dc, dt_device *dev, const bench_case *bc);
void bench_device_case_free(bench_device_case *dc);
/* Copies bc's host buffers to the device ones (after bench_case_fill). */
dt_status bench_device_case_upload(bench_device_case *dc, const bench_case *bc);
/* Copies the device receive buffer into bc's (before bench_case_count_wrong). */
dt_status bench_device_case_download(bench_device_case *dc, bench_case *bc);

#endif /* DT_BENCH_DEVICE_H */
