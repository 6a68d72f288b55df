/*
 * test_staging.c — collectives and p2p on device buffers, staged through
 * host memory, on the fake device (no GPU needed).
 *
 * The specification: an op on device buffers leaves the device buffers
 * bitwise equal to what the same op leaves in host buffers, for every
 * collective, dtype, reduction, world size 1-5 and count from 0 to several
 * 1 MiB staging pieces. Each rank runs every case twice — on host buffers,
 * then on device buffers holding the same inputs — and compares bytes.
 * Float inputs are inexact (their sums round), so a staged op that reduced
 * in another order would differ in the last bits.
 *
 * The fake device makes the mistakes staging can make visible: its device
 * pointers fault when the host reads them, its copies run late on another
 * thread (copy_delay_us), and a copy to the host poisons its destination
 * until it has run, so an algorithm that reads a piece before waiting for
 * it sees 0xA5 bytes and fails the comparison. What a dying rank or a hung
 * device does to staged ops is test_staging_failure.c's.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>

#include "collective_data.h"
#include "dt_device.h"
#include "rank_devices.h"
#include "rank_threads.h"

#define TEST_TIMEOUT_S 240.0
#define COPY_DELAY_US 30

static bool copy_wait(rank_ctx *rc, rank_dev *d, void *dst, const void *src, size_t n,
                      bool to_device)
{
    dt_status st = to_device ? dt_device_copy_h2d(d->dev, dst, src, n, d->stream)
                             : dt_device_copy_d2h(d->dev, dst, src, n, d->stream);
    if (st == DT_OK)
        st = dt_device_event_record(d->dev, d->event, d->stream);
    if (st == DT_OK)
        st = dt_device_event_synchronize(d->dev, d->event);
    return st == DT_OK || rank_fail(rc, "test copy: %s", dt_device_error(d->dev));
}

/* A device buffer holding a copy of host[0..n). */
static char *to_device(rank_ctx *rc, rank_dev *d, const void *host, size_t n)
{
    void *p = NULL;
    if (n == 0)
        return NULL;
    if (dt_device_alloc(d->dev, &p, n) != DT_OK) {
        rank_fail(rc, "device alloc: %s", dt_device_error(d->dev));
        return NULL;
    }
    return copy_wait(rc, d, p, host, n, true) ? p : NULL;
}

/* Inexact floats (sums round, so order shows) and exact small integers. */
static void fill_input(void *buf, size_t n, dt_dtype t, dt_redop op, int rank, int salt)
{
    if (t == DT_F32 || t == DT_F64 || t == DT_F16 || t == DT_BF16) {
        for (size_t i = 0; i < n; i++) {
            uint64_t h = element_hash(i * 31 + (size_t)rank * 7919 + (size_t)salt);
            double v = ((double)(h % 20001) - 10000.0) / 997.0;
            if (op == DT_PROD)
                v = 0.5 + (double)(h % 1000) / 1000.0;
            put_value(buf, i, t, v);
        }
    } else {
        fill_reduction_input(buf, n, t, op, rank + salt);
    }
}

/* The bytes of send and recv this rank uses for op kind k. */
static void sizes(const dt_op *o, int rank, int p, size_t *send, size_t *recv)
{
    size_t n = o->count * dt_dtype_size(o->dtype), pp = (size_t)p;
    bool root = o->root == rank;
    *send = *recv = 0;
    switch (o->kind) {
    case DT_OP_ALLREDUCE:
    case DT_OP_BROADCAST:
    case DT_OP_REDUCE: *recv = n; break;
    case DT_OP_REDUCE_SCATTER:
        *send = pp * n;
        *recv = n;
        break;
    case DT_OP_ALLGATHER:
        *send = n;
        *recv = pp * n;
        break;
    case DT_OP_ALLGATHERV:
        *send = o->counts[rank] * dt_dtype_size(o->dtype);
        for (int q = 0; q < p; q++)
            *recv += o->counts[q] * dt_dtype_size(o->dtype);
        break;
    case DT_OP_GATHER:
        *send = n;
        *recv = root ? pp * n : 0;
        break;
    case DT_OP_SCATTER:
        *send = root ? pp * n : 0;
        *recv = n;
        break;
    case DT_OP_ALLTOALL: *send = *recv = pp * n; break;
    default: break;
    }
}

/* In place: the byte offset of the inner buffer in the outer one (AG: send
 * in recv; RS: recv in send; all-to-all: one buffer). */
static size_t in_place_offset(const dt_op *o, int rank)
{
    size_t es = dt_dtype_size(o->dtype), off = 0;
    if (o->kind == DT_OP_ALLTOALL)
        off = 0;
    else if (o->kind == DT_OP_ALLGATHERV)
        for (int q = 0; q < rank; q++)
            off += o->counts[q] * es;
    else
        off = (size_t)rank * o->count * es;
    return off;
}

/* Host inputs: send, then recv (its initial contents matter to all-reduce,
 * broadcast and reduce); in place, one buffer. */
typedef struct bufs {
    char *send, *recv, *own; /* own: what to free */
    size_t sb, rb;
} bufs;

static void make_inputs(bufs *b, const dt_op *o, int rank, int p, bool in_place)
{
    sizes(o, rank, p, &b->sb, &b->rb);
    size_t es = dt_dtype_size(o->dtype);
    bool rs = o->kind == DT_OP_REDUCE_SCATTER;
    size_t outer = rs ? b->sb : b->rb;
    if (!in_place) {
        b->own = xmalloc(b->sb + b->rb);
        b->send = b->own;
        b->recv = b->own + b->sb;
    } else {
        b->own = xmalloc(outer);
        size_t off = in_place_offset(o, rank);
        b->send = rs ? b->own : b->own + off;
        b->recv = rs ? b->own + off : b->own;
    }
    fill_input(b->recv, b->rb / es, o->dtype, o->redop, rank, 2);
    fill_input(b->send, b->sb / es, o->dtype, o->redop, rank, 1);
}

/*
 * Runs `o` on host buffers, then on device buffers holding the same inputs,
 * and compares the receive buffers byte for byte. False when the job cannot
 * go on.
 */
static bool host_vs_device(rank_ctx *rc, dt_op o, bool in_place, const char *label)
{
    rank_dev *d = &((job_arg *)rc->arg)->rd[rc->rank];
    bufs h, init;
    make_inputs(&h, &o, rc->rank, rc->world, in_place);
    make_inputs(&init, &o, rc->rank, rc->world, in_place);
    size_t total = in_place ? (o.kind == DT_OP_REDUCE_SCATTER ? h.sb : h.rb) : h.sb + h.rb;
    char *dev = to_device(rc, d, init.own, total), *got = xmalloc(h.rb);
    bool ok = dev || total == 0;

    dt_op ho = o; /* pointers even for 0 B: all-gatherv wants one on every rank */
    ho.send = h.send;
    ho.recv = h.recv;
    dt_status st = ok ? dt_run(rc->comm, &ho) : DT_OK;
    ok = ok && (st == DT_OK || rank_fail(rc, "%s on host: %s: %s", label, dt_status_name(st),
                                         dt_comm_error(rc->comm)));
    o.send = dev ? dev + (h.send - h.own) : h.send;
    o.recv = dev ? dev + (h.recv - h.own) : h.recv;
    if (ok) {
        st = dt_run(rc->comm, &o);
        ok = st == DT_OK || rank_fail(rc, "%s on device: %s: %s", label, dt_status_name(st),
                                      dt_comm_error(rc->comm));
    }
    if (ok && h.rb && copy_wait(rc, d, got, o.recv, h.rb, false) &&
        memcmp(got, h.recv, h.rb) != 0) {
        size_t i = 0;
        while (got[i] == h.recv[i])
            i++;
        rank_fail(rc, "%s: byte %zu of %zu differs: device %#x, host %#x", label, i, h.rb,
                  (unsigned char)got[i], (unsigned char)h.recv[i]);
    }
    dt_device_free(d->dev, dev);
    free(h.own);
    free(init.own);
    free(got);
    ((job_arg *)rc->arg)->cases += rc->rank == 0;
    return ok;
}

/* ---- the matrix ------------------------------------------------------------------ */

typedef struct plan {
    dt_op_kind kind;
    dt_algo algo;
    bool in_place;
} plan;

static const plan PLANS[] = {
    {DT_OP_ALLREDUCE, DT_ALGO_AUTO, false},
    {DT_OP_ALLREDUCE, DT_ALGO_RING, false},
    {DT_OP_ALLREDUCE, DT_ALGO_RECURSIVE_DOUBLING, false},
    {DT_OP_REDUCE_SCATTER, DT_ALGO_AUTO, false},
    {DT_OP_REDUCE_SCATTER, DT_ALGO_AUTO, true},
    {DT_OP_ALLGATHER, DT_ALGO_AUTO, false},
    {DT_OP_ALLGATHER, DT_ALGO_AUTO, true},
    {DT_OP_ALLGATHERV, DT_ALGO_AUTO, false},
    {DT_OP_BROADCAST, DT_ALGO_TREE, false},
    {DT_OP_BROADCAST, DT_ALGO_CHAIN, false},
    {DT_OP_REDUCE, DT_ALGO_AUTO, false},
    {DT_OP_GATHER, DT_ALGO_AUTO, false},
    {DT_OP_SCATTER, DT_ALGO_AUTO, false},
    {DT_OP_ALLTOALL, DT_ALGO_AUTO, false},
    {DT_OP_ALLTOALL, DT_ALGO_AUTO, true},
};

static bool reduces(dt_op_kind k)
{
    return k == DT_OP_ALLREDUCE || k == DT_OP_REDUCE_SCATTER || k == DT_OP_REDUCE;
}

/* Counts: nothing, one element, a few, and several 1 MiB staging pieces
 * (the last only for f32 and bf16 sums and averages, to bound the time). */
static int counts_for(dt_dtype t, dt_redop op, size_t out[5])
{
    int n = 0;
    out[n++] = 0;
    out[n++] = 1;
    out[n++] = 7;
    out[n++] = 1000;
    if ((t == DT_F32 || t == DT_BF16) && (op == DT_SUM || op == DT_AVG))
        out[n++] = ((size_t)5 << 19) / dt_dtype_size(t) + 3; /* 2.5 MiB + a bit */
    return n;
}

static bool run_plan_case(rank_ctx *rc, const plan *pl, dt_dtype t, dt_redop r, size_t n)
{
    size_t counts[RANK_THREADS_MAX];
    for (int q = 0; q < rc->world; q++)
        counts[q] = q % 3 == 1 ? 0 : n + (size_t)q;
    dt_op o = {.kind = pl->kind,
               .count = n,
               .dtype = t,
               .redop = r,
               .algo = pl->algo,
               .root = rc->world - 1};
    if (pl->kind == DT_OP_ALLGATHERV) {
        o.counts = counts;
        o.count = counts[rc->rank];
    }
    char label[160];
    snprintf(label, sizeof label, "%s%s algo %d %s %s count %zu, world %d", dt_op_name(pl->kind),
             pl->in_place ? " in place" : "", pl->algo, dt_dtype_name(t), dt_redop_name(r), n,
             rc->world);
    return host_vs_device(rc, o, pl->in_place, label);
}

static void rank_every_collective(rank_ctx *rc)
{
    for (size_t i = 0; i < sizeof PLANS / sizeof PLANS[0]; i++) {
        const plan *pl = &PLANS[i];
        for (int t = 0; t < DT_NUM_DTYPES; t++)
            for (int r = 0; r < DT_NUM_REDOPS; r++) {
                if (reduces(pl->kind) ? !dt_redop_supports(r, t) : r != DT_SUM)
                    continue;
                size_t counts[5];
                int nc = counts_for(t, r, counts);
                for (int c = 0; c < nc; c++)
                    if (!run_plan_case(rc, pl, t, r, counts[c]))
                        return;
            }
    }
}

static void run_on_fake(int world, rank_fn fn, dt_fake_device_options *o)
{
    job_arg a = {0};
    dt_device *devs[RANK_THREADS_MAX];
    open_devices(&a, devs, world, o);
    rank_job job;
    int failed = rank_threads_run_on(&job, world, fn, &a, devs);
    close_devices(&a, world);
    for (int r = 0; r < world; r++)
        cr_expect_not(job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}

/* Needs a GPU (skips without one): the same matrix with real pinned memory,
 * streams and DMA, every rank (thread) on device 0. */
ParameterizedTestParameters(staging, every_collective_on_cuda_buffers_equals_the_host_result)
{
    static int worlds[] = {1, 2, 3, 4, 5};
    return cr_make_param_array(int, worlds, sizeof worlds / sizeof worlds[0]);
}
ParameterizedTest(int *world, staging, every_collective_on_cuda_buffers_equals_the_host_result,
                  .timeout = TEST_TIMEOUT_S)
{
    job_arg a = {0};
    dt_device *devs[RANK_THREADS_MAX];
    char err[512];
    for (int r = 0; r < *world; r++) {
        rank_dev *d = &a.rd[r];
        if (dt_device_open(&d->dev, "cuda", err, sizeof err) != DT_OK) {
            dt_device_close(d->dev);
            for (int k = 0; k < r; k++)
                dt_device_close(a.rd[k].dev);
            cr_skip_test("needs a CUDA device: %s", err);
        }
        cr_assert_eq(dt_device_stream_create(d->dev, &d->stream), DT_OK, "%s",
                     dt_device_error(d->dev));
        cr_assert_eq(dt_device_event_create(d->dev, &d->event), DT_OK, "%s",
                     dt_device_error(d->dev));
        devs[r] = d->dev;
    }
    rank_job job;
    int failed = rank_threads_run_on(&job, *world, rank_every_collective, &a, devs);
    for (int r = 0; r < *world; r++) {
        dt_device_event_destroy(a.rd[r].dev, a.rd[r].event);
        dt_device_stream_destroy(a.rd[r].dev, a.rd[r].stream);
        dt_device_close(a.rd[r].dev);
        cr_expect_not(job.ranks[r].failed, "rank %d: %s", r, job.ranks[r].msg);
    }
    cr_assert_eq(failed, 0);
}

ParameterizedTestParameters(staging, every_collective_on_device_buffers_equals_the_host_result)
{
    static int worlds[] = {1, 2, 3, 4, 5};
    return cr_make_param_array(int, worlds, sizeof worlds / sizeof worlds[0]);
}
ParameterizedTest(int *world, staging, every_collective_on_device_buffers_equals_the_host_result,
                  .timeout = TEST_TIMEOUT_S)
{
    dt_fake_device_options o = {.copy_delay_us = COPY_DELAY_US};
    run_on_fake(*world, rank_every_collective, &o);
}

/* ---- send and receive ------------------------------------------------------------- */

/* Each rank sends a device buffer to its right neighbour and receives its
 * left neighbour's into another device buffer; one of the two pairs uses a
 * host send buffer, so mixed ops are covered. */
static void rank_p2p_ring(rank_ctx *rc)
{
    rank_dev *d = &((job_arg *)rc->arg)->rd[rc->rank];
    const size_t n = ((size_t)3 << 19) / 4 + 5; /* 1.5 MiB of f32, and a bit */
    const int right = (rc->rank + 1) % rc->world, left = (rc->rank + rc->world - 1) % rc->world;
    float *mine = xmalloc(n * 4), *want = xmalloc(n * 4), *got = xmalloc(n * 4);
    fill_block(mine, n, DT_F32, rc->rank, right);
    fill_block(want, n, DT_F32, left, rc->rank);
    char *dsend = to_device(rc, d, mine, n * 4), *drecv = to_device(rc, d, got, n * 4);
    for (int round = 0; round < 2 && dsend && drecv; round++) {
        const void *src = round == 0 ? (const void *)dsend : (const void *)mine;
        dt_work *ws, *wr;
        int source = -1;
        dt_status st = dt_recv_async(rc->comm, drecv, n, DT_F32, left, 7, &source, &wr);
        if (st == DT_OK) {
            st = dt_send_async(rc->comm, src, n, DT_F32, right, 7, &ws);
            dt_status st2 = st == DT_OK ? dt_work_wait(ws) : st;
            st = dt_work_wait(wr);
            if (st == DT_OK)
                st = st2;
        }
        if (st != DT_OK) {
            rank_fail(rc, "round %d: %s: %s", round, dt_status_name(st), dt_comm_error(rc->comm));
            break;
        }
        if (copy_wait(rc, d, got, drecv, n * 4, false) && memcmp(got, want, n * 4) != 0)
            rank_fail(rc, "round %d: the received device buffer differs from rank %d's", round,
                      left);
        if (source != left)
            rank_fail(rc, "round %d: source %d, expected %d", round, source, left);
    }
    dt_device_free(d->dev, dsend);
    dt_device_free(d->dev, drecv);
    free(mine);
    free(want);
    free(got);
}

Test(staging, send_and_recv_move_device_buffers_between_ranks, .timeout = TEST_TIMEOUT_S)
{
    dt_fake_device_options o = {.copy_delay_us = COPY_DELAY_US};
    run_on_fake(3, rank_p2p_ring, &o);
}

/* Ten rounds of one send and one receive: the pool's two buffers serve them
 * all (live allocations: the two device buffers, two pool buffers). */
static void rank_p2p_reuses_buffers(rank_ctx *rc)
{
    rank_dev *d = &((job_arg *)rc->arg)->rd[rc->rank];
    const size_t n = 100000;
    const int right = (rc->rank + 1) % rc->world, left = (rc->rank + rc->world - 1) % rc->world;
    float *host = xmalloc(n * 4);
    fill_block(host, n, DT_F32, rc->rank, right);
    char *dsend = to_device(rc, d, host, n * 4), *drecv = to_device(rc, d, host, n * 4);
    for (int round = 0; round < 10 && dsend && drecv; round++) {
        dt_work *ws, *wr;
        dt_status st = dt_recv_async(rc->comm, drecv, n, DT_F32, left, 1, NULL, &wr);
        if (st == DT_OK && dt_send_async(rc->comm, dsend, n, DT_F32, right, 1, &ws) == DT_OK)
            st = dt_work_wait(ws);
        st = st == DT_OK ? dt_work_wait(wr) : st;
        if (st != DT_OK) {
            rank_fail(rc, "round %d: %s: %s", round, dt_status_name(st), dt_comm_error(rc->comm));
            break;
        }
    }
    size_t live = dt_device_fake_live_allocations(d->dev);
    if (live > 4)
        rank_fail(rc, "%zu live allocations after 10 rounds: the pool did not reuse", live);
    dt_device_free(d->dev, dsend);
    dt_device_free(d->dev, drecv);
    free(host);
}

Test(staging, repeated_sends_and_receives_reuse_their_host_buffers, .timeout = TEST_TIMEOUT_S)
{
    dt_fake_device_options o = {0};
    run_on_fake(2, rank_p2p_reuses_buffers, &o);
}

/* ---- no pinned memory ------------------------------------------------------------- */

static void rank_allreduce_large_and_p2p(rank_ctx *rc)
{
    dt_op o = {.kind = DT_OP_ALLREDUCE, .count = (size_t)3 << 18, .dtype = DT_F32, .redop = DT_SUM};
    if (host_vs_device(rc, o, false, "allreduce 3 MiB"))
        rank_p2p_ring(rc);
}

Test(staging, a_refused_pinned_allocation_falls_back_to_pageable_memory, .timeout = TEST_TIMEOUT_S)
{
    dt_fake_device_options o = {.copy_delay_us = COPY_DELAY_US, .fail_pinned_alloc = true};
    run_on_fake(3, rank_allreduce_large_and_p2p, &o);
}
