/*
 * ddp.c — DDP: gradient all-reduce in buckets, overlapped with backward.
 *
 * The idea (PyTorch's DistributedDataParallel Reducer). Backward produces
 * gradients from the last layer to the first, and the model lays tensors
 * out in forward order, so the finished gradients are a growing tail of the
 * flat buffer. Cut the buffer into buckets of whole tensors, walking from
 * the tail: bucket 0 holds the head, the last bucket the embeddings. The
 * model's backward hook (dt_grad_ready_fn) reports "everything from lo up
 * is final"; every bucket entirely above lo is launched right there as an
 * async all-reduce (avg) on its range, in place. The communicator's
 * executor thread then moves bytes while this thread computes the layers
 * below. Only the last bucket — whatever backward finishes last — must be
 * communicated with nothing left to hide it behind.
 *
 * Why buckets and not one all-reduce per tensor: each collective costs
 * 2(p-1) message latencies α on a ring, so many tiny ones are latency-bound;
 * why not one bucket: nothing would start before backward ends. 25 MB is
 * PyTorch's default; smaller buckets overlap more on small models.
 *
 * Invariants.
 * - Every rank builds the same buckets (same model, same size) and launches
 *   them in the same order (bucket 0 first), as the ordering contract of
 *   the collectives requires; the hook fires at the same points on all.
 * - A bucket is launched at most once per synced backward, and all launched
 *   ones are waited (dt_ddp_wait) before anyone reads the gradients.
 * - Without sync (no_sync) nothing is launched: gradients just accumulate
 *   locally, and the last, synced micro-step sends the sum of them all.
 *
 * --deterministic (dt_ddp_set_deterministic, rank_order.c): every
 * backward starts from zero, the running sum of the step's earlier
 * micro-steps is added into each bucket just before it is launched, the
 * all-reduce sums in rank order, and dt_ddp_wait divides by k·N.
 *
 * --grad-comm bf16 (dt_ddp_set_grad_bf16, grad_comm.c): each bucket is
 * rounded to bf16 just before it is launched and the all-reduce runs on
 * that copy; dt_ddp_wait widens the mean back into the gradients. Half
 * the bytes on the wire.
 *
 * Measuring "hidden". Ops of one communicator run one after another in
 * submission order, so bucket i is on the wire from max(submit_i,
 * done_{i-1}) to done_i; the sum of those spans is the communication time.
 * done_i is when this thread first saw the op finished (dt_work_test at
 * each hook, or the return of dt_work_wait), an upper bound that is exact
 * for the buckets waited after backward. exposed = the time dt_ddp_wait
 * blocked; hidden share = 1 - exposed / communication.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dt_optim.h"
#include "optim_internal.h"

typedef struct bucket {
    size_t lo, n;  /* range of the flat buffer, in elements */
    dt_work *work; /* in flight, or NULL */
    bool launched, done;
    double t_submit, t_done; /* seconds, dt_now() */
} bucket;

struct dt_ddp {
    dt_model *m;
    dt_comm *comm;   /* NULL: one process */
    bucket *buckets; /* [nb], bucket 0 = the tail of the flat buffer */
    int nb;
    int next;            /* first bucket not yet launched this backward */
    bool syncing;        /* the current backward launches buckets */
    optim_rank_order ro; /* --deterministic */
    optim_grad_comm gc;  /* --grad-comm bf16: a bf16 copy of the flat buffer */
    dt_status st;        /* first failure of a launch */
    char err[512];
};

static dt_status ddp_fail(dt_ddp *d, dt_status st, const char *what)
{
    if (d->st == DT_OK) {
        d->st = st;
        snprintf(d->err, sizeof d->err, "ddp (rank %d): %s: %s",
                 d->comm ? dt_comm_rank(d->comm) : 0, what,
                 d->comm && *dt_comm_error(d->comm) ? dt_comm_error(d->comm) : dt_status_name(st));
    }
    return st;
}

/* Groups whole tensors, from the last to the first, into buckets of at most
 * cap elements (a bigger tensor alone). Returns the bucket count, or -1 on
 * ENOMEM. */
static int build_buckets(bucket **out, const dt_model *m, size_t cap)
{
    bucket *b = calloc((size_t)m->num_tensors, sizeof *b);
    *out = b;
    if (!b)
        return -1;
    int nb = 0;
    size_t hi = m->num_params; /* top of the bucket being filled */
    for (int t = m->num_tensors - 1; t >= 0; t--) {
        size_t lo = m->tensors[t].offset;
        bool last = t == 0;
        size_t next_lo = last ? 0 : m->tensors[t - 1].offset;
        /* close the bucket at lo if the next tensor would overflow it */
        if (last || hi - next_lo > cap) {
            b[nb].lo = lo;
            b[nb].n = hi - lo;
            nb++;
            hi = lo;
        }
    }
    return nb;
}

dt_status dt_ddp_create(dt_ddp **out, dt_model *m, dt_comm *comm, size_t bucket_bytes)
{
    dt_ddp *d = calloc(1, sizeof *d);
    *out = d;
    if (!d)
        return DT_ENOMEM;
    d->m = m;
    d->comm = comm;
    size_t cap = (bucket_bytes ? bucket_bytes : DT_DDP_DEFAULT_BUCKET_BYTES) / sizeof(float);
    d->nb = build_buckets(&d->buckets, m, cap ? cap : 1);
    if (d->nb < 0)
        return ddp_fail(d, DT_ENOMEM, "create: out of memory for buckets");
    if (comm && dt_comm_size(comm) > 1) {
        dt_status st = dt_broadcast(comm, m->params_memory, m->num_params, DT_F32, 0);
        if (st != DT_OK)
            return ddp_fail(d, st, "create: broadcast of the parameters");
    }
    return DT_OK;
}

void dt_ddp_destroy(dt_ddp *d)
{
    if (!d)
        return;
    optim_rank_order_free(&d->ro);
    optim_grad_comm_free(&d->gc);
    free(d->buckets);
    free(d);
}

const char *dt_ddp_error(const dt_ddp *d)
{
    return d->err;
}
int dt_ddp_num_buckets(const dt_ddp *d)
{
    return d->nb;
}

void dt_ddp_bucket(const dt_ddp *d, int i, size_t *lo, size_t *n)
{
    *lo = d->buckets[i].lo;
    *n = d->buckets[i].n;
}

bool dt_ddp_bucket_times(const dt_ddp *d, int i, double *submit, double *done)
{
    const bucket *b = &d->buckets[i];
    *submit = b->t_submit;
    *done = b->t_done;
    return b->launched && b->done;
}

/* Notes, for the timing, which launched buckets have finished. */
static void poll_buckets(dt_ddp *d)
{
    for (int i = 0; i < d->next; i++) {
        bucket *b = &d->buckets[i];
        if (b->launched && !b->done && dt_work_test(b->work)) {
            b->done = true;
            b->t_done = dt_now();
        }
    }
}

/* The model's backward hook: gradients [lo, num_params) are final. */
static void on_grads_ready(void *user, size_t lo)
{
    dt_ddp *d = user;
    poll_buckets(d);
    while (d->next < d->nb && d->buckets[d->next].lo >= lo && d->st == DT_OK) {
        bucket *b = &d->buckets[d->next];
        b->t_submit = dt_now();
        optim_rank_order_fold(&d->ro, d->m->grads_memory, b->lo, b->n);
        dt_op op = {.kind = DT_OP_ALLREDUCE,
                    .recv = d->m->grads_memory + b->lo,
                    .count = b->n,
                    .dtype = DT_F32,
                    .redop = DT_AVG};
        optim_rank_order_op(&d->ro, &op);
        optim_grad_comm_pack(&d->gc, &op, b->lo);
        dt_status st = dt_submit(d->comm, &op, &b->work);
        if (st != DT_OK) {
            ddp_fail(d, st, "backward: launching a bucket's all-reduce");
            return;
        }
        b->launched = true;
        d->next++;
    }
}

/* Resets the buckets for a backward that syncs (or not); the hook to
 * install for it, NULL when nothing is sent. */
static dt_status arm(dt_ddp *d, bool sync, dt_grad_ready_fn *fn)
{
    if (d->syncing)
        return ddp_fail(d, DT_EINVAL, "backward: the last synced backward was not waited");
    bool comm = sync && d->comm && dt_comm_size(d->comm) > 1;
    d->syncing = comm;
    d->next = 0;
    for (int i = 0; i < d->nb; i++)
        d->buckets[i] = (bucket){.lo = d->buckets[i].lo, .n = d->buckets[i].n};
    *fn = comm ? on_grads_ready : NULL;
    return d->st;
}

dt_status dt_ddp_arm(dt_ddp *d, dt_grad_ready_fn *fn, void **user)
{
    *user = d;
    return arm(d, true, fn);
}

dt_status dt_ddp_backward(dt_ddp *d, float dloss, bool sync)
{
    dt_grad_ready_fn fn;
    dt_status st0 = arm(d, sync, &fn);
    if (st0 != DT_OK)
        return st0;
    dt_model *m = d->m;
    if (optim_rank_order_before(&d->ro, m->grads_memory, m->num_params, sync) != DT_OK)
        return ddp_fail(d, DT_ENOMEM, "backward: out of memory for the running sum");
    dt_model_set_grad_hook(m, fn, d);
    dt_status st = dt_model_backward(m, dloss);
    dt_model_set_grad_hook(m, NULL, NULL);
    optim_rank_order_after(&d->ro, m->grads_memory, m->num_params, sync, fn != NULL);
    if (st != DT_OK) {
        snprintf(d->err, sizeof d->err, "ddp: %s", dt_model_error(d->m));
        if (d->st == DT_OK)
            d->st = st;
    }
    return d->st;
}

/* Busy time of the launched buckets: they run one after another. */
static double comm_seconds(const dt_ddp *d)
{
    double total = 0, prev_done = 0;
    for (int i = 0; i < d->next; i++) {
        const bucket *b = &d->buckets[i];
        double start = b->t_submit > prev_done ? b->t_submit : prev_done;
        if (b->t_done > start)
            total += b->t_done - start;
        prev_done = b->t_done;
    }
    return total;
}

dt_status dt_ddp_wait(dt_ddp *d, dt_comm_stats *stats)
{
    double t0 = dt_now();
    poll_buckets(d);
    for (int i = 0; i < d->next; i++) {
        bucket *b = &d->buckets[i];
        dt_status st = dt_work_wait(b->work);
        b->work = NULL;
        if (!b->done) {
            b->done = true;
            b->t_done = dt_now();
        }
        if (st != DT_OK)
            ddp_fail(d, st, "wait: a bucket's all-reduce");
        else
            optim_grad_comm_unpack(&d->gc, d->m->grads_memory + b->lo, b->lo, b->n);
    }
    double t1 = dt_now();
    if (stats) {
        *stats = (dt_comm_stats){.ops = d->next, .hidden = -1};
        if (d->next > 0) {
            stats->comm_ms = 1e3 * comm_seconds(d);
            stats->exposed_ms = 1e3 * (t1 - t0);
            stats->hidden = dt_optim_hidden_share(stats->comm_ms, stats->exposed_ms);
        }
    }
    if (d->syncing && d->st == DT_OK && d->next != d->nb)
        ddp_fail(d, DT_EPROTO, "wait: backward did not finish every bucket");
    if (d->st == DT_OK)
        optim_rank_order_divide(&d->ro, d->m->grads_memory, d->m->num_params,
                                d->comm ? dt_comm_size(d->comm) : 1);
    d->syncing = false;
    d->next = 0;
    return d->st;
}

dt_status dt_ddp_set_grad_bf16(dt_ddp *d)
{
    char err[160];
    if (d->ro.on)
        return ddp_fail(d, DT_EINVAL, "bf16 gradients round: not with --deterministic");
    dt_status st = optim_grad_comm_enable(&d->gc, d->m, d->comm, d->m->num_params, err, sizeof err);
    return st == DT_OK ? DT_OK : ddp_fail(d, st, err);
}

dt_status dt_ddp_set_deterministic(dt_ddp *d)
{
    char err[160];
    if (d->gc.on)
        return ddp_fail(d, DT_EINVAL, "--deterministic sums fp32 gradients: not with bf16 ones");
    dt_status st = optim_rank_order_enable(&d->ro, d->m, err, sizeof err);
    return st == DT_OK ? DT_OK : ddp_fail(d, st, err);
}
