/*
 * test_clocks.c — the two clocks an op waits by (collectives/transport/
 * heartbeat.c): a peer that is stopped is named at the liveness limit; a
 * peer that is alive but busy elsewhere is waited for, and named only at
 * the much longer progress limit, as the rank that has not joined the op.
 *
 * Ranks run as forked processes (fork_job.h), so one can really be stopped
 * (SIGSTOP); every wait of the parent is bounded. Limits are short (2 s of
 * silence, a few seconds of progress) so that the tests stay fast.
 */
#include <signal.h>
#include <time.h>

#include "fork_job.h"

#define LIVENESS_S 2.0

static dt_status allreduce_one(dt_comm *c)
{
    float x[4] = {1, 2, 3, 4};
    return dt_allreduce(c, x, 4, DT_F32, DT_SUM);
}

/* ---- a busy rank is not a dead one ------------------------------------------ */

/* Rank 1 computes (sleeps) for three liveness limits before it joins the
 * all-reduce; its communicator keeps beating meanwhile. */
static void one_rank_busy_for_6_s(int rank, job *j, FILE *report)
{
    dt_comm *c = child_join_clocks(j, rank, LIVENESS_S, 60, report);
    if (rank == 1)
        sleep(6);
    double t0 = dt_now();
    dt_status st = allreduce_one(c);
    say(report, st, dt_now() - t0, dt_comm_error(c));
    dt_comm_destroy(c);
}

Test(clocks, a_rank_busy_longer_than_the_liveness_limit_does_not_fail_the_op, .timeout = 60)
{
    job j;
    start(&j, 3, "busy", one_rank_busy_for_6_s);
    for (int r = 0; r < 3; r++) {
        verdict v;
        verdict_of(&j, r, 30, &v);
        cr_expect_eq(v.status, DT_OK, "rank %d: %s", r, v.msg);
    }
    finish(&j);
}

/* ---- a stopped rank is named at the liveness limit -------------------------- */

static void one_rank_stops(int rank, job *j, FILE *report)
{
    dt_comm *c = child_join_clocks(j, rank, LIVENESS_S, 60, report);
    if (rank == 1)
        raise(SIGSTOP); /* finish() kills it */
    double t0 = dt_now();
    dt_status st = allreduce_one(c);
    say(report, st, dt_now() - t0, dt_comm_error(c));
    dt_comm_destroy(c);
}

Test(clocks, a_stopped_rank_is_named_within_the_liveness_limit_not_the_progress_limit,
     .timeout = 60)
{
    job j;
    start(&j, 2, "stopped", one_rank_stops);
    verdict v;
    verdict_of(&j, 0, 30, &v);
    cr_expect_eq(v.status, DT_ETIMEDOUT, "status %d: %s", v.status, v.msg);
    cr_expect(strstr(v.msg, "waiting on rank 1 ("), "%s", v.msg);
    cr_expect(strstr(v.msg, "stopped, hung or cut off"), "%s", v.msg);
    cr_expect(strstr(v.msg, "allreduce #0"), "%s", v.msg);
    /* the silence began when rank 1 stopped, a little before the op did */
    cr_expect(v.seconds < 3 * LIVENESS_S + 1, "took %.2f s", v.seconds);
    finish(&j);
}

/* ---- a rank that skips a collective is named at the progress limit ---------- */

/* Rank 2 is alive (its communicator beats) but never calls the all-reduce
 * that ranks 0 and 1 wait in. */
static void one_rank_skips_the_allreduce(int rank, job *j, FILE *report)
{
    dt_comm *c = child_join_clocks(j, rank, LIVENESS_S, 4, report);
    if (rank == 2) {
        sleep(10);
        dt_comm_destroy(c);
        return;
    }
    double t0 = dt_now();
    dt_status st = allreduce_one(c);
    say(report, st, dt_now() - t0, dt_comm_error(c));
    dt_comm_destroy(c);
}

Test(clocks, a_rank_that_skips_a_collective_is_named_at_the_progress_limit_with_the_op,
     .timeout = 60)
{
    job j;
    start(&j, 3, "skips", one_rank_skips_the_allreduce);
    for (int r = 0; r < 2; r++) {
        verdict v;
        verdict_of(&j, r, 30, &v);
        cr_expect_eq(v.status, DT_ETIMEDOUT, "rank %d: status %d: %s", r, v.status, v.msg);
        /* whoever timed out first named rank 2; the other quotes it */
        cr_expect(strstr(v.msg, "rank 2 (") && strstr(v.msg, "is alive"), "rank %d: %s", r, v.msg);
        cr_expect(strstr(v.msg, "has not joined #0"), "rank %d: %s", r, v.msg);
        cr_expect(strstr(v.msg, "allreduce #0"), "rank %d: %s", r, v.msg);
        cr_expect(strstr(v.msg, "progress limit"), "rank %d: %s", r, v.msg);
        cr_expect(v.seconds >= 4.0 - 0.1 && v.seconds < 10, "rank %d took %.2f s", r, v.seconds);
    }
    finish(&j);
}

/* ---- a peer that dies behind a frame no receive matches --------------------- */

/* Rank 1 sends a tagged message rank 0 has posted no receive for (tag 7),
 * of `bytes`, then dies without a word; rank 0 waits for tag 3 from it.
 * Rank 0's reader has parked on the tag-7 frame (the peer is ahead of
 * it), so it reads no heartbeats; the peer's end must still be named at
 * the liveness limit, not the progress limit (30 min by default). */
static void die_behind_an_unmatched_frame(int rank, job *j, FILE *report, size_t bytes)
{
    dt_comm *c = child_join_clocks(j, rank, LIVENESS_S, 0, report);
    static uint8_t payload[1 << 20];
    if (rank == 1) {
        dt_work *w = NULL;
        dt_send_async(c, payload, bytes, DT_U8, 0, 7, &w);
        sleep(1); /* what the kernels take is in their buffers */
        _exit(0); /* dies: no BYE, no ABORT */
    }
    double t0 = dt_now();
    dt_status st = dt_recv(c, payload, 4, DT_U8, 1, 3, NULL);
    say(report, st, dt_now() - t0, dt_comm_error(c));
    dt_comm_destroy(c);
}

static void dies_behind_a_small_frame(int rank, job *j, FILE *report)
{
    die_behind_an_unmatched_frame(rank, j, report, 64); /* staged whole, the EOF read behind it */
}

static void dies_behind_a_large_frame(int rank, job *j, FILE *report)
{
    die_behind_an_unmatched_frame(rank, j, report, 1 << 20); /* fills the stage: reading stops */
}

static void expect_named_at_the_liveness_limit(job *j)
{
    verdict v;
    verdict_of(j, 0, 30, &v);
    cr_expect_eq(v.status, DT_EPEER, "status %d: %s", v.status, v.msg);
    cr_expect(strstr(v.msg, "rank 1 ("), "%s", v.msg);
    cr_expect(strstr(v.msg, "died or its process was killed"), "%s", v.msg);
    cr_expect(strstr(v.msg, "tag 7"), "names the frame that waits: %s", v.msg);
    cr_expect(v.seconds < 3 * LIVENESS_S + 2, "took %.2f s", v.seconds);
    finish(j);
}

Test(clocks, a_peer_that_dies_behind_a_small_unmatched_frame_is_named_at_the_liveness_limit,
     .timeout = 60)
{
    job j;
    start(&j, 2, "parked-small", dies_behind_a_small_frame);
    expect_named_at_the_liveness_limit(&j);
}

Test(clocks, a_peer_that_dies_behind_a_large_unmatched_frame_is_named_at_the_liveness_limit,
     .timeout = 60)
{
    job j;
    start(&j, 2, "parked-large", dies_behind_a_large_frame);
    expect_named_at_the_liveness_limit(&j);
}
