/*
 * staging_p2p.c — send and receive on device buffers, through a pool of
 * reused host buffers.
 *
 * Send and receive do not go through the executor: they run on the caller's
 * thread and may be many and outstanding at once (a pipeline stage posts
 * its receive of the next activation while it sends the last gradient).
 * So each op takes a host buffer of its own from the communicator's pool:
 *
 *   send   dt_submit: take a buffer, copy the device bytes into it, wait for
 *          the copy, post the transfer from it
 *   recv   dt_submit: take a buffer, post the transfer into it;
 *          dt_work_wait: copy it to the device, wait, give the buffer back
 *
 * The copies are synchronous (the caller waits for its event): p2p buffers
 * are not cut into pieces, so there is nothing to overlap them with. The
 * bytes of a receive reach the device inside dt_work_wait, so dt_work_test
 * may report done a little before they have.
 *
 * The pool. Buffers are pinned when the device gives pinned memory (pageable
 * with one warning when not), sized in powers of two from 64 KiB so that
 * messages of similar sizes share them, and kept until dt_comm_destroy: a
 * steady stream of sends and receives allocates nothing after its first
 * round. The pool holds as many buffers as were ever outstanding at once.
 * One stream serves every copy; each buffer has its own event.
 */
#include <stdlib.h>
#include <string.h>

#include "dt_device.h"
#include "staging.h"

#define P2P_MIN_BYTES ((size_t)64 * 1024)

typedef struct p2p_buf {
    struct p2p_buf *next;
    char *data;
    size_t cap;
    bool pinned;
    dt_device_event *event;
} p2p_buf;

typedef struct p2p_pool {
    pthread_mutex_t mu; /* guards the lists and warned */
    dt_device_stream *stream;
    p2p_buf *idle, *busy;
    bool warned;
} p2p_pool;

static dt_status p2p_fail(dt_stager *sg, dt_status st, const char *what)
{
    sg->report->fail(sg->owner, st, "rank %d: staging through %s: %s: %s", sg->rank,
                     dt_device_name(sg->device), what, dt_device_error(sg->device));
    return st;
}

/* The pool, made on first use (under mu: any API thread may get here). */
static p2p_pool *pool_of(dt_stager *sg)
{
    pthread_mutex_lock(sg->mu);
    p2p_pool *p = sg->p2p_pool;
    if (!p && (p = calloc(1, sizeof *p)) != NULL) {
        pthread_mutex_init(&p->mu, NULL);
        if (dt_device_stream_create(sg->device, &p->stream) != DT_OK) {
            pthread_mutex_destroy(&p->mu);
            free(p);
            p = NULL;
        } else {
            sg->p2p_pool = p;
        }
    }
    pthread_mutex_unlock(sg->mu);
    return p;
}

static void buf_free(dt_device *d, p2p_buf *b)
{
    if (b->pinned)
        dt_device_pinned_free(d, b->data);
    else
        free(b->data);
    dt_device_event_destroy(d, b->event);
    free(b);
}

/* A new buffer of at least `bytes`: pinned if possible. */
static p2p_buf *buf_new(dt_stager *sg, p2p_pool *p, size_t bytes)
{
    p2p_buf *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    for (b->cap = P2P_MIN_BYTES; b->cap < bytes; b->cap *= 2) {}
    if (dt_device_event_create(sg->device, &b->event) != DT_OK) {
        free(b);
        return NULL;
    }
    b->pinned = dt_device_pinned_alloc(sg->device, (void **)&b->data, b->cap) == DT_OK;
    if (!b->pinned) {
        pthread_mutex_lock(&p->mu);
        bool warn = !p->warned;
        p->warned = true;
        pthread_mutex_unlock(&p->mu);
        if (warn)
            sg->report->log(sg->owner,
                            "rank %d: warning: %s: no pinned host memory for send/recv (%s); "
                            "using pageable memory",
                            sg->rank, dt_device_name(sg->device), dt_device_error(sg->device));
        b->data = malloc(b->cap);
    }
    if (!b->data) {
        buf_free(sg->device, b);
        return NULL;
    }
    return b;
}

/* An idle buffer of at least `bytes` (the smallest), or a new one; busy. */
static p2p_buf *buf_take(dt_stager *sg, p2p_pool *p, size_t bytes)
{
    pthread_mutex_lock(&p->mu);
    p2p_buf **best = NULL;
    for (p2p_buf **it = &p->idle; *it; it = &(*it)->next)
        if ((*it)->cap >= bytes && (!best || (*it)->cap < (*best)->cap))
            best = it;
    p2p_buf *b = best ? *best : NULL;
    if (b)
        *best = b->next;
    pthread_mutex_unlock(&p->mu);
    if (!b && !(b = buf_new(sg, p, bytes)))
        return NULL;
    pthread_mutex_lock(&p->mu);
    b->next = p->busy;
    p->busy = b;
    pthread_mutex_unlock(&p->mu);
    return b;
}

/* The busy buffer b, back to idle. */
static void buf_give(p2p_pool *p, p2p_buf *b)
{
    pthread_mutex_lock(&p->mu);
    p2p_buf **it = &p->busy;
    while (*it && *it != b)
        it = &(*it)->next;
    if (*it) {
        *it = b->next;
        b->next = p->idle;
        p->idle = b;
    }
    pthread_mutex_unlock(&p->mu);
}

/* The busy buffer whose data is `data`, or NULL. */
static p2p_buf *buf_busy(p2p_pool *p, const char *data)
{
    pthread_mutex_lock(&p->mu);
    p2p_buf *b = p->busy;
    while (b && b->data != data)
        b = b->next;
    pthread_mutex_unlock(&p->mu);
    return b;
}

/* One synchronous copy through buffer b, for p2p op `op`: bounded by the
 * op's timeout, so a hung device fails the send or receive instead of
 * hanging it. */
static dt_status copy_now(dt_stager *sg, p2p_pool *p, p2p_buf *b, const dt_op *op, void *dev,
                          size_t bytes, bool to_host)
{
    dt_device *d = sg->device;
    double timeout = op->timeout_s > 0 ? op->timeout_s : sg->timeout_s;
    const char *what = to_host ? "send: copying to the host" : "recv: copying to the device";
    dt_status st = to_host ? dt_device_copy_d2h(d, b->data, dev, bytes, p->stream)
                           : dt_device_copy_h2d(d, dev, b->data, bytes, p->stream);
    if (st == DT_OK)
        st = dt_device_event_record(d, b->event, p->stream);
    if (st == DT_OK)
        st = dt_device_event_wait(d, b->event, dt_now() + timeout);
    if (st == DT_ETIMEDOUT) {
        sg->report->fail(sg->owner, st,
                         "rank %d: %s with rank %d (tag %u): %s: %s did not complete within the "
                         "op's %.1f s; is the device hung?",
                         sg->rank, dt_op_name(op->kind), op->peer, op->tag, dt_device_name(d), what,
                         timeout);
        return st;
    }
    return st == DT_OK ? DT_OK : p2p_fail(sg, st, what);
}

dt_status comm_staging_p2p_begin(dt_stager *sg, dt_op *op, bool *staged, void **device_buf)
{
    size_t bytes = op->count * dt_dtype_size(op->dtype);
    bool send = op->kind == DT_OP_SEND;
    char *dev = send ? (char *)op->send : op->recv;
    if (bytes == 0 || !dt_device_owns(sg->device, dev)) {
        *staged = false;
        return DT_OK;
    }
    p2p_pool *p = pool_of(sg);
    p2p_buf *b = p ? buf_take(sg, p, bytes) : NULL;
    if (!b)
        return DT_ENOMEM;
    if (send) {
        dt_status st = copy_now(sg, p, b, op, dev, bytes, true);
        if (st != DT_OK) {
            buf_give(p, b);
            return st;
        }
        op->send = b->data;
    } else {
        op->recv = b->data;
    }
    *device_buf = dev;
    return DT_OK;
}

dt_status comm_staging_p2p_end(dt_stager *sg, dt_op *op, bool staged, void *device_buf,
                               dt_status st)
{
    if (!staged || (op->kind != DT_OP_SEND && op->kind != DT_OP_RECV))
        return st;
    p2p_pool *p = sg->p2p_pool; /* made by comm_staging_p2p_begin */
    p2p_buf *b = buf_busy(p, op->kind == DT_OP_SEND ? op->send : op->recv);
    if (!b)
        return st; /* not from the pool: cannot happen */
    if (op->kind == DT_OP_RECV && st == DT_OK)
        st = copy_now(sg, p, b, op, device_buf, op->count * dt_dtype_size(op->dtype), false);
    buf_give(p, b);
    return st;
}

void comm_staging_p2p_destroy(dt_stager *sg)
{
    p2p_pool *p = sg->p2p_pool;
    if (!p)
        return;
    p2p_buf *lists[2] = {p->idle, p->busy}; /* busy: works never waited */
    for (int i = 0; i < 2; i++)
        while (lists[i]) {
            p2p_buf *b = lists[i];
            lists[i] = b->next;
            buf_free(sg->device, b);
        }
    dt_device_stream_destroy(sg->device, p->stream);
    pthread_mutex_destroy(&p->mu);
    free(p);
    sg->p2p_pool = NULL;
}
