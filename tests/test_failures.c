/*
 * test_failures.c — the communicator fails loudly, quickly and precisely:
 * a killed rank, a silent one, a count mismatch, an abort, a peer that
 * sends an impossible frame. (Strangers on the port: test_strangers.c.)
 *
 * Ranks run as forked processes (fork_job.h), so a rank can really die
 * (SIGKILL); each child reports its verdict through a pipe, and every wait
 * of the parent is bounded.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sodium.h>
#include <sys/socket.h>
#include <time.h>

#include "fork_job.h"

/* ---- a rank dies mid all-reduce -------------------------------------------- */

static void allreduce_forever(int rank, job *j, FILE *report)
{
    dt_comm *c = child_join(j, rank, 30, report);
    size_t n = 1 << 20;
    float *buf = calloc(n, sizeof *buf);
    for (int i = 0;; i++) {
        dt_status st = dt_allreduce(c, buf, n, DT_F32, DT_SUM);
        if (st != DT_OK) {
            say(report, st, dt_now(), dt_comm_error(c));
            break;
        }
        if (i == 3) {
            fprintf(report, "running\n");
            fflush(report);
        }
    }
    fflush(report);
    dt_comm_destroy(c);
    free(buf);
}

Test(failures, killed_rank_is_named_by_every_survivor_within_5_seconds, .timeout = 60)
{
    job j;
    char line[2048];
    start(&j, 4, "kill", allreduce_forever);
    for (int r = 0; r < 4; r++) {
        report_of(&j, r, 30, line, sizeof line);
        cr_assert_str_eq(line, "running", "rank %d did not start: '%s'", r, line);
    }
    const int victim = 2;
    kill(j.pid[victim], SIGKILL);
    double killed_at = dt_now();
    for (int r = 0; r < 4; r++) {
        if (r == victim)
            continue;
        verdict v;
        verdict_of(&j, r, 10, &v);
        cr_assert_neq(v.status, DT_OK);
        cr_expect(strstr(v.msg, "rank 2") != NULL, "rank %d's error does not name rank 2: %s", r,
                  v.msg);
        cr_expect_lt(v.seconds - killed_at, 5.0, "rank %d noticed after %.2f s", r,
                     v.seconds - killed_at);
        cr_log_info("rank %d noticed after %.3f s: %s", r, v.seconds - killed_at, v.msg);
    }
    finish(&j);
}

/* ---- a rank never shows up for an op ---------------------------------------- */

static void one_rank_skips_the_op(int rank, job *j, FILE *report)
{
    dt_comm *c = child_join(j, rank, 30, report);
    if (rank == 1) {
        sleep(5); /* never calls the all-reduce */
        dt_comm_destroy(c);
        return;
    }
    float x[4] = {1, 2, 3, 4};
    dt_op op = {.kind = DT_OP_ALLREDUCE,
                .recv = x,
                .count = 4,
                .dtype = DT_F32,
                .redop = DT_SUM,
                .timeout_s = 0.5};
    double t0 = dt_now();
    dt_status st = dt_run(c, &op);
    say(report, st, dt_now() - t0, dt_comm_error(c));
    dt_comm_destroy(c);
}

Test(failures, op_timeout_fails_the_op_and_names_the_silent_peer, .timeout = 60)
{
    job j;
    verdict v;
    start(&j, 2, "timeout", one_rank_skips_the_op);
    verdict_of(&j, 0, 20, &v);
    cr_expect_eq(v.status, DT_ETIMEDOUT, "status %d: %s", v.status, v.msg);
    cr_expect(strstr(v.msg, "rank 1") != NULL, "%s", v.msg);
    cr_expect(strstr(v.msg, "allreduce #0") != NULL, "%s", v.msg);
    cr_expect(v.seconds >= 0.5 && v.seconds < 3.0, "took %.2f s", v.seconds);
    finish(&j);
}

/* ---- ranks disagree about the count ------------------------------------------ */

static void mismatched_counts(int rank, job *j, FILE *report)
{
    dt_comm *c = child_join(j, rank, 10, report);
    size_t count = rank == 0 ? 4096 : 8192;
    float *buf = calloc(count, sizeof *buf);
    dt_status st = dt_allreduce(c, buf, count, DT_F32, DT_SUM);
    say(report, st, dt_now(), dt_comm_error(c));
    dt_comm_destroy(c);
    free(buf);
}

Test(failures, different_counts_give_a_protocol_error_with_both_views, .timeout = 60)
{
    job j;
    start(&j, 2, "mismatch", mismatched_counts);
    for (int r = 0; r < 2; r++) {
        verdict v;
        verdict_of(&j, r, 20, &v);
        cr_expect_eq(v.status, DT_EPROTO, "rank %d: status %d: %s", r, v.status, v.msg);
        cr_expect(strstr(v.msg, "4096 x f32") && strstr(v.msg, "8192 x f32"),
                  "rank %d's error lacks both views: %s", r, v.msg);
    }
    finish(&j);
}

/* ---- abort unblocks a waiter ---------------------------------------------------- */

static void abort_from_another_thread(int rank, job *j, FILE *report)
{
    dt_comm *c = child_join(j, rank, 60, report);
    if (rank == 1) {
        sleep(5);
        dt_comm_destroy(c);
        return;
    }
    float x = 1;
    dt_work *w;
    dt_status st = dt_allreduce_async(c, &x, 1, DT_F32, DT_SUM, &w);
    if (st != DT_OK) {
        say(report, st, 0, dt_comm_error(c));
        _exit(1);
    }
    usleep(200 * 1000);
    double t0 = dt_now();
    dt_comm_abort(c, "test says stop");
    st = dt_work_wait(w);
    say(report, st, dt_now() - t0, dt_comm_error(c));
    dt_comm_destroy(c);
}

Test(failures, abort_unblocks_a_pending_op_at_once, .timeout = 60)
{
    job j;
    verdict v;
    start(&j, 2, "abort", abort_from_another_thread);
    verdict_of(&j, 0, 20, &v);
    cr_expect_eq(v.status, DT_EABORTED, "%s", v.msg);
    cr_expect(strstr(v.msg, "test says stop") != NULL, "%s", v.msg);
    cr_expect_lt(v.seconds, 1.0);
    finish(&j);
}

/* Rank 1 aborts and destroys its communicator at once, while rank 0 waits
 * for it in an all-reduce: rank 0 still learns the abort's reason (the
 * ABORT frames go out before the BYEs), not merely that rank 1 left. */
static void abort_then_destroy_at_once(int rank, job *j, FILE *report)
{
    dt_comm *c = child_join(j, rank, 20, report);
    if (rank == 1) {
        usleep(200 * 1000); /* rank 0 is in its all-reduce by now */
        dt_comm_abort(c, "rank 1 gives up");
        dt_comm_destroy(c);
        return;
    }
    float x = 1;
    dt_status st = dt_allreduce(c, &x, 1, DT_F32, DT_SUM);
    say(report, st, dt_now(), dt_comm_error(c));
    dt_comm_destroy(c);
}

Test(failures, an_abort_then_destroy_tells_the_peers_why, .timeout = 60)
{
    job j;
    verdict v;
    start(&j, 2, "abortdestroy", abort_then_destroy_at_once);
    verdict_of(&j, 0, 20, &v);
    cr_expect_eq(v.status, DT_EABORTED, "%s", v.msg);
    cr_expect(strstr(v.msg, "rank 1 gives up") != NULL, "%s", v.msg);
    finish(&j);
}

/* ---- abort racing the destroy it causes ------------------------------------------ */

#define ABORT_RACE_ITERATIONS 3000

static void *abort_now(void *comm)
{
    dt_comm_abort(comm, "racing a destroy");
    return NULL;
}

/* A thread that sees the abort's failure destroys the communicator at once,
 * while the aborting thread may still be inside dt_comm_abort: abort must
 * not touch the communicator after it has published the failure. A world
 * of one makes the destroy as quick as it gets, so the window is widest;
 * the ASan build turns a touch of freed memory into a crash. */
Test(failures, abort_racing_the_destroy_it_wakes_touches_nothing_freed, .timeout = 120)
{
    for (int i = 0; i < ABORT_RACE_ITERATIONS; i++) {
        dt_comm_options o;
        dt_comm_options_default(&o);
        dt_comm *c;
        cr_assert_eq(dt_comm_init(&c, &o), DT_OK, "iteration %d: %s", i, dt_comm_error(c));
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, abort_now, c), 0);
        while (dt_barrier(c) == DT_OK) /* until the abort shows */
            ;
        cr_assert(strstr(dt_comm_error(c), "racing a destroy"), "%s", dt_comm_error(c));
        dt_comm_destroy(c);
        pthread_join(t, NULL);
    }
}

/* ---- an authenticated peer that sends garbage ------------------------------------ */

static void read_exactly(int fd, void *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t k = read(fd, (char *)buf + got, n - got);
        if (k <= 0)
            return;
        got += (size_t)k;
    }
}

typedef struct fake_peer {
    int listen_fd, done_pipe[2];
} fake_peer;

/* Plays rank 0 of a 2-rank job: answers rank 1's handshake with the job's
 * key, then sends an ABORT frame whose length (2000 B) no ABORT may have,
 * followed by that many bytes, and stays connected until told to go. */
static void *fake_rank0_sends_a_bad_abort(void *arg)
{
    fake_peer *f = arg;
    uint8_t key[32], hello[48], challenge[64], response[32], msg[1 + 48 + 32];
    crypto_generichash(key, sizeof key, SECRET, sizeof SECRET, NULL, 0);
    int fd = accept(f->listen_fd, NULL, NULL);
    read_exactly(fd, hello, sizeof hello);
    uint32_t head[4] = {0x4e525444u, 2, 2, 0}; /* magic, version (handshake.c), world, rank */
    memcpy(challenge, head, sizeof head);
    randombytes_buf(challenge + 16, 16);
    msg[0] = 'A';
    memcpy(msg + 1, hello, 48);
    memcpy(msg + 49, challenge, 32);
    crypto_auth(challenge + 32, msg, sizeof msg, key);
    if (write(fd, challenge, sizeof challenge) == (ssize_t)sizeof challenge)
        read_exactly(fd, response, sizeof response);
    usleep(200 * 1000);
    static uint8_t frame[40 + 2000];
    memset(frame, 'x', sizeof frame);
    memset(frame, 0, 40);
    frame[0] = 3; /* kind: ABORT */
    int32_t root = -1;
    memcpy(frame + 4, &root, 4);
    uint64_t length = 2000;
    memcpy(frame + 32, &length, 8); /* over the longest notice */
    if (write(fd, frame, sizeof frame) != (ssize_t)sizeof frame)
        perror("fake rank 0");
    char go;
    if (read(f->done_pipe[0], &go, 1) < 0)
        perror("fake rank 0");
    close(fd);
    return NULL;
}

Test(failures, an_abort_frame_of_impossible_length_fails_the_op_and_stops, .timeout = 30)
{
    cr_assert_geq(sodium_init(), 0);
    fake_peer f;
    cr_assert_eq(pipe(f.done_pipe), 0);
    f.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    cr_assert_eq(bind(f.listen_fd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(f.listen_fd, 4), 0);
    cr_assert_eq(getsockname(f.listen_fd, (struct sockaddr *)&sa, &len), 0);

    job j = {.n = 2};
    job_url(&j, "abort");
    dt_store *s;
    cr_assert_eq(dt_store_open(&s, j.url, "failures"), DT_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "%d 127.0.0.1", ntohs(sa.sin_port));
    cr_assert_eq(dt_store_set(s, "addr/0", addr, strlen(addr)), DT_OK);
    pthread_t fake;
    cr_assert_eq(pthread_create(&fake, NULL, fake_rank0_sends_a_bad_abort, &f), 0);

    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = 1;
    o.world_size = 2;
    o.init_url = j.url;
    o.job_id = "failures";
    o.secret = SECRET;
    o.secret_len = sizeof SECRET;
    o.timeout_s = 5;
    o.init_timeout_s = 10;
    o.log = NULL;
    dt_comm *c;
    cr_assert_eq(dt_comm_init(&c, &o), DT_OK, "%s", dt_comm_error(c));
    usleep(400 * 1000); /* the frame is there before the op */
    double t0 = dt_now();
    dt_status st = dt_barrier(c);
    cr_expect_eq(st, DT_EPROTO, "barrier: %s: %s", dt_status_name(st), dt_comm_error(c));
    cr_expect_lt(dt_now() - t0, 4.0, "the failure took %.1f s to surface", dt_now() - t0);
    cr_expect_not_null(strstr(dt_comm_error(c), "ABORT frame of 2000 B"), "%s", dt_comm_error(c));
    dt_comm_destroy(c);
    cr_assert_eq(write(f.done_pipe[1], "g", 1), 1);
    pthread_join(fake, NULL);
    dt_store_close(s);
    close(f.listen_fd);
    close(f.done_pipe[0]);
    close(f.done_pipe[1]);
}
