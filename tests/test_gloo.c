/*
 * test_gloo.c — collectives/gloo/, torch 1.13 gloo's wire, without torch:
 * ranks as threads of this process, each with its own gloo context on one
 * file:// store in torch's key space. (tests/torch_gloo.py checks the same
 * code against real torch ranks, bit for bit; this suite runs everywhere.)
 */
#include <criterion/criterion.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dt_comm.h"
#include "gloo/gloo.h"

#define MAX_RANKS 5

typedef struct job job;
typedef struct rank {
    int rank;
    job *j;
    gloo_ctx *ctx;
    dt_status st; /* of the body (or of joining) */
    char err[GLOO_ERR_LEN];
} rank;

struct job {
    int size;
    char url[128];
    double timeout_s;
    void (*body)(rank *);
    void *arg;
    rank ranks[MAX_RANKS];
};

static void *rank_main(void *p)
{
    rank *r = p;
    dt_store *s = NULL;
    if (dt_store_open(&s, r->j->url, "") != DT_OK) {
        snprintf(r->err, sizeof r->err, "store: %s", dt_store_error(s));
        r->st = DT_ESTORE;
        dt_store_close(s);
        return NULL;
    }
    gloo_config cfg = {.rank = r->rank,
                       .size = r->j->size,
                       .host = "127.0.0.1",
                       .timeout_s = r->j->timeout_s,
                       .init_timeout_s = 20};
    r->st = comm_gloo_connect(&r->ctx, s, &cfg, r->err, sizeof r->err);
    if (r->st == DT_OK)
        r->j->body(r);
    if (r->st != DT_OK && r->ctx && !r->err[0])
        snprintf(r->err, sizeof r->err, "%s", comm_gloo_error(r->ctx));
    comm_gloo_destroy(r->ctx);
    r->ctx = NULL;
    dt_store_close(s);
    return NULL;
}

/* Runs `body` on `size` ranks as threads; the store file is removed after
 * unless `keep_store` (a test that reads what the ranks left there). */
static void run_job(job *j, int size, double timeout_s, void (*body)(rank *), void *arg,
                    bool keep_store)
{
    static atomic_uint counter;
    j->size = size;
    j->timeout_s = timeout_s;
    j->body = body;
    j->arg = arg;
    snprintf(j->url, sizeof j->url, "file:///tmp/dtrain-test-gloo-%d-%u", (int)getpid(),
             atomic_fetch_add(&counter, 1));
    /* torch's key space: no handle removes the file, and a stale one (an
     * earlier process of this pid) would hand out dead addresses */
    unlink(j->url + 7);
    pthread_t t[MAX_RANKS];
    for (int r = 0; r < size; r++) {
        j->ranks[r] = (rank){.rank = r, .j = j};
        cr_assert_eq(pthread_create(&t[r], NULL, rank_main, &j->ranks[r]), 0);
    }
    for (int r = 0; r < size; r++)
        pthread_join(t[r], NULL);
    if (!keep_store)
        unlink(j->url + 7);
}

static void run(job *j, int size, double timeout_s, void (*body)(rank *), void *arg)
{
    run_job(j, size, timeout_s, body, arg, false);
}

/* ---- gloo's all_reduce order, as a closed form ------------------------------ */

/* Element e of rank r's input: values whose sums round, so order shows. */
static float input(int r, size_t e)
{
    uint32_t a = (uint32_t)(e * 2654435761u + (uint32_t)r * 1000003u);
    return ldexpf((float)((int)(a % 2001) - 1000), (int)((a >> 11) % 40) - 20);
}

/* gloo's result for an element of chunk c: x_c + (x_c+1 + (... + x_c-1)). */
static float gloo_sum(int p, int c, size_t e)
{
    float acc = input((c + p - 1) % p, e);
    for (int k = p - 2; k >= 0; k--)
        acc = input((c + k) % p, e) + acc;
    return acc;
}

/* The chunk that owns byte offset `at` under gloo's all_reduce geometry. */
static int chunk_of(int p, size_t count, size_t e)
{
    const size_t total = count * 4, max_seg = 1 << 20;
    size_t want = (total + max_seg - 1) / max_seg, num = want > 2u * p ? want : 2u * p;
    num = (num + p - 1) / p * p;
    size_t seg = ((total + num - 1) / num + 3) / 4 * 4, chunk = num / p * seg;
    return (int)(e * 4 / chunk);
}

typedef struct sizes {
    size_t count;
} sizes;

static void allreduce_body(rank *r)
{
    size_t n = ((sizes *)r->j->arg)->count;
    float *x = malloc(n * sizeof *x);
    for (size_t e = 0; e < n; e++)
        x[e] = input(r->rank, e);
    r->st = comm_gloo_allreduce(r->ctx, x, n, DT_F32, DT_SUM);
    for (size_t e = 0; r->st == DT_OK && e < n; e++) {
        float want = gloo_sum(r->j->size, chunk_of(r->j->size, n, e), e);
        if (memcmp(&x[e], &want, 4) != 0) {
            snprintf(r->err, sizeof r->err, "element %zu: %a, gloo's order gives %a", e, x[e],
                     want);
            r->st = DT_EPROTO;
        }
    }
    free(x);
}

Test(gloo, allreduce_sums_in_gloos_ring_order_bit_for_bit, .timeout = 120)
{
    const size_t counts[] = {1, 7, 1000, 262145, 600001};
    for (int p = 2; p <= 4; p++)
        for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
            job j;
            sizes s = {counts[i]};
            run(&j, p, 20, allreduce_body, &s);
            for (int r = 0; r < p; r++)
                cr_assert_eq(j.ranks[r].st, DT_OK, "p=%d count=%zu rank %d: %s", p, counts[i], r,
                             j.ranks[r].err);
        }
}

/* ---- the rendezvous leaves torch's keys as torch does ----------------------- */

static void nothing(rank *r)
{
    (void)r;
}

Test(gloo, rendezvous_counts_the_store_barrier_exactly_once_and_sets_the_seq_key, .timeout = 60)
{
    job j;
    run_job(&j, 3, 20, nothing, NULL, true);
    for (int r = 0; r < 3; r++)
        cr_assert_eq(j.ranks[r].st, DT_OK, "rank %d: %s", r, j.ranks[r].err);
    dt_store *s = NULL;
    cr_assert_eq(dt_store_open(&s, j.url, ""), DT_OK);
    void *v = NULL;
    size_t n = 0;
    cr_assert_eq(dt_store_get(s, "default_pg/store_based_barrier_key:1", &v, &n, 1), DT_OK);
    cr_assert(n == 1 && memcmp(v, "3", 1) == 0, "the barrier counts %.*s", (int)n, (char *)v);
    free(v);
    cr_assert_eq(dt_store_get(s, "default_pg/0/SEQ_NUM_STORE_KEY", &v, &n, 1), DT_OK);
    const uint8_t seq[8] = {0x68, 0x45, 0x8b, 0x6b, 0, 0, 0, 0};
    cr_assert(n == 8 && memcmp(v, seq, 8) == 0);
    free(v);
    cr_assert_eq(dt_store_get(s, "default_pg/0/0/1", &v, &n, 1), DT_OK);
    cr_assert_eq(n, 2 * GLOO_ADDRESS_BYTES, "rank 1 publishes one 136-byte address per peer");
    free(v);
    dt_store_close(s);
    unlink(j.url + 7);
}

/* ---- failures: named, never a hang or a crash --------------------------------- */

static void allreduce_rank_sized(rank *r)
{
    float x[8] = {0};
    r->st = comm_gloo_allreduce(r->ctx, x, r->rank == 0 ? 4 : 8, DT_F32, DT_SUM);
}

Test(gloo, a_message_larger_than_the_posted_receive_is_a_protocol_error_naming_peer_slot_and_tag,
     .timeout = 60)
{
    job j;
    run(&j, 2, 10, allreduce_rank_sized, NULL);
    cr_assert_eq(j.ranks[0].st, DT_EPROTO, "%s", j.ranks[0].err);
    cr_assert(strstr(j.ranks[0].err, "peer 1 sent 8 bytes on slot 0x0400000000000000 "
                                     "(allreduce, tag 0)"),
              "%s", j.ranks[0].err);
    cr_assert_neq(j.ranks[1].st, DT_OK, "rank 1 sees its peer fail");
}

static void mismatched_collective(rank *r)
{
    float x[4] = {0};
    r->st = r->rank == 0 ? comm_gloo_allreduce(r->ctx, x, 4, DT_F32, DT_SUM)
                         : comm_gloo_broadcast(r->ctx, x, sizeof x, 0);
}

Test(gloo, different_collectives_time_out_naming_the_slot_and_tag, .timeout = 60)
{
    job j;
    run(&j, 2, 1, mismatched_collective, NULL);
    cr_assert_neq(j.ranks[0].st, DT_OK);
    cr_assert_neq(j.ranks[1].st, DT_OK);
    bool named = strstr(j.ranks[0].err, "slot 0x0400000000000000 (allreduce, tag 0)") ||
                 strstr(j.ranks[1].err, "slot 0x0600000000000000 (broadcast, tag 0)");
    cr_assert(named, "rank 0: %s / rank 1: %s", j.ranks[0].err, j.ranks[1].err);
}

static void rank_1_leaves(rank *r)
{
    float x[4] = {0};
    if (r->rank == 1) {
        comm_gloo_destroy(r->ctx);
        r->ctx = NULL;
        return;
    }
    r->st = comm_gloo_allreduce(r->ctx, x, 4, DT_F32, DT_SUM);
}

Test(gloo, a_peer_that_leaves_fails_the_op_naming_it, .timeout = 60)
{
    job j;
    run(&j, 3, 20, rank_1_leaves, NULL);
    cr_assert_eq(j.ranks[0].st, DT_EPEER, "%s", j.ranks[0].err);
    cr_assert(strstr(j.ranks[0].err, "lost peer 1"), "%s", j.ranks[0].err);
    cr_assert_neq(j.ranks[2].st, DT_OK, "rank 2 fails too");
}

/* ---- writes leave in batches --------------------------------------------------- */

/* The side that connected writes two announcements and holds them; the
 * side that accepted reads the connection it holds directly (its loop does
 * not run, so the connection is not yet proven to be its peer's, held.c):
 * nothing until the writer flushes, then both preambles, in the order
 * written. */
static void two_notices_then_a_flush(rank *r)
{
    atomic_int *step = r->j->arg;
    gloo_pair *p = &r->ctx->pairs[1 - r->rank];
    if (p->connected) {
        comm_gloo_wire_notify(p, GLOO_RECV_READY, 0x11, 4);
        comm_gloo_wire_notify(p, GLOO_SEND_READY, 0x12, 8);
        atomic_store(step, 1);
        while (atomic_load(step) != 2)
            usleep(1000);
        comm_gloo_wire_flush(r->ctx);
        while (atomic_load(step) != 3)
            usleep(1000);
        return;
    }
    while (atomic_load(step) != 1)
        usleep(1000);
    int fd = -1;
    for (int i = 0; i < GLOO_HELD_MAX; i++) /* the one connection held, not yet proven */
        if (p->held[i].state == GLOO_HELD_READING)
            uv_fileno((uv_handle_t *)&p->held[i].tcp, &fd);
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    int early = poll(&pf, 1, 100);
    atomic_store(step, 2);
    uint8_t got[2 * GLOO_PREAMBLE_BYTES];
    size_t n = 0;
    while (n < sizeof got && poll(&pf, 1, 10000) == 1) {
        ssize_t k = recv(fd, got + n, sizeof got - n, 0);
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    atomic_store(step, 3);
    const char *wrong = early != 0        ? "bytes arrived before the flush"
                        : n != sizeof got ? "fewer bytes than two preambles"
                        : got[8] != GLOO_RECV_READY || got[16] != 0x11 || got[32] != 4
                            ? "the first is not the RECV_READY"
                        : got[56] != GLOO_SEND_READY || got[64] != 0x12 || got[80] != 8
                            ? "the second is not the SEND_READY"
                            : NULL;
    if (wrong) {
        r->st = DT_EPROTO;
        snprintf(r->err, sizeof r->err, "%s", wrong);
    }
}

Test(gloo, messages_to_a_peer_leave_together_at_the_flush_in_the_order_written, .timeout = 30)
{
    job j;
    atomic_int step = 0;
    run(&j, 2, 20, two_notices_then_a_flush, &step);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(j.ranks[r].st, DT_OK, "rank %d: %s", r, j.ranks[r].err);
}

/* ---- another thread reaches a waiting context -------------------------------- */

static void *wake_it(void *ctx)
{
    comm_gloo_wake(ctx);
    return NULL;
}

/* A pass of a rank alone waits for nothing but its waker: no timer, no peer. */
static void one_pass_woken_from_another_thread(rank *r)
{
    pthread_t t;
    if (pthread_create(&t, NULL, wake_it, r->ctx) != 0) {
        r->st = DT_ESYS;
        return;
    }
    comm_gloo_progress(r->ctx); /* returns only once woken */
    pthread_join(t, NULL);
}

Test(gloo, comm_gloo_wake_ends_a_pass_that_waits_for_nothing_else, .timeout = 30)
{
    job j;
    run(&j, 1, 600, one_pass_woken_from_another_thread, NULL);
    cr_assert_eq(j.ranks[0].st, DT_OK, "%s", j.ranks[0].err);
}

static void *abort_it(void *ctx)
{
    comm_gloo_interrupt(ctx, DT_EABORTED);
    return NULL;
}

/* Rank 0 is interrupted while it waits for a message rank 1 never sends;
 * then rank 1 waits for one from rank 0. The wait is 600 s, the test's 30. */
static void interrupted_receive(rank *r)
{
    atomic_int *rank_0_done = r->j->arg;
    float x = 0;
    if (r->rank == 0) {
        pthread_t t;
        if (pthread_create(&t, NULL, abort_it, r->ctx) != 0) {
            r->st = DT_ESYS;
            atomic_store(rank_0_done, 1);
            return;
        }
        r->st = comm_gloo_recv(r->ctx, &x, sizeof x, 1, 3, NULL);
        pthread_join(t, NULL);
        atomic_store(rank_0_done, 1);
        return;
    }
    while (!atomic_load(rank_0_done))
        usleep(1000);
    r->st = comm_gloo_recv(r->ctx, &x, sizeof x, 0, 4, NULL);
}

Test(gloo, an_interrupt_ends_the_wait_in_progress_and_the_peer_hears_at_once, .timeout = 30)
{
    job j;
    atomic_int rank_0_done = 0;
    run(&j, 2, 600, interrupted_receive, &rank_0_done);
    cr_assert_eq(j.ranks[0].st, DT_EABORTED, "%s", j.ranks[0].err);
    cr_assert(strstr(j.ranks[0].err, "gloo rank 0: recv (tag 3) interrupted"), "%s",
              j.ranks[0].err);
    cr_assert_eq(j.ranks[1].st, DT_EPEER, "%s", j.ranks[1].err);
    cr_assert(strstr(j.ranks[1].err, "lost peer 0"), "%s", j.ranks[1].err);
}

static void rank_1_sends_garbage(rank *r)
{
    if (r->rank == 1) {
        comm_gloo_wire_notify(&r->ctx->pairs[0], (enum gloo_opcode)9, 0x0700000000000000ull, 0);
        uint8_t b = 0;
        gloo_buf buf = {.ptr = &b};
        comm_gloo_wait_send(r->ctx, &buf, 0); /* runs the loop: times out, closes */
        return;
    }
    r->st = comm_gloo_barrier(r->ctx);
}

Test(gloo, an_unknown_opcode_is_a_protocol_error_naming_the_peer, .timeout = 60)
{
    job j;
    run(&j, 2, 2, rank_1_sends_garbage, NULL);
    cr_assert_eq(j.ranks[0].st, DT_EPROTO, "%s", j.ranks[0].err);
    cr_assert(strstr(j.ranks[0].err, "peer 1 sent a malformed message (opcode 9, slot "
                                     "0x0700000000000000 (barrier, tag 0))"),
              "%s", j.ranks[0].err);
}

/* ---- the other collectives agree with their definitions ---------------------- */

static void every_collective(rank *r)
{
    const int p = r->j->size, me = r->rank;
    int32_t v[3] = {me, 10 * me, 100 * me}, all[3 * MAX_RANKS], one[3], want;
    char *err = r->err;
    size_t cap = sizeof r->err;
#define CHECK(cond, ...)                     \
    do {                                     \
        if (r->st == DT_OK && !(cond)) {     \
            snprintf(err, cap, __VA_ARGS__); \
            r->st = DT_EPROTO;               \
        }                                    \
    } while (0)
    if ((r->st = comm_gloo_allgather(r->ctx, all, v, sizeof v)) != DT_OK)
        return;
    for (int q = 0; q < p; q++)
        CHECK(all[3 * q + 2] == 100 * q, "allgather: block %d", q);
    int32_t b[3] = {me, me, me};
    if ((r->st = comm_gloo_broadcast(r->ctx, b, sizeof b, p - 1)) != DT_OK)
        return;
    CHECK(b[0] == p - 1 && b[2] == p - 1, "broadcast from %d gave %d", p - 1, b[0]);
    int32_t s[3] = {me + 1, me + 1, me + 1};
    if ((r->st = comm_gloo_reduce_root(r->ctx, s, 3, DT_I32, DT_SUM, 0)) != DT_OK)
        return;
    want = p * (p + 1) / 2;
    CHECK(me != 0 || s[1] == want, "reduce: %d, not %d", s[1], want);
    if ((r->st = comm_gloo_gather(r->ctx, all, v, sizeof v, 1)) != DT_OK)
        return;
    CHECK(me != 1 || all[3 * (p - 1) + 1] == 10 * (p - 1), "gather");
    for (int q = 0; q < 3 * p; q++)
        all[q] = q;
    if ((r->st = comm_gloo_scatter(r->ctx, one, all, sizeof one, 0)) != DT_OK)
        return;
    CHECK(one[0] == 3 * me, "scatter gave %d", one[0]);
    int32_t in[MAX_RANKS], out[MAX_RANKS];
    for (int q = 0; q < p; q++)
        in[q] = 100 * me + q;
    if ((r->st = comm_gloo_alltoall(r->ctx, out, in, sizeof(int32_t))) != DT_OK)
        return;
    for (int q = 0; q < p; q++)
        CHECK(out[q] == 100 * q + me, "alltoall: from %d", q);
    if ((r->st = comm_gloo_barrier(r->ctx)) != DT_OK)
        return;
    int32_t msg = 7 * me, got = -1, from = -1;
    if (me == 0) {
        for (int q = 1; q < p && r->st == DT_OK; q++) {
            r->st = comm_gloo_recv(r->ctx, &got, sizeof got, -1, 3, &from);
            CHECK(got == 7 * from, "recv from any: %d from %d", got, from);
        }
    } else {
        r->st = comm_gloo_send(r->ctx, &msg, sizeof msg, 0, 3);
    }
#undef CHECK
}

Test(gloo, every_collective_gives_its_definition, .timeout = 60)
{
    for (int p = 2; p <= 5; p++) {
        job j;
        run(&j, p, 20, every_collective, NULL);
        for (int r = 0; r < p; r++)
            cr_assert_eq(j.ranks[r].st, DT_OK, "p=%d rank %d: %s", p, r, j.ranks[r].err);
    }
}
