/*
 * device_fake.c — a device made of host memory that behaves badly on
 * purpose, so that CI without a GPU catches what a GPU would punish.
 *
 * Device memory. Each allocation is a memfd mapped twice:
 *
 *     memfd ──┬── view A: PROT_NONE   → handed out as the "device pointer"
 *             └── view B: read-write  → used only by the copy engine
 *
 * Host code that dereferences a device pointer (a forgotten staging step)
 * takes SIGSEGV, as it would on a real GPU's memory, instead of quietly
 * working. The engine translates a device address to view B by finding the
 * allocation that contains it; a copy that would run past the end of its
 * allocation is refused with an error (an out-of-bounds copy on a GPU is
 * silent corruption or a sticky fault).
 *
 * The copy engine. One thread per device runs the enqueued copies in order
 * (all streams share its FIFO, so copies complete in enqueue order, which is
 * also what one CUDA stream promises). Each copy waits `copy_delay_us`
 * first. A D2H copy fills its host destination with POISON at enqueue time,
 * so host code that reads it before an event recorded behind the copy has
 * completed sees 0xA5 bytes rather than yesterday's data; an H2D copy reads
 * its host source only when it runs, so host code that reuses the source
 * too early sends the wrong bytes. Events are tickets: recording one takes
 * the number of copies enqueued so far; it has completed once the engine
 * has finished that many.
 *
 * Pinned memory is plain malloc (counted, and it can be made to fail, to
 * test the fallback to pageable memory). The engine can be made to hang
 * after a number of copies (hang_after_copies), as a wedged GPU does:
 * events behind the rest never complete. Cost: a copy is one memcpy on the
 * engine thread; allocations cost a memfd, two mmaps and a lock.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "device_internal.h"

#define POISON 0xA5

typedef struct fake_alloc {
    char *dev;     /* PROT_NONE view: what the caller gets */
    char *rw;      /* read-write view of the same pages: the engine's */
    size_t bytes;  /* as asked */
    size_t mapped; /* rounded up to pages */
    struct fake_alloc *next;
} fake_alloc;

typedef struct fake_copy {
    char *dst;
    const char *src;
    size_t bytes;
    struct fake_copy *next;
} fake_copy;

typedef struct fake_device {
    dt_fake_device_options opts;
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* engine: a copy was enqueued, or stop */
    pthread_cond_t cv_done; /* waiters: a copy finished */
    fake_alloc *allocs;
    size_t live; /* pinned + device allocations not freed */
    fake_copy *head, *tail;
    uint64_t enqueued, completed;
    bool stop;
    pthread_t engine;
} fake_device;

struct dt_device_event {
    uint64_t ticket;
};
struct dt_device_stream {
    int unused;
};

static fake_device *impl(const dt_device *d)
{
    return d->impl;
}

/* ---- the copy engine ---------------------------------------------------------- */

/* hang_after_copies: the engine has done its share and takes no more. */
static bool hung(const fake_device *f)
{
    return f->opts.hang_after_copies && f->completed >= f->opts.hang_after_copies;
}

static void *engine_main(void *arg)
{
    fake_device *f = arg;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while ((!f->head || hung(f)) && !f->stop)
            pthread_cond_wait(&f->cv_work, &f->mu);
        if (!f->head || hung(f)) /* stopping; a hung engine drops what is queued */
            break;
        fake_copy *c = f->head;
        f->head = c->next;
        if (!f->head)
            f->tail = NULL;
        pthread_mutex_unlock(&f->mu);
        if (f->opts.copy_delay_us)
            usleep(f->opts.copy_delay_us);
        memcpy(c->dst, c->src, c->bytes);
        free(c);
        pthread_mutex_lock(&f->mu);
        f->completed++;
        pthread_cond_broadcast(&f->cv_done);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

static dt_status enqueue(dt_device *d, char *dst, const char *src, size_t bytes)
{
    fake_device *f = impl(d);
    fake_copy *c = malloc(sizeof *c);
    if (!c)
        return comm_device_base_fail(d, DT_ENOMEM, "fake device: no memory to enqueue a copy");
    *c = (fake_copy){dst, src, bytes, NULL};
    pthread_mutex_lock(&f->mu);
    if (f->tail)
        f->tail->next = c;
    else
        f->head = c;
    f->tail = c;
    f->enqueued++;
    pthread_cond_signal(&f->cv_work);
    pthread_mutex_unlock(&f->mu);
    return DT_OK;
}

/* View B of [p, p+bytes), or NULL if that range is not inside one allocation.
 * With mu held. */
static char *rw_view(fake_device *f, const void *p, size_t bytes)
{
    const char *q = p;
    for (fake_alloc *a = f->allocs; a; a = a->next)
        if (q >= a->dev && q < a->dev + a->bytes)
            return (size_t)(a->dev + a->bytes - q) >= bytes ? a->rw + (q - a->dev) : NULL;
    return NULL;
}

static dt_status translate(dt_device *d, const void *dev, size_t bytes, const char *what, char **rw)
{
    fake_device *f = impl(d);
    pthread_mutex_lock(&f->mu);
    *rw = rw_view(f, dev, bytes);
    pthread_mutex_unlock(&f->mu);
    if (!*rw)
        return comm_device_base_fail(d, DT_EINVAL,
                                     "fake device: %s of %zu B at %p: not inside one "
                                     "device allocation",
                                     what, bytes, dev);
    return DT_OK;
}

static dt_status fake_copy_d2h(dt_device *d, void *host, const void *dev, size_t bytes,
                               dt_device_stream *s)
{
    (void)s;
    char *rw;
    dt_status st = translate(d, dev, bytes, "D2H copy", &rw);
    if (st != DT_OK)
        return st;
    memset(host, POISON, bytes); /* what an early reader sees */
    return enqueue(d, host, rw, bytes);
}

static dt_status fake_copy_h2d(dt_device *d, void *dev, const void *host, size_t bytes,
                               dt_device_stream *s)
{
    (void)s;
    char *rw;
    dt_status st = translate(d, dev, bytes, "H2D copy", &rw);
    return st == DT_OK ? enqueue(d, rw, host, bytes) : st;
}

/* ---- events and streams ---------------------------------------------------------- */

static dt_status fake_event_create(dt_device *d, dt_device_event **e)
{
    *e = calloc(1, sizeof **e);
    return *e ? DT_OK : comm_device_base_fail(d, DT_ENOMEM, "fake device: no memory for an event");
}

static void fake_event_destroy(dt_device *d, dt_device_event *e)
{
    (void)d;
    free(e);
}

static dt_status fake_event_record(dt_device *d, dt_device_event *e, dt_device_stream *s)
{
    (void)s;
    fake_device *f = impl(d);
    pthread_mutex_lock(&f->mu);
    e->ticket = f->enqueued;
    pthread_mutex_unlock(&f->mu);
    return DT_OK;
}

static dt_status fake_event_query(dt_device *d, dt_device_event *e, bool *done)
{
    fake_device *f = impl(d);
    pthread_mutex_lock(&f->mu);
    *done = f->completed >= e->ticket;
    pthread_mutex_unlock(&f->mu);
    return DT_OK;
}

static dt_status fake_event_synchronize(dt_device *d, dt_device_event *e)
{
    fake_device *f = impl(d);
    pthread_mutex_lock(&f->mu);
    while (f->completed < e->ticket)
        pthread_cond_wait(&f->cv_done, &f->mu);
    pthread_mutex_unlock(&f->mu);
    return DT_OK;
}

static dt_status fake_stream_create(dt_device *d, dt_device_stream **s)
{
    *s = calloc(1, sizeof **s);
    return *s ? DT_OK : comm_device_base_fail(d, DT_ENOMEM, "fake device: no memory for a stream");
}

static void fake_stream_destroy(dt_device *d, dt_device_stream *s)
{
    (void)d;
    free(s);
}

/* ---- memory ------------------------------------------------------------------------ */

static void count_live(dt_device *d, int delta)
{
    fake_device *f = impl(d);
    pthread_mutex_lock(&f->mu);
    f->live += (size_t)delta;
    pthread_mutex_unlock(&f->mu);
}

static dt_status fake_pinned_alloc(dt_device *d, void **p, size_t bytes)
{
    if (impl(d)->opts.fail_pinned_alloc)
        return comm_device_base_fail(d, DT_ENOMEM,
                                     "fake device: pinned allocation of %zu B "
                                     "refused (fail_pinned_alloc is set)",
                                     bytes);
    *p = malloc(bytes ? bytes : 1);
    if (!*p)
        return comm_device_base_fail(d, DT_ENOMEM,
                                     "fake device: pinned allocation of %zu B "
                                     "failed",
                                     bytes);
    count_live(d, 1);
    return DT_OK;
}

static void fake_pinned_free(dt_device *d, void *p)
{
    free(p);
    count_live(d, -1);
}

/* Two views of one memfd: PROT_NONE for the caller, read-write for the engine. */
static dt_status map_twice(dt_device *d, fake_alloc *a)
{
    int fd = memfd_create("dtrain-fake-device", MFD_CLOEXEC);
    if (fd < 0)
        return comm_device_base_fail(d, DT_ESYS, "fake device: memfd_create: %s", strerror(errno));
    dt_status st = DT_OK;
    if (ftruncate(fd, (off_t)a->mapped) != 0) {
        st = comm_device_base_fail(d, DT_ENOMEM, "fake device: %zu B: ftruncate: %s", a->mapped,
                                   strerror(errno));
    } else {
        a->dev = mmap(NULL, a->mapped, PROT_NONE, MAP_SHARED, fd, 0);
        a->rw = mmap(NULL, a->mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (a->dev == MAP_FAILED || a->rw == MAP_FAILED) {
            st = comm_device_base_fail(d, DT_ENOMEM, "fake device: mmap of %zu B: %s", a->mapped,
                                       strerror(errno));
            if (a->dev != MAP_FAILED)
                munmap(a->dev, a->mapped);
            if (a->rw != MAP_FAILED)
                munmap(a->rw, a->mapped);
        }
    }
    close(fd);
    return st;
}

static dt_status fake_alloc_dev(dt_device *d, void **p, size_t bytes)
{
    if (bytes == 0)
        return DT_OK; /* as cudaMalloc: NULL, no error */
    long page = sysconf(_SC_PAGESIZE);
    fake_alloc *a = calloc(1, sizeof *a);
    if (!a)
        return comm_device_base_fail(d, DT_ENOMEM,
                                     "fake device: no memory for an allocation "
                                     "record");
    a->bytes = bytes;
    a->mapped = (bytes + (size_t)page - 1) / (size_t)page * (size_t)page;
    dt_status st = map_twice(d, a);
    if (st != DT_OK) {
        free(a);
        return st;
    }
    fake_device *f = impl(d);
    pthread_mutex_lock(&f->mu);
    a->next = f->allocs;
    f->allocs = a;
    f->live++;
    pthread_mutex_unlock(&f->mu);
    *p = a->dev;
    return DT_OK;
}

static void fake_free_dev(dt_device *d, void *p)
{
    fake_device *f = impl(d);
    pthread_mutex_lock(&f->mu);
    fake_alloc **pp = &f->allocs;
    while (*pp && (*pp)->dev != p)
        pp = &(*pp)->next;
    fake_alloc *a = *pp;
    if (a) {
        *pp = a->next;
        f->live--;
    }
    pthread_mutex_unlock(&f->mu);
    if (!a) {
        comm_device_base_fail(d, DT_EINVAL,
                              "fake device: free of %p, which is not a device "
                              "allocation",
                              p);
        return;
    }
    munmap(a->dev, a->mapped);
    munmap(a->rw, a->mapped);
    free(a);
}

static bool fake_owns(dt_device *d, const void *p)
{
    fake_device *f = impl(d);
    pthread_mutex_lock(&f->mu);
    bool yes = rw_view(f, p, 0) != NULL;
    pthread_mutex_unlock(&f->mu);
    return yes;
}

static size_t fake_live(const dt_device *d)
{
    fake_device *f = impl(d);
    pthread_mutex_lock(&f->mu);
    size_t n = f->live;
    pthread_mutex_unlock(&f->mu);
    return n;
}

/* Stops the engine after the copies already enqueued. */
static void fake_close(dt_device *d)
{
    fake_device *f = impl(d);
    if (!f)
        return;
    pthread_mutex_lock(&f->mu);
    f->stop = true;
    pthread_cond_signal(&f->cv_work);
    pthread_mutex_unlock(&f->mu);
    pthread_join(f->engine, NULL);
    while (f->head) { /* what a hung engine never ran */
        fake_copy *c = f->head;
        f->head = c->next;
        free(c);
    }
    while (f->allocs) {
        fake_alloc *a = f->allocs;
        f->allocs = a->next;
        munmap(a->dev, a->mapped);
        munmap(a->rw, a->mapped);
        free(a);
    }
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv_work);
    pthread_cond_destroy(&f->cv_done);
    free(f);
}

static const dt_device_ops fake_ops = {
    .pinned_alloc = fake_pinned_alloc,
    .pinned_free = fake_pinned_free,
    .alloc = fake_alloc_dev,
    .free = fake_free_dev,
    .owns = fake_owns,
    .stream_create = fake_stream_create,
    .stream_destroy = fake_stream_destroy,
    .copy_d2h = fake_copy_d2h,
    .copy_h2d = fake_copy_h2d,
    .event_create = fake_event_create,
    .event_destroy = fake_event_destroy,
    .event_record = fake_event_record,
    .event_query = fake_event_query,
    .event_synchronize = fake_event_synchronize,
    .live_allocations = fake_live,
    .close = fake_close,
};

dt_status dt_device_open_fake(dt_device **out, const dt_fake_device_options *opts)
{
    dt_device *d = *out = comm_device_base_new(&fake_ops, "fake");
    if (!d)
        return DT_ENOMEM;
    fake_device *f = calloc(1, sizeof *f);
    if (!f)
        return comm_device_base_fail(d, DT_ENOMEM, "fake device: out of memory");
    if (opts)
        f->opts = *opts;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv_work, NULL);
    pthread_cond_init(&f->cv_done, NULL);
    int rc = pthread_create(&f->engine, NULL, engine_main, f);
    if (rc != 0) {
        pthread_mutex_destroy(&f->mu);
        pthread_cond_destroy(&f->cv_work);
        pthread_cond_destroy(&f->cv_done);
        free(f);
        return comm_device_base_fail(d, DT_ESYS, "fake device: cannot start the copy thread: %s",
                                     strerror(rc));
    }
    d->impl = f;
    return DT_OK;
}
