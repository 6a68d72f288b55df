/*
 * rank_devices.h — a fake device per rank thread (rank_threads.h), as each
 * rank of a real job would have its own GPU, for the staging tests: open
 * them before the job, hand them to rank_threads_run_on, and close them
 * after it, expecting that staging left no device or pinned allocation
 * behind (the fake device counts them).
 */
#ifndef DT_TEST_RANK_DEVICES_H
#define DT_TEST_RANK_DEVICES_H

#include <criterion/criterion.h>

#include "dt_device.h"
#include "rank_threads.h"

/* Per rank: its device, and a stream and event for the test's own copies. */
typedef struct rank_dev {
    dt_device *dev;
    dt_device_stream *stream;
    dt_device_event *event;
} rank_dev;

/* What the ranks of a job share (rank_ctx.arg): each rank's device. */
typedef struct job_arg {
    rank_dev rd[RANK_THREADS_MAX];
    int cases; /* what each rank ran, for the report */
} job_arg;

/* Each rank its own fake device, as each would have its own GPU. */
static inline void open_devices(job_arg *a, dt_device **devs, int world, dt_fake_device_options *o)
{
    for (int r = 0; r < world; r++) {
        rank_dev *d = &a->rd[r];
        cr_assert_eq(dt_device_open_fake(&d->dev, o), DT_OK);
        cr_assert_eq(dt_device_stream_create(d->dev, &d->stream), DT_OK);
        cr_assert_eq(dt_device_event_create(d->dev, &d->event), DT_OK);
        devs[r] = d->dev;
    }
}

/* Closes the devices, asserting that staging left no allocation behind. */
static inline void close_devices(job_arg *a, int world)
{
    for (int r = 0; r < world; r++) {
        rank_dev *d = &a->rd[r];
        size_t live = dt_device_fake_live_allocations(d->dev);
        dt_device_event_destroy(d->dev, d->event);
        dt_device_stream_destroy(d->dev, d->stream);
        dt_device_close(d->dev);
        cr_expect_eq(live, 0, "rank %d: %zu device or pinned allocations left", r, live);
    }
}

#endif /* DT_TEST_RANK_DEVICES_H */
