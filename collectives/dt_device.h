/*
 * dt_device.h — an accelerator, as the collectives see it: memory the host
 * cannot touch, pinned host memory, and a copy engine driven through streams
 * and events. Part of the collectives layer's public interface, beside
 * dt_comm.h: a communicator given a device in its options stages that
 * device's buffers through pinned host memory (staging.c).
 *
 * A dt_device is a small table of functions with two implementations:
 *
 *   "cuda[:N]"  cudart (device_cuda.c), built with -Dcuda=enabled|auto when
 *               the toolkit is found, into the CUDA module libdtrain-cuda.so
 *               that the first "cuda" open loads (dt_cuda_module.h: where it
 *               is looked for; DT_CUDA_MODULE overrides). Without the module,
 *               a driver or a device, opening fails with a message naming
 *               which; nothing crashes.
 *   "fake"      host memory made to behave like a device (device_fake.c), so
 *               CI without a GPU catches the mistakes a GPU would punish:
 *                 - device memory is a memfd mapped twice: the pointer handed
 *                   out is a PROT_NONE view, so host code that dereferences
 *                   it crashes (SIGSEGV) instead of working by luck; only the
 *                   copy engine uses the private read-write view;
 *                 - copies run on a separate thread, optionally delayed; a
 *                   D2H copy first fills its host destination with poison
 *                   (0xA5 bytes), so reading it before the copy's event has
 *                   completed sees poison, not the data.
 *
 * The model is CUDA's: a copy is enqueued on a stream and returns at once;
 * copies on one stream complete in order; an event recorded on a stream
 * completes when everything enqueued before it has. The host may read the
 * destination of a D2H copy, or reuse the source of an H2D copy, only after
 * an event recorded behind it has completed (query or synchronize).
 *
 * Errors: every function returns a dt_status; dt_device_error(d) holds the
 * message of the last failure ("cuda: cudaMallocHost(1048576 B): ...").
 * A device may be used from several threads at once.
 *
 * Cost (what the staging layer has to hide): pinned allocations are slow
 * (cudaMallocHost maps and locks pages: ~ms per MiB), so they are made once
 * and reused; a copy costs a few µs to enqueue plus bytes / copy bandwidth
 * (PCIe 4 x16: ~25 GB/s pinned, about half that from pageable memory).
 */
#ifndef DT_DEVICE_H
#define DT_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "dt_comm.h" /* dt_status */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_device dt_device;
typedef struct dt_device_stream dt_device_stream;
typedef struct dt_device_event dt_device_event;

/* Options of the fake device (zeros are the defaults). */
typedef struct dt_fake_device_options {
    unsigned copy_delay_us;     /* the copy thread sleeps this long before each copy */
    bool fail_pinned_alloc;     /* dt_device_pinned_alloc always fails (DT_ENOMEM) */
    unsigned hang_after_copies; /* > 0: the copy engine completes that many
                                   copies, then none (a hung device) */
} dt_fake_device_options;

/*
 * Opens "fake", "cuda" (device 0) or "cuda:N". Always sets *out (NULL on
 * DT_ENOMEM, an unknown name, or a CUDA module that cannot be loaded, with
 * the reason in err); on failure err holds the message, then
 * dt_device_close(*out). A build without CUDA refuses "cuda" with a message
 * saying how to build it in.
 */
dt_status dt_device_open(dt_device **out, const char *name, char *err, size_t errlen);
dt_status dt_device_open_fake(dt_device **out, const dt_fake_device_options *opts);
/* Frees the device. Streams, events and memory must be freed first. */
void dt_device_close(dt_device *d);
const char *dt_device_name(const dt_device *d);  /* "fake", "cuda:0 (NVIDIA H100 ...)" */
const char *dt_device_error(const dt_device *d); /* the last failure, or "" */
/* True when dt_device_open(.., "cuda") can work in this build. */
bool dt_device_cuda_built(void);

/* Pinned (page-locked) host memory: the fast path for copies. */
dt_status dt_device_pinned_alloc(dt_device *d, void **p, size_t bytes);
void dt_device_pinned_free(dt_device *d, void *p);
/* Device memory: the host must not dereference it. */
dt_status dt_device_alloc(dt_device *d, void **p, size_t bytes);
void dt_device_free(dt_device *d, void *p);
/* True if p points into memory of this device (a pointer query). */
bool dt_device_owns(dt_device *d, const void *p);

dt_status dt_device_stream_create(dt_device *d, dt_device_stream **s);
void dt_device_stream_destroy(dt_device *d, dt_device_stream *s);
/* Enqueue a copy on s; returns at once. */
dt_status dt_device_copy_d2h(dt_device *d, void *host, const void *dev, size_t bytes,
                             dt_device_stream *s);
dt_status dt_device_copy_h2d(dt_device *d, void *dev, const void *host, size_t bytes,
                             dt_device_stream *s);

dt_status dt_device_event_create(dt_device *d, dt_device_event **e);
void dt_device_event_destroy(dt_device *d, dt_device_event *e);
/* e completes once everything enqueued on s so far has. */
dt_status dt_device_event_record(dt_device *d, dt_device_event *e, dt_device_stream *s);
/* *done = whether e has completed (an event never recorded has). */
dt_status dt_device_event_query(dt_device *d, dt_device_event *e, bool *done);
dt_status dt_device_event_synchronize(dt_device *d, dt_device_event *e);
/* Waits until e has completed or `deadline` (dt_now() seconds) passes:
 * DT_ETIMEDOUT then, with the device's message saying so. A hung device
 * fails an op at its timeout instead of hanging it (it polls: spins a
 * little, then sleeps 10 µs doubling to 0.5 ms between queries). */
dt_status dt_device_event_wait(dt_device *d, dt_device_event *e, double deadline);

/* Fake device only (0 on others): pinned and device allocations not yet
 * freed, so tests can prove that nothing leaks. */
size_t dt_device_fake_live_allocations(const dt_device *d);

#ifdef __cplusplus
}
#endif
#endif /* DT_DEVICE_H */
