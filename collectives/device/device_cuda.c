/*
 * device_cuda.c — the dt_device table on the CUDA runtime (cudart), in C.
 *
 * Built only with -Dcuda=enabled (or auto, when the toolkit is found), and
 * only into the CUDA module (dt_cuda_module.h), which device.c loads on the
 * first "cuda" open: its one entry is the table dt_cuda_module_device at
 * the end. It needs nothing but cudart's C API, so it is plain C compiled
 * by the host compiler. Each call maps to one cudart function:
 *
 *   pinned_alloc/free   cudaMallocHost / cudaFreeHost (page-locked: the DMA
 *                       engine reads it directly, ~2x pageable bandwidth)
 *   alloc/free          cudaMalloc / cudaFree
 *   owns                cudaPointerGetAttributes: type device or managed,
 *                       on this device
 *   copies              cudaMemcpyAsync on a non-blocking stream
 *   events              cudaEventCreateWithFlags(DisableTiming), Record,
 *                       Query (cudaErrorNotReady = not yet), Synchronize
 *
 * The current device is per thread in CUDA, and a communicator runs its ops
 * on its own thread: every call that allocates or creates selects the
 * device first (cudaSetDevice costs ~100 ns once the context exists).
 *
 * Without a driver (cudaErrorInsufficientDriver, cudaErrorNoDevice, ...)
 * opening fails with a message naming what is missing; no call is made on a
 * device that failed to open.
 */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "device_internal.h"
#include "dt_cuda_module.h"

typedef struct cuda_device {
    int ordinal;
} cuda_device;

static int ordinal_of(const dt_device *d)
{
    return ((const cuda_device *)d->impl)->ordinal;
}

/* Record a failed cudart call: "cuda:0: cudaMallocHost(1048576 B): out of memory
 * (cudaErrorMemoryAllocation)". */
static dt_status cuda_fail(dt_device *d, cudaError_t e, const char *call, size_t bytes)
{
    (void)cudaGetLastError(); /* clear a non-sticky error so later calls can succeed */
    dt_status st = e == cudaErrorMemoryAllocation ? DT_ENOMEM : DT_ESYS;
    if (bytes)
        return comm_device_base_fail(d, st, "%s: %s(%zu B): %s (%s)", d->name, call, bytes,
                                     cudaGetErrorString(e), cudaGetErrorName(e));
    return comm_device_base_fail(d, st, "%s: %s: %s (%s)", d->name, call, cudaGetErrorString(e),
                                 cudaGetErrorName(e));
}

static dt_status select_device(dt_device *d)
{
    cudaError_t e = cudaSetDevice(ordinal_of(d));
    return e == cudaSuccess ? DT_OK : cuda_fail(d, e, "cudaSetDevice", 0);
}

static dt_status cuda_pinned_alloc(dt_device *d, void **p, size_t bytes)
{
    dt_status st = select_device(d);
    if (st != DT_OK)
        return st;
    cudaError_t e = cudaMallocHost(p, bytes);
    return e == cudaSuccess ? DT_OK : cuda_fail(d, e, "cudaMallocHost", bytes);
}

static void cuda_pinned_free(dt_device *d, void *p)
{
    cudaError_t e = cudaFreeHost(p);
    if (e != cudaSuccess)
        cuda_fail(d, e, "cudaFreeHost", 0);
}

static dt_status cuda_alloc(dt_device *d, void **p, size_t bytes)
{
    dt_status st = select_device(d);
    if (st != DT_OK)
        return st;
    cudaError_t e = cudaMalloc(p, bytes);
    return e == cudaSuccess ? DT_OK : cuda_fail(d, e, "cudaMalloc", bytes);
}

static void cuda_free(dt_device *d, void *p)
{
    cudaError_t e = cudaFree(p);
    if (e != cudaSuccess)
        cuda_fail(d, e, "cudaFree", 0);
}

static bool cuda_owns(dt_device *d, const void *p)
{
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false; /* not memory CUDA knows: plain host memory */
    }
    return (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) &&
           a.device == ordinal_of(d);
}

static dt_status cuda_stream_create(dt_device *d, dt_device_stream **s)
{
    dt_status st = select_device(d);
    if (st != DT_OK)
        return st;
    cudaStream_t cs;
    cudaError_t e = cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        return cuda_fail(d, e, "cudaStreamCreateWithFlags", 0);
    *s = (dt_device_stream *)cs;
    return DT_OK;
}

static void cuda_stream_destroy(dt_device *d, dt_device_stream *s)
{
    cudaError_t e = cudaStreamDestroy((cudaStream_t)s);
    if (e != cudaSuccess)
        cuda_fail(d, e, "cudaStreamDestroy", 0);
}

static dt_status cuda_copy(dt_device *d, void *dst, const void *src, size_t bytes,
                           enum cudaMemcpyKind kind, dt_device_stream *s)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, (cudaStream_t)s);
    return e == cudaSuccess ? DT_OK : cuda_fail(d, e, "cudaMemcpyAsync", bytes);
}

static dt_status cuda_copy_d2h(dt_device *d, void *host, const void *dev, size_t bytes,
                               dt_device_stream *s)
{
    return cuda_copy(d, host, dev, bytes, cudaMemcpyDeviceToHost, s);
}

static dt_status cuda_copy_h2d(dt_device *d, void *dev, const void *host, size_t bytes,
                               dt_device_stream *s)
{
    return cuda_copy(d, dev, host, bytes, cudaMemcpyHostToDevice, s);
}

static dt_status cuda_event_create(dt_device *d, dt_device_event **ev)
{
    dt_status st = select_device(d);
    if (st != DT_OK)
        return st;
    cudaEvent_t ce;
    cudaError_t e = cudaEventCreateWithFlags(&ce, cudaEventDisableTiming);
    if (e != cudaSuccess)
        return cuda_fail(d, e, "cudaEventCreateWithFlags", 0);
    *ev = (dt_device_event *)ce;
    return DT_OK;
}

static void cuda_event_destroy(dt_device *d, dt_device_event *ev)
{
    cudaError_t e = cudaEventDestroy((cudaEvent_t)ev);
    if (e != cudaSuccess)
        cuda_fail(d, e, "cudaEventDestroy", 0);
}

static dt_status cuda_event_record(dt_device *d, dt_device_event *ev, dt_device_stream *s)
{
    cudaError_t e = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)s);
    return e == cudaSuccess ? DT_OK : cuda_fail(d, e, "cudaEventRecord", 0);
}

static dt_status cuda_event_query(dt_device *d, dt_device_event *ev, bool *done)
{
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    *done = e == cudaSuccess;
    if (e == cudaSuccess || e == cudaErrorNotReady)
        return DT_OK;
    return cuda_fail(d, e, "cudaEventQuery", 0);
}

static dt_status cuda_event_synchronize(dt_device *d, dt_device_event *ev)
{
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)ev);
    return e == cudaSuccess ? DT_OK : cuda_fail(d, e, "cudaEventSynchronize", 0);
}

static void cuda_close(dt_device *d)
{
    free(d->impl);
}

static const dt_device_ops cuda_ops = {
    .pinned_alloc = cuda_pinned_alloc,
    .pinned_free = cuda_pinned_free,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .owns = cuda_owns,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .copy_d2h = cuda_copy_d2h,
    .copy_h2d = cuda_copy_h2d,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .close = cuda_close,
};

/* What is missing, in words a user can act on. */
static const char *missing(cudaError_t e)
{
    switch (e) {
    case cudaErrorInsufficientDriver:
        return "no NVIDIA driver new enough for this CUDA runtime is loaded (install or update "
               "the driver; nvidia-smi should list a GPU)";
    case cudaErrorNoDevice: return "the driver sees no CUDA device";
    default: return "the CUDA runtime cannot reach a device";
    }
}

static dt_status cuda_open(dt_device **out, int ordinal)
{
    char name[32];
    snprintf(name, sizeof name, "cuda:%d", ordinal);
    dt_device *d = *out = comm_device_base_new(&cuda_ops, name);
    if (!d)
        return DT_ENOMEM;
    cuda_device *cd = calloc(1, sizeof *cd);
    if (!cd)
        return comm_device_base_fail(d, DT_ENOMEM, "%s: out of memory", name);
    cd->ordinal = ordinal;
    d->impl = cd;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return comm_device_base_fail(d, DT_ESYS, "%s: %s (cudaGetDeviceCount: %s)", name,
                                     missing(e), cudaGetErrorName(e));
    }
    if (ordinal >= count)
        return comm_device_base_fail(d, DT_EINVAL,
                                     "%s: no such device: this machine has %d CUDA "
                                     "device(s)",
                                     name, count);
    struct cudaDeviceProp prop;
    if (select_device(d) != DT_OK)
        return DT_ESYS;
    e = cudaGetDeviceProperties(&prop, ordinal);
    if (e != cudaSuccess)
        return cuda_fail(d, e, "cudaGetDeviceProperties", 0);
    snprintf(d->name, sizeof d->name, "%s (%.80s)", name, prop.name);
    return DT_OK;
}

/* The module's entry for the device (device_internal.h), found by dlsym;
 * the module exports nothing else (install/cuda_module.map). */
const comm_device_cuda_entry dt_cuda_module_device = {
    .abi = DT_CUDA_MODULE_ABI,
    .open = cuda_open,
};
