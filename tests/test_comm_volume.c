/*
 * test_comm_volume.c — the transport's byte counters (dt_comm_traffic):
 * what a collective moves per rank is its closed form, counted exactly.
 *
 * The counters hold payload bytes (the frame headers are counted as frames:
 * DT_FRAME_HEADER_BYTES each on dtrain's wire), so every expectation here
 * is a closed form in the element count n, the element size and the world
 * size p, taken as the difference of two readings around one op:
 *
 *   ring all-reduce        sent = received = 2 (p-1)/p · n · size,
 *                          2 (p-1) frames (one per chunk and step: chunks
 *                          below the ring's 1 MiB segment)
 *   recursive doubling     log2 p · n · size, log2 p frames (p a power of 2)
 *   send / recv            the buffer, one frame, on the two ends only
 *
 * A group made by dt_comm_split has its own connections, so its op counts
 * on the group and leaves the parent's counters where they were. The gloo
 * wire is counted too: torch's ring sends the same 2 (p-1)/p of the buffer,
 * in 2 (numSeg - numSeg/p) data messages (collectives/gloo/allreduce_ring.c).
 *
 * Ranks run as threads (rank_threads.h) over loopback TCP, every op bounded
 * by the communicators' timeouts and every test by Criterion's.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "rank_threads.h"

typedef struct volume_case {
    size_t count;  /* floats in the buffer */
    dt_algo algo;  /* forced */
    uint64_t sent; /* expected per rank: payload bytes, frames */
    uint64_t frames;
} volume_case;

static bool expect_delta(rank_ctx *rc, const char *what, const dt_traffic *before,
                         const dt_traffic *after, uint64_t bytes, uint64_t frames)
{
    uint64_t s = after->sent_bytes - before->sent_bytes;
    uint64_t r = after->recv_bytes - before->recv_bytes;
    uint64_t sf = after->sent_frames - before->sent_frames;
    uint64_t rf = after->recv_frames - before->recv_frames;
    if (s != bytes || r != bytes || sf != frames || rf != frames)
        return rank_fail(rc,
                         "rank %d: %s: sent %llu B in %llu frames, received %llu B in %llu "
                         "frames; expected %llu B in %llu frames each way",
                         rc->rank, what, (unsigned long long)s, (unsigned long long)sf,
                         (unsigned long long)r, (unsigned long long)rf, (unsigned long long)bytes,
                         (unsigned long long)frames);
    return true;
}

static void allreduce_volume(rank_ctx *rc)
{
    const volume_case *vc = rc->arg;
    float *buf = malloc(vc->count * sizeof(float));
    if (!buf) {
        rank_fail(rc, "rank %d: out of memory", rc->rank);
        return;
    }
    for (size_t i = 0; i < vc->count; i++)
        buf[i] = (float)(rc->rank + 1);
    dt_op op = {.kind = DT_OP_ALLREDUCE,
                .recv = buf,
                .count = vc->count,
                .dtype = DT_F32,
                .redop = DT_SUM,
                .algo = vc->algo};
    dt_traffic before, after;
    dt_comm_traffic(rc->comm, &before);
    dt_status st = dt_run(rc->comm, &op);
    dt_comm_traffic(rc->comm, &after);
    if (st != DT_OK)
        rank_fail(rc, "rank %d: all-reduce: %s", rc->rank, dt_comm_error(rc->comm));
    else if (buf[0] != (float)(rc->world * (rc->world + 1) / 2))
        rank_fail(rc, "rank %d: all-reduce gave %g", rc->rank, (double)buf[0]);
    else
        expect_delta(rc, "all-reduce", &before, &after, vc->sent, vc->frames);
    free(buf);
}

static void run_case(int world, const volume_case *vc)
{
    rank_job job;
    int failed = rank_threads_run(&job, world, allreduce_volume, (void *)vc);
    for (int r = 0; r < world; r++)
        cr_expect(!job.ranks[r].failed, "%s", job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}

/* 256 Ki floats = 1 MiB: each ring chunk is under one 1 MiB segment. */
#define N_FLOATS ((size_t)256 * 1024)
#define N_BYTES (N_FLOATS * sizeof(float))

Test(comm_volume, a_ring_all_reduce_on_2_ranks_sends_and_receives_the_buffer_once, .timeout = 60)
{
    volume_case vc = {N_FLOATS, DT_ALGO_RING, 2 * 1 * N_BYTES / 2, 2 * 1};
    run_case(2, &vc);
}

Test(comm_volume, a_ring_all_reduce_on_4_ranks_moves_two_times_three_quarters_per_rank,
     .timeout = 60)
{
    volume_case vc = {N_FLOATS, DT_ALGO_RING, 2 * 3 * N_BYTES / 4, 2 * 3};
    run_case(4, &vc);
}

Test(comm_volume, recursive_doubling_on_4_ranks_moves_the_whole_buffer_twice_per_rank,
     .timeout = 60)
{
    volume_case vc = {1024, DT_ALGO_RECURSIVE_DOUBLING, 2 * 1024 * sizeof(float), 2};
    run_case(4, &vc);
}

static void fresh_moves_nothing(rank_ctx *rc)
{
    dt_traffic t;
    dt_comm_traffic(rc->comm, &t);
    if (t.sent_bytes || t.recv_bytes || t.sent_frames || t.recv_frames)
        rank_fail(rc, "rank %d: a fresh communicator counts %llu B sent, %llu B received", rc->rank,
                  (unsigned long long)t.sent_bytes, (unsigned long long)t.recv_bytes);
}

Test(comm_volume, a_fresh_communicator_has_counted_nothing_the_handshake_is_not_payload,
     .timeout = 60)
{
    rank_job job;
    int failed = rank_threads_run(&job, 3, fresh_moves_nothing, NULL);
    for (int r = 0; r < 3; r++)
        cr_expect(!job.ranks[r].failed, "%s", job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}

/* Rank 0 sends 1000 doubles to rank 1; rank 2 looks on. */
static void send_recv_volume(rank_ctx *rc)
{
    double buf[1000] = {0};
    dt_traffic before, after;
    dt_comm_traffic(rc->comm, &before);
    dt_status st = DT_OK;
    if (rc->rank == 0)
        st = dt_send(rc->comm, buf, 1000, DT_F64, 1, 7);
    else if (rc->rank == 1)
        st = dt_recv(rc->comm, buf, 1000, DT_F64, 0, 7, NULL);
    if (st != DT_OK) {
        rank_fail(rc, "rank %d: send/recv: %s", rc->rank, dt_comm_error(rc->comm));
        return;
    }
    dt_comm_traffic(rc->comm, &after);
    uint64_t s = after.sent_bytes - before.sent_bytes, r = after.recv_bytes - before.recv_bytes;
    uint64_t want_s = rc->rank == 0 ? sizeof buf : 0, want_r = rc->rank == 1 ? sizeof buf : 0;
    if (s != want_s || r != want_r || after.sent_frames - before.sent_frames != (want_s ? 1 : 0) ||
        after.recv_frames - before.recv_frames != (want_r ? 1 : 0))
        rank_fail(rc, "rank %d: sent %llu B, received %llu B; expected %llu and %llu", rc->rank,
                  (unsigned long long)s, (unsigned long long)r, (unsigned long long)want_s,
                  (unsigned long long)want_r);
    rank_sync(rc); /* rank 2 keeps its communicator until the pair is done */
}

Test(comm_volume, a_send_counts_its_buffer_on_the_sender_and_the_receiver_only, .timeout = 60)
{
    rank_job job;
    int failed = rank_threads_run(&job, 3, send_recv_volume, NULL);
    for (int r = 0; r < 3; r++)
        cr_expect(!job.ranks[r].failed, "%s", job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}

/* World of 4 split into {0,1} and {2,3}: a ring all-reduce on the group
 * counts 2 (2-1)/2 · n on the group and nothing on the world. */
static void group_volume(rank_ctx *rc)
{
    dt_comm *half = NULL;
    if (dt_comm_split(rc->comm, rc->rank / 2, rc->rank, &half) != DT_OK) {
        rank_fail(rc, "rank %d: split: %s", rc->rank, dt_comm_error(rc->comm));
        return;
    }
    float *buf = calloc(N_FLOATS, sizeof(float));
    dt_traffic w0, w1, g0, g1;
    dt_comm_traffic(rc->comm, &w0);
    dt_comm_traffic(half, &g0);
    dt_op op = {.kind = DT_OP_ALLREDUCE,
                .recv = buf,
                .count = N_FLOATS,
                .dtype = DT_F32,
                .redop = DT_SUM,
                .algo = DT_ALGO_RING};
    dt_status st = buf ? dt_run(half, &op) : DT_ENOMEM;
    dt_comm_traffic(rc->comm, &w1);
    dt_comm_traffic(half, &g1);
    if (st != DT_OK)
        rank_fail(rc, "rank %d: group all-reduce: %s", rc->rank, dt_comm_error(half));
    else if (expect_delta(rc, "the group's all-reduce, on the group", &g0, &g1, N_BYTES, 2))
        expect_delta(rc, "the group's all-reduce, on the world", &w0, &w1, 0, 0);
    if (g0.sent_bytes != 0)
        rank_fail(rc, "rank %d: a new group counts %llu B already", rc->rank,
                  (unsigned long long)g0.sent_bytes);
    free(buf);
    dt_comm_destroy(half);
}

Test(comm_volume, a_groups_traffic_is_its_own_and_not_its_parents, .timeout = 60)
{
    rank_job job;
    int failed = rank_threads_run(&job, 4, group_volume, NULL);
    for (int r = 0; r < 4; r++)
        cr_expect(!job.ranks[r].failed, "%s", job.ranks[r].msg);
    cr_assert_eq(failed, 0);
}

/* ---- the gloo wire ------------------------------------------------------------ */

typedef struct gloo_rank {
    int rank, size;
    const char *url;
    const volume_case *vc;
    char err[512];
} gloo_rank;

static void *gloo_rank_main(void *p)
{
    gloo_rank *g = p;
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = g->rank;
    o.world_size = g->size;
    o.init_url = g->url;
    o.wire = DT_WIRE_GLOO;
    o.timeout_s = RANK_OP_TIMEOUT_S;
    o.init_timeout_s = RANK_INIT_TIMEOUT_S;
    dt_comm *c = NULL;
    float *buf = calloc(g->vc->count, sizeof(float));
    if (dt_comm_init(&c, &o) != DT_OK || !buf) {
        snprintf(g->err, sizeof g->err, "rank %d: init: %s", g->rank,
                 c ? dt_comm_error(c) : "out of memory");
    } else {
        dt_traffic a, b;
        dt_comm_traffic(c, &a);
        dt_status st = dt_allreduce(c, buf, g->vc->count, DT_F32, DT_SUM);
        dt_comm_traffic(c, &b);
        uint64_t s = b.sent_bytes - a.sent_bytes, r = b.recv_bytes - a.recv_bytes;
        uint64_t sf = b.sent_frames - a.sent_frames, rf = b.recv_frames - a.recv_frames;
        if (st != DT_OK)
            snprintf(g->err, sizeof g->err, "rank %d: all-reduce: %s", g->rank, dt_comm_error(c));
        else if (s != g->vc->sent || r != g->vc->sent || sf != g->vc->frames || rf != g->vc->frames)
            snprintf(g->err, sizeof g->err,
                     "rank %d: sent %llu B in %llu messages, received %llu B in %llu; expected "
                     "%llu B in %llu each way",
                     g->rank, (unsigned long long)s, (unsigned long long)sf, (unsigned long long)r,
                     (unsigned long long)rf, (unsigned long long)g->vc->sent,
                     (unsigned long long)g->vc->frames);
    }
    free(buf);
    dt_comm_destroy(c);
    return NULL;
}

static void run_gloo_case(int world, const volume_case *vc)
{
    static atomic_uint counter;
    char url[128];
    snprintf(url, sizeof url, "file:///tmp/dtrain-test-volume-gloo-%d-%u", (int)getpid(),
             atomic_fetch_add(&counter, 1));
    unlink(url + 7); /* torch's key space: a stale file would hand out dead addresses */
    gloo_rank ranks[4];
    pthread_t t[4];
    for (int r = 0; r < world; r++) {
        ranks[r] = (gloo_rank){.rank = r, .size = world, .url = url, .vc = vc};
        cr_assert_eq(pthread_create(&t[r], NULL, gloo_rank_main, &ranks[r]), 0);
    }
    for (int r = 0; r < world; r++)
        pthread_join(t[r], NULL);
    unlink(url + 7);
    for (int r = 0; r < world; r++)
        cr_expect(!ranks[r].err[0], "%s", ranks[r].err);
}

/* 1 MiB over p ranks: numSeg = max(2p, 1) segments of 1 MiB / numSeg, and
 * each phase sends numSeg - numSeg/p of them. */
Test(comm_volume, the_gloo_wire_counts_torchs_ring_on_2_and_4_ranks, .timeout = 60)
{
    volume_case two = {N_FLOATS, DT_ALGO_AUTO, N_BYTES, 2 * (4 - 2)};
    run_gloo_case(2, &two);
    volume_case four = {N_FLOATS, DT_ALGO_AUTO, 2 * 3 * N_BYTES / 4, 2 * (8 - 2)};
    run_gloo_case(4, &four);
}
