/*
 * test_staging_failure.c — what a failure does to ops on device buffers
 * staged through host memory, on the fake device (no GPU needed).
 *
 * A rank that dies while the others stage their pieces fails every rank's
 * op, naming it, and leaves no pinned or device memory behind; a device
 * that hangs (its copy engine stops completing copies, as a wedged GPU's
 * does) fails the op at its timeout naming the device, for collectives and
 * for sends alike, instead of waiting forever. The staging itself, op by
 * op against host buffers, is test_staging.c's.
 */
#include <criterion/criterion.h>

#include <string.h>
#include <unistd.h>

#include "dt_comm.h"
#include "dt_device.h"
#include "rank_devices.h"
#include "rank_threads.h"

#define TEST_TIMEOUT_S 240.0
#define COPY_DELAY_US 30

/* ---- a rank dying mid-staging --------------------------------------------------- */

/* Ranks 0 and 1 are copying their input out (each 1 MiB piece takes 20 ms
 * on this fake device) when rank 2 aborts. Everyone's op must fail, naming
 * the cause, and leave no pinned or device memory behind (the devices count
 * their allocations; ASan sees the pinned ones too). */
static void rank_dies_mid_staging(rank_ctx *rc)
{
    rank_dev *d = &((job_arg *)rc->arg)->rd[rc->rank];
    const size_t n = (size_t)2 << 20; /* 8 MiB of f32 */
    void *buf;
    if (dt_device_alloc(d->dev, &buf, n * 4) != DT_OK) {
        rank_fail(rc, "alloc: %s", dt_device_error(d->dev));
        return;
    }
    dt_work *w;
    dt_status st = dt_allreduce_async(rc->comm, buf, n, DT_F32, DT_SUM, &w);
    if (st == DT_OK && rc->rank == 2) {
        usleep(30 * 1000);
        dt_comm_abort(rc->comm, "rank 2 dies mid-staging");
    }
    if (st == DT_OK)
        st = dt_work_wait(w);
    if (st == DT_OK)
        rank_fail(rc, "the all-reduce succeeded though rank 2 died");
    else if (!strstr(dt_comm_error(rc->comm), "rank 2"))
        rank_fail(rc, "the error does not name rank 2: %s", dt_comm_error(rc->comm));
    dt_device_free(d->dev, buf);
}

Test(staging_failure, a_rank_dying_mid_staging_fails_every_rank_and_leaks_nothing,
     .timeout = TEST_TIMEOUT_S)
{
    dt_fake_device_options o = {.copy_delay_us = 20 * 1000};
    job_arg a = {0};
    dt_device *devs[3];
    open_devices(&a, devs, 3, &o);
    rank_job job;
    rank_threads_run_on(&job, 3, rank_dies_mid_staging, &a, devs);
    close_devices(&a, 3);
    for (int r = 0; r < 3; r++)
        cr_expect_not(job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
}

/* ---- a hung device ----------------------------------------------------------------- */

/* Rank 1's device hangs (its copy engine completes one copy, then none, as
 * a wedged GPU does). Its all-reduce on device buffers fails at its op's
 * 2 s timeout with DT_ETIMEDOUT naming the device, instead of waiting
 * forever for a copy; the other ranks fail too (rank 1 aborts the job). A
 * p2p op on the hung device fails the same way. */
static void rank_on_a_hung_device(rank_ctx *rc)
{
    rank_dev *d = &((job_arg *)rc->arg)->rd[rc->rank];
    const size_t n = (size_t)1 << 20; /* 4 MiB of f32: several staging pieces */
    void *buf;
    if (dt_device_alloc(d->dev, &buf, n * 4) != DT_OK) {
        rank_fail(rc, "alloc: %s", dt_device_error(d->dev));
        return;
    }
    /* the others wait longer, so that the hung rank's own timeout fires
     * first and theirs do not race it (they would blame their neighbour) */
    dt_op op = {.kind = DT_OP_ALLREDUCE,
                .send = buf,
                .recv = buf,
                .count = n,
                .dtype = DT_F32,
                .redop = DT_SUM,
                .timeout_s = rc->rank == 1 ? 2.0 : 10.0};
    dt_status st = dt_run(rc->comm, &op);
    const char *err = dt_comm_error(rc->comm);
    if (st == DT_OK)
        rank_fail(rc, "the all-reduce succeeded on a hung device");
    else if (rc->rank == 1 &&
             (st != DT_ETIMEDOUT || !strstr(err, "is the device hung") || !strstr(err, "fake")))
        rank_fail(rc, "rank 1: %s, not a timeout naming the device: %s", dt_status_name(st), err);
    else if (rc->rank != 1 && !strstr(err, "rank 1"))
        rank_fail(rc, "the error does not name rank 1: %s", err);
    dt_device_free(d->dev, buf);
}

Test(staging_failure, a_hung_device_fails_the_op_at_its_timeout_naming_the_device, .timeout = 60)
{
    job_arg a = {0};
    dt_device *devs[3];
    dt_fake_device_options ok = {.copy_delay_us = COPY_DELAY_US};
    dt_fake_device_options hung = {.copy_delay_us = COPY_DELAY_US, .hang_after_copies = 1};
    for (int r = 0; r < 3; r++) {
        rank_dev *d = &a.rd[r];
        cr_assert_eq(dt_device_open_fake(&d->dev, r == 1 ? &hung : &ok), DT_OK);
        cr_assert_eq(dt_device_stream_create(d->dev, &d->stream), DT_OK);
        cr_assert_eq(dt_device_event_create(d->dev, &d->event), DT_OK);
        devs[r] = d->dev;
    }
    rank_job job;
    rank_threads_run_on(&job, 3, rank_on_a_hung_device, &a, devs);
    close_devices(&a, 3);
    for (int r = 0; r < 3; r++)
        cr_expect_not(job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
}

/* A send from a device buffer on a hung device: the first send's copy to
 * the host completes (the engine's one), the second's never does, and that
 * send fails at its timeout; rank 1 receives the first into host memory. */
static void rank_sends_from_a_hung_device(rank_ctx *rc)
{
    rank_dev *d = &((job_arg *)rc->arg)->rd[rc->rank];
    void *buf;
    float host[1024];
    if (dt_device_alloc(d->dev, &buf, sizeof host) != DT_OK) {
        rank_fail(rc, "alloc: %s", dt_device_error(d->dev));
        return;
    }
    dt_op send = {.kind = DT_OP_SEND,
                  .send = buf,
                  .count = 1024,
                  .dtype = DT_F32,
                  .peer = 1,
                  .tag = 7,
                  .timeout_s = 1.0};
    dt_op recv = {.kind = DT_OP_RECV,
                  .recv = host,
                  .count = 1024,
                  .dtype = DT_F32,
                  .peer = 0,
                  .tag = 7,
                  .timeout_s = 10.0};
    if (rc->rank == 0) {
        dt_status st = dt_run(rc->comm, &send);
        if (st != DT_OK)
            rank_fail(rc, "the first send: %s", dt_comm_error(rc->comm));
        st = dt_run(rc->comm, &send);
        if (st != DT_ETIMEDOUT || !strstr(dt_comm_error(rc->comm), "is the device hung"))
            rank_fail(rc, "the second send: %s: %s", dt_status_name(st), dt_comm_error(rc->comm));
    } else {
        if (dt_run(rc->comm, &recv) != DT_OK)
            rank_fail(rc, "the first receive: %s", dt_comm_error(rc->comm));
        (void)dt_run(rc->comm, &recv); /* fails once rank 0 does */
    }
    dt_device_free(d->dev, buf);
}

Test(staging_failure, a_send_from_a_hung_device_fails_at_its_timeout, .timeout = 60)
{
    dt_fake_device_options hung = {.hang_after_copies = 1};
    job_arg a = {0};
    dt_device *devs[2];
    open_devices(&a, devs, 2, &hung);
    rank_job job;
    rank_threads_run_on(&job, 2, rank_sends_from_a_hung_device, &a, devs);
    close_devices(&a, 2);
    for (int r = 0; r < 2; r++)
        cr_expect_not(job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
}
