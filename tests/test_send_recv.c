/*
 * test_send_recv.c — tagged point-to-point messages (dt_send, dt_recv and
 * their async forms), with ranks as threads over loopback TCP
 * (rank_threads.h).
 *
 * The transport's contract, one behaviour per test: messages with one tag
 * arrive in the order they were sent; a receive takes the message with its
 * tag whatever order they came in; messages sent long before their
 * receives are posted wait, intact and in order; a message whose sender
 * has left is still delivered, while a receive from a rank that left with
 * nothing for it fails at once naming that rank; a receive from any source
 * reports who sent each message. Each test is one small job of 2 to 4
 * ranks, a few hundred kilobytes at most.
 */
#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "collective_data.h"
#include "dt_comm.h"
#include "rank_threads.h"

#define TEST_TIMEOUT_S 60

/* Rank 1 sends 1, 2, ..., 5 with one tag; rank 0 receives them in order. */
static void rank_same_tag_in_order(rank_ctx *rc)
{
    for (int32_t k = 1; k <= 5; k++) {
        int32_t v = rc->rank == 1 ? k : 0;
        if (rc->rank == 1)
            RANK_CHECK_OK(rc, "send", dt_send(rc->comm, &v, 1, DT_I32, 0, 7));
        if (rc->rank == 0) {
            RANK_CHECK_OK(rc, "recv", dt_recv(rc->comm, &v, 1, DT_I32, 1, 7, NULL));
            if (v != k)
                rank_fail(rc, "message %d of tag 7 carried %d", k, (int)v);
        }
    }
}

Test(send_recv, send_recv_with_one_tag_arrive_in_send_order, .timeout = TEST_TIMEOUT_S)
{
    rank_threads_expect_ok(2, rank_same_tag_in_order, NULL);
}

/* Rank 1 sends tag 1 (3 elements) then tag 2 (5 elements); rank 0 posts the
 * receive for tag 2 first. Each receive gets the message with its tag. */
static void rank_match_by_tag(rank_ctx *rc)
{
    int64_t one[3] = {11, 12, 13}, two[5] = {21, 22, 23, 24, 25};
    if (rc->rank == 1) {
        RANK_CHECK_OK(rc, "send tag 1", dt_send(rc->comm, one, 3, DT_I64, 0, 1));
        RANK_CHECK_OK(rc, "send tag 2", dt_send(rc->comm, two, 5, DT_I64, 0, 2));
    } else if (rc->rank == 0) {
        int64_t got1[3] = {0}, got2[5] = {0};
        dt_work *w2, *w1;
        RANK_CHECK_OK(rc, "post tag 2", dt_recv_async(rc->comm, got2, 5, DT_I64, 1, 2, NULL, &w2));
        RANK_CHECK_OK(rc, "post tag 1", dt_recv_async(rc->comm, got1, 3, DT_I64, 1, 1, NULL, &w1));
        dt_status s2 = dt_work_wait(w2), s1 = dt_work_wait(w1);
        RANK_CHECK_OK(rc, "recv tag 2", s2);
        RANK_CHECK_OK(rc, "recv tag 1", s1);
        expect_equal(rc, "tag 1", got1, one, 3, DT_I64);
        expect_equal(rc, "tag 2", got2, two, 5, DT_I64);
    }
}

Test(send_recv, recv_takes_the_message_with_its_tag, .timeout = TEST_TIMEOUT_S)
{
    rank_threads_expect_ok(3, rank_match_by_tag, NULL);
}

/* Rank 1 sends 48 messages of 4000 B at once (far more than a connection
 * reads ahead) while rank 0 is busy elsewhere for 200 ms; then rank 0
 * receives them in order: every one arrives, intact, in its place. */
#define EARLY_MESSAGES 48
#define EARLY_COUNT 1000
static void rank_sends_far_ahead(rank_ctx *rc)
{
    static _Thread_local int32_t buf[EARLY_COUNT];
    for (int m = 0; m < EARLY_MESSAGES; m++) {
        if (rc->rank == 1) {
            for (int i = 0; i < EARLY_COUNT; i++)
                buf[i] = m * EARLY_COUNT + i;
            RANK_CHECK_OK(rc, "send", dt_send(rc->comm, buf, EARLY_COUNT, DT_I32, 0, 9));
            continue;
        }
        if (m == 0)
            usleep(200 * 1000);
        RANK_CHECK_OK(rc, "recv", dt_recv(rc->comm, buf, EARLY_COUNT, DT_I32, 1, 9, NULL));
        for (int i = 0; i < EARLY_COUNT; i++)
            if (buf[i] != m * EARLY_COUNT + i) {
                rank_fail(rc, "message %d, element %d: %d", m, i, (int)buf[i]);
                return;
            }
    }
}

Test(send_recv, messages_sent_long_before_their_receives_arrive_intact_in_order,
     .timeout = TEST_TIMEOUT_S)
{
    rank_threads_expect_ok(2, rank_sends_far_ahead, NULL);
}

/* Rank 1 sends one message and leaves (destroys its communicator) before
 * rank 0 has posted the receive: the message is still delivered, and the
 * departure that came behind it is no error. */
static void rank_sends_and_leaves(rank_ctx *rc)
{
    int64_t v = rc->rank == 1 ? 4242 : 0;
    if (rc->rank == 1) {
        RANK_CHECK_OK(rc, "send", dt_send(rc->comm, &v, 1, DT_I64, 0, 4));
        return;
    }
    usleep(300 * 1000);
    RANK_CHECK_OK(rc, "recv", dt_recv(rc->comm, &v, 1, DT_I64, 1, 4, NULL));
    if (v != 4242)
        rank_fail(rc, "received %lld, sent 4242", (long long)v);
}

Test(send_recv, a_message_whose_sender_left_before_the_receive_is_still_delivered,
     .timeout = TEST_TIMEOUT_S)
{
    rank_threads_expect_ok(2, rank_sends_and_leaves, NULL);
}

/* Rank 1 leaves at once; rank 0 then posts a receive from it. No message
 * can ever come (a departed rank sent everything before its BYE), so the
 * receive fails at once naming rank 1, instead of waiting out its timeout
 * and blaming the clock. (Found by tests/fuzz/fuzz_frames.) */
static void rank_receives_from_a_rank_that_left(rank_ctx *rc)
{
    if (rc->rank == 1)
        return;
    usleep(300 * 1000);
    int32_t v = 0;
    dt_op op = {.kind = DT_OP_RECV,
                .recv = &v,
                .count = 1,
                .dtype = DT_I32,
                .peer = 1,
                .tag = 5,
                .timeout_s = 10};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    dt_status st = dt_run(rc->comm, &op);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    const char *msg = dt_comm_error(rc->comm);
    if (st != DT_EPEER || !strstr(msg, "rank 1") || took > 5.0)
        rank_fail(rc, "recv from a rank that left: %s after %.2f s: %s", dt_status_name(st), took,
                  msg);
}

Test(send_recv, a_receive_from_a_rank_that_left_fails_at_once_naming_it, .timeout = TEST_TIMEOUT_S)
{
    rank_threads_expect_ok(2, rank_receives_from_a_rank_that_left, NULL);
}

/* Every rank but 0 sends its rank number; rank 0 receives from any source
 * and learns who sent each message: everyone, once. */
static void rank_any_source(rank_ctx *rc)
{
    if (rc->rank != 0) {
        int32_t v = rc->rank;
        RANK_CHECK_OK(rc, "send", dt_send(rc->comm, &v, 1, DT_I32, 0, 3));
        return;
    }
    bool seen[RANK_THREADS_MAX] = {false};
    for (int k = 1; k < rc->world; k++) {
        int32_t v = -1;
        int source = -1;
        RANK_CHECK_OK(rc, "recv", dt_recv(rc->comm, &v, 1, DT_I32, DT_ANY_SOURCE, 3, &source));
        if (source < 1 || source >= rc->world || v != source || seen[source])
            rank_fail(rc, "message %d: source %d, payload %d", k, source, (int)v);
        else
            seen[source] = true;
    }
}

Test(send_recv, recv_from_any_source_reports_each_sender, .timeout = TEST_TIMEOUT_S)
{
    rank_threads_expect_ok(4, rank_any_source, NULL);
}
