/*
 * test_device.c — the dt_device table: the fake device's deliberate
 * strictness (the point of it is to make staging mistakes fail in CI), and
 * the CUDA device's behaviour where there is no GPU.
 *
 * Tests that need a real GPU skip themselves (TAP "# SKIP", counted as
 * skipped by dev.sh, never as passed) when none can be opened.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dt_device.h"

#define TEST_TIMEOUT_S 30.0

static dt_device *open_fake(unsigned delay_us)
{
    dt_fake_device_options o = {.copy_delay_us = delay_us};
    dt_device *d;
    dt_status st = dt_device_open_fake(&d, &o);
    cr_assert_eq(st, DT_OK, "open fake: %s", d ? dt_device_error(d) : "ENOMEM");
    return d;
}

/* H2D then D2H on one stream, waited: the bytes come back. */
static void round_trip(dt_device *d, void *dev, const void *in, void *out, size_t n)
{
    dt_device_stream *s;
    dt_device_event *e;
    cr_assert_eq(dt_device_stream_create(d, &s), DT_OK);
    cr_assert_eq(dt_device_event_create(d, &e), DT_OK);
    cr_assert_eq(dt_device_copy_h2d(d, dev, in, n, s), DT_OK, "%s", dt_device_error(d));
    cr_assert_eq(dt_device_copy_d2h(d, out, dev, n, s), DT_OK, "%s", dt_device_error(d));
    cr_assert_eq(dt_device_event_record(d, e, s), DT_OK);
    cr_assert_eq(dt_device_event_synchronize(d, e), DT_OK);
    dt_device_event_destroy(d, e);
    dt_device_stream_destroy(d, s);
}

Test(device, fake_device_pointer_crashes_the_host_code_that_dereferences_it,
     .timeout = TEST_TIMEOUT_S)
{
    dt_device *d = open_fake(0);
    void *dev;
    cr_assert_eq(dt_device_alloc(d, &dev, 4096), DT_OK);
    fflush(NULL);
    pid_t child = fork();
    cr_assert(child >= 0);
    if (child == 0) {
        volatile const char *p = dev;
        char c = p[100];       /* the mistake: host code reading device memory */
        _exit(c == 0 ? 0 : 1); /* reached only if the read did not fault */
    }
    int status;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFSIGNALED(status), "the child read a device pointer and survived (exit %d)",
              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    dt_device_free(d, dev);
    dt_device_close(d);
}

Test(device, fake_device_round_trips_bytes_through_device_memory, .timeout = TEST_TIMEOUT_S)
{
    dt_device *d = open_fake(0);
    enum { N = 3 * 4096 + 17 };
    static char in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = (char)(i * 7 + 3);
    void *dev;
    cr_assert_eq(dt_device_alloc(d, &dev, N), DT_OK);
    round_trip(d, dev, in, out, N);
    cr_assert(memcmp(in, out, N) == 0);
    dt_device_free(d, dev);
    dt_device_close(d);
}

Test(device, a_host_read_before_the_copy_event_completes_sees_poison, .timeout = TEST_TIMEOUT_S)
{
    dt_device *d = open_fake(200 * 1000); /* each copy waits 200 ms */
    char in[64], out[64];
    memset(in, 0x11, sizeof in);
    memset(out, 0x22, sizeof out);
    void *dev;
    dt_device_stream *s;
    dt_device_event *e;
    cr_assert_eq(dt_device_alloc(d, &dev, sizeof in), DT_OK);
    cr_assert_eq(dt_device_stream_create(d, &s), DT_OK);
    cr_assert_eq(dt_device_event_create(d, &e), DT_OK);
    cr_assert_eq(dt_device_copy_h2d(d, dev, in, sizeof in, s), DT_OK);
    cr_assert_eq(dt_device_copy_d2h(d, out, dev, sizeof out, s), DT_OK);
    cr_assert_eq(dt_device_event_record(d, e, s), DT_OK);
    bool done = true;
    cr_assert_eq(dt_device_event_query(d, e, &done), DT_OK);
    cr_assert_not(done, "the event completed before its delayed copies ran");
    /* The mistake: reading the destination without waiting for the event. */
    cr_assert_eq((unsigned char)out[0], 0xA5, "an early read saw %#x, not the poison",
                 (unsigned char)out[0]);
    cr_assert_eq(dt_device_event_synchronize(d, e), DT_OK);
    cr_assert(memcmp(out, in, sizeof in) == 0, "after the event the data is there");
    dt_device_event_destroy(d, e);
    dt_device_stream_destroy(d, s);
    dt_device_free(d, dev);
    dt_device_close(d);
}

Test(device, fake_copies_complete_in_enqueue_order, .timeout = TEST_TIMEOUT_S)
{
    dt_device *d = open_fake(2000);
    enum { N = 256, K = 8 };
    static char in[K][N], out[K][N];
    void *dev;
    dt_device_stream *s;
    dt_device_event *e[K];
    cr_assert_eq(dt_device_alloc(d, &dev, N), DT_OK);
    cr_assert_eq(dt_device_stream_create(d, &s), DT_OK);
    /* Every round overwrites the one device buffer: out[k] can only equal
     * in[k] if round k's H2D ran after round k-1's D2H and before its own. */
    for (int k = 0; k < K; k++) {
        memset(in[k], 'a' + k, N);
        cr_assert_eq(dt_device_event_create(d, &e[k]), DT_OK);
        cr_assert_eq(dt_device_copy_h2d(d, dev, in[k], N, s), DT_OK);
        cr_assert_eq(dt_device_copy_d2h(d, out[k], dev, N, s), DT_OK);
        cr_assert_eq(dt_device_event_record(d, e[k], s), DT_OK);
    }
    cr_assert_eq(dt_device_event_synchronize(d, e[K / 2]), DT_OK);
    for (int k = 0; k <= K / 2; k++) {
        bool done = false;
        cr_assert_eq(dt_device_event_query(d, e[k], &done), DT_OK);
        cr_assert(done, "event %d is not done though a later one is", k);
    }
    cr_assert_eq(dt_device_event_synchronize(d, e[K - 1]), DT_OK);
    for (int k = 0; k < K; k++) {
        cr_assert(memcmp(out[k], in[k], N) == 0, "round %d read another round's bytes", k);
        dt_device_event_destroy(d, e[k]);
    }
    dt_device_stream_destroy(d, s);
    dt_device_free(d, dev);
    dt_device_close(d);
}

Test(device, a_copy_past_the_end_of_a_device_allocation_is_refused, .timeout = TEST_TIMEOUT_S)
{
    dt_device *d = open_fake(0);
    char host[128];
    void *dev;
    dt_device_stream *s;
    cr_assert_eq(dt_device_alloc(d, &dev, 100), DT_OK);
    cr_assert_eq(dt_device_stream_create(d, &s), DT_OK);
    cr_assert_eq(dt_device_copy_d2h(d, host, (char *)dev + 50, 51, s), DT_EINVAL);
    cr_assert(strstr(dt_device_error(d), "not inside one device allocation"), "message: %s",
              dt_device_error(d));
    dt_device_stream_destroy(d, s);
    dt_device_free(d, dev);
    dt_device_close(d);
}

Test(device, the_fake_device_owns_its_device_memory_and_nothing_else, .timeout = TEST_TIMEOUT_S)
{
    dt_device *d = open_fake(0);
    void *dev, *pinned;
    char host[16];
    cr_assert_eq(dt_device_alloc(d, &dev, 1000), DT_OK);
    cr_assert_eq(dt_device_pinned_alloc(d, &pinned, 1000), DT_OK);
    cr_assert(dt_device_owns(d, dev));
    cr_assert(dt_device_owns(d, (char *)dev + 999), "an interior pointer is device memory too");
    cr_assert_not(dt_device_owns(d, (char *)dev + 1000));
    cr_assert_not(dt_device_owns(d, host));
    cr_assert_not(dt_device_owns(d, pinned));
    cr_assert_not(dt_device_owns(d, NULL));
    cr_assert_eq(dt_device_fake_live_allocations(d), 2);
    dt_device_free(d, dev);
    dt_device_pinned_free(d, pinned);
    cr_assert_eq(dt_device_fake_live_allocations(d), 0);
    dt_device_close(d);
}

Test(device, a_refused_pinned_allocation_says_so, .timeout = TEST_TIMEOUT_S)
{
    dt_fake_device_options o = {.fail_pinned_alloc = true};
    dt_device *d;
    cr_assert_eq(dt_device_open_fake(&d, &o), DT_OK);
    void *p;
    cr_assert_eq(dt_device_pinned_alloc(d, &p, 4096), DT_ENOMEM);
    cr_assert_null(p);
    cr_assert(strstr(dt_device_error(d), "pinned allocation of 4096 B"), "message: %s",
              dt_device_error(d));
    dt_device_close(d);
}

Test(device, an_unknown_device_name_is_refused_by_name, .timeout = TEST_TIMEOUT_S)
{
    dt_device *d;
    char err[256];
    cr_assert_eq(dt_device_open(&d, "tpu", err, sizeof err), DT_EINVAL);
    cr_assert_null(d);
    cr_assert(strstr(err, "\"tpu\""), "message: %s", err);
}

/* Without CUDA built in, or without a driver or a GPU, opening "cuda" fails
 * with a message saying what is missing; with a GPU this test has nothing to
 * check and skips. */
Test(device, opening_cuda_without_a_gpu_names_what_is_missing, .timeout = TEST_TIMEOUT_S)
{
    dt_device *d;
    char err[512];
    dt_status st = dt_device_open(&d, "cuda", err, sizeof err);
    if (st == DT_OK) {
        char name[128];
        snprintf(name, sizeof name, "%s", dt_device_name(d));
        dt_device_close(d);
        cr_skip_test("a CUDA device is present: %s", name);
    }
    dt_device_close(d);
    if (dt_device_cuda_built())
        cr_assert(strstr(err, "driver") || strstr(err, "device"), "message: %s", err);
    else
        cr_assert(strstr(err, "built without CUDA"), "message: %s", err);
}

/* Needs a GPU: the same round trip as the fake's, on the real thing. */
Test(device, cuda_device_round_trips_bytes_through_pinned_memory, .timeout = TEST_TIMEOUT_S)
{
    dt_device *d;
    char err[512];
    if (dt_device_open(&d, "cuda", err, sizeof err) != DT_OK) {
        dt_device_close(d);
        cr_skip_test("needs a CUDA device: %s", err);
    }
    enum { N = 1 << 20 };
    char *in, *out;
    void *dev;
    cr_assert_eq(dt_device_pinned_alloc(d, (void **)&in, N), DT_OK, "%s", dt_device_error(d));
    cr_assert_eq(dt_device_pinned_alloc(d, (void **)&out, N), DT_OK, "%s", dt_device_error(d));
    cr_assert_eq(dt_device_alloc(d, &dev, N), DT_OK, "%s", dt_device_error(d));
    cr_assert(dt_device_owns(d, dev));
    cr_assert_not(dt_device_owns(d, in));
    for (int i = 0; i < N; i++)
        in[i] = (char)(i * 13 + 1);
    round_trip(d, dev, in, out, N);
    cr_assert(memcmp(in, out, N) == 0);
    dt_device_free(d, dev);
    dt_device_pinned_free(d, in);
    dt_device_pinned_free(d, out);
    dt_device_close(d);
}
